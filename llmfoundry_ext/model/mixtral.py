"""Mixtral: the Llama block with a sparse mixture-of-experts feed-forward, experts run as grouped GEMMs.

Shapes: T tokens (batch x sequence), E experts, k experts per token, F the experts' feed-forward width.
Parameter names follow transformers' Mixtral (``layers.{i}.mlp.gate``; the experts' weights are stacked,
``layers.{i}.mlp.experts.w1`` [E, F, dim], where HF's checkpoints hold one ``experts.{e}.w1`` each: ``mixtral_hf``).
"""
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed._functional_collectives import all_to_all_single_autograd
from torch.distributed.tensor import DTensor

from llmfoundry_ext.bounds import NonNegativeFloat, PositiveInt
from llmfoundry_ext.model import fused
from llmfoundry_ext.model.kernels import KernelConfig
from llmfoundry_ext.model.llama import (INIT_STD, LlamaConfig, Transformer, TransformerBlock, at, residual_init_std,
                                        up_init_std)


@dataclass(frozen=True)
class MixtralConfig(LlamaConfig):
    """Llama's architecture fields (``ffn_dim`` is each expert's width) and the experts (HF ``MixtralConfig``)."""
    n_experts: PositiveInt = 8       # experts a block
    experts_per_token: PositiveInt = 2  # experts each token is routed to (at most n_experts)
    router_aux_loss_coef: NonNegativeFloat = field(default=0.02, metadata={'weights': False})  # load-balancing loss weight

    def feed_forward_params(self, active: bool = False) -> int:
        """The router and every expert, or (``active``) the router and the experts one token runs through."""
        experts = self.experts_per_token if active else self.n_experts
        return self.dim * self.n_experts + experts * 3 * self.dim * self.ffn_dim


PRESETS = {
    'debug': MixtralConfig(dim=256, n_layers=4, n_heads=8, n_kv_heads=4, ffn_dim=512, vocab_size=8000,
                           n_experts=8, experts_per_token=2, rope_theta=10000.0, rope_scaling_factor=1.0,
                           max_seq_len=2048),
    'mixtral-8x7b': MixtralConfig(dim=4096, n_layers=32, n_heads=32, n_kv_heads=8, ffn_dim=14336, vocab_size=32000,
                                  norm_eps=1e-5, rope_theta=1e6, rope_scaling_factor=1.0, max_seq_len=32768,
                                  n_experts=8, experts_per_token=2),
}


