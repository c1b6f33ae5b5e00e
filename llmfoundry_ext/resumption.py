"""Checkpoints autoresume can trust: sealed once complete, checked before a run resumes from them.

Composer writes a sharded checkpoint in place (each rank's ``__<rank>_0.distcp``, then ``.metadata``) and then points
``latest-rank0.pt`` at it by removing and re-creating that link. A kill inside the write leaves a half-written
folder; a kill between the two link steps leaves no link, and Composer would start from scratch; files can also be
truncated or damaged later. So: after each save rank 0 writes a seal (each file's size and the metadata's sha256),
and before a run starts rank 0 picks the newest checkpoint that is complete and intact, moves newer broken ones
aside (renamed, never deleted) with one line each, and points the link at it.

One process writes one file (the model unsharded: the run plan's ``shards_the_model``), FSDP2 over several a sharded
folder; Composer reads only the format the run writes. A checkpoint of the other format is converted beside it
(torch.distributed.checkpoint's own format conversion; the original kept), so a run moves between one GPU and many
and back, with its data order: the dataset state travels in the checkpoint either way.

The saving side runs in training (``checkpoint_saver.py``); this module is files alone, without
Composer, so that reading a run's checkpoints (``checkpoint.py``, ``scripts/evaluate.py``) does not import it.
"""
import json
import os
import pickle
import re
import shutil
import zipfile

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

from llmfoundry_ext.atomic import atomic_folder, write_atomically
from llmfoundry_ext.data.mds import file_sha256
from llmfoundry_ext.errors import TrainingStopped

LATEST = 'latest-rank0.pt'  # Composer's link to the checkpoint autoresume loads (rank 0's; sharded runs share it)
SEAL = '.complete.json'
METADATA = '.metadata'
CHECKPOINT_NAME = re.compile(r'^ep\d+-ba(\d+)(-rank0\.pt)?$')  # a sharded folder, or a whole-model file


def seal_path(checkpoint: str) -> str:
    """A sharded checkpoint's seal is a file in its folder; a whole-model file's sits beside it."""
    if os.path.isdir(checkpoint):
        return os.path.join(checkpoint, SEAL)
    return os.path.join(os.path.dirname(checkpoint), f'.{os.path.basename(checkpoint)}{SEAL}')


def seal(checkpoint: str) -> None:
    """Record, once every rank has written, each file's size and the sharded metadata's sha256."""
    if os.path.isdir(checkpoint):
        folder, names = checkpoint, [name for name in sorted(os.listdir(checkpoint)) if name != SEAL]
    else:
        folder, names = os.path.dirname(checkpoint), [os.path.basename(checkpoint)]
    record = {'sizes': {name: os.path.getsize(os.path.join(folder, name)) for name in names}}
    if os.path.isdir(checkpoint):
        record['metadata_sha256'] = file_sha256(os.path.join(checkpoint, METADATA))
    write_atomically(seal_path(checkpoint), json.dumps(record))


def problem(checkpoint: str) -> str | None:
    """Why ``checkpoint`` cannot be resumed from (incomplete, truncated, a shard missing, changed metadata), or None."""
    sharded = os.path.isdir(checkpoint)
    if sharded and not os.path.isfile(os.path.join(checkpoint, METADATA)):
        return 'no .metadata: its write was interrupted'
    if os.path.isfile(seal_path(checkpoint)):
        return sealed_problem(checkpoint)
    return unsealed_sharded_problem(checkpoint) if sharded else unsealed_file_problem(checkpoint)


def sealed_problem(checkpoint: str) -> str | None:
    try:
        with open(seal_path(checkpoint)) as file:
            record = json.load(file)
        sizes = record['sizes']
    except (ValueError, KeyError):
        return f'its seal {os.path.basename(seal_path(checkpoint))} is unreadable'
    folder = checkpoint if os.path.isdir(checkpoint) else os.path.dirname(checkpoint)
    for name, size in sizes.items():
        path = os.path.join(folder, name)
        if not os.path.isfile(path):
            return f'{name} is missing'
        if os.path.getsize(path) != size:
            return f'{name} has {os.path.getsize(path):,} bytes where {size:,} were written'
    if 'metadata_sha256' in record and file_sha256(os.path.join(checkpoint, METADATA)) != record['metadata_sha256']:
        return '.metadata differs from what was written (sha256)'
    return None


