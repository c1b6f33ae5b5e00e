"""The machine: the launcher's environment read in one place; GPUs named on the command line."""
import glob
import os
import re

import pytest

from llmfoundry_ext.machine import GIB, Machine, gpu_named
from tests.conftest import REPO, write_yaml

READS = re.compile(r"""(environ|getenv)\W{1,8}(get\(\s*)?['"](WORLD_SIZE|LOCAL_WORLD_SIZE|NODE_RANK|RANK)['"]""")


def test_no_module_but_the_machine_reads_the_launchers_world_size():
    sources = [path for pattern in ('llmfoundry_ext/**/*.py', 'scripts/*.py', 'data_prep/*.py', 'train.py')
               for path in glob.glob(os.path.join(REPO, pattern), recursive=True)]
    readers = {os.path.relpath(path, REPO) for path in sources if READS.search(open(path).read())}
    assert readers == {'llmfoundry_ext/machine.py'}


def test_the_environment_gives_the_processes(monkeypatch):
    for name, value in {'WORLD_SIZE': '16', 'LOCAL_WORLD_SIZE': '8', 'RANK': '9', 'NODE_RANK': '1'}.items():
        monkeypatch.setenv(name, value)
    machine = Machine.from_environment()
    assert (machine.world_size, machine.local_world_size, machine.rank, machine.node_rank, machine.nodes) == \
        (16, 8, 9, 1, 2)


def test_gpus_by_name_or_memory():
    assert (gpu_named('H100').memory_bytes, gpu_named('mi250x').has_float8, gpu_named('h200').calibrated) == \
        (int(79.19 * GIB), False, True)
    assert gpu_named('48').memory_bytes == 48 * GIB
    with pytest.raises(ValueError, match=r"^unknown GPU 'a100': give one of h100, h200, mi250x, mi300x or a memory "
                                         r"size in GiB$"):
        gpu_named('a100')


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_train_runs_on_two_nodes_of_torchruns_agent(tiny_config, tmp_path):
    """Two torchrun agents on this machine, a node each (static rendezvous, one process each): torchrun names a
    node by GROUP_RANK, Composer asks NODE_RANK (``name_the_node_rank``); before it, both stopped at the node watch's
    start (MissingEnvironmentError)."""
    import subprocess
    import sys

    from composer.utils import get_free_tcp_port

    tiny_config.update(max_duration='4ba')
    torchrun = [sys.executable, '-m', 'torch.distributed.run', '--nnodes=2', '--nproc-per-node=1',
                '--master-addr=127.0.0.1', f'--master-port={get_free_tcp_port()}']
    env = {**os.environ, 'OMP_NUM_THREADS': '1'}
    nodes = [subprocess.Popen([*torchrun, f'--node-rank={node}', 'train.py', node_yaml(tiny_config, tmp_path, node)],
                              cwd=REPO, text=True, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
             for node in (0, 1)]
    outputs = [node.communicate(timeout=240)[0] for node in nodes]
    assert [node.returncode for node in nodes] == [0, 0], outputs[0][-3000:] + outputs[1][-3000:]
    assert 'world size 2' in outputs[0] and 'run tiny stopped at batch 4 of 4ba' in outputs[0]


def node_yaml(config: dict, folder, node: int) -> str:
    """``config`` reading a copy of its streams of the node's own, as each node of a cluster its local disk: two
    nodes on one machine would decompress the same shards into one folder at once."""
    import copy
    import shutil

    config = copy.deepcopy(config)
    for name, stream in config['data']['train']['streams'].items():
        stream['local'] = str(shutil.copytree(stream['local'], folder / f'node{node}' / name))
    return write_yaml(config, folder / f'node{node}.yaml')
