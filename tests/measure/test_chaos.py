"""Autoresume after kill -9, through the chaos harness (scripts/chaos.py runs 20 trials): a 2-process FSDP2 run
(selective activation checkpointing, untied) killed inside a checkpoint write resumes from the checkpoint before with
every rank's losses and sample ids equal to the uninterrupted run's, bit for bit; resumed from the same kill with 1
process (elastic, unsharded: the sharded checkpoint converted to one file), it reads the same global batches and its
losses are the 2 ranks' averages; and a checkpoint that one process wrote resumes on 2 (converted to shards) with each
rank's samples and losses those of the uninterrupted run."""
import os
import random
import shutil
import subprocess

import pytest

from llmfoundry_ext.callbacks.sample_ledger import read_ledger
from llmfoundry_ext.measure.chaos import (BATCHES, SAVE_EVERY, Runner, identical, keep_checkpoints_up_to, kill,
                                          resumption, run_yaml, wait_until, write_streams)
from llmfoundry_ext.resumption import SEAL
from llmfoundry_ext.train import main
from tests.conftest import train_runs


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_a_kill_inside_a_checkpoint_write_resumes_from_the_one_before_on_two_processes_or_one(tmp_path, capsys):
    """The killed run is launched as the chaos trials launch it (Composer's launcher); the uninterrupted one, and then
    the killed one's resume and the elastic run's back on 2 processes, fork their ranks from one import
    (tests/forked_launch.py, tests/training_runs_worker.py); the elastic run on 1 process runs in this one (what
    train.py runs)."""
    folder = str(tmp_path)
    runner = Runner(folder, run_yaml(folder, write_streams(folder)), write_delay=0.02)
    uninterrupted, = train_forked(runner, ['uninterrupted'])
    assert 'FSDP2 over 2 ranks, selective activation checkpointing of every block' in uninterrupted
    expected = runner.ledgers('uninterrupted')
    assert expected[0][1]['sample_ids'] != expected[1][1]['sample_ids']  # ranks read different samples

    killed_after, killed_inside = kill(runner, 'killed', True, random.Random(1))  # aims at ep0-ba6: 2 slow writes
    shutil.copytree(tmp_path / 'killed', tmp_path / 'elastic', symlinks=True)  # the same kill, resumed on 1 process
    capsys.readouterr()
    assert main([runner.yaml_path, 'run_name=elastic']) == 0
    elastic_log = capsys.readouterr().out
    resumed, skipped = resumption(elastic_log)
    back = resumed + SAVE_EVERY  # the elastic run's first checkpoint of its own (one file)
    shutil.copytree(tmp_path / 'elastic', tmp_path / 'back', symlinks=True)
    keep_checkpoints_up_to(tmp_path / 'back' / 'checkpoints', back)
    killed_log, back_log = train_forked(runner, ['killed', 'back'])

    assert resumption(killed_log) == (resumed, skipped)
    assert killed_inside == skipped == 'ep0-ba6' and resumed == 6 - SAVE_EVERY <= killed_after
    assert identical(runner.ledgers('killed'), expected)
    final = sorted(os.listdir(os.path.join(runner.checkpoints('killed'), f'ep0-ba{BATCHES}')))
    assert final == [SEAL, '.metadata', '__0_0.distcp', '__1_0.distcp']  # FSDP2 sharded checkpoint, sealed

    one, two = read_ledger(str(tmp_path / 'elastic' / 'ledger' / 'ledger-rank0.jsonl')), runner.ledgers('elastic')
    after = range(resumed + 1, BATCHES + 1)
    # streaming deals a global batch out to the ranks in turn: one process reads it in the interleaved order
    interleaved = [[i for pair in zip(expected[0][b]['sample_ids'], expected[1][b]['sample_ids']) for i in pair]
                   for b in after]
    assert [one[b]['sample_ids'] for b in after] == interleaved
    assert [one[b]['loss'] for b in after] == pytest.approx(
        [(expected[0][b]['loss'] + expected[1][b]['loss']) / 2 for b in after], rel=1e-5, abs=0)
    for rank in (0, 1):
        assert [two[rank][b]['sample_ids'] for b in range(1, resumed + 1)] == \
            [expected[rank][b]['sample_ids'] for b in range(1, resumed + 1)]
    assert f'autoresume: ep0-ba{resumed} is sharded, this run reads one file: converted it to ' \
           f'ep0-ba{resumed}-rank0.pt (kept ep0-ba{resumed})' in elastic_log
    assert 'one process, unsharded' in elastic_log
    check_resumed_on_two_processes_from_one(runner, back_log, back, expected)


def train_forked(runner: Runner, names: list[str]) -> list[str]:
    """The runs ``names`` (the runner's YAML, each its run_name) one after another in one 2-process launch whose ranks
    fork from one import (``train_runs``), at full write speed; each run's output."""
    return train_runs(2, [f'{runner.yaml_path} run_name={name}' for name in names],
                      env={**runner.env, 'CHAOS_WRITE_DELAY': '0'})


def check_resumed_on_two_processes_from_one(runner: Runner, log: str, batch: int, expected) -> None:
    """The elastic run cut back to its first checkpoint of its own (one file), resumed on 2 processes to the end."""
    assert f'autoresume: ep0-ba{batch}-rank0.pt is one file, this run reads sharded folders: converted it to ' \
           f'ep0-ba{batch} (kept ep0-ba{batch}-rank0.pt)' in log
    assert resumption(log) == (batch, '') and 'FSDP2 over 2 ranks' in log
    back, after = runner.ledgers('back'), range(batch + 1, BATCHES + 1)
    for rank in (0, 1):
        assert [back[rank][b]['sample_ids'] for b in after] == [expected[rank][b]['sample_ids'] for b in after]
        assert [back[rank][b]['loss'] for b in after] == pytest.approx(
            [expected[rank][b]['loss'] for b in after], rel=1e-5, abs=0)
    checkpoints = os.path.join(runner.checkpoints('back'), f'ep0-ba{BATCHES}')
    assert sorted(os.listdir(checkpoints)) == [SEAL, '.metadata', '__0_0.distcp', '__1_0.distcp']


def test_waiting_on_a_run_returns_when_done_and_fails_when_it_ends_or_stalls():
    """A trial waits on its run's progress: the check's value once done; the failure's line when the run has ended
    or the time is up first (a stalled run no longer waits for pytest's timeout)."""
    calls = iter([(False, 'a'), (False, 'b'), (True, 'ep0-ba6')])
    with subprocess.Popen(['sleep', '30']) as alive:
        assert wait_until(lambda: next(calls), alive, 'never') == 'ep0-ba6'
        with pytest.raises(RuntimeError, match=r'^run stalled$'):
            wait_until(lambda: (False, None), alive, 'run stalled', timeout_s=0.05)
        alive.kill()
    ended = subprocess.Popen(['true'])
    ended.wait()
    with pytest.raises(RuntimeError, match=r'^run ended before batch 5$'):
        wait_until(lambda: (False, None), ended, 'run ended before batch 5')
