"""The machine: the launcher's environment read in one place; GPUs named on the command line."""
import glob
import os
import re

import pytest

from llmfoundry_ext.machine import GIB, Machine, gpu_named
from tests.conftest import REPO

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
