"""One run per save folder, and a run's processes end with their launcher.

Two jobs training into one folder interleave their checkpoints, ledgers and ``config.yaml``. Rank 0 holds
``<save_folder>/run.lock`` (host, PID, the job's rendezvous, start) while it trains and refreshes its time every
``HEARTBEAT_S``; a second start is refused with one line naming the holder, while the ranks of the holder's own job
(the same rendezvous) pass. A lock is stale, and taken over, when its process is gone or a zombie (same host) or it
has not been refreshed for ``STALE_S`` (another host: its PID cannot be checked from here).
Neither Composer nor torchrun has such a lock (torchtitan and llm-foundry neither).

Composer's launcher does not take its ranks with it when it is killed (``kill -9``); each rank asks the kernel for a
SIGTERM when its parent dies (``PR_SET_PDEATHSIG``, Linux).
"""
import contextlib
import ctypes
import json
import os
import signal
import socket
import threading
import time

import psutil

from llmfoundry_ext.atomic import write_atomically
from llmfoundry_ext.errors import ConfigError
from llmfoundry_ext.machine import Machine

LOCK_NAME = 'run.lock'
HEARTBEAT_S = 30.0
STALE_S = 120.0
DYING_S = 5.0
PR_SET_PDEATHSIG = 1


def end_with_the_launcher() -> None:
    """A SIGTERM to this process when its parent (the launcher) dies; nothing where prctl is not (macOS)."""
    if Machine.from_environment().job is None:
        return  # not launched: the parent is the user's shell
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() == 1:  # the launcher died before the call
            os.kill(os.getpid(), signal.SIGTERM)


@contextlib.contextmanager
def holding(folder: str | None):
    """The folder's lock held inside (nothing without a folder)."""
    if folder is None:
        yield
        return
    path = os.path.join(folder, LOCK_NAME)
    take(path)
    stop = threading.Event()
    beat = threading.Thread(target=heartbeat, args=(path, stop), daemon=True, name='run-lock-heartbeat')
    beat.start()
    try:
        yield
    finally:
        stop.set()
        with contextlib.suppress(OSError, ValueError):
            if read(path).get('pid') == os.getpid():
                os.remove(path)


def check_free(folder: str | None, rank: int) -> None:
    """Preflight, every rank: refused (one line) if a live run holds the folder. A rank on another host than the
    holder's cannot check its PIDs and leaves the verdict to rank 0 (``take``)."""
    path = os.path.join(folder or '', LOCK_NAME)
    if folder is None or not os.path.exists(path):
        return
    holder = read(path)
    if rank == 0 or holder.get('host') == socket.gethostname():
        refuse_if_held(path, holder)


def refuse_if_held(path: str, holder: dict) -> None:
    """Refused if the holder is alive, and still alive ``DYING_S`` later: a run killed a moment ago (``kill -9``,
    then the same command) may still be exiting."""
    with contextlib.suppress(FileNotFoundError):
        deadline = time.monotonic() + DYING_S
        while alive(holder, os.path.getmtime(path)) and time.monotonic() < deadline:
            time.sleep(0.2)
        if alive(holder, os.path.getmtime(path)):
            raise ConfigError(f"checkpoint.save_folder: {os.path.dirname(path)} is in use by another run (host "
                              f"{holder.get('host')}, PID {holder.get('pid')}, since {holder.get('started')}); wait "
                              f"for it to end, stop it, or give a new checkpoint.save_folder (a lock whose run is "
                              f"gone is taken over: {path})")


def take(path: str) -> None:
    """The lock written as ours, unless a live holder has it (one line naming it)."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    if os.path.exists(path):
        refuse_if_held(path, read(path))
    mine = {'host': socket.gethostname(), 'pid': os.getpid(), 'job': Machine.from_environment().job,
            'started': time.strftime('%Y-%m-%d %H:%M:%S')}
    write_atomically(path, json.dumps(mine))


def read(path: str) -> dict:
    try:
        with open(path) as file:
            return json.load(file)
    except (OSError, ValueError):
        return {}  # unreadable: a torn write of a crashed run, stale once old


def alive(holder: dict, refreshed: float) -> bool:
    """Whether the holder may still be training: its PID running (this host), or its lock refreshed lately."""
    if time.time() - refreshed > STALE_S:
        return False
    job = Machine.from_environment().job
    if job is not None and holder.get('job') == job:
        return False  # rank 0 of this job took it first
    if holder.get('host') != socket.gethostname():
        return True
    pid = holder.get('pid')
    if not isinstance(pid, int) or pid == os.getpid():
        return False
    try:  # a killed rank may stay a zombie where the container's init does not reap it
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
    except psutil.AccessDenied:
        return True


def heartbeat(path: str, stop: threading.Event) -> None:
    while not stop.wait(HEARTBEAT_S):
        with contextlib.suppress(OSError):
            os.utime(path)
