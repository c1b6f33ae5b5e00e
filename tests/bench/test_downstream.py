"""The downstream benchmark's run on one GPU or two (the same global batch) and its metrics beside another run's."""
import json
from types import SimpleNamespace

import pytest

from llmfoundry_ext.bench.downstream import metric_differences, print_differences, run_yaml
from llmfoundry_ext.config import load

ACC = 'metrics/downstream/hellaswag_like/acc'
NORM = 'metrics/downstream/hellaswag_like/acc_norm'


@pytest.mark.parametrize('gpus, micro', [(1, 2), (2, 1)])
def test_the_run_keeps_its_global_batch_on_two_gpus_and_scores_the_task_every_interval(tmp_path, monkeypatch, gpus,
                                                                                        micro):
    monkeypatch.setenv('WORLD_SIZE', str(gpus))
    (tmp_path / 'tokenizer.json').write_text('{}')
    args = SimpleNamespace(gpus=gpus, batches=200, interval=100, batch_tokens=16384, overrides=['model.n_layers=3'])
    data = {'window': 8193, 'tokenizer': str(tmp_path / 'tokenizer.json'), 'mds': str(tmp_path / 'mds')}
    config = load(run_yaml(args, data, {'yaml': str(tmp_path / 'task.yaml')}, str(tmp_path)))
    assert (config.global_batch_size, config.device_microbatch_size, config.model.n_layers) == (2, micro, 3)
    assert (config.downstream.interval, config.downstream.tasks) == ('100ba', ['hellaswag_like'])
    assert config.checkpoint.save_interval == '200ba'


def test_each_evaluations_metrics_stand_beside_the_other_runs(tmp_path, capsys):
    two = {'gpus': 2, 'ours': {'metrics_by_batch': {100: {ACC: 0.25, NORM: 0.3}, 200: {ACC: 0.5, NORM: 0.4}}}}
    one = {'gpus': 1, 'ours': {'metrics_by_batch': {100: {ACC: 0.25, NORM: 0.3}, 200: {ACC: 0.48, NORM: 0.41}}}}
    (tmp_path / 'one.json').write_text(json.dumps(one))  # as --against reads it: the batches become text
    differences = metric_differences(two, json.loads((tmp_path / 'one.json').read_text()))
    assert differences['max_abs'] == pytest.approx(0.02)
    print_differences(differences)
    assert capsys.readouterr().out == (
        'batch 100: acc 0.2500 on 2 GPU(s), 0.2500 on 1, acc_norm 0.3000 on 2 GPU(s), 0.3000 on 1\n'
        'batch 200: acc 0.5000 on 2 GPU(s), 0.4800 on 1, acc_norm 0.4000 on 2 GPU(s), 0.4100 on 1\n'
        'largest |difference|: 0.0200\n')
