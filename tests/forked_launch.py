"""The tests' launcher for runs whose subject is not the launch: ``python tests/forked_launch.py -n N SCRIPT [ARG ...]``
runs SCRIPT in N processes as ``composer -n N SCRIPT ...`` does (the environment torch.distributed and Composer read;
rank 0's output here, the others' discarded), but forks them, with torch.multiprocessing's ``fork`` start method,
from this process once it has imported the trainer: one import a launch (~6 s of CPU on 2 cores) in place of the
launcher's and each rank's. Safe for gloo: this process starts no thread and no process group before it forks; each
rank makes its own. A rank that fails ends the others (torch's ProcessContext), and its exit status is the launch's.
The tests of the launch itself (the Slurm job, kill and resume, the benchmark's rows, scripts/evaluate.py under the
launcher) run Composer's launcher (llmfoundry_ext.launch)."""
import atexit
import gc
import os
import runpy
import sys

import llmfoundry_ext.train  # noqa: F401  what every rank imports, once, before the fork
from composer.utils import get_free_tcp_port
from torch.multiprocessing import ProcessExitedException, ProcessRaisedException, start_processes


def run_rank(rank: int, world: int, port: int, argv: list[str]) -> None:
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(world),
                      NODE_RANK='0', MASTER_ADDR='127.0.0.1', MASTER_PORT=str(port))
    if rank:
        discard = os.open(os.devnull, os.O_WRONLY)
        os.dup2(discard, 1)
        os.dup2(discard, 2)
    sys.argv = argv
    try:
        runpy.run_path(argv[0], run_name='__main__')
    finally:
        atexit._run_exitfuncs()  # a forked process ends without them; Composer closes its callbacks there


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[0] != '-n':
        print('usage: python tests/forked_launch.py -n N SCRIPT [ARG ...]', file=sys.stderr)
        return 2
    world = int(argv[1])
    gc.freeze()  # the imported objects: no rank's collections walk them (and copy their pages)
    try:
        start_processes(run_rank, args=(world, get_free_tcp_port(), argv[2:]), nprocs=world, start_method='fork')
    except ProcessRaisedException as failure:
        print(failure, file=sys.stderr)
        return 1
    except ProcessExitedException as failure:
        return failure.exit_code if failure.exit_code > 0 else 1
    return 0


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
