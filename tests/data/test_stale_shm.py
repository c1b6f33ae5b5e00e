"""Crash leftovers: only streaming state that no live process maps and that predates us is removed."""
import mmap
import os
import time
from tempfile import gettempdir

from llmfoundry_ext.data.stale_shm import remove_stale_streaming_state

STALE, LIVE, YOUNG = '990001', '990002', '990003'


def touch(path: str, size: int = 64, age: float = 0) -> str:
    with open(path, 'wb') as file:
        file.write(b'\0' * size)
    moment = time.time() - age
    os.utime(path, (moment, moment))
    return path


def test_removes_only_unmapped_segments_and_locks_older_than_this_process():
    stale = [touch(f'/dev/shm/{STALE}_locals', age=600), touch(f'/dev/shm/{STALE}_barrier', age=600),
             touch(os.path.join(gettempdir(), f'{STALE}_barrier_filelock'), age=600)]
    live = touch(f'/dev/shm/{LIVE}_locals', age=600)
    young = touch(f'/dev/shm/{YOUNG}_locals', age=-5)
    with open(live, 'r+b') as file, mmap.mmap(file.fileno(), 64):  # a live job has it mapped
        removed = remove_stale_streaming_state(started_at=time.time() - 60)
        assert LIVE not in removed and YOUNG not in removed
    # gone: removed here, or by a run that another test started meanwhile (each run's rank 0 cleans up at its start)
    assert not any(os.path.exists(path) for path in stale)
    assert os.path.exists(live) and os.path.exists(young)
    for path in (live, young):
        os.remove(path)
