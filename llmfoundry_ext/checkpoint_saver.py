"""The saving side of the checkpoints autoresume can trust (``resumption`` reads them): Composer's CheckpointSaver,
sealed."""
import errno
import os
import shutil

import torch
from composer.callbacks import CheckpointSaver
from composer.utils import dist
from composer.utils import checkpoint as composer_checkpoint
from composer.utils.checkpoint import get_save_filename
from composer.utils.compression import is_compressed_pt
from composer.utils.file_helpers import is_tar

from llmfoundry_ext.atomic import atomic_file
from llmfoundry_ext.errors import TrainingStopped
from llmfoundry_ext.resumption import checkpoints_newest_first, prune, remove, seal


def write_checkpoint_file_atomically(state_dict: dict, filename: str) -> None:
    """Composer's ``_write_checkpoint_file`` for a plain ``.pt`` (the one-process checkpoint) through ``atomic_file``:
    Composer writes it under its final name, where a reader (an export, an evaluation, autoresume after a crash)
    could find it half-written. Its other forms (tar, compressed) go to Composer's own writer."""
    if is_tar(filename) or is_compressed_pt(filename):
        return COMPOSER_WRITE_CHECKPOINT_FILE(state_dict, filename)
    with atomic_file(filename) as file:
        torch.save(state_dict, file)


COMPOSER_WRITE_CHECKPOINT_FILE = composer_checkpoint._write_checkpoint_file
composer_checkpoint._write_checkpoint_file = write_checkpoint_file_atomically


class SealedCheckpointSaver(CheckpointSaver):
    """Composer's CheckpointSaver that refuses to save non-finite weights, turns a failed write (a full disk) into
    one line, and seals each checkpoint once every rank has written it."""

    def _save_checkpoint(self, state, logger) -> None:
        name = self.checkpoint_path(state)
        stop_on_nonfinite_weights(state, os.path.basename(name))
        try:
            super()._save_checkpoint(state, logger)
        except BaseException as error:  # torch.distributed.checkpoint's CheckpointException is a BaseException
            if not is_disk_full(error):
                raise
            raise TrainingStopped(disk_full_line(name, state.fsdp_sharded_state_dict_enabled)) from None
        if dist.get_global_rank() == 0:
            seal(name)
            for line in prune(os.path.dirname(name), state.fsdp_sharded_state_dict_enabled,
                              self.num_checkpoints_to_keep):
                print(line, flush=True)  # what a run before the restart saved, which Composer does not count

    def checkpoint_path(self, state) -> str:
        """The folder (sharded) or file this save writes, as Composer names it."""
        saved = get_save_filename(state, self.filename.format(state, keep_placeholders=True))
        return os.path.dirname(saved) if state.fsdp_sharded_state_dict_enabled else saved


def disk_full_line(name: str, sharded: bool) -> str:
    """The partial checkpoint removed (rank 0; the ranks' writes have all failed), and what to free, measured on the
    newest complete checkpoint."""
    folder = os.path.dirname(name)
    if dist.get_global_rank() == 0 and os.path.lexists(name):
        remove(name)
    newest = next(iter(checkpoints_newest_first(folder, sharded)), None)
    needed = f', a checkpoint takes {human_bytes(size_of(os.path.join(folder, newest)))}' if newest else ''
    free = human_bytes(shutil.disk_usage(folder).free)
    return (f'no space left on the device while writing checkpoint {name} ({free} free in {folder}{needed}; the '
            f'partial checkpoint was removed): free space, then run the same command; it resumes from the newest '
            f'complete checkpoint')


def size_of(path: str) -> int:
    if os.path.isfile(path):
        return os.path.getsize(path)
    return sum(os.path.getsize(os.path.join(root, name)) for root, _, names in os.walk(path) for name in names)


def human_bytes(count: int) -> str:
    for unit in ('B', 'KB', 'MB', 'GB'):
        if count < 1000:
            return f'{count:.3g} {unit}'
        count /= 1000
    return f'{count:,.1f} TB'


def is_disk_full(error: BaseException) -> bool:
    """An ENOSPC in ``error``, what it was raised from or while handling (torch.save's zip writer, closing after the
    failed write, raises its own RuntimeError), or the failures torch.distributed.checkpoint collected from the ranks
    (each an exception, or an (exception, traceback) pair)."""
    if isinstance(error, OSError) and error.errno == errno.ENOSPC:
        return True
    failures = [failure[0] if isinstance(failure, tuple) else failure
                for failure in (getattr(error, 'failures', None) or {}).values()]
    return any(isinstance(inner, BaseException) and is_disk_full(inner)
               for inner in [*failures, error.__cause__, error.__context__])


def stop_on_nonfinite_weights(state, checkpoint: str) -> None:
    """Raise before a checkpoint of non-finite weights is written (checked on every rank's shard)."""
    shards = [p.to_local() if hasattr(p, 'to_local') else p for p in state.model.parameters()]
    finite = torch.stack([torch.isfinite(shard).all() for shard in shards]).all().to(torch.int32).reshape(1)
    dist.all_reduce(finite, reduce_operation='MIN')
    if not finite.item():
        raise TrainingStopped(f'non-finite weights at batch {int(state.timestamp.batch)}: not writing checkpoint '
                              f'{checkpoint}; the same command resumes from the last checkpoint (lower the learning '
                              f'rate or check the data first)')
