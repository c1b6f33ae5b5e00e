"""Remove mosaicml-streaming's shared memory and lock files left behind by crashed runs.

streaming names them ``/dev/shm/NNNNNN_*`` and ``$TMPDIR/NNNNNN_{barrier,cache}_filelock``; a run killed with
its resource tracker (kill -9 of a process group, a node failure) leaves them, and with a ``remote`` stream
the next run over the same ``local`` folder refuses to start ("Reused local directory"). Its own
``clean_stale_shared_memory`` stops at the first free number and misses leaks above a gap.

A prefix is stale when no live process maps any of its segments and all of them predate this process:
a job starting beside us maps its segments as it creates them, so it is never touched.
"""
import os
import re
from tempfile import gettempdir

import psutil

SHM_FOLDER = '/dev/shm'
PREFIXED = re.compile(r'^(\d{6})_')


def mapped_shm_names() -> set[str]:
    """Names of /dev/shm files that some live process (that we may inspect) has mapped."""
    names = set()
    for pid in filter(str.isdigit, os.listdir('/proc')):
        try:
            with open(f'/proc/{pid}/maps') as maps:
                names.update(line.rsplit('/dev/shm/', 1)[1].strip() for line in maps if '/dev/shm/' in line)
        except OSError:
            continue
    return names


def prefix_files(folder: str, suffix: str = '') -> dict[str, list[str]]:
    """prefix -> paths of this user's prefixed files in ``folder`` (ending in ``suffix``)."""
    found: dict[str, list[str]] = {}
    if not os.path.isdir(folder):
        return found
    for name in os.listdir(folder):
        match = PREFIXED.match(name)
        path = os.path.join(folder, name)
        if match and name.endswith(suffix) and owned_by_me(path):
            found.setdefault(match[1], []).append(path)
    return found


def owned_by_me(path: str) -> bool:
    try:
        return os.stat(path).st_uid == os.getuid()
    except FileNotFoundError:
        return False


def stale_prefixes(started_at: float) -> list[str]:
    """Prefixes none of whose segments is mapped, all of them older than ``started_at``."""
    mapped = mapped_shm_names()
    segments = prefix_files(SHM_FOLDER)
    locks = prefix_files(gettempdir(), '_filelock')
    stale = []
    for prefix in sorted(set(segments) | set(locks)):
        paths = segments.get(prefix, []) + locks.get(prefix, [])
        in_use = any(os.path.basename(p) in mapped for p in segments.get(prefix, []))
        if not in_use and all(modified_before(p, started_at) for p in paths):
            stale.append(prefix)
    return stale


def modified_before(path: str, moment: float) -> bool:
    try:
        return os.stat(path).st_mtime < moment
    except FileNotFoundError:
        return True


def remove_stale_streaming_state(started_at: float | None = None) -> list[str]:
    """Delete the segments and lock files of stale prefixes; returns the prefixes removed."""
    if started_at is None:
        started_at = psutil.Process().create_time()
    removed = stale_prefixes(started_at)
    for prefix in removed:
        paths = prefix_files(SHM_FOLDER).get(prefix, []) + prefix_files(gettempdir(), '_filelock').get(prefix, [])
        for path in paths:
            try:
                os.remove(path)
            except FileNotFoundError:
                pass
    return removed
