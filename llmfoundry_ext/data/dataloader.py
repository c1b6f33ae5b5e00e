"""Token windows from MDS shards -> Composer DataSpecs (StreamingDataset + StreamingDataLoader).

The StreamingDataLoader's position is saved in every Composer checkpoint and restored on autoresume,
so the sample order after a restart equals the uninterrupted run's.
"""
import json
import os
import threading
from typing import TYPE_CHECKING

import numpy as np
import torch
import xxhash
from composer.core import DataSpec
from streaming import Stream, StreamingDataLoader, StreamingDataset
from streaming.base.dataset import _ShardState  # the shard states prepare_shard moves through

from llmfoundry_ext.config import LoaderConfig, first_line
from llmfoundry_ext.data.collate import Collator
from llmfoundry_ext.data.mds import HASH, TOKENS
from llmfoundry_ext.data.shm_prefix import use_race_free_prefixes
from llmfoundry_ext.errors import TrainingStopped

if TYPE_CHECKING:
    from llmfoundry_ext.parallelism import ContextParallel


class TokenWindows(StreamingDataset):
    """Samples of an MDS ``tokens`` column (uint32), as int64 tensors with their global sample index.

    A shard that cannot be prepared (a compressed shard whose bytes were damaged: zstd finds the corruption, or its
    checksum in index.json differs) stops the run in one line naming it. Streaming prepares shards in a background
    thread; when one fails it ends the epoch early without an error, and the run would then be "complete" with the
    batches it had (none, in the first epoch), or wait for the shard for ever. The failure is kept here and raised
    once the epoch's iteration ends.

    A decompressed shard already in the local folder (streaming reads it as it is) is checked against its checksum
    before this process first reads it (a 64 MB shard, 16M tokens: ~35 ms from the page cache, once a process), and
    a sample that cannot be decoded stops the run in one line naming its shard too, not in streaming's IndexError."""
    failure = None  # the TrainingStopped of a shard that could not be prepared
    checked = frozenset()  # the shards this process has checked or prepared (each process its own set)

    def __getitem__(self, index: int) -> dict:
        tokens = super().__getitem__(index)[TOKENS]
        return {'tokens': torch.from_numpy(tokens.astype(np.int64)), 'sample_id': index}

    def get_item(self, sample_id: int, retry: int = 7):
        shard_id, _ = self.spanner[sample_id]
        shard = self.shards[shard_id]
        if shard_id not in self.checked:
            problem = raw_checksum_problem(shard)
            if problem:
                raise TrainingStopped(unreadable_shard_line(shard, ValueError(problem), raw=True))
            self.checked = self.checked | {shard_id}
        try:
            return super().get_item(sample_id, retry)
        except TrainingStopped:
            raise
        except Exception as error:  # what decoding damaged bytes raises: IndexError, ValueError, ...
            raise (self.failure or TrainingStopped(unreadable_shard_line(shard, error, raw=True))) from None

    def prepare_shard(self, shard_id: int, blocking: bool = True) -> None:
        if self.failure is not None and threading.current_thread() is threading.main_thread():
            raise self.failure
        try:
            super().prepare_shard(shard_id, blocking)
        except Exception as error:
            self.failure = TrainingStopped(unreadable_shard_line(self.shards[shard_id], error))
            # Out of PREPARING, in which a reader of the shard would wait for it for ever: the next one to prepare
            # it (the main thread, whose sample it is) fails as this thread did, and stops the run
            self._shard_states[shard_id] = _ShardState.REMOTE
            if hasattr(self, '_event'):  # made by the first __iter__
                self._event.set()  # the other threads stop; __iter__ raises the failure
            if threading.current_thread() is threading.main_thread():
                raise self.failure from None

    def __iter__(self):
        yield from super().__iter__()
        if self.failure is not None:
            raise self.failure


def raw_checksum_problem(shard) -> str | None:
    """Why a decompressed shard in the local folder differs from the checksum its index records, or None (no such
    file yet: streaming prepares it from the checked compressed one; or no checksum recorded)."""
    expected = shard.raw_data.hashes.get(HASH)
    path = shard_path(shard, raw=True)
    if expected is None or not os.path.isfile(path):
        return None
    with open(path, 'rb') as file:
        found = xxhash.xxh3_64_hexdigest(file.read())
    return None if found == expected else f'its {HASH} checksum is {found}, index.json records {expected}'


