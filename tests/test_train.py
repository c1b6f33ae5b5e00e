"""Training end to end: order-change warnings, eval, Mixtral's logged loss parts, masked LM, the parallel layout of a
launch (kill -9 and autoresume: tests/measure/test_chaos.py)."""
import math
import os
import subprocess

import pytest
import torch
from omegaconf import OmegaConf

from llmfoundry_ext.build import build_collator
from llmfoundry_ext.config import load
from llmfoundry_ext.preflight import prepare
from llmfoundry_ext import use_expandable_segments
from llmfoundry_ext.train import checkpoint_line, context_parallel_layout, train, write_resolved_config
from tests.conftest import FORKED, REPO, write_yaml


def test_resume_warns_when_the_data_order_settings_changed(tiny_config, tmp_path, capsys):
    tiny_config['parallelism'] = {'fsdp': None}
    tiny_config['max_duration'] = '2ba'
    path = write_yaml(tiny_config, tmp_path / 'run.yaml')
    train(prepare(path)).close()
    train(prepare(path, ['max_duration=3ba', 'data.train.shuffle_seed=4', 'data.train.num_workers=1'])).close()
    warnings = [line for line in capsys.readouterr().out.splitlines() if line.startswith('warning:')]
    assert warnings == ['warning: data.train.shuffle_seed changed since the checkpointed run (3 -> 4): the sample '
                        'order will not continue exactly where it stopped']


def test_the_recorded_config_names_the_tokenizer_from_anywhere(tiny_config, tmp_path, monkeypatch):
    """config.yaml, which scripts/evaluate.py and the exports read from any folder, holds the tokenizer's absolute
    path where the YAML gave it relative to the folder the run trained in."""
    monkeypatch.chdir(tmp_path)
    os.makedirs('tokenizer')
    tiny_config['data']['tokenizer'] = 'tokenizer'
    config = load(write_yaml(tiny_config, tmp_path / 'run.yaml'))
    write_resolved_config(config)
    recorded = OmegaConf.load(os.path.join(config.checkpoint_folder, 'config.yaml'))
    given = tiny_config['data']['train']['streams']
    assert recorded.data.tokenizer == str(tmp_path / 'tokenizer')
    assert {name: stream.local for name, stream in recorded.data.train.streams.items()} == {
        name: stream['local'] for name, stream in given.items()}  # the streams as given


@pytest.mark.parametrize('users', [{}, {'PYTORCH_CUDA_ALLOC_CONF': 'max_split_size_mb:512'}])
def test_the_allocator_grows_its_segments_unless_the_user_set_it_up(users, monkeypatch):
    for name in ('PYTORCH_ALLOC_CONF', 'PYTORCH_CUDA_ALLOC_CONF', 'PYTORCH_HIP_ALLOC_CONF'):
        monkeypatch.delenv(name, raising=False)
    for name, value in users.items():
        monkeypatch.setenv(name, value)
    use_expandable_segments()
    settings = {name: os.environ[name] for name in os.environ if name.endswith('ALLOC_CONF')}
    assert settings == (users or {'PYTORCH_ALLOC_CONF': 'expandable_segments:True'})


def test_the_allocator_is_set_up_before_torch_is_imported(trainer_import):
    """PyTorch reads its allocator settings when imported: importing the trainer (as ``train.py`` does) sets them
    before the first import of torch."""
    assert trainer_import['allocator_when_torch_imported'] == ['expandable_segments:True']


def test_a_training_run_imports_none_of_the_tools(trainer_import):
    """What ``train.py`` imports holds no module of ``llmfoundry_ext.measure`` (the benchmarks, profiler, chaos trials,
    demo) and nothing of data_prep."""
    loaded = [name for name in trainer_import['modules'] if name.startswith(('llmfoundry_ext', 'data_prep'))]
    assert len(loaded) > 30 and 'llmfoundry_ext.trainer' in loaded
    assert [name for name in loaded if name.startswith(('llmfoundry_ext.measure', 'data_prep'))] == []


