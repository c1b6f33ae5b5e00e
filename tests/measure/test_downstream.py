"""The downstream benchmark's run on one GPU or two (the same global batch) and its metrics beside another run's."""
import json
from types import SimpleNamespace

import pytest
from omegaconf import OmegaConf

from llmfoundry_ext.measure.downstream import metric_differences, print_differences, print_report, run_yaml
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
    path = run_yaml(args, data, {'yaml': str(tmp_path / 'task.yaml')}, str(tmp_path))
    assert OmegaConf.load(path).model.init_from == str(tmp_path / 'init')  # the same first weights on 1 GPU and 2
    config = load(path, ['model.init_from=null'])  # (the run writes init before it trains)
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


def test_the_checkpoint_scored_again_in_one_process_stands_beside_the_last_in_loop_evaluation(capsys):
    metrics = {ACC: 0.257, NORM: 0.28}
    report = {'device': 'NVIDIA H200', 'gpus': 2, 'torch': '2.11', 'task': {'questions': 1000}, 'batches': 200,
              'hf': [], 'ours': {'evaluations': [(100, 10.2), (200, 1.4)], 'metrics': metrics,
                                 'share_of_1000_batches': 0.0079, 'tokens_per_second': 46462.0},
              'rescored': {'seconds': 3.375, 'metrics': {ACC: 0.257, NORM: 0.282}, 'loglikelihood_differences': {
                  'max_abs': 0.7322, 'mean_abs': 0.0971, 'questions_picked_differently': 0}}}
    print_report(report)
    assert capsys.readouterr().out.splitlines()[-2:] == [
        'ours, 1 process            3.38  0.2570    0.2820                0.7322/0.0971             0',
        'an evaluation every 1,000 batches: 0.79 % of the run (training at 46,462 tokens/s a GPU)']