def shard_path(shard, raw: bool = False) -> str:
    """The shard's file: the compressed one where there is one (``raw``: the decompressed one)."""
    files = shard.raw_data if raw or not shard.zip_data else shard.zip_data
    return os.path.join(shard.dirname, shard.split or '', files.basename)


def unreadable_shard_line(shard, error: Exception, raw: bool = False) -> str:
    path = shard_path(shard, raw)
    return (f'shard {path} cannot be read ({type(error).__name__}: {first_line(error)}); re-convert its stream with '
            f'data_prep/convert_to_mds.py (or restore the file), then run the same command: it resumes from the last '
            f'checkpoint')


class HeldOutWindows(TokenWindows):
    """The evaluation set. Streaming starts a new epoch at every pass, and each epoch reshuffles and redraws the
    streams' proportions: evaluations would read different samples (and restart the sequence after a restart).
    Every pass here is epoch 0, so every evaluation, before and after a restart, reads the same samples in the same
    order, and ``eval_subset_num_batches`` is the same subset each time."""

    def __iter__(self):
        self.next_epoch = 0
        return super().__iter__()


def build_dataset(loader: LoaderConfig, device_batch_size: int, held_out: bool = False,
                  replication: int = 1) -> TokenWindows:
    """``replication``: so many consecutive ranks read the same samples (a context-parallel group)."""
    use_race_free_prefixes()
    streams = [Stream(local=s.local, remote=s.remote, proportion=s.proportion, repeat=s.repeat, choose=s.choose,
                      validate_hash=HASH if recorded_checksums(s.local) else None) for s in loader.streams.values()]
    windows = HeldOutWindows if held_out else TokenWindows
    return windows(streams=streams, batch_size=device_batch_size, shuffle=loader.shuffle,
                   shuffle_seed=loader.shuffle_seed, shuffle_algo=loader.shuffle_algo,
                   num_canonical_nodes=loader.num_canonical_nodes, epoch_size=loader.epoch_size,
                   replication=replication if replication > 1 else None)


def recorded_checksums(folder: str) -> bool:
    """Whether the MDS index in ``folder`` records each shard's ``HASH`` (converted since it did; a remote stream's
    index not here yet: unknown, so not checked)."""
    try:
        with open(os.path.join(folder, 'index.json')) as file:
            shards = json.load(file)['shards']
    except (OSError, ValueError, KeyError):
        return False
    return all(HASH in shard['raw_data'].get('hashes', {}) for shard in shards)


def build_dataloader(loader: LoaderConfig, device_batch_size: int, collator: Collator, held_out: bool = False,
                     context_parallel: 'ContextParallel | None' = None) -> DataSpec:
    """A DataSpec whose token count per batch feeds Composer's token-based durations and SpeedMonitor;
    ``held_out``: the evaluation set, the same samples at every evaluation. Under ``context_parallel`` each group
    reads the same samples, every micro-batch is cut to the rank's shard on the GPU, and each rank counts its share
    of the samples and tokens."""
    if context_parallel is not None:
        return DataSpec(build_loader(loader, device_batch_size, collator, held_out, context_parallel.degree),
                        microbatch_transforms=context_parallel.shard,
                        get_num_samples_in_batch=context_parallel.samples,
                        get_num_tokens_in_batch=context_parallel.tokens)
    return DataSpec(build_loader(loader, device_batch_size, collator, held_out),
                    get_num_tokens_in_batch=lambda batch: batch['input_ids'].numel())


def build_loader(loader: LoaderConfig, device_batch_size: int, collator: Collator, held_out: bool,
                 replication: int = 1) -> StreamingDataLoader:
    return StreamingDataLoader(
        build_dataset(loader, device_batch_size, held_out, replication), batch_size=device_batch_size,
        num_workers=loader.num_workers, drop_last=loader.drop_last,
        prefetch_factor=loader.prefetch_factor if loader.num_workers else None,
        persistent_workers=loader.num_workers > 0, collate_fn=collator,
        pin_memory=torch.cuda.is_available())  # from pageable memory each copy to the GPU would wait for the GPU
