"""A family's model inside one ComposerModel: loss (with a mixture of experts' load-balancing loss), metrics, and
FLOPs per batch for MFU."""
import functools

import torch
import torch.nn.functional as F
from composer.metrics.nlp import LanguageCrossEntropy, LanguagePerplexity
from composer.models import ComposerModel

from llmfoundry_ext.model.llama import LlamaConfig, Transformer
from llmfoundry_ext.model.mixtral import MixtralConfig, load_balancing_loss


METRIC_TOKENS = 8192  # fp32 log-softmax of 8,192 x 128,256 logits: 4 GiB


class LanguageModel(ComposerModel):
    """Batches {'input_ids' [B, S], 'labels' [B, S] with -100 = ignore} -> logits and a token-mean loss.

    Labels are aligned with positions (the collator shifts them for causal LM), so the same loss serves
    masked LM. The Transformer is the only child, as Composer's FSDP2 policy expects; it may be on
    ``meta`` (the metrics are built here, on the CPU). The loss is chosen once, here: with the fused cross_entropy
    kernel the training forward returns the loss itself (the logits never exist) and evaluation computes logits for
    its metrics; otherwise the forward returns logits and the cross-entropy (compiled or not) takes them.
    A mixture of experts also returns its router statistics: the loss is then {'total': cross-entropy +
    router_aux_loss_coef x load-balancing loss, 'cross_entropy', 'router_aux'} (Composer logs each).
    """

    def __init__(self, model: Transformer, compile_loss: bool = False):
        super().__init__()
        self.config = model.config
        self.model = model
        self.fused_loss = model.kernels.fused_loss
        self.routed = isinstance(model.config, MixtralConfig)
        self.cross_entropy = compiled_cross_entropy() if compile_loss else token_mean_cross_entropy
        self.eval_metrics = {'LanguageCrossEntropy': LanguageCrossEntropy(),
                             'LanguagePerplexity': LanguagePerplexity()}

    def forward(self, batch: dict):
        """The loss (fused) or logits [B, S, vocab]; routed: with the router statistics [layers, 2, E]."""
        labels = batch['labels'] if self.fused_loss else None
        return self.model(batch['input_ids'], batch.get('position_ids'), labels, batch.get('attention_mask'))

    def loss(self, outputs, batch: dict) -> torch.Tensor | dict:
        main, statistics = outputs if self.routed else (outputs, None)
        loss = main if self.fused_loss else self.cross_entropy(main, batch['labels'])
        if 'loss_scale' in batch:  # a context-parallel shard: its share of the group's mean (ContextParallel.shard)
            loss = loss * batch['loss_scale']
        if statistics is None:
            return loss
        router_aux = load_balancing_loss(statistics, batch['input_ids'].numel())
        return {'total': loss + self.config.router_aux_loss_coef * router_aux, 'cross_entropy': loss,
                'router_aux': router_aux}

    def eval_forward(self, batch: dict, outputs=None) -> torch.Tensor:
        """Logits: the training forward's, or (fused loss, or none given) a forward of their own."""
        if outputs is None or self.fused_loss:
            outputs = self.model(batch['input_ids'], batch.get('position_ids'), None, batch.get('attention_mask'))
        return outputs[0] if self.routed else outputs

    def get_metrics(self, is_train: bool = False) -> dict:
        """No training metrics: Composer 0.32 would run ``eval_forward`` on every micro-batch for them (another
        forward, or a second cross-entropy over the logits); ``loss/train/total`` is the training loss."""
        return {} if is_train else self.eval_metrics

    def update_metric(self, batch: dict, outputs: torch.Tensor, metric) -> None:
        """At most ``METRIC_TOKENS`` tokens at a time: the metrics' fp32 log-softmax of a whole batch of logits
        (4 x 8,192 x 128,256: 31 GiB) ran out of memory on an H100 at the shipped YAMLs' first evaluation."""
        for logits, labels in zip(outputs.split(1), batch['labels'].split(1)):
            for logits_part, labels_part in zip(logits.split(METRIC_TOKENS, 1), labels.split(METRIC_TOKENS, 1)):
                metric.update(logits_part, labels_part)

    def rank_flops(self, batch: dict) -> int:
        """Training FLOPs of this rank's share of the batch (our SpeedMonitor sums the ranks' into MFU):
        under context parallelism every rank of a group is given the group's whole batch and computes 1/degree."""
        context_parallel = self.model.context_parallel
        return batch_flops(self.config, batch) // (context_parallel.degree if context_parallel else 1)


def token_mean_cross_entropy(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean over labels != -100 of the fp32 cross-entropy of logits [B, S, vocab] against labels [B, S]."""
    return F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(), ignore_index=-100)


@functools.lru_cache(maxsize=None)
def compiled_cross_entropy():
    """``token_mean_cross_entropy`` compiled, as torchtitan compiles its loss: the fp32 upcast, log-softmax and
    its gradient fused, so neither fp32 logits nor probabilities are written out."""
    return torch.compile(token_mean_cross_entropy, dynamic=False)


def batch_flops(config: LlamaConfig, batch: dict) -> int:
    """Training FLOPs of one batch of this architecture (torchtitan's convention)."""
    batch_size, seq_len = batch['input_ids'].shape
    return batch_size * seq_len * config.flops_per_token(seq_len)
