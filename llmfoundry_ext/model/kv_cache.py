"""Keys and values kept while generating, so that each decoding step runs the new token alone instead of the whole
text again. As gpt-fast does it: the cache is an attribute of each attention module, set only inside ``caching``
(training and scoring never see one); PyTorch has no cache of its own for a hand-written model, and transformers'
``Cache`` classes expect its attention's call."""
import contextlib
from typing import Iterator

import torch
from torch import nn


class KVCache:
    """One attention layer's keys and values [rows, K, length, D], filled from the left by each forward's tokens;
    a forward reads and writes the rows of ``rows`` (all but while a prefill runs in parts)."""

    def __init__(self, rows: int, length: int):
        self.shape_rows, self.length, self.filled, self.rows = rows, length, 0, slice(None)
        self.keys = self.values = None

    def append(self, keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The keys and values so far of ``rows``, these [B, K, S, D] included."""
        if self.keys is None:
            shape = (self.shape_rows, keys.shape[1], self.length, keys.shape[-1])
            self.keys, self.values = keys.new_empty(shape), values.new_empty(shape)
        end = self.filled + keys.shape[2]
        if end > self.length:
            raise ValueError(f'the cache holds {self.length} tokens a row; {end} asked')
        self.keys[self.rows, :, self.filled:end], self.values[self.rows, :, self.filled:end] = keys, values
        self.filled = end
        return self.keys[self.rows, :, :end], self.values[self.rows, :, :end]


class Caches:
    """Every layer's ``KVCache`` of a transformer, set on its attention modules while ``caching``."""

    def __init__(self, attentions: list[nn.Module]):
        self.attentions = attentions

    def rows(self, rows: slice, filled: int) -> None:
        """The next forwards read and write ``rows``, after ``filled`` tokens of each."""
        for attention in self.attentions:
            attention.kv_cache.rows, attention.kv_cache.filled = rows, filled

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Forwards inside neither read nor write the caches."""
        caches = [attention.kv_cache for attention in self.attentions]
        for attention in self.attentions:
            attention.kv_cache = None
        try:
            yield
        finally:
            for attention, cache in zip(self.attentions, caches):
                attention.kv_cache = cache


@contextlib.contextmanager
def caching(transformer: nn.Module, rows: int, length: int) -> Iterator[Caches]:
    """Each layer of ``transformer`` keeping up to ``length`` tokens of ``rows`` rows while inside: a forward then
    reads the tokens after those already cached, with their RoPE positions and a mask over all the cached keys."""
    attentions = [layer.self_attn for layer in transformer.layers]
    for attention in attentions:
        attention.kv_cache = KVCache(rows, length)
    try:
        yield Caches(attentions)
    finally:
        for attention in attentions:
            attention.kv_cache = None
