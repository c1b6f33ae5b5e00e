"""A bad input refused under Composer's launcher as in one process: its line printed once, exit status 2.

Every rank checks the same input before the process group forms. Once one rank has exited, Composer's launcher stops
the others with SIGTERM and exits with the status of the lowest rank that failed; a rank stopped that way reports
-15, which the shell sees as 241. So, until the process joins the group (``default_sigterm``), a SIGTERM ends it
with status 2 (``exit_2_on_sigterm``). A rank other than 0 that finds a problem waits ``RANK_ZERO_FIRST_S`` first:
rank 0, which found it too, prints it and exits, and the launcher stops the waiting rank before it prints. If rank 0
found nothing (a node-local problem), the waiting rank prints its line and exits 2; the launcher's SIGTERM then ends
rank 0, if it is still in Python code, with 2 as well.
"""
import os
import signal
import sys
import time

from llmfoundry_ext.machine import Machine

RANK_ZERO_FIRST_S = 5.0


def exit_2_on_sigterm() -> None:
    """A SIGTERM ends the process with status 2, without output (until ``default_sigterm``)."""
    signal.signal(signal.SIGTERM, lambda signum, frame: os._exit(2))


def default_sigterm() -> None:
    """A SIGTERM ends the process as by default: once it has joined the group, or has refused."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def refuse(line: str, status: int = 2) -> int:
    """Print ``line`` once across the launched processes and return ``status`` (2: a bad input; 1: a run that
    stopped, which only training could see, on whichever ranks saw it)."""
    machine = Machine.from_environment()
    if machine.world_size > 1 and machine.rank != 0:
        time.sleep(RANK_ZERO_FIRST_S)
    print(line, file=sys.stderr, flush=True)
    default_sigterm()
    return status
