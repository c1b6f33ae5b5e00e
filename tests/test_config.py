"""The typed config: presets, overrides, includes, and one clear line for each kind of inconsistent value."""
import dataclasses
import json
import os
import subprocess
import sys

import pytest

from llmfoundry_ext.config import TrainConfig, build, load, read_yaml
from llmfoundry_ext.errors import ConfigError
from tests.conftest import REPO, change, changes, config_error, write_yaml


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


def test_includes_merge_in_order_under_the_yaml_with_its_variables(tiny_config, tmp_path):
    (tmp_path / 'common').mkdir()
    write_yaml({'seed': 1, 'max_duration': '${variables.steps}ba', 'optimizer': {'name': 'adamw', 'lr': 0.5},
                'model': {'fused_kernels': ['cross_entropy', 'rms_norm']}}, tmp_path / 'common' / 'a.yaml')
    write_yaml({'include': ['b.yaml'], 'seed': 2}, tmp_path / 'common' / 'nested.yaml')  # relative to its own file
    write_yaml({'seed': 3, 'eval_interval': '5ba'}, tmp_path / 'common' / 'b.yaml')
    tiny_config.pop('optimizer', None), tiny_config.pop('max_duration')
    tiny_config['model']['fused_kernels'] = ['rope']
    run = write_yaml({**tiny_config, 'include': ['common/a.yaml', 'common/nested.yaml'], 'variables': {'steps': 7},
                      'optimizer': {'name': 'adamw', 'lr': 0.01}}, tmp_path / 'run.yaml')
    config = load(run, ['seed=4'])
    assert (config.seed, config.max_duration, config.eval_interval) == (4, '7ba', '5ba')
    assert config.optimizer == {'name': 'adamw', 'lr': 0.01}
    assert config.model.fused_kernels == ['rope']  # a list is replaced whole
    assert load(run).seed == 2  # the later include over the earlier, the includer over its include


@pytest.mark.parametrize('files, message', [
    ({'run.yaml': {'include': ['common.yaml']}}, "run.yaml: include {tmp}/common.yaml: no such YAML file"),
    ({'run.yaml': {'include': 'common.yaml'}},
     "run.yaml: include: expected a list of YAML paths relative to this file, got str 'common.yaml'"),
    ({'run.yaml': {'include': ['a.yaml']}, 'a.yaml': {'include': ['run.yaml']}},
     'run.yaml: the includes go round: {tmp}/run.yaml -> {tmp}/a.yaml -> {tmp}/run.yaml'),
])
def test_a_bad_include_is_one_line_naming_the_file(tmp_path, files, message):
    for name, data in files.items():
        write_yaml(data, tmp_path / name)
    with pytest.raises(ConfigError) as caught:
        load(str(tmp_path / 'run.yaml'))
    assert str(caught.value) == f'{tmp_path}/' + message.format(tmp=tmp_path)


with open(os.path.join(REPO, 'tests', 'shipped_yamls_resolved.json')) as stored:
    SHIPPED_RESOLVED = json.load(stored)


