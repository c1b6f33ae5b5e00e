"""One run per save folder (run_lock.py): a live holder refuses a second start in one line; a holder that is gone, or
silent for STALE_S, is taken over; the launcher's death ends its ranks, and the re-run resumes exactly."""
import json
import os
import signal
import socket
import subprocess
import sys
import time

import psutil
import pytest

from llmfoundry_ext import run_lock
from llmfoundry_ext.callbacks.sample_ledger import read_ledger
from llmfoundry_ext.launch import LAUNCHER
from llmfoundry_ext.train import main
from tests.conftest import REPO, global_batches, train_runs, write_yaml


def write_lock(folder, pid: int, host: str = socket.gethostname(), age_s: float = 0.0) -> str:
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, run_lock.LOCK_NAME)
    with open(path, 'w') as file:
        json.dump({'host': host, 'pid': pid, 'job': None, 'started': '2026-11-28 10:00:00'}, file)
    os.utime(path, (time.time() - age_s,) * 2)
    return path


@pytest.fixture
def sleeper():
    """A live process that is not this one: the holder of a lock."""
    process = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])
    yield process.pid
    process.kill()
    process.wait()


def short_run(tiny_config, tmp_path) -> tuple[str, str]:
    tiny_config.update(max_duration='2ba', loggers={})
    tiny_config['parallelism'] = {'fsdp': None}
    return write_yaml(tiny_config, tmp_path / 'run.yaml'), str(tmp_path / 'checkpoints' / 'tiny')


@pytest.mark.parametrize('host, age_s', [(socket.gethostname(), 0.0), ('another-node', 60.0)],
                         ids=['this host, alive', 'another host, refreshed a minute ago'])
def test_a_held_save_folder_refuses_a_second_run_in_one_line(tiny_config, tmp_path, capsys, sleeper, host, age_s,
                                                             monkeypatch):
    monkeypatch.setattr(run_lock, 'DYING_S', 0.5)  # the live holder's time to exit (5 s) passes sooner
    path, folder = short_run(tiny_config, tmp_path)
    lock = write_lock(folder, sleeper, host, age_s)
    capsys.readouterr()
    assert main([path]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f'config error: checkpoint.save_folder: {folder} is in use by another run (host {host}, PID {sleeper}, since '
        f'2026-11-28 10:00:00); wait for it to end, stop it, or give a new checkpoint.save_folder (a lock whose run '
        f'is gone is taken over: {lock})']
    assert sorted(os.listdir(folder)) == [run_lock.LOCK_NAME]  # nothing trained, nothing written


@pytest.mark.parametrize('stale', ['pid', 'age'], ids=['its process gone', 'another host, silent 3 minutes'])
def test_a_stale_lock_is_taken_over_and_released_at_the_end(tiny_config, tmp_path, stale):
    path, folder = short_run(tiny_config, tmp_path)
    dead = subprocess.Popen([sys.executable, '-c', 'pass'])
    dead.wait()
    if stale == 'pid':
        write_lock(folder, dead.pid)
    else:
        write_lock(folder, os.getpid(), 'another-node', 180.0)
    assert main([path]) == 0
    assert run_lock.LOCK_NAME not in os.listdir(folder) and 'ep0-ba2-rank0.pt' in os.listdir(folder)


def launch(yaml: str, log) -> subprocess.Popen:
    return subprocess.Popen([*LAUNCHER, '-n', '2', os.path.join(REPO, 'train.py'), yaml], cwd=REPO, stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)


@pytest.mark.slow
def test_killing_the_launcher_ends_its_ranks_and_the_rerun_resumes_exactly(tiny_config, tmp_path):
    tiny_config.update(max_duration='16ba', loggers={})
    tiny_config['checkpoint']['save_interval'] = '4ba'
    tiny_config['run_name'] = 'whole'
    train_runs(2, [write_yaml(tiny_config, tmp_path / 'whole.yaml')])  # the reference: forked ranks, no launcher
    tiny_config['run_name'] = 'killed'
    yaml = write_yaml(tiny_config, tmp_path / 'killed.yaml')
    with open(tmp_path / 'killed.log', 'w') as log:
        launcher = launch(yaml, log)
        while not (tmp_path / 'checkpoints' / 'killed' / 'ep0-ba8').exists() and launcher.poll() is None:
            time.sleep(0.2)
        ranks = psutil.Process(launcher.pid).children()
        launcher.send_signal(signal.SIGKILL)
        launcher.wait()
        gone, alive = psutil.wait_procs(ranks, timeout=30)
        assert (len(ranks), alive) == (2, [])
        launcher = launch(yaml, log)  # the same command: the stale lock is taken over
        assert launcher.wait(timeout=600) == 0
    ledgers = {name: {rank: read_ledger(str(tmp_path / 'ledger' / name / f'ledger-rank{rank}.jsonl'))
                      for rank in range(2)} for name in ('whole', 'killed')}
    batches = range(1, 17)
    assert global_batches(ledgers['killed'], batches) == global_batches(ledgers['whole'], batches)
    assert [ledgers['killed'][0][b]['loss'] for b in batches] == [ledgers['whole'][0][b]['loss'] for b in batches]