def unsealed_sharded_problem(checkpoint: str) -> str | None:
    """A folder written before seals (or killed between its write and its seal): its metadata must read, and every
    byte range it names must exist."""
    try:
        with open(os.path.join(checkpoint, METADATA), 'rb') as file:
            storage = pickle.load(file).storage_data
        ends = {}  # file -> the end of the last byte range the metadata places in it
        for info in storage.values():
            ends[info.relative_path] = max(ends.get(info.relative_path, 0), info.offset + info.length)
    except Exception as error:  # a damaged pickle raises anything
        return f'.metadata is unreadable ({type(error).__name__})'
    for name, end in sorted(ends.items()):
        path = os.path.join(checkpoint, name)
        if not os.path.isfile(path):
            return f'{name} is missing'
        if os.path.getsize(path) < end:
            return f'{name} has {os.path.getsize(path):,} bytes where {end:,} were written'
    return None


def unsealed_file_problem(checkpoint: str) -> str | None:
    """torch.save writes a zip archive whose directory comes last: a truncated file has none."""
    return None if zipfile.is_zipfile(checkpoint) else 'not a complete torch.save archive (truncated?)'


def checkpoints_newest_first(folder: str, sharded: bool) -> list[str]:
    """The checkpoints Composer wrote in ``folder`` (``ep<e>-ba<b>`` folders or ``-rank0.pt`` files), newest first;
    of one batch's two formats, ``sharded``'s first."""
    names = [(int(match[1]), is_sharded(name) == sharded, name)
             for name in os.listdir(folder) if (match := CHECKPOINT_NAME.match(name))]
    return [name for *_, name in sorted(names, reverse=True)]


def is_sharded(name: str) -> bool:
    return not name.endswith('-rank0.pt')


def prepare_autoresume(folder: str, sharded: bool, keep: int = -1) -> list[str]:
    """Point ``folder/latest-rank0.pt`` at the newest complete checkpoint, moving newer broken ones aside, and
    converting it first where it is not of the format this run reads (``sharded``: a folder, else one file); with
    ``keep`` > 0 (``save_num_checkpoints_to_keep``), older checkpoints beyond it and all but the newest set-aside one
    removed (Composer counts only what its own run saved); returns one line per checkpoint moved, converted, or per
    pruning. Raises TrainingStopped if none is complete but one was once (sealed,
    or its metadata written) and has since been damaged: starting from scratch would silently throw the run away."""
    if not os.path.isdir(folder):
        return []
    names = checkpoints_newest_first(folder, sharded)
    problems = {name: problem(os.path.join(folder, name)) for name in names}
    target = next((name for name in names if problems[name] is None), None)
    if target is None and any(was_complete(os.path.join(folder, name)) for name in names):
        listed = '; '.join(f'{name}: {reason}' for name, reason in problems.items())
        raise TrainingStopped(f'autoresume: no complete checkpoint in {folder} ({listed}); move them out of the folder '
                              f'to start from scratch, or set checkpoint.load_path')
    lines = []
    for name in names[:names.index(target)] if target else names:
        moved = move_aside(os.path.join(folder, name))
        lines.append(f'autoresume: skipped checkpoint {name} ({problems[name]}); moved it to {moved}, '
                     + (f'resuming from {target}' if target else 'starting from scratch (no checkpoint was complete)'))
    if target and is_sharded(target) != sharded:
        converted = convert(folder, target, sharded)
        lines.append(f'autoresume: {target} is {"one file" if sharded else "sharded"}, this run reads '
                     f'{"sharded folders" if sharded else "one file"}: converted it to {converted} (kept {target})')
        target = converted
    if target:
        point_latest_at(folder, target)
    return lines + prune(folder, sharded, keep)


