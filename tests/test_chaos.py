"""Autoresume after kill -9, through the chaos harness (scripts/chaos.py runs 20 trials): a 2-process FSDP2 run
(selective activation checkpointing, untied) killed inside a checkpoint write resumes from the checkpoint before with
every rank's losses and sample ids equal to the uninterrupted run's, bit for bit; resumed from the same kill with 1
process (elastic), it reads the same global batches and its losses are the 2 ranks' averages."""
import os
import random
import shutil

import pytest

from llmfoundry_ext.callbacks.sample_ledger import read_ledger
from llmfoundry_ext.chaos import BATCHES, SAVE_EVERY, Runner, identical, kill, resumption, run_yaml, write_streams
from llmfoundry_ext.resumption import SEAL


@pytest.mark.timeout(900)
def test_a_kill_inside_a_checkpoint_write_resumes_from_the_one_before_on_two_processes_or_one(tmp_path):
    folder = str(tmp_path)
    runner = Runner(folder, run_yaml(folder, write_streams(folder)), write_delay=0.02)
    runner.finish('uninterrupted', attempts=1)
    assert 'FSDP2 over 2 ranks, selective activation checkpointing of every block' in runner.log('uninterrupted')
    expected = runner.ledgers('uninterrupted')
    assert expected[0][1]['sample_ids'] != expected[1][1]['sample_ids']  # ranks read different samples

    killed_after, killed_inside = kill(runner, 'killed', True, random.Random(1))  # aims at ep0-ba6: 2 slow writes
    shutil.copytree(tmp_path / 'killed', tmp_path / 'elastic', symlinks=True)  # the same kill, resumed on 1 process
    runner.finish('killed', attempts=1)
    resumed, skipped = resumption(runner.log('killed'))
    assert killed_inside == skipped == 'ep0-ba6' and resumed == 6 - SAVE_EVERY <= killed_after
    assert identical(runner.ledgers('killed'), expected)
    final = sorted(os.listdir(os.path.join(runner.checkpoints('killed'), f'ep0-ba{BATCHES}')))
    assert final == [SEAL, '.metadata', '__0_0.distcp', '__1_0.distcp']  # FSDP2 sharded checkpoint, sealed

    runner.finish('elastic', attempts=1, processes=1)
    assert resumption(runner.log('elastic')) == (resumed, skipped)
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
