"""HF interop: logits parity with transformers both ways, round trips, a new vocabulary, clear mismatch errors."""
import dataclasses
import json
import logging
import os
import subprocess
import sys
import warnings

import pytest
import torch
import transformers
from safetensors.torch import load_file

from llmfoundry_ext.build import build_model
from llmfoundry_ext.checkpoint import export_to_hf, read_composer_model
from llmfoundry_ext.errors import CheckpointError, ConfigError
from llmfoundry_ext.model.llama import LlamaConfig, Transformer
from llmfoundry_ext.model.llama_hf import config_from_hf, hf_config
from llmfoundry_ext.preflight import prepare
from llmfoundry_ext.train import train
from llmfoundry_ext.weights import import_from_hf, load_hf, load_into, load_weights_folder, save_hf
from scripts.convert_checkpoint import main as checkpoint_main
from tests.conftest import FORKED, REPO, write_yaml

CONFIGS = {
    'llama2-shape': LlamaConfig(dim=64, n_layers=2, n_heads=4, n_kv_heads=4, ffn_dim=96, vocab_size=101,
                                max_seq_len=128, rope_theta=10000.0, rope_scaling_factor=1.0),
    'tied-gqa': LlamaConfig(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=96, vocab_size=101,
                            max_seq_len=128, rope_theta=10000.0, rope_scaling_factor=1.0, tie_embeddings=True),
    'untied-mha-rope-scaled': LlamaConfig(dim=96, n_layers=3, n_heads=6, n_kv_heads=6, ffn_dim=160,
                                          vocab_size=211, max_seq_len=256, rope_scaling_factor=8.0,
                                          rope_original_max_seq_len=32, tie_embeddings=False),
    'untied-gqa-rope-scaled': LlamaConfig(dim=128, n_layers=2, n_heads=8, n_kv_heads=2, ffn_dim=224,
                                          vocab_size=300, max_seq_len=256, rope_scaling_factor=32.0,
                                          rope_original_max_seq_len=16, tie_embeddings=False),
}


def ours(config: LlamaConfig, seed: int = 0) -> Transformer:
    torch.manual_seed(seed)
    model = Transformer(config)
    model.init_weights()
    return model.eval()


def hf_model(folder) -> transformers.LlamaForCausalLM:
    return transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32,
                                                             attn_implementation='eager').eval()