def test_eval_logs_loss_and_perplexity(tiny_config, tmp_path):
    from llmfoundry_ext.train import logged_history
    tiny_config.update(parallelism={'fsdp': None}, max_duration='4ba', eval_interval='2ba', loggers={'in_memory': {}})
    tiny_config['data']['eval'] = {'streams': {'b': {'local': tiny_config['data']['train']['streams']['b']['local']}},
                                   'shuffle': False}
    trainer = train(prepare(write_yaml(tiny_config, tmp_path / 'run.yaml')))
    history = logged_history(trainer)
    trainer.close()
    losses = [(int(t.batch), float(v)) for t, v in history['metrics/eval/LanguageCrossEntropy']]
    perplexities = [float(v) for _, v in history['metrics/eval/LanguagePerplexity']]
    assert [batch for batch, _ in losses] == [2, 4]
    assert perplexities == pytest.approx([math.exp(loss) for _, loss in losses], rel=1e-5)
    assert 5.5 < losses[0][1] < 7.0  # random tokens over a 512 vocabulary: about ln(512) = 6.24


def test_mixtral_logs_its_loss_parts_and_the_experts_load(tiny_config, tmp_path):
    """total = cross-entropy + 0.02 x router_aux at every batch; each batch's expert shares sum to 1."""
    from llmfoundry_ext.train import logged_history
    tiny_config['model'] = {**tiny_config['model'], 'family': 'mixtral', 'n_experts': 4}
    tiny_config.update(parallelism={'fsdp': None}, max_duration='3ba', eval_interval='3ba', loggers={'in_memory': {}})
    tiny_config['data']['eval'] = {'streams': {'b': {'local': tiny_config['data']['train']['streams']['b']['local']}}}
    trainer = train(prepare(write_yaml(tiny_config, tmp_path / 'run.yaml')))
    history = {name: [float(value) for _, value in values] for name, values in logged_history(trainer).items()}
    trainer.close()
    totals, entropies, aux = (history[f'loss/train/{part}'] for part in ('total', 'cross_entropy', 'router_aux'))
    assert len(totals) == 3
    assert totals == pytest.approx([entropy + 0.02 * a for entropy, a in zip(entropies, aux)], abs=1e-6)
    shares = [history[f'router/load/expert_{expert}'] for expert in range(4)]
    assert [sum(batch) for batch in zip(*shares)] == pytest.approx([1.0, 1.0, 1.0])
    # aux = E x sum_e P_e x k x share_e, P the mean router probabilities (summing to 1): an average of E x k x share_e
    # weighted by P, so between E x k x the smallest share and E x k x the largest (k = 2 when balanced), whatever the
    # weights drawn
    for batch_aux, batch_shares in zip(aux, zip(*shares)):
        assert 4 * 2 * min(batch_shares) - 1e-6 <= batch_aux <= 4 * 2 * max(batch_shares) + 1e-6
    assert all(1.0 <= load <= 2.0 for load in history['router/max_load'])  # at most E/k = 2
    assert 5.5 < history['metrics/eval/LanguageCrossEntropy'][0] < 7.0


def test_masked_lm_trains_on_masked_positions_only(tiny_config, tmp_path):
    tiny_config.update(parallelism={'fsdp': None}, max_duration='2ba',
                       objective={'name': 'mlm', 'mask_token_id': 1, 'mask_probability': 0.3})
    tiny_config['model']['causal'] = False
    run = prepare(write_yaml(tiny_config, tmp_path / 'run.yaml'))
    batch = build_collator(run)([{'tokens': torch.arange(2, 40), 'sample_id': 5}])
    masked = batch['input_ids'] == 1
    assert masked.any() and torch.equal(batch['labels'][masked], torch.arange(2, 34)[masked[0]])
    trainer = train(run)
    assert 5.5 < float(trainer.state.loss) < 7.0  # about ln(512) on random tokens
    trainer.close()


LAYOUT_SCRIPT = """
import sys
from composer.utils import dist, get_device
from llmfoundry_ext.build import build_trainer
from llmfoundry_ext.preflight import prepare
from llmfoundry_ext.train import parallel_layout
dist.initialize_dist(get_device(None))
trainer = build_trainer(prepare(sys.argv[1]))
block = trainer.state.model.model.layers[1]
print(f'rank {dist.get_global_rank()}: {parallel_layout(trainer)}; block 1 {type(block).__name__} on mesh '
      f'{next(block.parameters()).device_mesh.mesh_dim_names}', flush=True)
"""