class GroupedExperts(nn.Module):
    """E SwiGLU experts, their weights stacked; each runs only on the tokens routed to it, all experts in one
    grouped GEMM per projection over the tokens sorted by expert (no loop over experts; no padding but where
    ``group_alignment`` asks for it).

    Under expert parallelism (``parallelism.shard_experts``) this rank holds E / ``expert_group``'s size of them
    (its weights a DTensor's shard); each token copy goes to the rank that holds its expert and comes back (an
    all-to-all each way, torch's autograd one).

    ``group_alignment`` above 1 pads each expert's group with zero rows to a multiple of it (``aligned_groups``):
    torchao's float8 grouped GEMM (``model.float8_experts``) takes groups of a multiple of 16 rows."""
    expert_group = None  # the process group the experts are split over (expert parallelism), else None
    group_alignment = 1  # each expert's rows padded to a multiple of this in the grouped GEMMs

    def __init__(self, config: MixtralConfig, kernels: KernelConfig, layer_id: int):
        super().__init__()
        experts, dim, width = config.n_experts, config.dim, config.ffn_dim
        self.w1 = nn.Parameter(torch.empty(experts, width, dim))  # gate
        self.w2 = nn.Parameter(torch.empty(experts, dim, width))  # down
        self.w3 = nn.Parameter(torch.empty(experts, width, dim))  # up
        self.init_stds = {'w1': INIT_STD, 'w2': residual_init_std(config, layer_id), 'w3': up_init_std(config, layer_id)}
        self.fused_swiglu = 'swiglu' in kernels.fused_kernels

    def forward(self, tokens: torch.Tensor, experts: torch.Tensor, weights: torch.Tensor,
                counts: torch.Tensor) -> torch.Tensor:
        """tokens [T, dim], experts [T, k] (chosen expert ids), weights [T, k], counts [E] (``times_chosen``, as
        integers) -> the weighted sum [T, dim]."""
        top_k = experts.shape[1]
        order = experts.flatten().argsort(stable=True)           # the T*k routed copies, grouped by expert
        token_of = order // top_k
        routed = tokens[token_of].to(gemm_dtype(tokens))
        if self.expert_group is None:
            out = self.run_local(routed, counts)
        else:
            out = self.run_dispatched(routed, counts)
        out = out * weights.flatten()[order].unsqueeze(-1)
        return torch.zeros_like(tokens).index_add_(0, token_of, out)

    def run_local(self, routed: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """This rank's experts on ``routed`` [N, dim], grouped by expert (``counts`` [E]: each group's rows)."""
        if self.group_alignment == 1:
            return self.grouped_swiglu(routed, counts.cumsum(0).to(torch.int32))  # each expert's group ends there
        padded, slots, offsets = aligned_groups(routed, counts, self.group_alignment)
        return self.grouped_swiglu(padded, offsets)[slots]

    def grouped_swiglu(self, routed: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        """Each expert's SwiGLU on its group of ``routed``'s rows (``offsets``: each group's end), three grouped
        GEMMs."""
        w1, w2, w3 = (local_shard(weight).to(routed.dtype).transpose(-2, -1) for weight in (self.w1, self.w2, self.w3))
        gate = F.grouped_mm(routed, w1, offs=offsets)
        up = F.grouped_mm(routed, w3, offs=offsets)
        hidden = fused.swiglu(gate, up) if self.fused_swiglu else F.silu(gate) * up
        return F.grouped_mm(hidden, w2, offs=offsets)

    @torch.compiler.disable
    def run_dispatched(self, routed: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """Every expert on ``routed`` [N, dim] (grouped by expert, ``counts`` [E] a group) over the expert group:
        the copies go to their experts' ranks and their outputs come back in the same order. Eager in a compiled
        block: the all-to-all's split sizes are the routing's, new each step, on which a traced graph specialises."""
        group, ranks = self.expert_group, self.expert_group.size()
        sent = counts.view(ranks, -1)                              # [rank, its expert]: my copies for each
        received = torch.empty_like(sent)                          # [source rank, my expert]: theirs for mine
        torch.distributed.all_to_all_single(received, sent, group=group)
        send_sizes, receive_sizes = sent.sum(1).tolist(), received.sum(1).tolist()
        arrived = all_to_all_single_autograd(routed, receive_sizes, send_sizes, group)  # by source, then expert
        local_expert = torch.arange(sent.shape[1], device=routed.device).repeat(ranks)
        by_expert = local_expert.repeat_interleave(received.flatten()).argsort(stable=True)
        out = self.run_local(arrived[by_expert], received.sum(0))
        return all_to_all_single_autograd(out[by_expert.argsort()], send_sizes, receive_sizes, group)

    def init_weights(self):
        for name, std in self.init_stds.items():
            nn.init.trunc_normal_(getattr(self, name), std=std)


def aligned_groups(routed: torch.Tensor, counts: torch.Tensor, alignment: int
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``routed`` [N, dim], grouped by expert (``counts`` [E]: each group's rows), with each group padded by zero
    rows to a multiple of ``alignment``: the padded rows [N + E x (alignment - 1), dim], rounded up to a multiple of
    ``alignment`` (those past the last group unused; the weight gradient's float8 operand is the padded rows
    transposed, whose stride cuBLAS needs in 16 bytes), each routed row's slot there, and the padded groups' ends.
    Shapes fixed by N and E, no host sync: one compiled graph whatever the routing. Ours: torchao's float8 grouped
    GEMM asks aligned groups of its caller (torchtitan pads in its own permutation, written for its MoE)."""
    counts = counts.to(torch.int64)
    padded_counts = (counts + alignment - 1) // alignment * alignment
    shift = (padded_counts.cumsum(0) - padded_counts) - (counts.cumsum(0) - counts)  # each group's start, moved
    rows, experts = routed.shape[0], counts.shape[0]
    expert_of = torch.repeat_interleave(torch.arange(experts, device=routed.device), counts, output_size=rows)
    slots = torch.arange(rows, device=routed.device) + shift[expert_of]
    total = -(-(rows + experts * (alignment - 1)) // alignment) * alignment
    padded = routed.new_zeros(total, routed.shape[1]).index_copy(0, slots, routed)
    return padded, slots, padded_counts.cumsum(0).to(torch.int32)


def local_shard(weight: torch.Tensor) -> torch.Tensor:
    """This rank's experts of a weight split over the expert group (a DTensor), or the weight itself."""
    return weight.to_local() if isinstance(weight, DTensor) else weight


def gemm_dtype(tensor: torch.Tensor) -> torch.dtype:
    """The dtype autocast gives a GEMM on ``tensor``'s device (bf16 under amp_bf16), else ``tensor``'s own: autocast
    has no rule for grouped GEMMs, and one process trains fp32 parameters under autocast (FSDP2's are bf16)."""
    device = tensor.device.type
    return torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else tensor.dtype


def times_chosen(experts: torch.Tensor, n_experts: int) -> torch.Tensor:
    """[E] fp32: how many times each expert is among the chosen ``experts`` [T, k] (histc: no host sync)."""
    return torch.histc(experts.flatten().float(), bins=n_experts, min=0, max=n_experts)


class MoE(nn.Module):
    """Mixtral's sparse feed-forward: the router's softmax over all experts, the top k kept and renormalised
    (as transformers' MixtralSparseMoeBlock), and the router's statistics for the load-balancing loss."""

    def __init__(self, config: MixtralConfig, kernels: KernelConfig, layer_id: int):
        super().__init__()
        self.top_k = config.experts_per_token
        self.gate = nn.Linear(config.dim, config.n_experts, bias=False)
        self.experts = GroupedExperts(config, kernels, layer_id)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x [B, S, dim] -> (output [B, S, dim], router statistics [2, E]: times each expert was chosen, and the
        sum of its router probabilities over the tokens)."""
        tokens = x.flatten(0, 1)
        probabilities = F.softmax(self.gate(tokens), dim=-1, dtype=torch.float)
        weights, experts = probabilities.topk(self.top_k, dim=-1)
        weights = (weights / weights.sum(dim=-1, keepdim=True)).to(x.dtype)
        chosen = times_chosen(experts, probabilities.shape[1])
        statistics = torch.stack((chosen, probabilities.sum(dim=0)))
        # integers: FSDP2's mixed precision casts a sharded module's float inputs to bf16, and expert parallelism
        # shards the experts on their own (4,197 rows would arrive as 4,192)
        return self.experts(tokens, experts, weights, chosen.to(torch.int64)).view_as(x), statistics


class MixtralBlock(TransformerBlock):
    """Returns (x, router statistics [2, E])."""
    feed_forward_class = MoE

    def add_feed_forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out, statistics = self.mlp(self.post_attention_layernorm(x))
        return x + out, statistics


class Mixtral(Transformer):
    """Token ids [B, S] -> (logits [B, S, vocab], or the loss given labels; router statistics [layers, 2, E])."""
    block_class = MixtralBlock

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor | None = None,
                labels: torch.Tensor | None = None, attention_mask=None, logits_at: tuple | None = None
                ) -> tuple[torch.Tensor, torch.Tensor]:
        x, *context = self.layer_inputs(input_ids, position_ids, attention_mask)
        statistics = []
        for layer in self.layers:
            x, layer_statistics = layer(x, *context)
            statistics.append(layer_statistics)
        return self.lm_head(at(self.norm(x), logits_at), labels), torch.stack(statistics)

    def init_module(self, module: nn.Module):
        if isinstance(module, GroupedExperts):
            module.init_weights()
        else:
            super().init_module(module)


def load_balancing_loss(statistics: torch.Tensor, tokens: int) -> torch.Tensor:
    """The Switch / Mixtral auxiliary loss over all layers at once, as transformers' ``load_balancing_loss_func``:
    E x sum over experts of (times chosen per token) x (mean router probability), both averaged over every layer's
    ``tokens``. ``statistics`` [layers, 2, E] from ``Mixtral``; k (experts per token) when perfectly balanced."""
    layers, _, experts = statistics.shape
    chosen, probability = statistics.sum(dim=0) / (layers * tokens)
    return experts * (chosen * probability).sum()
