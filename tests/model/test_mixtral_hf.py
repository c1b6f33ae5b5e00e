"""Mixtral and transformers' MixtralForCausalLM: logits, auxiliary loss and training loss on the same weights both
ways, from-hf -> train (lr 0) -> to-hf reproducing every tensor, and the family read from config.json."""
import dataclasses
import json
import os
import subprocess

import pytest
import torch
import transformers
from safetensors.torch import load_file

from llmfoundry_ext.errors import CheckpointError, ConfigError
from llmfoundry_ext.model.composer_model import LanguageModel
from llmfoundry_ext.model.mixtral import Mixtral, MixtralConfig, load_balancing_loss
from llmfoundry_ext.model.mixtral_hf import config_from_hf, from_hf, hf_config
from llmfoundry_ext.preflight import prepare
from llmfoundry_ext.weights import load_hf, load_into, save_hf
from scripts.convert_checkpoint import main as checkpoint_main
from tests.conftest import FORKED, REPO, write_yaml

TINY = MixtralConfig(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=96, vocab_size=512, n_experts=4,
                     experts_per_token=2, rope_theta=1e6, rope_scaling_factor=1.0, max_seq_len=64)


def ours(config: MixtralConfig = TINY, seed: int = 0) -> Mixtral:
    torch.manual_seed(seed)
    model = Mixtral(config)
    model.init_weights()
    return model.eval()


def transformers_model(tmp_path, seed: int = 5) -> transformers.MixtralForCausalLM:
    """transformers' own MixtralForCausalLM, randomly initialised, saved as transformers saves it."""
    (tmp_path / 'hf-config').mkdir(exist_ok=True)
    (tmp_path / 'hf-config' / 'config.json').write_text(json.dumps(hf_config(TINY, torch.float32)))
    torch.manual_seed(seed)
    model = transformers.MixtralForCausalLM(transformers.AutoConfig.from_pretrained(tmp_path / 'hf-config'))
    model.save_pretrained(tmp_path / 'hf-source', safe_serialization=True)
    return model.eval()


def hf_model(folder) -> transformers.MixtralForCausalLM:
    return transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32,
                                                             attn_implementation='eager').eval()


def tokens() -> torch.Tensor:
    return torch.randint(0, TINY.vocab_size, (2, 48), generator=torch.Generator().manual_seed(1))


def test_exported_model_gives_our_logits_and_aux_loss_in_transformers(tmp_path):
    model = ours()
    save_hf(model.state_dict(), TINY, str(tmp_path / 'hf'), torch.float32)
    with torch.no_grad():
        theirs = hf_model(tmp_path / 'hf')(tokens(), output_router_logits=True)
        logits, statistics = model(tokens())
    assert (theirs.logits - logits).abs().max() < 1e-5
    assert abs(theirs.aux_loss - load_balancing_loss(statistics, tokens().numel())) < 1e-6


def test_transformers_model_gives_its_logits_and_training_loss_in_ours(tmp_path):
    """Its loss with labels (cross-entropy + router_aux_loss_coef x aux loss) is our LanguageModel's total."""
    reference = transformers_model(tmp_path)
    config, tensors = load_hf(str(tmp_path / 'hf-source'))
    assert config == TINY
    model = Mixtral(config).eval()
    load_into(model, tensors)
    labels = torch.roll(tokens(), -1, 1)
    labels[:, -1] = -100
    batch = {'input_ids': tokens(), 'labels': labels}
    with torch.no_grad():
        theirs = reference(tokens(), labels=tokens(), output_router_logits=True)
        outputs = model(tokens())
        loss = LanguageModel(model).loss(outputs, batch)
    assert (outputs[0] - theirs.logits).abs().max() < 1e-5
    assert abs(loss['router_aux'] - theirs.aux_loss) < 1e-6
    assert abs(loss['total'] - theirs.loss) < 1e-5
    assert TINY.router_aux_loss_coef == reference.config.router_aux_loss_coef == 0.02