@pytest.mark.slow
def test_replicate_degree_builds_an_hsdp_mesh(tiny_config, tmp_path):
    """The mesh and the per-block layout (training: tests/test_parallelism.py's HSDP 2 x 2)."""
    tiny_config['parallelism']['fsdp'].update(replicate_degree=2, activation_checkpointing='full', checkpoint_every=2)
    script = tmp_path / 'layout.py'
    script.write_text(LAYOUT_SCRIPT)
    run = subprocess.run([*FORKED, '-n', '2', str(script), write_yaml(tiny_config, tmp_path / 'hsdp.yaml')],
                         cwd=REPO, capture_output=True, text=True, timeout=300,
                         env={**os.environ, 'OMP_NUM_THREADS': '1', 'PYTHONPATH': REPO})
    assert run.returncode == 0, run.stderr[-2000:]
    # composer shows rank 0's output; block 1 (not checkpointed: every 2nd from block 0) is sharded over both dims
    assert ("rank 0: HSDP 2 replicas x 1 shards; block 1 FSDPTransformerBlock on mesh "
            "('data_parallel_replicate', 'data_parallel_shard')") in run.stdout


def test_start_summary_says_where_checkpoints_go_or_that_none_are_written(tiny_config, tmp_path, monkeypatch):
    saving = load(write_yaml(tiny_config, tmp_path / 'run.yaml'), ['run_name=r1'])
    assert checkpoint_line(saving) == f"  checkpoints in {tmp_path / 'checkpoints' / 'r1'}"
    none = load(write_yaml(tiny_config, tmp_path / 'run.yaml'), ['checkpoint.save_folder=null',
                                                                 'checkpoint.autoresume=false'])
    assert checkpoint_line(none) == '  no checkpoints (checkpoint.save_folder is null)'
    assert context_parallel_layout(none) == ''
    monkeypatch.setenv('WORLD_SIZE', '2')
    split = load(write_yaml(tiny_config, tmp_path / 'run.yaml'), ['parallelism.context_parallel_degree=2'])
    assert context_parallel_layout(split) == ', each sequence split over 2 GPUs (context parallel)'


def test_an_optimizer_named_without_lr_trains_at_the_documented_default(tiny_config, tmp_path, capsys):
    """A YAML that names its optimizer replaces the default dict; the lr it leaves out is still the reference's 3e-4
    (torch's AdamW alone would take 1e-3), and the start summary says so."""
    tiny_config.update(max_duration='1ba', scheduler=None, parallelism={'fsdp': None},
                       optimizer={'name': 'adamw', 'betas': [0.9, 0.95]})
    trainer = train(prepare(write_yaml(tiny_config, tmp_path / 'run.yaml')))
    trainer.close()
    assert [group['lr'] for group in trainer.state.optimizers[0].param_groups] == [3e-4]
    assert '  optimizer adamw (betas [0.9, 0.95], lr 0.0003 default); scheduler none (a constant rate)' in (
        capsys.readouterr().out.splitlines())


def test_the_start_summary_names_the_float8_recipe_and_the_report_of_its_held_out_loss():
    from llmfoundry_ext.config import ModelConfig, model_config_class
    from llmfoundry_ext.plan.run_plan import PRECISION_REPORT
    from llmfoundry_ext.train import float8_text

    report = 'benchmarks/time-to-quality_h200_2026-11-29.md'
    assert PRECISION_REPORT == report and os.path.isfile(os.path.join(REPO, report))
    assert float8_text(ModelConfig(float8=True, compile=True)) == (
        f', float8 tensorwise (blocks; held-out loss: {report})')
    assert float8_text(ModelConfig(float8=True, compile=True, float8_output=True, float8_recipe='rowwise')) == (
        f', float8 rowwise (blocks and output layer; held-out loss: {report})')
    assert float8_text(ModelConfig(float8=False)) == ''
    mixtral = model_config_class('mixtral')
    assert float8_text(mixtral(float8=True, compile=True, float8_output=True, float8_experts=True)) == (
        f", float8 tensorwise (blocks, experts and output layer; held-out loss: {report}; the experts' not measured "
        'yet)')
