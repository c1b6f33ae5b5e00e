"""The typed config: presets, overrides, and one clear line for each kind of bad config."""
import copy
import json
import os
import shutil
import subprocess
import sys

import pytest
import torch

from llmfoundry_ext.config import ConfigError, load
from llmfoundry_ext.data.manifest import file_sha256
from llmfoundry_ext.model.attention import has_module
from tests.conftest import REPO, write_yaml


def test_preset_fills_the_architecture_under_yaml_keys(tiny_config, tmp_path):
    config = load(write_yaml(tiny_config, tmp_path / 'run.yaml'), ['model.n_layers=3', 'optimizer.lr=0.01'])
    assert (config.model.dim, config.model.n_layers, config.model.rope_theta) == (64, 3, 10000.0)
    assert config.optimizer == {'name': 'decoupled_adamw', 'lr': 0.01}
    assert config.tokens_per_step == 8 * 32
    assert config.data.train.streams['a'].proportion == 0.75


def test_variables_are_resolved_and_dropped(tiny_config, tmp_path):
    tiny_config['variables'] = {'steps': 7}
    tiny_config['max_duration'] = '${variables.steps}ba'
    assert load(write_yaml(tiny_config, tmp_path / 'run.yaml')).max_duration == '7ba'


def change(path: str, value):
    """A function that sets ``path`` (dotted) in a config dict; value ``DELETE`` removes the key."""
    def apply(config: dict):
        *parents, last = path.split('.')
        for key in parents:
            config = config.setdefault(key, {})
        if value == 'DELETE':
            del config[last]
        else:
            config[last] = value
    return apply


def changes(*pairs):
    def apply(config: dict):
        for path, value in pairs:
            change(path, value)(config)
    return apply


