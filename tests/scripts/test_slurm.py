"""The sbatch scripts parse and render the right ``composer`` command for 2 nodes x 8 GPUs from Slurm's variables;
a job over nodes simulated on this machine survives the loss of a node and resumes on another node count."""
import os
import shlex
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time

import pytest

from llmfoundry_ext.train import main as train_main
from tests.conftest import FORKED, REPO, demo_data, global_batches
from tests.launch_server import OWN_SHM

SLURM = os.path.join(REPO, 'scripts', 'slurm')
STUBS = {
    # scontrol show hostnames 'gpu[017-018]' -> one host a line; a single host as it is
    'scontrol': '#!/usr/bin/env python3\nimport re, sys\nrange_ = re.fullmatch(r"(\\w+)\\[(\\d+)-(\\d+)\\]", sys.argv[3])\n'
                'if not range_: sys.exit(print(sys.argv[3]))\nprefix, low, high = range_.groups()\n'
                'for n in range(int(low), int(high) + 1): print(f"{prefix}{n:0{len(low)}}")\n',
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


@pytest.mark.parametrize('node', [0, 1])
def test_with_min_nodes_the_sbatch_renders_torchruns_elastic_agent(slurm_job, node):
    """MIN_NODES=1: torchrun's elastic agent on every node (through elastic_launch), its rendezvous on the job's first
    host."""
    result = subprocess.run(['bash', os.path.join(SLURM, 'nvidia.sbatch'), 'yamls/llama8b.yaml'],
                            env={**slurm_job, 'SLURM_NODEID': str(node), 'MIN_NODES': '1'}, capture_output=True,
                            text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1] == (
        'python -m llmfoundry_ext.elastic_launch --nnodes 1:2 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint '
        'gpu017:29500 --rdzv-id 4242 --rdzv-conf join_timeout=600 --max-restarts 3 train.py yamls/llama8b.yaml')


def test_launcher_outside_slurm_says_so():
    result = subprocess.run(['bash', os.path.join(SLURM, 'launch.sh'), 'yamls/llama8b.yaml'],
                            env={'PATH': os.environ['PATH']}, capture_output=True, text=True)
    assert result.returncode != 0
    assert 'run under Slurm (SLURM_NNODES is not set)' in result.stderr


BATCHES, SAVE_EVERY = 12, 4  # killed after batch SAVE_EVERY + 2: six batches before the job would end


class Job:
    """A Slurm job of ``nodes`` x ``per_node`` processes on this machine: the real ``launch.sh`` once a node, with the
    variables Slurm sets, on 127.0.0.1; its ``composer`` forks the node's ranks from the suite's import
    (tests/forked_launch.py), each node in namespaces of its own (tests/launch_server.py, LAUNCH_OWN_SHM)."""

    def __init__(self, path: str, folder, overrides: list[str]):
        self.path, self.folder, self.overrides = path, folder, overrides

    def start(self, name: str, nodes: int, per_node: int) -> list[subprocess.Popen]:
        port = free_port()
        nodes_started = []
        for node in range(nodes):
            env = {**os.environ, 'PATH': self.path, 'SLURM_NNODES': str(nodes), 'SLURM_NODEID': str(node),
                   'SLURM_JOB_NODELIST': '127.0.0.1', 'GPUS_PER_NODE': str(per_node), 'MASTER_PORT': str(port),
                   'OMP_NUM_THREADS': '1', OWN_SHM: '1'}
            with open(self.folder / f'{name}-node{node}.log', 'a') as log:  # the node's processes keep their copy
                nodes_started.append(subprocess.Popen(
                    ['bash', os.path.join(SLURM, 'launch.sh'), 'yamls/demo.yaml', *self.overrides,
                     f'checkpoint.save_folder={self.folder / name / "checkpoints"}',
                     f'callbacks.sample_ledger.folder={self.folder / name / "ledger"}'],
                    cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True))
        return nodes_started

    def run(self, name: str, nodes: int, per_node: int) -> str:
        """Start the job, wait for every node; node 0's output."""
        codes = [node.wait(timeout=300) for node in self.start(name, nodes, per_node)]
        assert codes == [0] * nodes, self.log(name, 0)[-3000:]
        return self.log(name, 0)

    def log(self, name: str, node: int) -> str:
        return (self.folder / f'{name}-node{node}.log').read_text()

    def global_batches(self, name: str, ranks: int) -> list[list[int]]:
        """The sorted sample ids all ranks read in each batch; the ledgers must hold batches 1 to BATCHES."""
        from llmfoundry_ext.callbacks.sample_ledger import read_ledger
        ledgers = {rank: read_ledger(str(self.folder / name / 'ledger' / f'ledger-rank{rank}.jsonl'))
                   for rank in range(ranks)}
        assert all(sorted(ledger) == list(range(1, BATCHES + 1)) for ledger in ledgers.values()), name
        return global_batches(ledgers, range(1, BATCHES + 1))


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(('127.0.0.1', 0))
        return probe.getsockname()[1]


def wait_for(path, text: str, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while text not in path.read_text():
        assert time.monotonic() < deadline, f'{text!r} not in {path} after {seconds} s'
        time.sleep(0.2)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_two_node_job_stops_when_a_node_dies_and_resumes_on_any_node_count(nodes_of_their_own, tmp_path):
    """2 nodes x 2 processes through launch.sh: kill -9 of node 1 (its launch.sh's process group) stops node 0 within
    60 s with one line naming node 1; re-submitted as 2 x 2 or 4 x 1 it resumes, and every global batch holds the
    samples of the uninterrupted run's: one process in this one (what train.py runs) with the 2 canonical nodes
    streaming gives a 2-node job (one node resuming a two-process run: tests/measure/test_chaos.py). Each node's
    ranks fork from the suite's import (Composer's launcher when its ranks fail: tests/test_bad_inputs.py; killed:
    tests/test_run_lock.py)."""
    stubs = tmp_path / 'bin'
    stubs.mkdir()
    for name, text in (('scontrol', STUBS['scontrol']), ('composer', f'#!/bin/sh\nexec {shlex.join(FORKED)} "$@"\n')):
        (stubs / name).write_text(text)
        (stubs / name).chmod(stat.S_IRWXU)
    job = Job(f"{stubs}:{os.path.dirname(sys.executable)}:{os.environ['PATH']}", tmp_path, [
        f'variables.data_root={demo_data(tmp_path / "data")}', f'max_duration={BATCHES}ba', 'global_batch_size=8',
        f'checkpoint.save_interval={SAVE_EVERY}ba', 'eval_interval=100ba', 'eval_subset_num_batches=2',
        'log_interval=1ba', 'progress_bar=false', 'node_timeout_s=10',
        'downstream=null'])  # each of the 20 processes' preflight would load the task (~8 s)
    assert train_main([os.path.join(REPO, 'yamls', 'demo.yaml'), *job.overrides, 'data.train.num_canonical_nodes=2',
                       f"checkpoint.save_folder={tmp_path / 'uninterrupted' / 'checkpoints'}",
                       f"callbacks.sample_ledger.folder={tmp_path / 'uninterrupted' / 'ledger'}"]) == 0
    expected = job.global_batches('uninterrupted', 1)
    assert [len(ids) for ids in expected] == [8] * BATCHES

    node0, node1 = job.start('killed', 2, 2)
    wait_for(tmp_path / 'killed-node0.log', f'batch {SAVE_EVERY + 2}/{BATCHES}', 240)
    os.killpg(node1.pid, signal.SIGKILL)
    killed = time.monotonic()
    code = node0.wait(timeout=120)
    stopped_after = time.monotonic() - killed
    print(f'node 0 stopped {stopped_after:.1f} s after node 1 was killed, exit status {code}')
    assert stopped_after < 60 and code != 0
    lines = [line for line in job.log('killed', 0).splitlines() if line.startswith('error: ')]
    assert lines == ['error: node 1 of 2 stopped answering (no heartbeat for 10 s): stopping node 0. '
                     'Re-submit the job to resume from its last checkpoint.']
    shutil.copytree(tmp_path / 'killed', tmp_path / 'as-4x1', symlinks=True)

    for name, nodes, per_node in (('killed', 2, 2), ('as-4x1', 4, 1)):
        resumed = job.run(name, nodes, per_node)
        assert f'autoresume: resuming from the latest checkpoint at batch {SAVE_EVERY}\n' in resumed, resumed[-2000:]
        assert job.global_batches(name, 4) == expected, name


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_with_min_nodes_launch_sh_runs_the_elastic_agent_on_every_node(nodes_of_their_own, tmp_path):
    """MIN_NODES=1, 2 nodes x 2 processes: the real launch.sh once a node (each in namespaces of its own, node 0's
    rendezvous listening before node 1 starts), both agents end well and the run trained on 4 ranks of 2 nodes with
    the elastic line in its start summary (the losses of nodes and the ends: tests/measure/test_elastic_*.py, through
    the same command)."""
    from llmfoundry_ext.measure.elastic_chaos import NODE_OF_ITS_OWN, wait_for_the_rendezvous

    stubs = tmp_path / 'bin'
    stubs.mkdir()
    (stubs / 'scontrol').write_text(STUBS['scontrol'])
    (stubs / 'scontrol').chmod(stat.S_IRWXU)
    port, nodes, data = free_port(), [], demo_data(tmp_path / 'data')
    for node in range(2):
        env = {**os.environ, 'PATH': f"{stubs}:{os.path.dirname(sys.executable)}:{os.environ['PATH']}",
               'SLURM_NNODES': '2', 'SLURM_NODEID': str(node), 'SLURM_JOB_NODELIST': '127.0.0.1', 'SLURM_JOB_ID': '7',
               'GPUS_PER_NODE': '2', 'MASTER_PORT': str(port), 'MIN_NODES': '1', 'OMP_NUM_THREADS': '1'}
        with open(tmp_path / f'node{node}.log', 'w') as log:
            nodes.append(subprocess.Popen(
                [*NODE_OF_ITS_OWN, 'bash', os.path.join(SLURM, 'launch.sh'), 'yamls/demo.yaml',
                 f'variables.data_root={data}', 'max_duration=4ba', 'global_batch_size=8',
                 'eval_interval=100ba', 'progress_bar=false', 'downstream=null',
                 f"checkpoint.save_folder={tmp_path / 'run' / 'checkpoints'}",
                 f"callbacks.sample_ledger.folder={tmp_path / 'run' / 'ledger'}"],
                cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True))
        if node == 0:
            wait_for_the_rendezvous(port)
    codes = [process.wait(timeout=300) for process in nodes]
    log = (tmp_path / 'node0.log').read_text()
    assert codes == [0, 0], log[-3000:]
    assert '  elastic (torchrun): restart 0 of 3; 4 ranks on 2 nodes\n' in log
    assert 'stopped at batch 4 of 4ba' in log
