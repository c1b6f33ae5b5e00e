"""A short run of the chaos harness (scripts/chaos.py runs 20 trials): kill -9 inside a checkpoint write, re-run,
and every rank's losses and sample ids equal the uninterrupted run's."""
import pytest

from llmfoundry_ext.chaos import SAVE_EVERY, run


@pytest.mark.timeout(900)
def test_a_kill_inside_a_checkpoint_write_resumes_from_the_one_before(tmp_path):
    (trial,) = run(str(tmp_path), trials=1, seed=1, write_delay=0.02)  # aims at ep0-ba6: 2 slow writes, not 7
    assert trial.aimed_inside_write and trial.identical
    assert trial.killed_inside_write == trial.skipped != ''
    assert trial.resumed_from_batch == int(trial.skipped.removeprefix('ep0-ba')) - SAVE_EVERY