BROKEN_NAME = re.compile(r'^ep\d+-ba(\d+)(?:-rank0\.pt)?\.broken(?:-(\d+))?$')


def prune(folder: str, sharded: bool, keep: int) -> list[str]:
    """The ``keep`` newest complete checkpoints (both formats of a batch count as one) and the newest set-aside
    ``.broken`` one kept, the rest removed with their seals; one line saying what went, or none."""
    if keep <= 0:
        return []
    names = checkpoints_newest_first(folder, sharded)
    complete = [name for name in names if problem(os.path.join(folder, name)) is None]
    batches = sorted({int(CHECKPOINT_NAME.match(name)[1]) for name in complete}, reverse=True)[:keep]
    old = [name for name in complete if int(CHECKPOINT_NAME.match(name)[1]) not in batches]
    broken = sorted((name for name in os.listdir(folder) if BROKEN_NAME.match(name)),
                    key=lambda name: (int(BROKEN_NAME.match(name)[1]), int(BROKEN_NAME.match(name)[2] or 1)))
    for name in old + broken[:-1]:
        remove(os.path.join(folder, name))
    for name in os.listdir(folder):  # the seals of files Composer's own rotation removed
        sealed = name[1:-len(SEAL)]
        if name.startswith('.') and name.endswith(SEAL) and not os.path.exists(os.path.join(folder, sealed)):
            os.remove(os.path.join(folder, name))
    if not old and len(broken) < 2:
        return []
    return [f'autoresume: removed {len(old)} checkpoints beyond checkpoint.save_num_checkpoints_to_keep ({keep}) and '
            f'{max(len(broken) - 1, 0)} older set-aside ones' + (f'; kept {broken[-1]} to inspect' if broken else '')]


def remove(path: str) -> None:
    """A checkpoint (a folder, its seal inside; or a file and its seal beside it)."""
    if os.path.isdir(path):
        shutil.rmtree(path)
        return
    os.remove(path)
    if os.path.isfile(seal_path(path)):
        os.remove(seal_path(path))


def convert(folder: str, name: str, sharded: bool) -> str:
    """Checkpoint ``name`` written into the other format beside it (``ep0-ba6-rank0.pt`` <-> ``ep0-ba6``), whole or
    not at all, and sealed; returns the new name. The file is memory-mapped, not read into memory, to write the
    folder; the folder's shards, each with its part of every tensor, are gathered whole into the file."""
    source, base = os.path.join(folder, name), name.removesuffix('-rank0.pt')
    converted = base if sharded else f'{base}-rank0.pt'
    target = os.path.join(folder, converted)
    if sharded:
        with atomic_folder(target) as partial:
            state = torch.load(source, map_location='cpu', mmap=True, weights_only=False)  # our own checkpoint
            dcp.save(state, storage_writer=dcp.FileSystemWriter(partial), no_dist=True)
    else:
        partial = f'{target}.partial'
        dcp_to_torch_save(source, partial)
        os.replace(partial, target)
    seal(target)
    return converted


def was_complete(checkpoint: str) -> bool:
    """Sealed, or (sharded) its metadata written: every rank finished writing it once."""
    return os.path.isfile(seal_path(checkpoint)) or os.path.isfile(os.path.join(checkpoint, METADATA))


def move_aside(path: str) -> str:
    """Rename ``path`` to ``<name>.broken`` (``.broken-2``, ... if taken); returns the new name."""
    candidate, number = f'{path}.broken', 1
    while os.path.lexists(candidate):
        number += 1
        candidate = f'{path}.broken-{number}'
    os.rename(path, candidate)
    if os.path.isfile(seal_path(path)):
        os.rename(seal_path(path), seal_path(candidate))
    return os.path.basename(candidate)


def point_latest_at(folder: str, name: str) -> None:
    """Replace the link atomically (Composer removes it, then re-creates it: a kill between leaves none)."""
    link = os.path.join(folder, LATEST)
    if os.path.islink(link) and os.readlink(link) == name:
        return
    temporary = f'{link}.{os.getpid()}.tmp'
    os.symlink(name, temporary)
    os.replace(temporary, link)
