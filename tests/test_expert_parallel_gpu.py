"""Expert parallelism on 2 GPUs: the meta build's experts, split before Composer draws each rank's share."""
import shlex

import pytest
import torch

from tests.conftest import train_runs
from tests.test_expert_parallel import drawn_gate, mixtral

pytestmark = pytest.mark.gpu


@pytest.mark.timeout(600)
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason='needs 2 GPUs')
def test_experts_split_on_a_meta_build_are_drawn_apart_on_two_gpus(tiny_config, tmp_path):
    """The meta build (``model.init_device=meta``): DTensor's CUDA RNG draws each rank's share of the experts from its
    own offsets: experts 0-1 (rank 0) and 2-3 (rank 1) apart, each at the init std (a learning rate of 0 keeps the draw
    to the checkpoint at batch 10). On the CPU both ranks draw the same share (tests/test_expert_parallel.py)."""
    tiny_config.update(max_duration='10ba', precision='amp_bf16')
    run = mixtral(tiny_config, tmp_path / 'drawn', 2)
    train_runs(2, [shlex.join([run, 'model.init_device=meta', 'optimizer.lr=0'])])
    gate = drawn_gate(tmp_path / 'drawn')
    assert gate.std().item() == pytest.approx(0.02, rel=0.05)
    assert (gate[:2] - gate[2:]).std().item() == pytest.approx(0.02 * 2 ** 0.5, rel=0.05)