def tokens(config: LlamaConfig) -> torch.Tensor:
    return torch.randint(0, config.vocab_size, (2, 48), generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize('name', CONFIGS)
def test_exported_model_gives_our_logits_in_transformers(name, tmp_path):
    config = CONFIGS[name]
    model = ours(config)
    save_hf(model.state_dict(), config, str(tmp_path / 'hf'), torch.float32)
    with torch.no_grad():
        difference = (hf_model(tmp_path / 'hf')(tokens(config)).logits - model(tokens(config))).abs().max()
    assert difference < 1e-5


@pytest.mark.parametrize('name', CONFIGS)
def test_transformers_model_gives_its_logits_in_ours(name, tmp_path):
    config = CONFIGS[name]
    reference = transformers_model(config, tmp_path, seed=2).eval()
    reference.save_pretrained(tmp_path / 'hf', safe_serialization=True)
    loaded_config, tensors = load_hf(str(tmp_path / 'hf'))
    assert loaded_config == config
    model = Transformer(loaded_config).eval()
    load_into(model, tensors)
    with torch.no_grad():
        assert (model(tokens(config)) - reference(tokens(config)).logits).abs().max() < 1e-5


def test_export_in_shards_loads_in_transformers_and_imports_back(tmp_path):
    """200 kB shards (5 GB for real models): every shard within the limit or one tensor alone, the index naming
    each tensor's file; transformers loads the folder, and from-hf reads the shards back tensor for tensor."""
    config = CONFIGS['untied-gqa-rope-scaled']
    model = ours(config)
    hf = tmp_path / 'hf'
    save_hf(model.state_dict(), config, str(hf), torch.float32, max_shard_size=200_000)
    index = json.loads((hf / 'model.safetensors.index.json').read_text())
    shards = sorted(set(index['weight_map'].values()))
    assert len(shards) > 1
    assert shards == [f'model-{i:05d}-of-{len(shards):05d}.safetensors' for i in range(1, len(shards) + 1)]
    assert sorted(os.listdir(hf)) == sorted(shards + ['config.json', 'model.safetensors.index.json'])
    sizes = []
    for shard in shards:
        tensors = load_file(hf / shard)
        sizes.append(sum(t.numel() * t.element_size() for t in tensors.values()))
        assert sizes[-1] <= 200_000 or len(tensors) == 1
        assert sorted(tensors) == sorted(k for k, v in index['weight_map'].items() if v == shard)
    assert index['metadata']['total_size'] == sum(sizes) == 4 * config.num_params()
    with torch.no_grad():
        assert (hf_model(hf)(tokens(config)).logits - model(tokens(config))).abs().max() < 1e-5

    import_from_hf(str(hf), str(tmp_path / 'native'), max_shard_size=200_000)
    assert len([f for f in os.listdir(tmp_path / 'native') if f.endswith('.safetensors')]) == len(shards)
    state = model.state_dict()
    for folder, read in ((hf, load_hf), (tmp_path / 'native', load_weights_folder)):
        _, round_trip = read(str(folder))
        assert sorted(round_trip) == sorted(state) and all(torch.equal(round_trip[k], state[k]) for k in state)


def save_config(config: LlamaConfig) -> dict:
    return hf_config(config, torch.float32)


def transformers_model(config: LlamaConfig, tmp_path, seed: int) -> transformers.LlamaForCausalLM:
    """transformers' own LlamaForCausalLM, randomly initialised, its config read by AutoConfig (any version)."""
    (tmp_path / 'hf-config').mkdir(exist_ok=True)
    (tmp_path / 'hf-config' / 'config.json').write_text(json.dumps(save_config(config)))
    torch.manual_seed(seed)
    return transformers.LlamaForCausalLM(transformers.AutoConfig.from_pretrained(tmp_path / 'hf-config'))


def hf_reference(tmp_path, config: LlamaConfig) -> str:
    """An HF Llama folder with random weights, as transformers writes it."""
    folder = tmp_path / 'hf-source'
    transformers_model(config, tmp_path, seed=5).save_pretrained(folder, safe_serialization=True)
    return str(folder)


def run_config(tiny_config: dict, config: LlamaConfig, **model) -> dict:
    fields = {k: v for k, v in dataclasses.asdict(config).items() if k not in ('attn_impl', 'init_scheme')}
    tiny_config['model'] = {**fields, 'max_seq_len': 64, **model}
    tiny_config['max_duration'] = '2ba'
    tiny_config['checkpoint']['save_interval'] = '2ba'
    tiny_config.pop('callbacks')
    return tiny_config


SOURCE = LlamaConfig(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=96, vocab_size=512, max_seq_len=64,
                     rope_theta=500000.0, rope_scaling_factor=8.0, rope_original_max_seq_len=16)


@pytest.mark.slow
def test_from_hf_train_fsdp2_to_hf_reproduces_tensors_and_logits(tiny_config, tmp_path, capsys):
    """from-hf -> init_from -> 2-process FSDP2 run (lr 0: weights kept) -> sharded checkpoint -> to-hf."""
    source = hf_reference(tmp_path, SOURCE)
    native = str(tmp_path / 'native')
    assert checkpoint_main(['from-hf', source, native]) == 0
    config = run_config(tiny_config, SOURCE, init_from=native)
    config['optimizer'] = {'name': 'adamw', 'lr': 0.0, 'weight_decay': 0.0}
    config['scheduler'] = None
    yaml_path = write_yaml(config, tmp_path / 'run.yaml')
    env = {**os.environ, 'OMP_NUM_THREADS': '1'}
    subprocess.run([*FORKED, '-n', '2', 'train.py', yaml_path], cwd=REPO, env=env, check=True,
                   capture_output=True, timeout=600)
    run_folder = tmp_path / 'checkpoints' / 'tiny'
    exported = str(tmp_path / 'exported')
    capsys.readouterr()
    assert checkpoint_main(['to-hf', str(run_folder), exported, '--dtype', 'float32']) == 0
    assert capsys.readouterr().out == f"wrote {exported} from {run_folder / 'ep0-ba2'}\n"
    original, round_trip = load_file(f'{source}/model.safetensors'), load_file(f'{exported}/model.safetensors')
    assert sorted(original) == sorted(round_trip)
    assert all(torch.equal(original[name], round_trip[name]) for name in original)

    ours_from_checkpoint = Transformer(SOURCE).eval()
    load_into(ours_from_checkpoint, read_composer_model(str(run_folder / 'ep0-ba2')))
    with torch.no_grad():
        difference = (hf_model(exported)(tokens(SOURCE)).logits - ours_from_checkpoint(tokens(SOURCE))).abs().max()
    assert difference < 1e-5


def test_trained_monolithic_checkpoint_to_hf_matches_our_logits(tiny_config, tmp_path):
    config = run_config(tiny_config, SOURCE)
    config['parallelism'] = {'fsdp': None}
    trainer = train(prepare(write_yaml(config, tmp_path / 'run.yaml')))
    trained = trainer.state.model.model.eval()
    trainer.close()
    checkpoint = export_to_hf(str(tmp_path / 'checkpoints' / 'tiny'), str(tmp_path / 'hf'), torch.float32)
    assert checkpoint.endswith('ep0-ba2-rank0.pt')
    with torch.no_grad():
        assert (hf_model(tmp_path / 'hf')(tokens(SOURCE)).logits - trained(tokens(SOURCE))).abs().max() < 1e-5


def test_the_1b_presets_export_loads_in_transformers_without_a_warning_and_says_what_it_trained_for(tiny_config,
                                                                                                   tmp_path):
    """The 1B preset's RoPE (Llama 3's scaling by 32 from 8,192) and context (8,192), at a tiny width: config.json's
    max_position_embeddings is the range the scaling reaches (transformers warns on every load when it is not above
    the original context), the training is in its llmfoundry_ext entry, and the import reads the context back."""
    tiny_config['model'].update(preset='1b', max_seq_len=8192, tie_embeddings=True)
    tiny_config.update(max_duration='2ba', parallelism={'fsdp': None})
    train(prepare(write_yaml(tiny_config, tmp_path / 'run.yaml'))).close()
    export_to_hf(str(tmp_path / 'checkpoints' / 'tiny'), str(tmp_path / 'hf'), torch.float32)
    written = json.loads((tmp_path / 'hf' / 'config.json').read_text())
    assert (written['max_position_embeddings'], written['rope_scaling']['original_max_position_embeddings'],
            written['rope_scaling']['factor']) == (262144, 8192, 32.0)
    assert written['llmfoundry_ext'] == {
        'max_seq_len': 8192, 'run_name': 'tiny', 'checkpoint': 'ep0-ba2-rank0.pt', 'objective': 'clm',
        'trained_sequence_length': 32, 'trained_batches': 2, 'trained_tokens': 2 * 8 * 32}
    said = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = said.append
    logger = transformers.logging.get_logger('transformers')
    logger.addHandler(handler)
    try:
        with warnings.catch_warnings(record=True) as warned:
            warnings.simplefilter('always')
            hf_model(tmp_path / 'hf')
    finally:
        logger.removeHandler(handler)
    assert [record.getMessage() for record in said] + [str(warning.message) for warning in warned] == []
    assert load_weights_folder(str(tmp_path / 'hf'))[0].max_seq_len == 8192


def test_init_from_alone_takes_the_architecture_from_the_hf_folder_and_trains(tiny_config, tmp_path):
    source_config = dataclasses.replace(SOURCE, norm_eps=1e-6, rope_low_freq_factor=2.0, rope_high_freq_factor=8.0)
    source = hf_reference(tmp_path, source_config)
    tiny_config['model'] = {'init_from': source}  # no preset, no architecture field
    tiny_config.update(max_duration='2ba', parallelism={'fsdp': None}, scheduler=None,
                       optimizer={'name': 'adamw', 'lr': 0.0, 'weight_decay': 0.0})
    run = prepare(write_yaml(tiny_config, tmp_path / 'run.yaml'))
    assert run.architecture == dataclasses.replace(source_config, init_scheme='gpt2')  # what init_skip would draw
    trainer = train(run)
    trained = trainer.state.model.model.eval()
    assert trainer.state.timestamp.batch.value == 2
    trainer.close()
    with torch.no_grad():
        difference = (hf_model(source)(tokens(SOURCE)).logits - trained(tokens(SOURCE))).abs().max()
    assert difference < 1e-5


def test_init_froms_config_is_read_once_from_yaml_to_model(tiny_config, tmp_path, monkeypatch):
    """config.json is read where the YAML's architecture is filled and checked (config.apply_preset); preflight and
    the model's build read only the tensors."""
    from llmfoundry_ext import weights
    reads = []
    for name in ('read_hf_architecture', 'read_native_config'):
        original = getattr(weights, name)
        monkeypatch.setattr(weights, name, lambda folder, original=original, name=name: (
            reads.append(name), original(folder))[1])
    source = hf_reference(tmp_path, SOURCE)
    run = prepare(write_yaml(run_config(tiny_config, SOURCE, init_from=source), tmp_path / 'run.yaml'))
    build_model(run)
    assert reads == ['read_hf_architecture']


def test_new_vocabulary_keeps_every_other_tensor(tiny_config, tmp_path):
    source = hf_reference(tmp_path, SOURCE)
    run = prepare(write_yaml(run_config(tiny_config, SOURCE, init_from=source, vocab_size=1000,
                                        init_skip=['embed_tokens', 'lm_head']), tmp_path / 'run.yaml'))
    model = build_model(run)[0].model
    _, original = load_hf(source)
    state = model.state_dict()
    kept = [name for name in state if name not in ('embed_tokens.weight', 'lm_head.weight')]
    assert len(kept) == 2 * 9 + 1
    assert all(torch.equal(state[name], original[name]) for name in kept)
    assert state['embed_tokens.weight'].shape == (1000, 64) and state['lm_head.weight'].shape == (1000, 64)
    assert abs(state['embed_tokens.weight'].std().item() - 0.02) < 0.002  # freshly initialised
    assert not torch.equal(state['embed_tokens.weight'][:512], original['embed_tokens.weight'])


def test_weights_of_another_size_name_the_first_mismatching_tensor():
    small, wide = ours(SOURCE), Transformer(dataclasses.replace(SOURCE, ffn_dim=128))
    with pytest.raises(CheckpointError) as caught:
        load_into(wide, small.state_dict())
    assert str(caught.value) == ('checkpoint tensor layers.0.mlp.gate_proj.weight has shape [96, 64] but the '
                                 'model expects [128, 64]: it is from another model size or vocabulary')


def test_weights_of_another_architecture_name_the_missing_tensor():
    state = ours(SOURCE).state_dict()
    state['layers.1.self_attn.qkv_proj.weight'] = state.pop('layers.1.self_attn.q_proj.weight')
    with pytest.raises(CheckpointError) as caught:
        load_into(Transformer(SOURCE), state)
    assert str(caught.value) == ('checkpoint has no tensor layers.1.self_attn.q_proj.weight (shape [64, 64]) that '
                                 'the model expects: it is from another architecture')


def test_init_from_another_shape_is_a_config_error(tiny_config, tmp_path):
    source = hf_reference(tmp_path, SOURCE)
    with pytest.raises(ConfigError) as caught:
        prepare(write_yaml(run_config(tiny_config, SOURCE, init_from=source, ffn_dim=128), tmp_path / 'run.yaml'))
    assert str(caught.value) == f'model.ffn_dim: 128 but the weights in {source} have 96; set model.ffn_dim=96'


def test_init_from_with_a_meta_build_is_a_config_error(tiny_config, tmp_path):
    source = hf_reference(tmp_path, SOURCE)
    with pytest.raises(ConfigError) as caught:
        prepare(write_yaml(run_config(tiny_config, SOURCE, init_from=source, init_device='meta'), tmp_path / 'r.yaml'))
    assert str(caught.value) == ('model.init_device: meta leaves no rank to read model.init_from; use auto (rank 0 '
                                 'reads the weights on the CPU and they are broadcast)')


def test_non_llama_and_pickled_checkpoints_are_refused(tmp_path):
    (tmp_path / 'gpt2').mkdir()
    (tmp_path / 'gpt2' / 'config.json').write_text(json.dumps({'model_type': 'gpt2'}))
    result = subprocess.run([sys.executable, 'scripts/convert_checkpoint.py', 'from-hf', str(tmp_path / 'gpt2'),
                             str(tmp_path / 'out')], cwd=REPO, capture_output=True, text=True)
    assert (result.returncode, result.stderr) == (
        2, "error: config.json: model_type is 'gpt2', not 'llama' or 'mixtral'; only Llama and Mixtral checkpoints "
           "convert\n")
    (tmp_path / 'bin').mkdir()
    (tmp_path / 'bin' / 'config.json').write_text(json.dumps(save_config(SOURCE)))
    torch.save({}, tmp_path / 'bin' / 'pytorch_model.bin')
    with pytest.raises(CheckpointError, match='no .safetensors files; only safetensors are loaded'):
        import_from_hf(str(tmp_path / 'bin'), str(tmp_path / 'out'))


def test_rope_settings_read_from_transformers_4_and_5_config_formats():
    base = {k: v for k, v in save_config(SOURCE).items() if k not in ('rope_theta', 'rope_scaling')}
    llama3 = {'rope_type': 'llama3', 'factor': 8.0, 'low_freq_factor': 1.0, 'high_freq_factor': 4.0,
              'original_max_position_embeddings': 16}
    version_4 = config_from_hf({**base, 'rope_theta': 500000.0, 'rope_scaling': llama3})
    version_5 = config_from_hf({**base, 'rope_parameters': {**llama3, 'rope_theta': 500000.0}})
    assert version_4 == version_5 == SOURCE
    plain = config_from_hf({**base, 'rope_parameters': {'rope_type': 'default', 'rope_theta': 10000.0}})
    assert (plain.rope_theta, plain.rope_scaling_factor) == (10000.0, 1.0)
