"""torchrun's elastic agent, its end told in one line: ``python -m llmfoundry_ext.elastic_launch`` takes torchrun's
arguments and runs torchrun itself (``torch.distributed.run``) in this process; ``scripts/slurm/launch.sh`` with
``MIN_NODES`` starts it on every node.

When the job ends without finishing (fewer nodes than its minimum gathered within the rendezvous's join timeout, the
workers failed with no restart left, the rendezvous's host gone, the agent stopped by a signal), torchrun ends in
its own traceback; this prints one line naming the cause and what to do, and exits 1. Our own code: torchrun has no
hook for how its agent ends."""
import os
import sys

from torch.distributed import DistError
from torch.distributed import run as torchrun
from torch.distributed.elastic.multiprocessing.api import SignalException
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.elastic.rendezvous.api import RendezvousClosedError, RendezvousError, RendezvousTimeoutError

from llmfoundry_ext.errors import RESUBMIT
from llmfoundry_ext.machine import MIN_NODES_VARIABLE

LAUNCHER = [sys.executable, '-m', 'llmfoundry_ext.elastic_launch']  # a command line's first words
JOIN_TIMEOUT_S = 600  # torchrun's c10d rendezvous's, where --rdzv-conf does not set join_timeout
# how the agent ends without finishing: its workers' failures, the rendezvous's (its timeout, closed, unreachable),
# its store's, a signal
ENDS = (ChildFailedError, RendezvousError, DistError, SignalException)


def main(argv: list[str]) -> int:
    args = torchrun.parse_args(argv)
    os.environ[MIN_NODES_VARIABLE] = args.nnodes.split(':')[0]  # the node watch's line says what a loss leaves
    try:
        torchrun.run(args)
    except ENDS as error:  # anything else is a bug, and keeps its traceback
        print(f'error: {why_the_job_ends(error, args)} {RESUBMIT}', file=sys.stderr, flush=True)
        return 1
    return 0


def why_the_job_ends(error: Exception, args) -> str:
    """The cause of the agent's end, from torchrun's exception and its arguments."""
    if isinstance(error, ChildFailedError):
        rank, failure = error.get_first_failure()
        how = f'was killed by {failure.signal_name()}' if failure.exitcode < 0 else f'exited {failure.exitcode}'
        return (f'the workers failed with no restart left (--max-restarts {args.max_restarts}): the job ends; the '
                f'first failure: rank {rank} {how}.')
    if isinstance(error, RendezvousTimeoutError):
        return (f'fewer nodes than the minimum (--nnodes {args.nnodes}) gathered within the rendezvous\'s join timeout '
                f'({join_timeout(args.rdzv_conf):g} s): the job ends.')
    if isinstance(error, SignalException):
        return f'the elastic agent got {error.sigval.name}: the job ends.'
    if isinstance(error, RendezvousClosedError):
        return "the rendezvous was closed (another node's agent ended the job): the job ends."
    return (f"the rendezvous at {args.rdzv_endpoint} (on the job's first node) cannot be reached "
            f'({type(error).__name__}): the job ends.')


def join_timeout(rdzv_conf: str) -> float:
    """The rendezvous's join timeout in seconds, from torchrun's ``--rdzv-conf key=value,...``."""
    settings = dict(pair.split('=', 1) for pair in rdzv_conf.split(',') if pair)
    return float(settings.get('join_timeout', JOIN_TIMEOUT_S))


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