BAD_CONFIGS = [
    (change('global_batch', 8),
     "global_batch: unknown key; did you mean 'global_batch_size'?"),
    (change('model.n_layer', 2),
     "model.n_layer: unknown key; did you mean 'n_layers'?"),
    (change('data.train.streams.a.proportoin', 0.5),
     "data.train.streams.a.proportoin: unknown key; did you mean 'proportion'?"),
    (change('global_batch_size', 'eight'),
     "global_batch_size: expected int, got str 'eight'"),
    (change('global_batch_size', True),
     'global_batch_size: expected int, got bool True'),
    (change('global_batch_size', -8),
     'global_batch_size: must be positive, got -8'),
    (change('device_microbatch_size', 3),
     'device_microbatch_size: 3 does not divide the per-device batch 8 (global_batch_size 8 / 1 devices); '
     'pick a divisor of 8'),
    (change('max_duration', 'DELETE'),
     'max_duration: missing required key'),
    (change('max_duration', '100 batches'),
     "max_duration: '100 batches' is not a duration; write e.g. 1000ba, 2ep, 1000000tok or 5000sp"),
    (change('data.train.streams.a.local', '/nonexistent/mds'),
     'data.train.streams.a.local: no MDS dataset at /nonexistent/mds (index.json missing) and no remote set; '
     'run data_prep/convert_to_mds.py or fix the path'),
    (change('data.train.streams.a.proportion', None),
     'data.train.streams: give a proportion to every stream or to none'),
    (change('callbacks.speed_monitr', {}),
     "callbacks.speed_monitr: unknown callbacks name 'speed_monitr'; did you mean 'speed_monitor'?"),
    (change('callbacks.speed_monitor', {'window': 5}),
     "callbacks.speed_monitor.window: not an argument of SpeedMonitor; did you mean 'window_size'?"),
    (change('loggers.tensorbord', {}),
     "loggers.tensorbord: unknown loggers name 'tensorbord'; did you mean 'tensorboard'?"),
    (change('optimizer.name', 'adam'),
     "optimizer.name: unknown optimizer name 'adam'; did you mean 'adamw'?"),
    (change('scheduler.t_warmpu', '2ba'),
     "scheduler.t_warmpu: not an argument of CosineAnnealingWithWarmupScheduler; did you mean 't_warmup'?"),
    (change('model.preset', '7b'),
     "model.preset: unknown preset '7b'; choose one of debug, 1b, 3b, 8b, 70b"),
    (change('model.n_heads', 5),
     'model.dim: 64 is not divisible by model.n_heads 5'),
    (change('max_seq_len', 128),
     'max_seq_len: 128 exceeds model.max_seq_len 64; raise model.max_seq_len or shorten max_seq_len'),
    (change('precision', 'bf16'),
     "precision: 'bf16' is not one of fp32, amp_bf16, amp_fp16, amp_fp8"),
    (change('model.attn_impl', 'flash'),
     "model.attn_impl: attn_impl 'flash' needs the flash-attn package, which is not installed: pip install "
     "'llmfoundry_ext[gpu]' (or the ROCm build on AMD), or set model.attn_impl=auto"),
    (change('model.attn_impl', 'fast'),
     "model.attn_impl: attn_impl 'fast' is unknown; choose one of auto, sdpa, flash, varlen, flex, eager"),
    (change('model.sdpa_kernel', 'cudnn9'),
     "model.sdpa_kernel: 'cudnn9' is not one of auto, cudnn, flash, efficient, math"),
    (change('model.fused_kernels', ['layer_norm']),
     "model.fused_kernels: unknown fused kernel 'layer_norm'; choose from cross_entropy, rms_norm, swiglu, rope"),
    (change('model.float8', True),
     'model.float8: float8 training needs an H100-class GPU (compute capability 8.9+); set model.float8=false'),
    (change('parallelism.fsdp.activation_checkpointing', 'some'),
     "parallelism.fsdp.activation_checkpointing: 'some' is not one of none, full, selective"),
    (change('parallelism.fsdp.activation_checkpointing', True),
     'parallelism.fsdp.activation_checkpointing: expected str, got bool True'),
    (change('parallelism.fsdp.checkpoint_every', 0),
     'parallelism.fsdp.checkpoint_every: must be >= 1, got 0'),
    (change('parallelism.fsdp.replicate_degree', 3),
     'parallelism.fsdp.replicate_degree: 3 does not divide the world size 1'),
    (change('parallelism.fsdp.reshard', True),
     "parallelism.fsdp.reshard: unknown key; did you mean 'reshard_after_forward'?"),
    (change('checkpoint.save_folder', None),
     'checkpoint.autoresume: needs checkpoint.save_folder to resume from; set a save_folder or '
     'checkpoint.autoresume=false'),
    (change('objective.name', 'bert'),
     "objective.name: 'bert' is not one of clm, mlm"),
    (change('model.causal', False),
     'model.causal: false lets every position see its label under objective clm; set model.causal=true or '
     'objective.name=mlm'),
    (change('objective.name', 'mlm'),
     'model.causal: masked LM needs bidirectional attention; set model.causal=false'),
    (changes(('objective.name', 'mlm'), ('model.causal', False)),
     "objective.mask_token_id: not set and no data.tokenizer to look up '<|reserved_special_token_100|>' in; "
     "set one of them"),
    (changes(('objective.name', 'mlm'), ('model.causal', False), ('objective.mask_token_id', 512)),
     'objective.mask_token_id: 512 is outside the vocabulary (model.vocab_size 512)'),
    (change('data.document_masking', True),
     "data.eos_token_id: not set and no data.tokenizer to look up '<|end_of_text|>' in; set one of them"),
    (change('data.train.streams', []),
     'data.train.streams: expected a mapping, got list []'),
]


@pytest.mark.skipif(torch.cuda.is_available(), reason='the CPU messages of backends a GPU machine may have')
@pytest.mark.parametrize('key, value, message', [
    ('model.attn_impl', 'varlen',
     f"model.attn_impl: attn_impl 'varlen' needs torch.nn.attention.varlen (PyTorch >= 2.10; this is "
     f"{torch.__version__}): upgrade torch, or set model.attn_impl=flex, flash or auto"),
    ('model.fused_kernels', ['cross_entropy'],
     "model.fused_kernels: fused kernels need the liger-kernel package, which is not installed: "
     "pip install 'llmfoundry_ext[gpu]', or set model.fused_kernels=[]"),
    ('model.attn_impl', 'flex',
     f"model.attn_impl: 'flex' trains only on a GPU (on the CPU, torch {torch.__version__}'s inductor fails to "
     f"compile its backward); set model.attn_impl=auto or sdpa on the CPU"),
])
def test_missing_backend_or_kernel_is_one_line(tiny_config, tmp_path, key, value, message):
    if value == 'varlen' and has_module('torch.nn.attention.varlen'):
        pytest.skip('this torch has varlen attention')
    if key == 'model.fused_kernels' and has_module('liger_kernel'):
        pytest.skip('liger-kernel is installed')
    config = copy.deepcopy(tiny_config)
    change(key, value)(config)
    with pytest.raises(ConfigError) as caught:
        load(write_yaml(config, tmp_path / 'run.yaml'))
    assert str(caught.value) == message


