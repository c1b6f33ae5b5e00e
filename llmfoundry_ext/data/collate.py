"""Token windows -> training batches: next-token labels, document boundaries, masked-LM masking.

Batches hold ``input_ids`` [B, S], ``labels`` [B, S] (-100: no loss) and ``sample_ids`` [B]; with document
masking also ``position_ids`` [B, S], restarting after each EOS: the model derives each attention backend's
document mask from them (cu_seqlens for varlen kernels), per micro-batch.
"""
from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch

from llmfoundry_ext.errors import TrainingStopped

IGNORE = -100


def check_vocabulary(input_ids: torch.Tensor, sample_ids: torch.Tensor, vocab_size: int) -> None:
    """Shards tokenized with a larger vocabulary than the model's (no manifest said which tokenizer) would stop the
    run in the embedding: an IndexError on the CPU, a device-side assert on a GPU. One max over the batch on the
    CPU, where the collator runs."""
    largest = int(input_ids.max())
    if largest >= vocab_size:
        row = int((input_ids >= vocab_size).any(dim=1).nonzero()[0])
        raise TrainingStopped(f'sample {int(sample_ids[row])} holds token id {largest:,}, beyond model.vocab_size '
                              f'{vocab_size:,}: its shards were tokenized with a larger vocabulary; set data.tokenizer '
                              f'to their tokenizer (and model.vocab_size to its size), or re-convert them')


def stack_windows(samples: list[dict], max_seq_len: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """input_ids [B, S] from the samples' first ``max_seq_len`` tokens, the token after them [B] (IGNORE where a
    sample has no more), and sample_ids [B]."""
    short = [len(s['tokens']) for s in samples if len(s['tokens']) < max_seq_len]
    if short:
        raise ValueError(f'a sample has {short[0]} tokens, fewer than max_seq_len {max_seq_len}: convert the data '
                         f'with --concat-tokens >= {max_seq_len} or lower max_seq_len')
    input_ids = torch.stack([s['tokens'][:max_seq_len] for s in samples])
    following = torch.tensor([int(s['tokens'][max_seq_len]) if len(s['tokens']) > max_seq_len else IGNORE
                              for s in samples], dtype=input_ids.dtype)
    return input_ids, following, torch.tensor([s['sample_id'] for s in samples], dtype=torch.int64)


def next_token_labels(input_ids: torch.Tensor, following: torch.Tensor | None = None) -> torch.Tensor:
    """labels[:, t] = input_ids[:, t + 1]; the last position's is ``following`` (each row's next token, as windows
    of max_seq_len + 1 tokens give: every position labelled, as torchtitan's samples), else none."""
    labels = torch.full_like(input_ids, IGNORE)
    labels[:, :-1] = input_ids[:, 1:]
    if following is not None:
        labels[:, -1] = following
    return labels


def document_positions(input_ids: torch.Tensor, eos_id: int) -> torch.Tensor:
    """position_ids [B, S] restarting at 0 after every EOS and at each row's start."""
    batch, seq_len = input_ids.shape
    starts = torch.zeros_like(input_ids, dtype=torch.bool)
    starts[:, 0] = True
    starts[:, 1:] = input_ids[:, :-1] == eos_id
    index = torch.arange(seq_len).expand(batch, seq_len)
    last_start = torch.where(starts, index, torch.zeros_like(index)).cummax(dim=1).values
    return index - last_start


def mlm_mask(sample_ids: torch.Tensor, seq_len: int, probability: float, seed: int) -> torch.Tensor:
    """[B, S] bool, each position True with ``probability``, drawn from (seed, sample id): the same sample is
    masked the same way however often it is read, so resumption stays exact."""
    rows = [np.random.default_rng([seed, int(i)]).random(seq_len) < probability for i in sample_ids]
    return torch.from_numpy(np.stack(rows))


@dataclass
class Collator:
    """Builds the batch for the run's objective (``clm`` or ``mlm``), optionally with document boundaries."""
    max_seq_len: int
    objective: str = 'clm'
    eos_id: Optional[int] = None            # set: add position_ids (document masking)
    mask_probability: float = 0.3
    mask_token_id: Optional[int] = None
    seed: int = 0
    vocab_size: Optional[int] = None        # set: a token id at or beyond it stops the run (the embedding's bound)

    def __call__(self, samples: list[dict]) -> dict:
        input_ids, following, sample_ids = stack_windows(samples, self.max_seq_len)
        if self.vocab_size is not None:
            check_vocabulary(input_ids, sample_ids, self.vocab_size)
        batch = {'sample_ids': sample_ids}
        if self.eos_id is not None:
            batch['position_ids'] = document_positions(input_ids, self.eos_id)
        if self.objective == 'mlm':
            masked = mlm_mask(sample_ids, self.max_seq_len, self.mask_probability, self.seed)
            batch['labels'] = torch.where(masked, input_ids, IGNORE)
            batch['input_ids'] = torch.where(masked, self.mask_token_id, input_ids)
        else:
            batch['labels'] = next_token_labels(input_ids, following)
            batch['input_ids'] = input_ids
        return batch
