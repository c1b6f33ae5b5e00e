"""Preflight: the config against this machine (files, packages, GPUs, tokenizer, registered names), one clear
line for each problem, and the values it resolves."""
import json
import os
import shutil

import pytest
import torch

from llmfoundry_ext.data.mds import file_sha256
from llmfoundry_ext.errors import ConfigError
from llmfoundry_ext.config import load
from llmfoundry_ext.model.attention import choose_backend, has_module
from llmfoundry_ext.preflight import check_context_parallel_kernels, prepare
from tests.conftest import change, changes, config_error, write_yaml

BAD_ENVIRONMENTS = [
    (change('data.train.streams.a.local', '/nonexistent/mds'),
     'data.train.streams.a.local: no MDS dataset at /nonexistent/mds (index.json missing) and no remote set; '
     'run data_prep/convert_to_mds.py or fix the path'),
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
    (change('model.attn_impl', 'flash'),
     "model.attn_impl: attn_impl 'flash' needs the flash-attn package, which is not installed: pip install "
     "'llmfoundry_ext[gpu]' (or the ROCm build on AMD), or set model.attn_impl=auto"),
    (change('model.attn_impl', 'fast'),
     "model.attn_impl: attn_impl 'fast' is unknown; choose one of auto, sdpa, flash, varlen, flex, eager"),
    (change('model.fused_kernels', ['layer_norm']),
     "model.fused_kernels: unknown fused kernel 'layer_norm'; choose from cross_entropy, rms_norm, swiglu, rope"),
    (change('model.float8', True),
     'model.float8: float8 training needs an H100-class GPU (compute capability 8.9+); set model.float8=false'),
    (changes(('objective.name', 'mlm'), ('model.causal', False)),
     "objective.mask_token_id: not set and no data.tokenizer to look up '<|reserved_special_token_100|>' in; "
     "set one of them"),
    (changes(('objective.name', 'mlm'), ('model.causal', False), ('objective.mask_token_id', 512)),
     'objective.mask_token_id: 512 is outside the vocabulary (model.vocab_size 512)'),
    (change('data.document_masking', True),
     "data.eos_token_id: not set and no data.tokenizer to look up '<|end_of_text|>' in; set one of them"),
    (changes(('parallelism.fsdp.activation_checkpointing', 'full_except_attention'), ('model.attn_impl', 'eager')),
     "parallelism.fsdp.activation_checkpointing: full_except_attention keeps the attention kernel's outputs, and "
     "attn_impl 'eager' runs no kernel op it can keep; set model.attn_impl to sdpa, flex, varlen (sdpa_kernel not "
     "math), or activation_checkpointing=full"),
    (changes(('parallelism.fsdp.activation_checkpointing', 'full_except_attention'), ('model.sdpa_kernel', 'math')),
     "parallelism.fsdp.activation_checkpointing: full_except_attention keeps the attention kernel's outputs, and "
     "sdpa_kernel 'math' runs no kernel op it can keep; set model.attn_impl to sdpa, flex, varlen (sdpa_kernel not "
     "math), or activation_checkpointing=full"),
]


@pytest.mark.parametrize('mutate, message', BAD_ENVIRONMENTS, ids=[m for _, m in BAD_ENVIRONMENTS])
def test_bad_environment_is_one_line_naming_the_key(tiny_config, tmp_path, mutate, message):
    assert config_error(prepare, tiny_config, tmp_path, mutate) == message


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
    assert config_error(prepare, tiny_config, tmp_path, change(key, value)) == message


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
        prepare(write_yaml(tiny_config, tmp_path / 'run.yaml'))
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
        prepare(write_yaml(tiny_config, tmp_path / 'run.yaml'))
    digest = file_sha256(os.path.join(tokenizer_folder, 'tokenizer.json'))
    assert str(caught.value) == (
        f'data.train.streams.a: its shards were tokenized with another tokenizer than data.tokenizer '
        f'{tokenizer_folder} (sha256 f00df00df00d vs {digest[:12]}); point data.tokenizer at the one named in '
        f'{stream}/manifest.json or re-convert')


@pytest.mark.parametrize('overrides, backend, on_gpu, message', [
    ([], 'sdpa', False, 'parallelism.context_parallel_degree: context parallelism needs GPUs (ring attention runs '
                        'CUDA kernels) and none is visible; set parallelism.context_parallel_degree=1'),
    (['precision=amp_bf16'], 'varlen', True, "model.attn_impl: 'varlen' cannot run under context parallelism "
                                             "(PyTorch's covers sdpa and flex); set model.attn_impl=auto"),
    (['precision=amp_bf16', 'data.document_masking=true'], 'sdpa', True,
     'model.attn_impl: sdpa under context parallelism masks only causally, not by document; set model.attn_impl=auto '
     '(flex) or data.document_masking=false'),
    (['precision=amp_bf16', 'model.sdpa_kernel=math'], 'sdpa', True,
     "model.sdpa_kernel: 'math' has no ring attention under context parallelism; set model.sdpa_kernel=auto"),
    ([], 'sdpa', True, 'precision: fp32 runs SDPA on its math kernel, which has no ring attention under context '
                       'parallelism; use precision=amp_bf16, or model.attn_impl=flex'),
    (['precision=amp_bf16'], 'flex', True, 'max_seq_len: 32 is not divisible by 256 (128-token flex blocks x '
                                           'parallelism.context_parallel_degree 2), which flex under context '
                                           'parallelism needs'),
], ids=['needs-gpus', 'varlen', 'sdpa-documents', 'math-kernel', 'fp32-sdpa', 'flex-blocks'])
def test_context_parallel_kernels_are_checked(tiny_config, tmp_path, monkeypatch, overrides, backend, on_gpu,
                                              message):
    monkeypatch.setenv('WORLD_SIZE', '2')
    config = load(write_yaml(tiny_config, tmp_path / 'run.yaml'), ['parallelism.context_parallel_degree=2',
                                                                   *overrides])
    with pytest.raises(ConfigError) as caught:
        check_context_parallel_kernels(config, backend, on_gpu)
    assert str(caught.value) == message


def test_context_parallel_auto_attention_is_sdpa_or_flex():
    assert choose_backend('auto', document_masking=False, on_gpu=True, context_parallel=True) == 'sdpa'
    expected = 'flex' if has_module('torch.nn.attention.flex_attention') else 'sdpa'
    assert choose_backend('auto', document_masking=True, on_gpu=True, context_parallel=True) == expected
