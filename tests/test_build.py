"""What the config builds: per-step metrics land in TensorBoard next to the checkpoints by default."""
import glob

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from llmfoundry_ext.config import load
from llmfoundry_ext.train import train
from tests.conftest import write_yaml

MONITORS = {'speed_monitor': {'window_size': 2}, 'lr_monitor': {}, 'memory_monitor': {},
            'system_metrics_monitor': {}, 'runtime_estimator': {}, 'optimizer_monitor': {'batch_log_interval': 1}, 'nan_monitor': {},
            'step_monitor': {}}
EXPECTED_TAGS = [
    'loss/train/total', 'throughput/tokens_per_sec', 'throughput/device/tokens_per_sec', 'time/step_seconds',
    'lr-DecoupledAdamW/group0', 'l2_norm/grad/global', 'process/memory_rss_gib', 'process/cpu_percent',
    'cpu_percentage', 'cpu_memory_percent', 'time/remaining_estimate',
]


def test_default_tensorboard_logs_the_per_step_metrics(tiny_config, tmp_path):
    tiny_config.update(parallelism={'fsdp': None}, max_duration='6ba', callbacks=MONITORS)
    tiny_config.pop('loggers', None)  # the default: TensorBoard
    train(load(write_yaml(tiny_config, tmp_path / 'run.yaml'))).close()
    (events,) = glob.glob(str(tmp_path / 'checkpoints' / 'tiny' / 'tensorboard' / 'tiny' / 'events.out.tfevents.*'))
    accumulator = EventAccumulator(events)
    accumulator.Reload()
    tags = accumulator.Tags()['scalars']
    missing = [tag for tag in EXPECTED_TAGS if tag not in tags]
    assert missing == []
    assert [event.step for event in accumulator.Scalars('loss/train/total')] == [0, 1, 2, 3, 4, 5]
    assert all(5.5 < event.value < 7.0 for event in accumulator.Scalars('loss/train/total'))
    assert all(event.value > 0 for event in accumulator.Scalars('time/step_seconds'))


def test_plot_run_draws_every_logged_batch_across_invocations(tiny_config, tmp_path):
    from llmfoundry_ext.plotting import plot_run
    tiny_config.update(parallelism={'fsdp': None}, max_duration='6ba', callbacks={'speed_monitor': {'window_size': 2}})
    path = write_yaml(tiny_config, tmp_path / 'run.yaml')
    train(load(path, ['callbacks.stop_after.batches=4'])).close()
    train(load(path)).close()  # resumed: a second event file
    drawn = plot_run(str(tmp_path / 'checkpoints' / 'tiny' / 'tensorboard'), str(tmp_path / 'run.png'))
    # SpeedMonitor logs once its window (2) is full in an invocation: batches 3 and 4; the second invocation has
    # only 2 batches. MFU needs a GPU's peak FLOP/s: none on CPU.
    assert drawn == {'loss/train/total': 6, 'throughput/device/tokens_per_sec': 2, 'throughput/device/mfu': 0}
    assert open(tmp_path / 'run.png', 'rb').read(8) == b'\x89PNG\r\n\x1a\n'
