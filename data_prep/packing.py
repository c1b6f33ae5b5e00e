"""Tokenize documents, append EOS, and pack them into fixed windows (written by ``llmfoundry_ext.data.mds``)."""
from collections.abc import Iterable, Iterator

import numpy as np


class Packer:
    """Concatenates token lists and cuts full ``window``-token arrays off the front."""

    def __init__(self, window: int):
        self.window = window
        self.buffer: list[int] = []

    def add(self, tokens: list[int]) -> Iterator[np.ndarray]:
        self.buffer.extend(tokens)
        while len(self.buffer) >= self.window:
            yield np.asarray(self.buffer[:self.window], dtype=np.uint32)
            del self.buffer[:self.window]


def pack(documents: Iterable[list[int]], window: int) -> Iterator[np.ndarray]:
    """Concatenate token lists and cut them into ``window``-token arrays; the incomplete tail is dropped."""
    packer = Packer(window)
    for tokens in documents:
        yield from packer.add(tokens)


def tokenize_documents(texts: Iterable[str], tokenizer, eos_id: int, bos_id: int | None = None,
                       batch_size: int = 256) -> Iterator[list[int]]:
    """Each text -> [BOS] + ids + [EOS] (a ``tokenizers.Tokenizer``, encoded in batches). The tokenizer's own
    special tokens are not added (Llama-3's post-processor would add a second BOS); offsets are not computed
    where ``encode_batch_fast`` exists (a third faster)."""
    encode = getattr(tokenizer, 'encode_batch_fast', tokenizer.encode_batch)
    batch = []
    for text in texts:
        batch.append(text)
        if len(batch) == batch_size:
            yield from wrap(encode(batch, add_special_tokens=False), eos_id, bos_id)
            batch = []
    if batch:
        yield from wrap(encode(batch, add_special_tokens=False), eos_id, bos_id)


def wrap(encodings, eos_id: int, bos_id: int | None) -> Iterator[list[int]]:
    prefix = [bos_id] if bos_id is not None else []
    for encoding in encodings:
        yield prefix + encoding.ids + [eos_id]

