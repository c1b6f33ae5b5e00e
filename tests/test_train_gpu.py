"""On a GPU: the model is built on ``meta``, sharded by FSDP2, initialised per shard, and trains in bf16."""
import math

import numpy as np
import pytest
import torch

from data_prep.packing import write_mds
from llmfoundry_ext.build import resolve_init_device
from llmfoundry_ext.config import load
from llmfoundry_ext.model.attention import attend
from llmfoundry_ext.train import logged_history, train
from tests.conftest import write_yaml

pytestmark = pytest.mark.gpu


def repeated_patterns(count: int, window: int, vocab: int) -> list[np.ndarray]:
    """Windows made of one random 8-token pattern repeated: learnable by attention (induction)."""
    rng = np.random.default_rng(0)
    return [np.tile(rng.integers(2, vocab, 8, dtype=np.uint32), window // 8) for _ in range(count)]


def test_meta_init_fsdp2_bf16_training(tiny_config, tmp_path):
    write_mds(str(tmp_path / 'patterns'), repeated_patterns(800, 32, 512), {'source': 'test', 'window': 32})
    tiny_config['data']['train']['streams'] = {'patterns': {'local': str(tmp_path / 'patterns')}}
    tiny_config.update(precision='amp_bf16', max_duration='30ba', loggers={'in_memory': {}})
    tiny_config['optimizer']['lr'] = 3e-3
    tiny_config['callbacks'] = {}
    config = load(write_yaml(tiny_config, tmp_path / 'run.yaml'))
    assert resolve_init_device(config) == 'meta'

    trainer = train(config)
    model = trainer.state.model.model
    down_proj = model.layers[0].mlp.down_proj.weight
    assert type(down_proj).__name__ == 'DTensor' and down_proj.device.type == 'cuda'
    std = down_proj.full_tensor().float().std().item()
    assert abs(std - 0.02 / math.sqrt(2 * 2)) < 0.002  # our depth-scaled init, applied after sharding
    losses = [float(value) for _, value in logged_history(trainer)['loss/train/total']]
    trainer.close()
    assert losses[0] > 6.0 and losses[-1] < 1.0


@pytest.mark.parametrize('causal', [True, False])
def test_sdpa_matches_eager_in_bf16(causal):
    torch.manual_seed(0)
    q = torch.randn(2, 8, 512, 64, device='cuda', dtype=torch.bfloat16)
    k, v = (torch.randn(2, 2, 512, 64, device='cuda', dtype=torch.bfloat16) for _ in range(2))
    torch.testing.assert_close(attend(q, k, v, causal, 'sdpa'), attend(q, k, v, causal, 'eager'),
                               atol=2e-2, rtol=2e-2)