def test_experts_are_stacked_from_and_split_into_hf_tensors(tmp_path):
    model = ours()
    save_hf(model.state_dict(), TINY, str(tmp_path / 'hf'), torch.float32)
    hf = load_file(tmp_path / 'hf' / 'model.safetensors')
    assert torch.equal(hf['model.layers.1.block_sparse_moe.experts.3.w2.weight'], model.layers[1].mlp.experts.w2[3])
    assert torch.equal(hf['model.layers.0.block_sparse_moe.gate.weight'], model.layers[0].mlp.gate.weight)
    assert len(hf) == 1 + 2 * (4 + 2 + 1 + 3 * 4) + 1 + 1  # embed, per layer (attn, norms, router, experts), norm, head


def test_a_missing_expert_is_named():
    tensors = {f'model.layers.0.block_sparse_moe.experts.{e}.w1.weight': torch.zeros(2, 2) for e in (0, 1, 3)}
    with pytest.raises(CheckpointError) as caught:
        from_hf(tensors)
    assert str(caught.value) == ('checkpoint has no expert 2 for layers.0.mlp.experts.w1: the checkpoint is '
                                 'incomplete')


def test_sliding_window_attention_is_refused():
    with pytest.raises(CheckpointError) as caught:
        config_from_hf({**hf_config(TINY, torch.float32), 'sliding_window': 16})
    assert str(caught.value) == 'config.json: sliding_window 16 is not supported (full attention only)'


def run_yaml(tiny_config: dict, tmp_path, **model) -> str:
    tiny_config['model'] = model
    tiny_config.update(max_duration='2ba', scheduler=None, optimizer={'name': 'adamw', 'lr': 0.0, 'weight_decay': 0.0})
    tiny_config['checkpoint']['save_interval'] = '2ba'
    tiny_config.pop('callbacks')
    return write_yaml(tiny_config, tmp_path / 'run.yaml')


def test_init_from_reads_the_family_from_config_json(tiny_config, tmp_path):
    transformers_model(tmp_path)
    run = prepare(run_yaml(tiny_config, tmp_path, init_from=str(tmp_path / 'hf-source')))
    assert (run.config.model.family, run.architecture) == ('mixtral', dataclasses.replace(TINY, init_scheme='gpt2'))


def test_init_from_of_another_family_is_a_config_error(tiny_config, tmp_path):
    transformers_model(tmp_path)
    source = str(tmp_path / 'hf-source')
    with pytest.raises(ConfigError) as caught:
        prepare(run_yaml(tiny_config, tmp_path, family='llama', init_from=source))
    assert str(caught.value) == (f"model.family: 'llama' but the weights in {source} are 'mixtral'; set "
                                 f"model.family=mixtral")


@pytest.mark.slow
def test_from_hf_train_fsdp2_to_hf_reproduces_every_tensor(tiny_config, tmp_path, capsys):
    """from-hf -> init_from -> 2-process FSDP2 run (lr 0) -> sharded checkpoint -> to-hf: HF's tensors back."""
    transformers_model(tmp_path)
    source, native = str(tmp_path / 'hf-source'), str(tmp_path / 'native')
    assert checkpoint_main(['from-hf', source, native]) == 0
    env = {**os.environ, 'OMP_NUM_THREADS': '1'}
    run = subprocess.run([*FORKED, '-n', '2', 'train.py', run_yaml(tiny_config, tmp_path, init_from=native)],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]  # why, where CI saw it fail once
    exported = str(tmp_path / 'exported')
    assert checkpoint_main(['to-hf', str(tmp_path / 'checkpoints' / 'tiny'), exported, '--dtype', 'float32']) == 0
    original, round_trip = load_file(f'{source}/model.safetensors'), load_file(f'{exported}/model.safetensors')
    assert sorted(original) == sorted(round_trip) and len(original) == 1 + 2 * 19 + 2
    assert all(torch.equal(original[name], round_trip[name]) for name in original)
    assert json.loads((tmp_path / 'exported' / 'config.json').read_text())['architectures'] == ['MixtralForCausalLM']
