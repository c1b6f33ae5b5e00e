"""The sbatch scripts parse, and render the right ``composer`` command for 2 nodes x 8 GPUs from Slurm's variables."""
import os
import shutil
import stat
import subprocess

import pytest

from tests.conftest import REPO

SLURM = os.path.join(REPO, 'scripts', 'slurm')
STUBS = {
    # scontrol show hostnames 'gpu[017-018]' -> one host a line
    'scontrol': '#!/usr/bin/env python3\nimport re, sys\nprefix, low, high = re.fullmatch(r"(\\w+)\\[(\\d+)-(\\d+)\\]",'
                ' sys.argv[3]).groups()\nfor n in range(int(low), int(high) + 1): print(f"{prefix}{n:0{len(low)}}")\n',
    # srun runs the launcher in place (one task: this node) and only reports anything else
    'srun': '#!/usr/bin/env bash\nwhile [[ "$1" == -* ]]; do shift; done\n'
            'if [[ "$1" == bash ]]; then exec "$@"; else echo "srun: $*"; fi\n',
    'module': '#!/usr/bin/env bash\necho "module $*"\n',
}


@pytest.mark.parametrize('script', ['nvidia.sbatch', 'frontier.sbatch', 'launch.sh', 'convert.sbatch'])
def test_scripts_parse(script):
    assert subprocess.run(['bash', '-n', os.path.join(SLURM, script)]).returncode == 0


@pytest.fixture
def slurm_job(tmp_path) -> dict:
    """A submit folder (repo scripts + an empty venv activate) and stub Slurm commands on PATH."""
    bin_folder = tmp_path / 'bin'
    bin_folder.mkdir()
    for name, text in STUBS.items():
        (bin_folder / name).write_text(text)
        (bin_folder / name).chmod(stat.S_IRWXU)
    submit = tmp_path / 'submit'
    shutil.copytree(os.path.join(REPO, 'scripts'), submit / 'scripts')
    (submit / '.venv' / 'bin').mkdir(parents=True)
    (submit / '.venv' / 'bin' / 'activate').write_text('')
    return {'PATH': f"{bin_folder}:{os.environ['PATH']}", 'SLURM_SUBMIT_DIR': str(submit), 'SLURM_NNODES': '2',
            'SLURM_JOB_NUM_NODES': '2', 'SLURM_JOB_NODELIST': 'gpu[017-018]', 'SLURM_JOB_ID': '4242',
            'USER': 'alice', 'HOME': str(tmp_path), 'DRY_RUN': '1'}


@pytest.mark.parametrize('script', ['nvidia.sbatch', 'frontier.sbatch'])
@pytest.mark.parametrize('node', [0, 1])
def test_sbatch_renders_the_composer_command(slurm_job, script, node):
    result = subprocess.run(['bash', os.path.join(SLURM, script), 'yamls/llama8b.yaml', 'variables.data_root=/data'],
                            env={**slurm_job, 'SLURM_NODEID': str(node)}, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1] == (
        f'composer --world_size 16 --nproc 8 --node_rank {node} --master_addr gpu017 --master_port 29500 '
        f'train.py yamls/llama8b.yaml variables.data_root=/data')


def test_launcher_outside_slurm_says_so():
    result = subprocess.run(['bash', os.path.join(SLURM, 'launch.sh'), 'yamls/llama8b.yaml'],
                            env={'PATH': os.environ['PATH']}, capture_output=True, text=True)
    assert result.returncode != 0
    assert 'run under Slurm (SLURM_NNODES is not set)' in result.stderr
