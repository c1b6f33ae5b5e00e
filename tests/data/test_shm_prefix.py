"""Registering streaming's shared-memory prefixes beside other jobs on one machine: streaming's own registration
collides when two jobs start together or when another dataset is half set up or half torn down; ours gives every
dataset a prefix of its own. Each test names its segments in a namespace of its own (streaming's ``_get_path``), so
the suite's other worker's datasets do not take part."""
import multiprocessing
import os
import time

import pytest
import streaming.base.shared.prefix as streaming_prefix
from streaming.base.constant import BARRIER, LOCALS
from streaming.base.shared import SharedMemory
from streaming.base.world import World

from llmfoundry_ext.data import shm_prefix

REGISTRATIONS = 6
ONE_PROCESS = dict(num_nodes=1, ranks_per_node=1, workers_per_rank=1, worker=0)


def in_a_namespace_of_its_own(namespace: str) -> None:
    """Streaming's and our registrations, in this process, name their segments and file locks under ``namespace``."""
    def get_path(prefix: int, name: str) -> str:
        return f'{namespace}_{prefix:06}_{name}'
    streaming_prefix._get_path = shm_prefix._get_path = get_path


def slowed(find):
    """The look-up for a free prefix, 50 ms longer: another job's registration lands in between."""
    def find_slowly(*args, **kwargs):
        found = find(*args, **kwargs)
        time.sleep(0.05)
        return found
    return find_slowly


def register(ours: bool, job: int, namespace: str, start, results) -> None:
    """One job (one process, its own local leader): REGISTRATIONS datasets' prefixes, all kept until the end."""
    in_a_namespace_of_its_own(namespace)
    module = shm_prefix if ours else streaming_prefix
    module._check_and_find_retrying = slowed(module._check_and_find_retrying)
    world = World(**ONE_PROCESS)
    held = []
    start.wait()
    try:
        for index in range(REGISTRATIONS):
            held.append(module.get_shm_prefix([f'/data/job{job}/stream{index}'], [None], world))
        results.put((job, [prefix for prefix, _ in held]))
    except FileExistsError as error:
        results.put((job, f'FileExistsError: {error}'))
    start.wait()  # both done before either frees its segments
    for _, shm in held:
        shm.cleanup()


def registered_by_two_jobs(ours: bool) -> dict:
    # not fork: a child forked from a test worker inherits whatever lock another thread of it held (in a CI run a
    # child never answered); the fork server is a fresh single-threaded process that imported this module once
    context = multiprocessing.get_context('forkserver')
    context.set_forkserver_preload([__name__])
    start, results = context.Barrier(2), context.Queue()
    namespace = f'llmfx_test_{os.getpid()}'
    jobs = [context.Process(target=register, args=(ours, job, namespace, start, results)) for job in range(2)]
    for process in jobs:
        process.start()
    found = dict(results.get(timeout=120) for _ in jobs)
    for process in jobs:
        process.join(timeout=60)
    assert [process.exitcode for process in jobs] == [0, 0]
    return found


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_two_jobs_starting_together_get_prefixes_of_their_own_where_streamings_collide():
    theirs = registered_by_two_jobs(ours=False)
    assert any(isinstance(result, str) and result.startswith('FileExistsError') for result in theirs.values()), theirs
    ours = registered_by_two_jobs(ours=True)
    assert all(isinstance(result, list) and len(result) == REGISTRATIONS for result in ours.values()), ours
    assert len(set(ours[0]) | set(ours[1])) == 2 * REGISTRATIONS


def test_a_prefix_half_torn_down_below_one_half_set_up_is_passed_over_where_streamings_collides(monkeypatch):
    namespace = f'llmfx_test_{os.getpid()}'
    monkeypatch.setattr(streaming_prefix, '_get_path', streaming_prefix._get_path)
    monkeypatch.setattr(shm_prefix, '_get_path', shm_prefix._get_path)
    in_a_namespace_of_its_own(namespace)
    # prefix 0: a dataset tearing down (its locals gone, its barrier not yet); prefix 1: one setting up (locals only)
    others = [SharedMemory(shm_prefix._get_path(prefix, name), True, 8) for prefix, name in ((0, BARRIER), (1, LOCALS))]
    try:
        with pytest.raises(FileExistsError, match=f'{namespace}_000001_locals'):
            streaming_prefix.get_shm_prefix(['/data/mine'], [None], World(**ONE_PROCESS))
        prefix, mine = shm_prefix.get_shm_prefix(['/data/mine'], [None], World(**ONE_PROCESS))
        assert prefix == 2
        mine.cleanup()
    finally:
        for shm in others:
            shm.cleanup()
