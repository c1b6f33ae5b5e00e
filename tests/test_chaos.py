"""A short run of the chaos harness (scripts/chaos.py runs 20 trials): kill -9 inside a checkpoint write, re-run,
and every rank's losses and sample ids equal the uninterrupted run's."""
import pytest

from llmfoundry_ext.chaos import SAVE_EVERY, run


@pytest.mark.timeout(900)
def test_a_kill_inside_a_checkpoint_write_resumes_from_the_one_before(tmp_path):
    """Trial 1 aims at a batch, trial 2 inside a write; the first only runs the uninterrupted and killed runs once."""
    first, second = run(str(tmp_path), trials=2, seed=0, write_delay=0.02)
    assert first.identical and second.identical
    assert second.killed_inside_write == second.skipped != ''
    assert second.resumed_from_batch == int(second.skipped.removeprefix('ep0-ba')) - SAVE_EVERY
    assert first.resumed_from_batch == first.killed_after_batch // SAVE_EVERY * SAVE_EVERY or first.skipped
