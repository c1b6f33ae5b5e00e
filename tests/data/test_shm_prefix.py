"""Two jobs registering streaming's shared-memory prefixes on one machine at the same moments: streaming's own
registration collides once its look-up and its creation are apart; ours, the same look-up slowed the same way, gives
every dataset a prefix of its own."""
import multiprocessing
import time

import pytest
import streaming.base.shared.prefix as streaming_prefix
from streaming.base.world import World

from llmfoundry_ext.data import shm_prefix

REGISTRATIONS = 6


def slowed(find):
    """The look-up for a free prefix, 50 ms longer: another job's registration lands in between."""
    def find_slowly(*args, **kwargs):
        found = find(*args, **kwargs)
        time.sleep(0.05)
        return found
    return find_slowly


def register(ours: bool, job: int, start, results) -> None:
    """One job (one process, its own local leader): REGISTRATIONS datasets' prefixes, all kept until the end."""
    module = shm_prefix if ours else streaming_prefix
    module._check_and_find_retrying = slowed(module._check_and_find_retrying)
    world = World(num_nodes=1, ranks_per_node=1, workers_per_rank=1, worker=0)
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
    jobs = [context.Process(target=register, args=(ours, job, start, results)) for job in range(2)]
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