@pytest.mark.parametrize('name', sorted(SHIPPED_RESOLVED))
def test_a_shipped_yaml_resolves_to_every_value_it_had_before_sharing_yamls_common(name):
    """tests/shipped_yamls_resolved.json: each shipped YAML's every key (defaults filled, presets not yet), as the
    YAMLs gave it before they included yamls/common/; a change to a shipped run's settings updates it on purpose."""
    config = build(TrainConfig, read_yaml(os.path.join(REPO, 'yamls', name)), '')
    assert json.loads(json.dumps(dataclasses.asdict(config), default=str)) == SHIPPED_RESOLVED[name]


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
    (change('data.train.streams.a.proportion', None),
     'data.train.streams: give a proportion to every stream or to none'),
    (change('model.preset', '7b'),
     "model.preset: unknown preset '7b' of family llama; choose one of debug, 1b, 3b, 8b, 70b, llama2-7b, "
     "llama2-13b, llama2-70b"),
    (change('model.n_heads', 5),
     'model.dim: 64 is not divisible by model.n_heads 5'),
    (change('max_seq_len', 128),
     'max_seq_len: 128 exceeds model.max_seq_len 64; raise model.max_seq_len or shorten max_seq_len'),
    (change('precision', 'bf16'),
     "precision: 'bf16' is not one of fp32, amp_bf16, amp_fp16, amp_fp8"),
    (change('model.sdpa_kernel', 'cudnn9'),
     "model.sdpa_kernel: 'cudnn9' is not one of auto, cudnn, flash, efficient, math; did you mean 'cudnn'?"),
    (change('model.float8_recipe', 'blockwise'),
     "model.float8_recipe: 'blockwise' is not one of tensorwise, rowwise"),
    (changes(('model.float8', True), ('max_seq_len', 33), ('model.max_seq_len', 64), ('device_microbatch_size', 2)),
     'model.float8: a micro-batch is 66 tokens a GPU, and float8 GEMMs need a multiple of 16 (their weight gradients '
     'sum over the tokens); make max_seq_len a multiple of 16'),
    (change('model.init_scheme', 'xavier'),
     "model.init_scheme: 'xavier' is not one of torchtitan, gpt2"),
    (change('parallelism.fsdp.activation_checkpointing', 'some'),
     "parallelism.fsdp.activation_checkpointing: 'some' is not one of none, full, selective, "
     "full_except_attention, auto"),
    (change('device_microbatch_size', 'largest'),
     "device_microbatch_size: expected int or 'auto', got str 'largest'"),
    (change('model.float8', 'yes'),
     "model.float8: expected bool or 'auto', got str 'yes'"),
    (change('parallelism.fsdp.activation_checkpointing', True),
     'parallelism.fsdp.activation_checkpointing: expected str, got bool True'),
    (change('parallelism.fsdp.checkpoint_every', 0),
     'parallelism.fsdp.checkpoint_every: must be positive, got 0'),
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
    (change('data.train.streams', []),
     'data.train.streams: expected a mapping, got list []'),
    (changes(('model.family', 'mixtral'), ('model.compile', True), ('precision', 'fp32')),
     "model.compile: the experts' compiled grouped GEMMs take bf16 only, and precision is fp32; use "
     'precision=amp_bf16 or model.compile=false'),
    (change('model.float8_output', True),
     'model.float8_output: needs model.float8=true (it is False); set both, or neither'),
    (changes(('model.float8', True), ('model.float8_output', True), ('model.compile', True),
             ('model.fused_kernels', ['cross_entropy'])),
     'model.float8_output: the output layer runs in float8 inside the compiled loss; set model.compile=true without '
     'cross_entropy in model.fused_kernels, or model.float8_output=false'),
    (change('model.float8_experts', True),
     'model.float8_experts: model.family llama has no experts; remove it or use a mixture of experts '
     '(model.family mixtral)'),
    (changes(('model.family', 'mixtral'), ('model.float8_experts', True)),
     'model.float8_experts: needs model.float8=true (it is False); set both, or neither'),
    (changes(('model.family', 'mixtral'), ('model.float8', 'auto'), ('model.float8_experts', True)),
     'model.float8_experts: needs model.float8=true (it is auto); set both, or neither'),
    (changes(('model.family', 'mixtral'), ('model.float8', True), ('model.float8_experts', True),
             ('model.ffn_dim', 100)),
     'model.float8_experts: float8 grouped GEMMs need model.dim (64) and model.ffn_dim (100) divisible by 16'),
]


@pytest.mark.parametrize('mutate, message', BAD_CONFIGS, ids=[m for _, m in BAD_CONFIGS])
def test_bad_config_is_one_line_naming_the_key(tiny_config, tmp_path, mutate, message):
    assert config_error(load, tiny_config, tmp_path, mutate) == message


def test_global_batch_must_split_over_the_world(tiny_config, tmp_path, monkeypatch):
    monkeypatch.setenv('WORLD_SIZE', '3')
    with pytest.raises(ConfigError) as caught:
        load(write_yaml(tiny_config, tmp_path / 'run.yaml'))
    assert str(caught.value) == 'global_batch_size: 8 is not divisible by the world size 3; use a multiple of 3'


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


@pytest.mark.parametrize('world, overrides, message', [
    ('4', ['parallelism.context_parallel_degree=3'],
     'parallelism.context_parallel_degree: 3 does not divide the world size 4; use a divisor of it'),
    ('4', ['parallelism.context_parallel_degree=0'], 'parallelism.context_parallel_degree: must be positive, got 0'),
    ('4', ['parallelism.context_parallel_degree=2', 'global_batch_size=3'],
     'global_batch_size: 3 is not divisible by the data-parallel size 2 (world size 4 / context_parallel_degree 2); '
     'use a multiple of 2'),
    ('4', ['parallelism.context_parallel_degree=4', 'max_seq_len=36'],
     'max_seq_len: 36 is not divisible by 2 x parallelism.context_parallel_degree = 8 (each rank takes a head and a '
     'tail chunk of every sequence)'),
    ('4', ['parallelism.context_parallel_degree=2', 'parallelism.fsdp=null'],
     'parallelism.context_parallel_degree: context parallelism runs under FSDP2; set parallelism.fsdp (not null)'),
    ('4', ['parallelism.context_parallel_degree=4', 'parallelism.fsdp.replicate_degree=2'],
     'parallelism.context_parallel_degree: 4 does not divide the 2 GPUs of an FSDP2 shard group (world size / '
     'parallelism.fsdp.replicate_degree)'),
], ids=['degree-divides-world', 'degree-positive', 'batch-per-group', 'sequence-chunks', 'needs-fsdp',
        'within-shard-group'])
def test_bad_context_parallel_degree(tiny_config, tmp_path, monkeypatch, world, overrides, message):
    monkeypatch.setenv('WORLD_SIZE', world)
    with pytest.raises(ConfigError) as caught:
        load(write_yaml(tiny_config, tmp_path / 'run.yaml'), overrides)
    assert str(caught.value) == message


def test_context_parallel_groups_read_the_batch_together(tiny_config, tmp_path, monkeypatch):
    monkeypatch.setenv('WORLD_SIZE', '8')
    config = load(write_yaml(tiny_config, tmp_path / 'run.yaml'), ['parallelism.context_parallel_degree=4'])
    assert (config.data_parallel_size, config.device_batch_size, config.tokens_per_step) == (2, 4, 8 * 32)
