"""On a GPU: the model is built on ``meta``, sharded by FSDP2, initialised per shard, and trains in bf16."""
import math

import numpy as np
import pytest
import torch

from llmfoundry_ext.data.mds import write_mds
from llmfoundry_ext.build import build_trainer
from llmfoundry_ext.preflight import prepare
from llmfoundry_ext.model.attention import attend
from llmfoundry_ext.train import logged_history, train
from tests.conftest import write_yaml

pytestmark = pytest.mark.gpu


def repeated_patterns(count: int, window: int, vocab: int, period: int = 4) -> list[np.ndarray]:
    """Windows of one random ``period``-token pattern repeated: all but the first period is predictable by
    attention (induction), so the loss can fall from ln(vocab) to about period / window x ln(vocab)."""
    rng = np.random.default_rng(0)
    return [np.tile(rng.integers(2, vocab, period, dtype=np.uint32), window // period) for _ in range(count)]


def test_meta_init_fsdp2_bf16_training(tiny_config, tmp_path, fsdp_on_one_process):
    write_mds(str(tmp_path / 'patterns'), repeated_patterns(4000, 32, 512), {'source': 'test', 'window': 32})
    tiny_config['data']['train']['streams'] = {'patterns': {'local': str(tmp_path / 'patterns')}}
    tiny_config.update(precision='amp_bf16', max_duration='200ba', global_batch_size=32, scheduler=None,
                       loggers={'in_memory': {}})
    tiny_config['model']['dim'] = 128
    tiny_config['optimizer']['lr'] = 3e-3
    tiny_config['callbacks'] = {}
    run = prepare(write_yaml(tiny_config, tmp_path / 'run.yaml'))
    assert run.plan.init_device == 'meta'

    trainer = build_trainer(run)  # shards with FSDP2, then materialises and initialises each shard
    assert trainer.state.train_dataloader.pin_memory
    down_proj = trainer.state.model.model.layers[0].mlp.down_proj.weight
    assert type(down_proj).__name__ == 'DTensor' and down_proj.device.type == 'cuda'
    std = down_proj.full_tensor().float().std().item()
    assert abs(std - 0.02 / math.sqrt(2 * 1)) < 0.001  # torchtitan's depth init of layer 0, not to_empty's garbage
    trainer.fit()
    losses = [float(value) for _, value in logged_history(trainer)['loss/train/total']]
    trainer.close()
    assert losses[0] > 6.0 and sum(losses[-10:]) / 10 < 2.5  # fp32 on CPU: 6.3 -> 1.4 in 200 batches


@pytest.mark.parametrize('causal', [True, False])
def test_sdpa_matches_eager_in_bf16(causal):
    torch.manual_seed(0)
    q = torch.randn(2, 8, 512, 64, device='cuda', dtype=torch.bfloat16)
    k, v = (torch.randn(2, 2, 512, 64, device='cuda', dtype=torch.bfloat16) for _ in range(2))
    torch.testing.assert_close(attend(q, k, v, causal, 'sdpa'), attend(q, k, v, causal, 'eager'),
                               atol=2e-2, rtol=2e-2)


def test_gpu_metrics_reach_tensorboard(tiny_config, tmp_path):
    """On a GPU the per-step metrics add MFU, GPU memory and GPU utilisation (nvidia-ml-py)."""
    import glob

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tiny_config.update(precision='amp_bf16', max_duration='6ba', callbacks={
        'speed_monitor': {'window_size': 2}, 'memory_monitor': {}, 'system_metrics_monitor': {}, 'step_monitor': {}})
    tiny_config.pop('loggers', None)
    train(prepare(write_yaml(tiny_config, tmp_path / 'run.yaml'))).close()
    (events,) = glob.glob(str(tmp_path / 'checkpoints' / 'tiny' / 'tensorboard' / 'tiny' / 'events.out.tfevents.*'))
    accumulator = EventAccumulator(events)
    accumulator.Reload()
    tags = accumulator.Tags()['scalars']
    print(sorted(tags))
    assert 'throughput/device/mfu' in tags and 'time/step_seconds' in tags
    assert any(tag.startswith('memory/') and 'peak' in tag for tag in tags)
    assert any('gpu_percentage' in tag for tag in tags)


def test_a_training_batch_never_makes_the_host_wait_for_the_gpu(tiny_config, tmp_path):
    """The shipped callbacks, console line and TensorBoard: no read-back of the loss, the counts, the FLOPs or the
    batch size (Composer's ``_train_microbatches`` read it back before the forward)."""
    from llmfoundry_ext.measure.profiling import SyncReport

    tiny_config.update(precision='amp_bf16', max_duration='6ba', log_interval='10ba', callbacks={
        'speed_monitor': {'window_size': 2}, 'lr_monitor': {}, 'memory_monitor': {}, 'runtime_estimator': {},
        'stop_after': {'minutes': 60}})
    tiny_config['model']['compile'] = True
    tiny_config['checkpoint']['save_interval'] = '3ba'  # batch 5 (4 from 0) saves nothing: a save reads weights back
    tiny_config['optimizer'] = {'name': 'adamw', 'fused': True, 'lr': 1e-3}  # the shipped YAMLs' (Composer's
    tiny_config.pop('loggers', None)                                         # DecoupledAdamW reads back per tensor)
    syncs = SyncReport(batch=4)
    train(prepare(write_yaml(tiny_config, tmp_path / 'run.yaml')), extra_callbacks=[syncs]).close()
    print(syncs.report())
    assert dict(syncs.sites) == {}
