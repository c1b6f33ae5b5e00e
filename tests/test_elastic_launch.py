"""torchrun's elastic agent's end, told in one line: each way the agent ends, from torchrun's own exception."""
import signal

from torch.distributed import run as torchrun
from torch.distributed.elastic.multiprocessing.api import SignalException
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure
from torch.distributed.elastic.rendezvous.api import RendezvousConnectionError, RendezvousTimeoutError

from llmfoundry_ext.elastic_launch import why_the_job_ends

ARGS = torchrun.parse_args(['--nnodes=2:4', '--nproc-per-node=2', '--rdzv-backend=c10d',
                            '--rdzv-endpoint=node-a:29500', '--rdzv-conf=last_call_timeout=2,join_timeout=45',
                            '--max-restarts=3', 'train.py', 'run.yaml'])


def failure(local_rank: int, exitcode: int) -> ProcessFailure:
    return ProcessFailure(local_rank=local_rank, pid=100 + local_rank, exitcode=exitcode, error_file='<N/A>')


def test_each_end_of_the_agent_is_named_with_its_cause():
    killed = ChildFailedError('train.py', {1: failure(1, -signal.SIGKILL)})
    assert why_the_job_ends(killed, ARGS) == ('the workers failed with no restart left (--max-restarts 3): the job '
                                              'ends; the first failure: rank 1 was killed by SIGKILL.')
    stopped = ChildFailedError('train.py', {0: failure(0, 3)})  # the node watch's exit
    assert why_the_job_ends(stopped, ARGS).endswith('the first failure: rank 0 exited 3.')
    assert why_the_job_ends(RendezvousTimeoutError(), ARGS) == (
        "fewer nodes than the minimum (--nnodes 2:4) gathered within the rendezvous's join timeout (45 s): the job "
        "ends.")
    assert why_the_job_ends(SignalException('', signal.SIGTERM), ARGS) == 'the elastic agent got SIGTERM: the job ends.'
    assert why_the_job_ends(RendezvousConnectionError(), ARGS) == (
        "the rendezvous at node-a:29500 (on the job's first node) cannot be reached (RendezvousConnectionError): the "
        "job ends.")
    default = torchrun.parse_args(['--nnodes=1:2', 'train.py'])
    assert why_the_job_ends(RendezvousTimeoutError(), default).endswith('join timeout (600 s): the job ends.')


def test_a_closed_rendezvous_is_another_agents_end_and_anything_else_keeps_its_traceback():
    from torch.distributed import DistNetworkError
    from torch.distributed.elastic.rendezvous.api import RendezvousClosedError

    from llmfoundry_ext.elastic_launch import ENDS
    assert why_the_job_ends(RendezvousClosedError(), ARGS) == (
        "the rendezvous was closed (another node's agent ended the job): the job ends.")
    assert why_the_job_ends(DistNetworkError('Connection reset by peer'), ARGS).endswith(
        'cannot be reached (DistNetworkError): the job ends.')
    assert not isinstance(ValueError('--nnodes 3:2'), ENDS)  # a bad argument is torchrun's own error
