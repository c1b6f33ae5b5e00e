"""Training through ``composer -n 2`` (FSDP2, sharded checkpoints, CPU): kill -9 and autoresume is exact."""
import os
import random
import re
import signal
import subprocess
import time

import pytest

from llmfoundry_ext.callbacks.sample_ledger import read_ledger
from tests.conftest import COMPOSER, REPO, write_yaml

BATCHES = 20


def launch(yaml_path: str, run_name: str, log_path) -> subprocess.Popen:
    """``composer -n 2 train.py`` in its own process group (so kill -9 reaches every rank)."""
    env = {**os.environ, 'OMP_NUM_THREADS': '1'}
    log = open(log_path, 'a')
    return subprocess.Popen([COMPOSER, '-n', '2', 'train.py', yaml_path, f'run_name={run_name}'], cwd=REPO,
                            env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def run_to_end(yaml_path: str, run_name: str, log_path) -> None:
    process = launch(yaml_path, run_name, log_path)
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


@pytest.mark.timeout(900)
def test_kill_9_and_autoresume_matches_uninterrupted_run(tiny_config, tmp_path):
    yaml_path = write_yaml(tiny_config, tmp_path / 'tiny.yaml')
    ledger_root = tmp_path / 'ledger'

    run_to_end(yaml_path, 'uninterrupted', tmp_path / 'uninterrupted.log')

    kill_at = random.Random(os.getpid()).randint(6, 14)  # past the first checkpoint (batch 5), before the end
    process = launch(yaml_path, 'interrupted', tmp_path / 'interrupted.log')
    wait_for_batch(str(ledger_root / 'interrupted' / 'ledger-rank0.jsonl'), kill_at, process)
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    killed_at = max(read_ledger(str(ledger_root / 'interrupted' / 'ledger-rank0.jsonl')))
    run_to_end(yaml_path, 'interrupted', tmp_path / 'resumed.log')

    resumed_log = open(tmp_path / 'resumed.log').read()
    resumed_at = int(re.search(r'autoresume: resuming from the latest checkpoint at batch (\d+)', resumed_log)[1])
    assert resumed_at % 5 == 0 and 5 <= resumed_at <= killed_at < BATCHES
    shards = sorted(os.listdir(tmp_path / 'checkpoints' / 'interrupted' / f'ep0-ba{BATCHES}'))
    assert shards == ['.metadata', '__0_0.distcp', '__1_0.distcp']  # FSDP2 sharded checkpoint
    expected, actual = ledgers(ledger_root / 'uninterrupted'), ledgers(ledger_root / 'interrupted')
    for rank in (0, 1):
        assert sorted(actual[rank]) == list(range(1, BATCHES + 1))
        assert [actual[rank][b]['loss'] for b in range(1, BATCHES + 1)] == \
            [expected[rank][b]['loss'] for b in range(1, BATCHES + 1)]
        assert [actual[rank][b]['sample_ids'] for b in range(1, BATCHES + 1)] == \
            [expected[rank][b]['sample_ids'] for b in range(1, BATCHES + 1)]
    assert expected[0][1]['sample_ids'] != expected[1][1]['sample_ids']  # ranks read different samples
