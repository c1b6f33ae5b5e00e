"""streaming's shared-memory prefix, registered without a race between jobs starting on one machine.

mosaicml-streaming 0.13 (``streaming.base.shared.prefix.get_shm_prefix``) has every rank of a node look for the first
free prefix, then the node's local leader creates ``/dev/shm/<prefix>_locals``. A job starting on the same machine in
between (a second job on a node, the test suite's other worker) takes that prefix first: the leader then fails with
``FileExistsError: '/0000NN_locals'``, or the node's ranks saw different free prefixes and fail with "shared memory
registered does not match local leader". Its look-up also takes, for each segment name, the first prefix without
that segment, then the largest of those: a prefix half torn down (its ``locals`` gone, its ``barrier`` not yet) below
one half set up (its ``locals`` only) gives the latter, taken. streaming has no option against either, so
``StreamingDataset`` is given this function instead: the local leader alone looks and creates, holding a lock on a
file in /dev/shm (the contended resource, shared by exactly the jobs that contend) only for that, never across a
collective, and takes the first prefix none of whose segments exists; the node's other ranks take its prefix from it
in one all-gather.
"""
import contextlib
import fcntl
import os
from tempfile import gettempdir
from typing import Iterator, Optional

import streaming.base.dataset
from streaming.base.constant import BARRIER_FILELOCK, CACHE_FILELOCK, LOCALS, SHM_TO_CLEAN
from streaming.base.shared import SharedMemory
from streaming.base.shared.prefix import _check_and_find_retrying, _check_self, _get_path, _pack_locals, _unpack_locals
from streaming.base.world import World
from torch import distributed as dist

LOCK = '/dev/shm/llmfoundry_ext_shm_prefix.lock'


@contextlib.contextmanager
def machine_lock(path: str = LOCK) -> Iterator[None]:
    """An exclusive lock on ``path`` for the processes of this machine (any user: the file is opened to read, which
    ``flock`` needs, and another user's may be); none where it cannot be opened (no /dev/shm): streaming's own
    behaviour then."""
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_CREAT, 0o644)
    except OSError:
        yield
        return
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX)
        yield
    finally:
        os.close(descriptor)  # closing releases the lock


def in_use(prefix: int) -> bool:
    """Whether any of streaming's shared-memory segments or file locks for ``prefix`` exists on this machine."""
    if any(os.path.exists(os.path.join(gettempdir(), _get_path(prefix, name)))
           for name in (BARRIER_FILELOCK, CACHE_FILELOCK)):
        return True
    for name in SHM_TO_CLEAN:
        try:
            SharedMemory(_get_path(prefix, name), False, auto_cleanup=False).cleanup()
        except FileNotFoundError:
            continue
        except PermissionError:  # another user's
            pass
        return True
    return False


def register_locals(streams_local: list[str], streams_remote: list[Optional[str]],
                    retry: int) -> tuple[int, SharedMemory]:
    """The first free prefix from where streaming's look-up starts (which also refuses a local folder another
    dataset with a remote uses), and its ``locals`` segment, created."""
    prefix = _check_and_find_retrying(streams_local, streams_remote, LOCALS, retry)
    while True:
        if not in_use(prefix):
            data = _pack_locals(streams_local, prefix)
            try:
                shm = SharedMemory(_get_path(prefix, LOCALS), True, len(data))
                shm.buf[:len(data)] = data
                return prefix, shm
            except FileExistsError:  # taken since by a job that registers without the lock
                pass
        prefix += 1


def get_shm_prefix(streams_local: list[str], streams_remote: list[Optional[str]], world: World,
                   retry: int = 100) -> tuple[int, SharedMemory]:
    """streaming's ``get_shm_prefix``, same arguments and result: the prefix this dataset's shared memory uses on
    this node, and its ``locals`` segment."""
    _check_self(streams_local)
    prefix = shm = None
    if world.is_local_leader:
        with machine_lock():
            prefix, shm = register_locals(streams_local, streams_remote, retry)
    if dist.is_available() and dist.is_initialized():
        everyone = [None] * dist.get_world_size()
        dist.all_gather_object(everyone, (world.node, world.is_local_leader, prefix))
        prefix = next(theirs for node, leader, theirs in everyone if leader and node == world.node)
    if not world.is_local_leader:
        shm = SharedMemory(_get_path(prefix, LOCALS), False)
        registered = _unpack_locals(bytes(shm.buf))
        if registered != (streams_local, prefix):
            raise RuntimeError(f'shared memory prefix {prefix}: the local leader registered other local folders '
                               f'({registered[0]}) than this rank\'s {streams_local}: give every rank the same '
                               f'streams')
    return prefix, shm


def use_race_free_prefixes() -> None:
    """Make ``StreamingDataset`` register its prefix with ``get_shm_prefix`` above (idempotent)."""
    streaming.base.dataset.get_shm_prefix = get_shm_prefix
