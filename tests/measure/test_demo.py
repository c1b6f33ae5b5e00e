"""What the config builds: per-step metrics land in TensorBoard next to the checkpoints by default."""
import os
import re

from llmfoundry_ext.measure.plotting import plot_run, read_scalars
from llmfoundry_ext.train import train
from llmfoundry_ext.preflight import prepare
from tests.conftest import REPO, demo_data, write_yaml

MONITORS = {'speed_monitor': {'window_size': 2}, 'lr_monitor': {}, 'memory_monitor': {},
            'system_metrics_monitor': {}, 'runtime_estimator': {}, 'optimizer_monitor': {'batch_log_interval': 1},
            'nan_monitor': {}, 'step_monitor': {}}
EXPECTED_TAGS = [
    'loss/train/total', 'throughput/tokens_per_sec', 'throughput/device/tokens_per_sec', 'time/step_seconds',
    'lr-DecoupledAdamW/group0', 'l2_norm/grad/global', 'process/memory_rss_gib', 'process/cpu_percent',
    'cpu_percentage', 'cpu_memory_percent', 'time/remaining_estimate',
]


def test_demo_run_on_cpu_logs_the_per_step_metrics_to_tensorboard(tmp_path):
    monitors = [f'callbacks.{name}={value}' for name, value in MONITORS.items()]
    run = prepare(os.path.join(REPO, 'yamls', 'demo.yaml'), [
        f'variables.data_root={demo_data(tmp_path / "data")}', f'checkpoint.save_folder={tmp_path}/{{run_name}}',
        f'callbacks.sample_ledger.folder={tmp_path}/ledger', 'max_duration=6ba', 'global_batch_size=4',
        'model.n_layers=2', 'parallelism.fsdp=null', *monitors])
    train(run).close()
    scalars = read_scalars(str(tmp_path / 'demo' / 'tensorboard'))
    missing = [tag for tag in EXPECTED_TAGS if tag not in scalars]
    assert missing == []
    assert [step for step, _ in scalars['loss/train/total']] == [0, 1, 2, 3, 4, 5]
    assert all(7.0 < loss < 8.5 for _, loss in scalars['loss/train/total'])  # ln(2048) = 7.6
    assert all(seconds > 0 for _, seconds in scalars['time/step_seconds'])
    (evaluation,) = scalars['metrics/eval/LanguageCrossEntropy']  # at the end of training only (interval: 50ba)
    assert evaluation[0] == 6 and 7.0 < evaluation[1] < 8.5


def test_plot_run_draws_every_logged_batch_across_invocations(tiny_config, tmp_path):
    from llmfoundry_ext.measure.demo import evaluation_curves
    tiny_config.update(parallelism={'fsdp': None}, max_duration='6ba', callbacks={'speed_monitor': {'window_size': 2}},
                       eval_interval='2ba')
    tiny_config['data']['eval'] = {'streams': {'b': {'local': tiny_config['data']['train']['streams']['b']['local']}},
                                   'shuffle': False}
    path = write_yaml(tiny_config, tmp_path / 'run.yaml')
    train(prepare(path, ['callbacks.stop_after.batches=4'])).close()
    train(prepare(path)).close()  # resumed: a second event file
    tensorboard = str(tmp_path / 'checkpoints' / 'tiny' / 'tensorboard')
    drawn = plot_run(tensorboard, str(tmp_path / 'run.png'))
    # SpeedMonitor logs once its window (2) is full in an invocation: batches 3 and 4; the second invocation has
    # only 2 batches. MFU needs a GPU's peak FLOP/s: on the CPU it is not logged, and has no panel.
    assert drawn == {'loss/train/total': 6, 'metrics/eval/LanguageCrossEntropy': 3,
                     'throughput/device/tokens_per_sec': 2}
    assert re.findall(r'(\d+): \d\.\d\d', evaluation_curves(tensorboard)) == ['2', '4', '6']
    assert open(tmp_path / 'run.png', 'rb').read(8) == b'\x89PNG\r\n\x1a\n'
