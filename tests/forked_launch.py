"""The tests' launcher for runs whose subject is not the launch: ``python tests/forked_launch.py -n N SCRIPT [ARG ...]``
(and Composer's other arguments for a node: --world_size, --node_rank, --master_addr, --master_port) runs SCRIPT in N
processes as ``composer -n N SCRIPT ...`` does (the environment torch.distributed and Composer read;
rank 0's output here, the others' discarded), but forks them, with torch.multiprocessing's ``fork`` start method,
from this process once it has imported the trainer: one import a launch (~6 s of CPU on 2 cores) in place of the
launcher's and each rank's. Safe for gloo: this process starts no thread and no process group before it forks; each
rank makes its own. A rank that fails ends the others (torch's ProcessContext), and its exit status is the launch's.
The tests of Composer's launcher itself (killed with its ranks, a rank's failure under it, the chaos harness's kill)
run it (llmfoundry_ext.launch).

Where LAUNCH_SERVER names the socket of the suite's fork server (tests/launch_server.py, one a pytest process), the
launch is forked from that server, which imported the trainer once for all of them: this process then imports
nothing heavy, hands the server its streams, folder, environment and arguments, and exits with the launch's
status."""
import argparse
import atexit
import gc
import os
import runpy
import socket
import struct
import sys

SERVER = 'LAUNCH_SERVER'  # the fork server's socket (tests/conftest.py)


def run_rank(local_rank: int, node: argparse.Namespace, port: int) -> None:
    """One rank, in the environment Composer's launcher gives it (``composer.cli.launcher._launch_processes``)."""
    os.environ.update(RANK=str(node.node_rank * node.nproc + local_rank), WORLD_SIZE=str(node.world_size),
                      LOCAL_RANK=str(local_rank), LOCAL_WORLD_SIZE=str(node.nproc), NODE_RANK=str(node.node_rank),
                      MASTER_ADDR=node.master_addr, MASTER_PORT=str(port), PYTHONUNBUFFERED='1',
                      TORCH_NCCL_ASYNC_ERROR_HANDLING='1')
    if local_rank:
        discard = os.open(os.devnull, os.O_WRONLY)
        os.dup2(discard, 1)
        os.dup2(discard, 2)
    sys.argv = [node.script, *node.args]
    try:
        runpy.run_path(node.script, run_name='__main__')
    finally:
        atexit._run_exitfuncs()  # a forked process ends without them; Composer closes its callbacks there


def parse(argv: list[str]) -> argparse.Namespace:
    """Composer's launcher's arguments for a node (those scripts/slurm/launch.sh passes)."""
    parser = argparse.ArgumentParser(prog='tests/forked_launch.py')
    parser.add_argument('-n', '--nproc', type=int, required=True)
    parser.add_argument('--world_size', type=int)
    parser.add_argument('--node_rank', type=int, default=0)
    parser.add_argument('--master_addr', default='127.0.0.1')
    parser.add_argument('--master_port', type=int)
    parser.add_argument('script')
    parser.add_argument('args', nargs=argparse.REMAINDER)
    node = parser.parse_args(argv)
    node.world_size = node.world_size or node.nproc
    return node


def main(argv: list[str]) -> int:
    import llmfoundry_ext.train  # noqa: F401  what every rank imports, once, before the fork
    from composer.utils import get_free_tcp_port
    from torch.multiprocessing import ProcessExitedException, ProcessRaisedException, start_processes
    node = parse(argv)
    gc.freeze()  # the imported objects: no rank's collections walk them (and copy their pages)
    try:
        start_processes(run_rank, args=(node, node.master_port or get_free_tcp_port()), nprocs=node.nproc,
                        start_method='fork')
    except ProcessRaisedException as failure:
        print(failure, file=sys.stderr)
        return 1
    except ProcessExitedException as failure:
        return failure.exit_code if failure.exit_code > 0 else 1
    return 0


def through_server(path: str, argv: list[str]) -> int:
    """The launch forked by the server at ``path``: its exit status (1, said, if the server went away)."""
    from tests.launch_server import send_request
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as connection:
        connection.connect(path)
        send_request(connection, {'argv': argv, 'cwd': os.getcwd(), 'env': dict(os.environ)})
        status = connection.recv(4)
    if len(status) < 4:
        print(f'forked_launch: the launch server at {path} went away', file=sys.stderr)
        return 1
    return struct.unpack('!i', status)[0]


if __name__ == '__main__':
    sys.path[0] = os.path.dirname(sys.path[0])  # the repository: tests.launch_server, and the package where it is
    server = os.environ.get(SERVER)             # not installed (the GPU machines run the checkout)
    if server and os.path.exists(server):
        sys.exit(through_server(server, sys.argv[1:]))
    sys.exit(main(sys.argv[1:]))
