"""Training end to end: kill -9 + autoresume is exact (2 processes, and elastic to 1, where 1 process continues with
FSDP2's losses), order-change warnings, eval."""
import math
import os
import random
import re
import shutil
import signal
import subprocess
import time

import pytest
import torch

from llmfoundry_ext.callbacks.sample_ledger import read_ledger
from llmfoundry_ext.config import load
from llmfoundry_ext.resumption import SEAL
from llmfoundry_ext.train import train
from tests.conftest import COMPOSER, REPO, write_yaml

BATCHES = 20


def launch(yaml_path: str, run_name: str, log_path, processes: int = 2) -> subprocess.Popen:
    """``composer -n 2 train.py`` in its own process group (so kill -9 reaches every rank)."""
    env = {**os.environ, 'OMP_NUM_THREADS': '1'}
    log = open(log_path, 'a')
    return subprocess.Popen([COMPOSER, '-n', str(processes), 'train.py', yaml_path, f'run_name={run_name}'],
                            cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def run_to_end(yaml_path: str, run_name: str, log_path, processes: int = 2) -> None:
    process = launch(yaml_path, run_name, log_path, processes)
    assert process.wait(timeout=600) == 0, open(log_path).read()[-3000:]


def wait_for_batch(ledger_path: str, batch: int, process: subprocess.Popen, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if os.path.exists(ledger_path) and max(read_ledger(ledger_path), default=0) >= batch:
            return
        assert process.poll() is None, 'the run ended before it could be killed'
        time.sleep(0.05)
    raise TimeoutError(f'batch {batch} not reached')


def ledgers(folder) -> list[dict[int, dict]]:
    return [read_ledger(os.path.join(folder, f'ledger-rank{rank}.jsonl')) for rank in (0, 1)]


def kill_at_random_batch(yaml_path: str, run_name: str, tmp_path, ledger_root) -> int:
    """Start a 2-process run, kill -9 its whole process group at a random batch past the first checkpoint
    (batch 5); returns the last batch rank 0 recorded."""
    kill_at = random.Random(os.getpid()).randint(6, 14)
    process = launch(yaml_path, run_name, tmp_path / f'{run_name}.log')
    ledger = str(ledger_root / run_name / 'ledger-rank0.jsonl')
    wait_for_batch(ledger, kill_at, process)
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    return max(read_ledger(ledger))


def resumed_batch(log_path) -> int:
    log = open(log_path).read()
    return int(re.search(r'autoresume: resuming from the latest checkpoint at batch (\d+)', log)[1])


@pytest.mark.timeout(900)
def test_kill_9_and_autoresume_matches_uninterrupted_run(tiny_config, tmp_path):
    """Same losses and sample ids on every rank, bit for bit; and with 1 process after 2 (elastic), the same
    global batches and losses: FSDP2 over 2 ranks with selective (per-op) activation checkpointing trains the same
    model as 1 process (fp32, CPU; untied, so the embeddings and output layer are units of their own)."""
    tiny_config['model']['tie_embeddings'] = False
    tiny_config['parallelism']['fsdp']['activation_checkpointing'] = 'selective'
    yaml_path = write_yaml(tiny_config, tmp_path / 'tiny.yaml')
    ledger_root = tmp_path / 'ledger'
    run_to_end(yaml_path, 'uninterrupted', tmp_path / 'uninterrupted.log')
    assert ('FSDP2 over 2 ranks, selective activation checkpointing of every block' in
            (tmp_path / 'uninterrupted.log').read_text())
    expected = ledgers(ledger_root / 'uninterrupted')
    assert expected[0][1]['sample_ids'] != expected[1][1]['sample_ids']  # ranks read different samples

    killed_at = kill_at_random_batch(yaml_path, 'interrupted', tmp_path, ledger_root)
    for root in (tmp_path / 'checkpoints', ledger_root):  # 'elastic' resumes from the same kill, with 1 process
        shutil.copytree(root / 'interrupted', root / 'elastic', symlinks=True)
    run_to_end(yaml_path, 'interrupted', tmp_path / 'resumed.log')
    resumed_at = resumed_batch(tmp_path / 'resumed.log')
    assert resumed_at % 5 == 0 and 5 <= resumed_at <= killed_at < BATCHES
    shards = sorted(os.listdir(tmp_path / 'checkpoints' / 'interrupted' / f'ep0-ba{BATCHES}'))
    assert shards == [SEAL, '.metadata', '__0_0.distcp', '__1_0.distcp']  # FSDP2 sharded checkpoint, sealed
    actual = ledgers(ledger_root / 'interrupted')
    for rank in (0, 1):
        assert sorted(actual[rank]) == list(range(1, BATCHES + 1))
        for field in ('loss', 'sample_ids'):
            assert [actual[rank][b][field] for b in range(1, BATCHES + 1)] == \
                [expected[rank][b][field] for b in range(1, BATCHES + 1)]

    run_to_end(yaml_path, 'elastic', tmp_path / 'elastic.log', processes=1)
    assert resumed_batch(tmp_path / 'elastic.log') == resumed_at
    one, two = read_ledger(str(ledger_root / 'elastic' / 'ledger-rank0.jsonl')), ledgers(ledger_root / 'elastic')
    # streaming deals a global batch out to the ranks in turn: one process reads it in the interleaved order
    interleaved = [[i for pair in zip(expected[0][b]['sample_ids'], expected[1][b]['sample_ids']) for i in pair]
                   for b in range(resumed_at + 1, BATCHES + 1)]
    assert [one[b]['sample_ids'] for b in range(resumed_at + 1, BATCHES + 1)] == interleaved
    assert [one[b]['loss'] for b in range(resumed_at + 1, BATCHES + 1)] == pytest.approx(
        [(expected[0][b]['loss'] + expected[1][b]['loss']) / 2 for b in range(resumed_at + 1, BATCHES + 1)],
        rel=1e-5, abs=0)
    for rank in (0, 1):
        assert [two[rank][b]['sample_ids'] for b in range(1, resumed_at + 1)] == \
            [expected[rank][b]['sample_ids'] for b in range(1, resumed_at + 1)]


def test_resume_warns_when_the_data_order_settings_changed(tiny_config, tmp_path, capsys):
    tiny_config['parallelism'] = {'fsdp': None}
    tiny_config['max_duration'] = '2ba'
    path = write_yaml(tiny_config, tmp_path / 'run.yaml')
    train(load(path)).close()
    train(load(path, ['max_duration=3ba', 'data.train.shuffle_seed=4', 'data.train.num_workers=1'])).close()
    warnings = [line for line in capsys.readouterr().out.splitlines() if line.startswith('warning:')]
    assert warnings == ['warning: data.train.shuffle_seed changed since the checkpointed run (3 -> 4): the sample '
                        'order will not continue exactly where it stopped']


def test_eval_logs_loss_and_perplexity(tiny_config, tmp_path):
    from llmfoundry_ext.train import logged_history
    tiny_config.update(parallelism={'fsdp': None}, max_duration='4ba', eval_interval='2ba', loggers={'in_memory': {}})
    tiny_config['data']['eval'] = {'streams': {'b': {'local': tiny_config['data']['train']['streams']['b']['local']}},
                                   'shuffle': False}
    trainer = train(load(write_yaml(tiny_config, tmp_path / 'run.yaml')))
    history = logged_history(trainer)
    trainer.close()
    losses = [(int(t.batch), float(v)) for t, v in history['metrics/eval/LanguageCrossEntropy']]
    perplexities = [float(v) for _, v in history['metrics/eval/LanguagePerplexity']]
    assert [batch for batch, _ in losses] == [2, 4]
    assert perplexities == pytest.approx([math.exp(loss) for _, loss in losses], rel=1e-5)
    assert 5.5 < losses[0][1] < 7.0  # random tokens over a 512 vocabulary: about ln(512) = 6.24


def test_masked_lm_trains_on_masked_positions_only(tiny_config, tmp_path):
    from llmfoundry_ext.build import build_collator
    tiny_config.update(parallelism={'fsdp': None}, max_duration='2ba',
                       objective={'name': 'mlm', 'mask_token_id': 1, 'mask_probability': 0.3})
    tiny_config['model']['causal'] = False
    config = load(write_yaml(tiny_config, tmp_path / 'run.yaml'))
    batch = build_collator(config)([{'tokens': torch.arange(2, 40), 'sample_id': 5}])
    masked = batch['input_ids'] == 1
    assert masked.any() and torch.equal(batch['labels'][masked], torch.arange(2, 34)[masked[0]])
    trainer = train(config)
    assert 5.5 < float(trainer.state.loss) < 7.0  # about ln(512) on random tokens
    trainer.close()


LAYOUT_SCRIPT = """
import sys
from composer.utils import dist, get_device
from llmfoundry_ext.build import build_trainer
from llmfoundry_ext.config import load
from llmfoundry_ext.train import parallel_layout
dist.initialize_dist(get_device(None))
trainer = build_trainer(load(sys.argv[1]))
block = trainer.state.model.model.layers[1]
print(f'rank {dist.get_global_rank()}: {parallel_layout(trainer)}; block 1 {type(block).__name__} on mesh '
      f'{next(block.parameters()).device_mesh.mesh_dim_names}', flush=True)
"""


def test_replicate_degree_builds_an_hsdp_mesh(tiny_config, tmp_path):
    """Built, not trained: gloo cannot average the replicas' gradients (ReduceOp.AVG), NCCL does."""
    tiny_config['parallelism']['fsdp'].update(replicate_degree=2, activation_checkpointing='full', checkpoint_every=2)
    script = tmp_path / 'layout.py'
    script.write_text(LAYOUT_SCRIPT)
    run = subprocess.run([COMPOSER, '-n', '2', str(script), write_yaml(tiny_config, tmp_path / 'hsdp.yaml')],
                         cwd=REPO, capture_output=True, text=True, timeout=300,
                         env={**os.environ, 'OMP_NUM_THREADS': '1', 'PYTHONPATH': REPO})
    assert run.returncode == 0, run.stderr[-2000:]
    # composer shows rank 0's output; block 1 (not checkpointed: every 2nd from block 0) is sharded over both dims
    assert ("rank 0: HSDP 2 replicas x 1 shards; block 1 FSDPTransformerBlock on mesh "
            "('data_parallel_replicate', 'data_parallel_shard')") in run.stdout
