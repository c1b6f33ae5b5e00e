"""Downstream evaluation during training (the YAML's ``downstream`` section): the metrics it logs are the ones
scripts/evaluate.py gives the checkpoint of the same batch, training is untouched by it (the same losses and samples,
bit for bit), and two processes under FSDP2 give the metrics of one (CPU, fp32)."""
import json
import os
import subprocess

import pytest

from llmfoundry_ext.callbacks.sample_ledger import read_ledger
from llmfoundry_ext.preflight import prepare
from llmfoundry_ext.train import train
from scripts.evaluate import main as evaluate_main
from tests.conftest import COMPOSER, REPO, write_yaml
from tests.test_downstream import tasks_folder, texts_config, tokenizer_folder  # noqa: F401 (fixtures)

METRICS = ('arithmetic_choice/acc', 'arithmetic_choice/acc_norm', 'last_word/acc', 'last_word/perplexity')


def run_in(config: dict, folder, downstream: dict | None) -> dict:
    """``config`` saving under ``folder`` (checkpoints every 100 batches, the sample ledger), with ``downstream``."""
    config = {**config, 'checkpoint': {'save_folder': str(folder / 'checkpoints'), 'save_interval': '100ba'},
              'callbacks': {'sample_ledger': {'folder': str(folder / 'ledger')}}}
    if downstream:
        config['downstream'] = downstream
    return config


def downstream_metrics(results: dict) -> dict[str, float]:
    return {f'{task}/{key.split(",")[0]}': value for task, values in results['results'].items()
            for key, value in values.items() if f'{task}/{key.split(",")[0]}' in METRICS}


def in_loop(folder, batch: int) -> dict[str, float]:
    return downstream_metrics(json.loads((folder / 'checkpoints' / 'downstream' / f'ba{batch}.json').read_text()))


@pytest.mark.timeout(600)
def test_in_loop_metrics_are_the_checkpoints_and_training_is_untouched(texts_config, tasks_folder, tmp_path,
                                                                         capsys):
    downstream = {'tasks': ['arithmetic_choice', 'last_word'], 'include': [tasks_folder], 'interval': '100ba'}
    train(prepare(write_yaml(run_in(texts_config, tmp_path / 'plain', None), tmp_path / 'plain.yaml'))).close()
    train(prepare(write_yaml(run_in(texts_config, tmp_path / 'with', downstream), tmp_path / 'with.yaml'))).close()
    output = capsys.readouterr().out
    assert read_ledger(str(tmp_path / 'with' / 'ledger' / 'ledger-rank0.jsonl')) == read_ledger(
        str(tmp_path / 'plain' / 'ledger' / 'ledger-rank0.jsonl'))
    assert '  downstream every 100 batches: arithmetic_choice (240 examples), last_word (120 examples)' in output
    assert output.count('downstream at batch ') == 2
    for batch in (100, 200):
        checkpoint, = (tmp_path / 'with' / 'checkpoints').glob(f'ep*-ba{batch}-rank0.pt')  # the texts loop
        assert evaluate_main([str(checkpoint), '--tasks',
                              'arithmetic_choice', 'last_word', '--include', tasks_folder, '--json',
                              str(tmp_path / f'ba{batch}.json')]) == 0
        offline = downstream_metrics(json.loads((tmp_path / f'ba{batch}.json').read_text()))
        assert in_loop(tmp_path / 'with', batch) == pytest.approx(offline, rel=1e-6, abs=0)
    trail = ', '.join(f"{batch} {in_loop(tmp_path / 'with', batch)['arithmetic_choice/acc']:.4f}"
                      for batch in (100, 200))
    assert f'  arithmetic_choice/acc by batch: {trail}' in output


@pytest.mark.timeout(900)
def test_two_processes_under_fsdp2_give_the_metrics_of_one(texts_config, tasks_folder, tmp_path):
    downstream = {'tasks': ['arithmetic_choice', 'last_word'], 'include': [tasks_folder], 'interval': '100ba'}
    texts_config['parallelism'] = {'fsdp': {'state_dict_type': 'sharded'}}
    metrics = {}
    for processes in (1, 2):
        folder = tmp_path / f'{processes}'
        yaml = write_yaml(run_in(texts_config, folder, downstream), tmp_path / f'{processes}.yaml')
        run = subprocess.run([COMPOSER, '-n', str(processes), 'train.py', yaml], cwd=REPO, capture_output=True,
                             text=True, timeout=600, env={**os.environ, 'OMP_NUM_THREADS': '1'})
        assert run.returncode == 0, run.stderr[-3000:]
        metrics[processes] = [in_loop(folder, batch) for batch in (100, 200)]
    print(metrics)
    for one, two in zip(metrics[1], metrics[2]):
        assert two == pytest.approx(one, rel=1e-4, abs=0)