@pytest.mark.parametrize('mutate, message', BAD_CONFIGS, ids=[m for _, m in BAD_CONFIGS])
def test_bad_config_is_one_line_naming_the_key(tiny_config, tmp_path, mutate, message):
    config = copy.deepcopy(tiny_config)
    mutate(config)
    with pytest.raises(ConfigError) as caught:
        load(write_yaml(config, tmp_path / 'run.yaml'))
    assert str(caught.value) == message


def test_global_batch_must_split_over_the_world(tiny_config, tmp_path, monkeypatch):
    monkeypatch.setenv('WORLD_SIZE', '3')
    with pytest.raises(ConfigError) as caught:
        load(write_yaml(tiny_config, tmp_path / 'run.yaml'))
    assert str(caught.value) == 'global_batch_size: 8 is not divisible by the world size 3; use a multiple of 3'


@pytest.fixture
def tokenizer_folder(tmp_path) -> str:
    from data_prep.train_tokenizer import train_bpe
    folder = tmp_path / 'tokenizer'
    folder.mkdir()
    train_bpe([f'word{i} and more words {i * 7}' for i in range(200)], vocab_size=300).save(
        str(folder / 'tokenizer.json'))
    return str(folder)


def test_tokenizer_larger_than_the_model_vocabulary(tiny_config, tmp_path, tokenizer_folder):
    tiny_config['data']['tokenizer'] = tokenizer_folder
    tiny_config['model']['vocab_size'] = 100
    with pytest.raises(ConfigError) as caught:
        load(write_yaml(tiny_config, tmp_path / 'run.yaml'))
    assert str(caught.value) == 'data.tokenizer: its vocabulary has 300 ids but model.vocab_size is 100; ' \
                                'set model.vocab_size >= 300'


def test_shards_from_another_tokenizer(tiny_config, tmp_path, tokenizer_folder):
    stream = tmp_path / 'other'
    shutil.copytree(tiny_config['data']['train']['streams']['a']['local'], stream)
    manifest = json.loads((stream / 'manifest.json').read_text())
    (stream / 'manifest.json').write_text(json.dumps({**manifest, 'tokenizer_sha256': 'f00d' * 16}))
    tiny_config['data']['tokenizer'] = tokenizer_folder
    tiny_config['data']['train']['streams']['a']['local'] = str(stream)
    with pytest.raises(ConfigError) as caught:
        load(write_yaml(tiny_config, tmp_path / 'run.yaml'))
    digest = file_sha256(os.path.join(tokenizer_folder, 'tokenizer.json'))
    assert str(caught.value) == (
        f'data.train.streams.a: its shards were tokenized with another tokenizer than data.tokenizer '
        f'{tokenizer_folder} (sha256 f00df00df00d vs {digest[:12]}); point data.tokenizer at the one named in '
        f'{stream}/manifest.json or re-convert')


def test_override_without_equals_sign(tiny_config, tmp_path):
    with pytest.raises(ConfigError) as caught:
        load(write_yaml(tiny_config, tmp_path / 'run.yaml'), ['global_batch_size'])
    assert str(caught.value) == "override 'global_batch_size': expected key=value, e.g. global_batch_size=64"


def test_train_script_prints_one_line_and_no_traceback(tiny_config, tmp_path):
    path = write_yaml(tiny_config, tmp_path / 'run.yaml')
    result = subprocess.run([sys.executable, 'train.py', path, 'model.n_layer=3'], cwd=REPO,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert result.stderr == "config error: model.n_layer: unknown key; did you mean 'n_layers'?\n"
