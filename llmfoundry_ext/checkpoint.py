"""Weights in and out: Composer checkpoints -> HF Llama folders, HF/native folders -> our Transformer.

Our Transformer uses HF's LlamaModel names, so conversion is one rename: HF puts ``model.`` before every
name but ``lm_head.weight``. Only safetensors are read from HF folders (no unpickling of foreign files).
"""
import json
import os
import shutil

import torch
from safetensors.torch import load_file, save_file

from llmfoundry_ext.atomic import atomic_folder
from llmfoundry_ext.model.llama import LlamaConfig, Transformer

NATIVE_CONFIG = 'llama_config.json'   # a from-hf folder: our LlamaConfig + safetensors in our names
HF_CONFIG = 'config.json'
MAX_SHARD_SIZE = '5GB'                # per safetensors file written, as transformers' save_pretrained
COMPOSER_MODEL_PREFIX = 'state.model.model.'


class CheckpointError(ValueError):
    """A checkpoint that does not fit: one line naming the tensor or file and what was expected."""


def to_hf_name(name: str) -> str:
    return name if name == 'lm_head.weight' else f'model.{name}'


def from_hf_name(name: str) -> str:
    return name if name == 'lm_head.weight' else name.removeprefix('model.')


def hf_config(config: LlamaConfig, dtype: torch.dtype) -> dict:
    """transformers' LlamaConfig (config.json) for our architecture."""
    rope_scaling = None
    if config.rope_scaling_factor != 1.0:
        rope_scaling = {'rope_type': 'llama3', 'factor': config.rope_scaling_factor,
                        'low_freq_factor': config.rope_low_freq_factor,
                        'high_freq_factor': config.rope_high_freq_factor,
                        'original_max_position_embeddings': config.rope_original_max_seq_len}
    return {
        'architectures': ['LlamaForCausalLM'], 'model_type': 'llama', 'hidden_act': 'silu',
        'hidden_size': config.dim, 'intermediate_size': config.ffn_dim, 'num_hidden_layers': config.n_layers,
        'num_attention_heads': config.n_heads, 'num_key_value_heads': config.n_kv_heads,
        'head_dim': config.head_dim, 'vocab_size': config.vocab_size, 'rms_norm_eps': config.norm_eps,
        'rope_theta': config.rope_theta, 'rope_scaling': rope_scaling,
        'max_position_embeddings': config.max_seq_len, 'tie_word_embeddings': config.tie_embeddings,
        'attention_bias': False, 'mlp_bias': False, 'torch_dtype': str(dtype).removeprefix('torch.'),
    }


def llama_config_from_hf(hf: dict) -> LlamaConfig:
    """Our LlamaConfig from an HF config.json (transformers 4's rope_theta/rope_scaling or 5's rope_parameters)."""
    if hf.get('model_type') != 'llama':
        raise CheckpointError(f"config.json: model_type is {hf.get('model_type')!r}, not 'llama'; only Llama "
                              f"checkpoints convert")
    rope = {**(hf.get('rope_parameters') or {}), **(hf.get('rope_scaling') or {})}
    rope_type = rope.get('rope_type', rope.get('type', 'default'))
    if rope_type not in ('default', 'llama3'):
        raise CheckpointError(f"config.json: rope type {rope_type!r} is not supported (only 'default' and 'llama3')")
    scaled = rope_type == 'llama3'
    return LlamaConfig(
        dim=hf['hidden_size'], n_layers=hf['num_hidden_layers'], n_heads=hf['num_attention_heads'],
        n_kv_heads=hf.get('num_key_value_heads', hf['num_attention_heads']), ffn_dim=hf['intermediate_size'],
        vocab_size=hf['vocab_size'], norm_eps=hf['rms_norm_eps'],
        rope_theta=hf.get('rope_theta', rope.get('rope_theta', 10000.0)),
        rope_scaling_factor=rope['factor'] if scaled else 1.0,
        rope_low_freq_factor=rope['low_freq_factor'] if scaled else 1.0,
        rope_high_freq_factor=rope['high_freq_factor'] if scaled else 4.0,
        rope_original_max_seq_len=rope['original_max_position_embeddings'] if scaled else 8192,
        max_seq_len=hf.get('max_position_embeddings', 8192), tie_embeddings=hf.get('tie_word_embeddings', False))


def safetensors_files(folder: str) -> list[str]:
    """The folder's ``*.safetensors`` files; a folder with none (only .bin/.pt) is refused."""
    files = sorted(f for f in os.listdir(folder) if f.endswith('.safetensors'))
    if not files:
        raise CheckpointError(f'{folder}: no .safetensors files; only safetensors are loaded (pickled .bin/.pt '
                              f'weights from elsewhere are never unpickled): save the model with safetensors')
    return files


def read_safetensors(folder: str) -> dict[str, torch.Tensor]:
    """All tensors of a folder's ``*.safetensors`` files (sharded or not); .bin/.pt files are refused."""
    tensors = {}
    for name in safetensors_files(folder):
        try:
            tensors.update(load_file(os.path.join(folder, name)))
        except Exception as error:  # safetensors raises its own SafetensorError, or OSError
            raise CheckpointError(f'{os.path.join(folder, name)}: not a readable safetensors file ({error}); '
                                  f'download or export it again') from None
    return tensors


def load_hf(folder: str) -> tuple[LlamaConfig, dict[str, torch.Tensor]]:
    """An HF Llama folder -> (our config, tensors in our names)."""
    if not os.path.isfile(os.path.join(folder, HF_CONFIG)):
        raise CheckpointError(f'{folder}: no {HF_CONFIG}; give the folder of an HF Llama model (config.json and '
                              f'*.safetensors)')
    with open(os.path.join(folder, HF_CONFIG)) as file:
        config = llama_config_from_hf(json.load(file))
    return config, {from_hf_name(k): v for k, v in read_safetensors(folder).items()}


def read_weights_config(folder: str) -> LlamaConfig:
    """The architecture of an HF folder (config.json) or a native one (llama_config.json)."""
    if os.path.isfile(os.path.join(folder, NATIVE_CONFIG)):
        with open(os.path.join(folder, NATIVE_CONFIG)) as file:
            return LlamaConfig(**json.load(file))
    if os.path.isfile(os.path.join(folder, HF_CONFIG)):
        with open(os.path.join(folder, HF_CONFIG)) as file:
            return llama_config_from_hf(json.load(file))
    raise CheckpointError(f'{folder}: neither {HF_CONFIG} (an HF model) nor {NATIVE_CONFIG} (from-hf output) '
                          f'is there')


def load_weights_folder(folder: str) -> tuple[LlamaConfig, dict[str, torch.Tensor]]:
    """(config, tensors in our names) of an HF folder or a native one."""
    if os.path.isfile(os.path.join(folder, NATIVE_CONFIG)):
        return read_weights_config(folder), read_safetensors(folder)
    return load_hf(folder)


def check_compatible(model: Transformer, tensors: dict[str, torch.Tensor], skip: tuple[str, ...] = ()) -> None:
    """Every model tensor not skipped is in ``tensors`` with the same shape; names the first that is not."""
    expected = {k: v for k, v in model.state_dict().items() if not skipped(k, skip)}
    if model.config.tie_embeddings:
        expected.pop('lm_head.weight', None)
    for name, tensor in expected.items():
        if name not in tensors:
            raise CheckpointError(f'checkpoint has no tensor {name} (shape {list(tensor.shape)}) that the model '
                                  f'expects: it is from another architecture')
        if tensors[name].shape != tensor.shape:
            raise CheckpointError(f'checkpoint tensor {name} has shape {list(tensors[name].shape)} but the model '
                                  f'expects {list(tensor.shape)}: it is from another model size or vocabulary')
    unexpected = [k for k in tensors if k not in expected and not skipped(k, skip) and k != 'lm_head.weight']
    if unexpected:
        raise CheckpointError(f'checkpoint tensor {unexpected[0]} has no place in the model: it is from another '
                              f'architecture')


def skipped(name: str, skip: tuple[str, ...]) -> bool:
    return any(name == s or name.startswith(s + '.') for s in skip)


def load_into(model: Transformer, tensors: dict[str, torch.Tensor], skip: tuple[str, ...] = ()) -> None:
    """Copy ``tensors`` into ``model`` in place, leaving the ``skip`` prefixes as they are (freshly initialised)."""
    check_compatible(model, tensors, skip)
    with torch.no_grad():
        for name, parameter in model.state_dict().items():
            if not skipped(name, skip) and name in tensors:
                parameter.copy_(tensors[name])


def save_hf(tensors: dict[str, torch.Tensor], config: LlamaConfig, out: str, dtype: torch.dtype,
            tokenizer: str | None = None, max_shard_size: int | str = MAX_SHARD_SIZE) -> None:
    """Write an HF Llama folder (config.json, safetensors weights, tokenizer files), atomically."""
    hf_tensors = {to_hf_name(k): v.to(dtype) for k, v in tensors.items()
                  if not (config.tie_embeddings and k == 'lm_head.weight')}
    with atomic_folder(out) as partial:
        write_safetensors(hf_tensors, partial, max_shard_size)
        with open(os.path.join(partial, HF_CONFIG), 'w') as file:
            json.dump(hf_config(config, dtype), file, indent=2)
        if tokenizer:
            write_hf_tokenizer(tokenizer, partial)


def write_safetensors(tensors: dict[str, torch.Tensor], folder: str, max_shard_size: int | str) -> None:
    """``model.safetensors``, or shards ``model-0000k-of-0000n.safetensors`` of at most ``max_shard_size`` (a
    larger tensor alone in its shard) with the ``model.safetensors.index.json`` that transformers reads."""
    from huggingface_hub import split_torch_state_dict_into_shards
    tensors = {name: tensor.contiguous() for name, tensor in tensors.items()}  # as safetensors stores them
    split = split_torch_state_dict_into_shards(tensors, max_shard_size=max_shard_size)
    for filename, names in split.filename_to_tensors.items():
        save_file({name: tensors[name] for name in names}, os.path.join(folder, filename), metadata={'format': 'pt'})
    if split.is_sharded:
        with open(os.path.join(folder, 'model.safetensors.index.json'), 'w') as file:
            json.dump({'metadata': split.metadata, 'weight_map': split.tensor_to_filename}, file, indent=2)


def write_hf_tokenizer(tokenizer: str, folder: str) -> None:
    """tokenizer.json (+ a tokenizer_config.json naming PreTrainedTokenizerFast) for AutoTokenizer."""
    from llmfoundry_ext.config import tokenizer_file
    shutil.copy(tokenizer_file(tokenizer), os.path.join(folder, 'tokenizer.json'))
    for name in ('tokenizer_config.json', 'special_tokens_map.json'):
        if os.path.isdir(tokenizer) and os.path.isfile(os.path.join(tokenizer, name)):
            shutil.copy(os.path.join(tokenizer, name), os.path.join(folder, name))
    if not os.path.isfile(os.path.join(folder, 'tokenizer_config.json')):
        with open(os.path.join(folder, 'tokenizer_config.json'), 'w') as file:
            json.dump({'tokenizer_class': 'PreTrainedTokenizerFast'}, file)


def save_native(tensors: dict[str, torch.Tensor], config: LlamaConfig, out: str,
                max_shard_size: int | str = MAX_SHARD_SIZE) -> None:
    """Our names + our config (what ``model.init_from`` reads fastest), atomically."""
    with atomic_folder(out) as partial:
        write_safetensors(tensors, partial, max_shard_size)
        with open(os.path.join(partial, NATIVE_CONFIG), 'w') as file:
            json.dump(config.__dict__, file, indent=2)


def read_composer_model(path: str) -> dict[str, torch.Tensor]:
    """Model tensors (our names) of a Composer checkpoint: a sharded FSDP2 folder or a monolithic .pt."""
    path = os.path.realpath(path)
    if os.path.isdir(path):
        return read_sharded(path)
    state = torch.load(path, map_location='cpu', weights_only=False)  # our own Composer checkpoint
    model = state['state']['model']
    prefix = COMPOSER_MODEL_PREFIX.removeprefix('state.model.')
    return {k.removeprefix(prefix): v for k, v in model.items() if k.startswith(prefix)}


def read_sharded(folder: str) -> dict[str, torch.Tensor]:
    """The model tensors of a torch.distributed.checkpoint folder, gathered whole on the CPU."""
    import torch.distributed.checkpoint as dcp
    reader = dcp.FileSystemReader(folder)
    metadata = reader.read_metadata().state_dict_metadata
    state = {key: torch.empty(meta.size, dtype=meta.properties.dtype)
             for key, meta in metadata.items() if key.startswith(COMPOSER_MODEL_PREFIX)}
    dcp.load(state, storage_reader=reader, no_dist=True)
    return {key.removeprefix(COMPOSER_MODEL_PREFIX): tensor for key, tensor in state.items()}


def latest_checkpoint(run_folder: str) -> str:
    """A run folder -> the checkpoint its ``latest-rank0.pt`` link names; a checkpoint path stays itself. Either must
    be complete and intact (``resumption.problem``)."""
    from llmfoundry_ext.resumption import LATEST, METADATA, problem
    link = os.path.join(run_folder, LATEST)
    if os.path.lexists(link):
        checkpoint = os.path.realpath(link)
    elif os.path.isfile(run_folder) or os.path.isfile(os.path.join(run_folder, METADATA)):
        checkpoint = run_folder
    else:
        raise CheckpointError(f'{run_folder}: no latest-rank0.pt link and not a checkpoint; give the save folder of a '
                              f'run or one checkpoint (ep0-ba100/ or ep0-ba100-rank0.pt)')
    reason = problem(checkpoint) if os.path.exists(checkpoint) else 'it does not exist'
    if reason:
        raise CheckpointError(f'{checkpoint}: {reason}; export another checkpoint of the run (ep0-ba100/ or '
                              f'ep0-ba100-rank0.pt)')
    return checkpoint


def run_config_file(checkpoint: str) -> str:
    """The resolved config.yaml that train.py writes next to a run's checkpoints."""
    return os.path.join(os.path.dirname(checkpoint.rstrip('/')), 'config.yaml')


def export_to_hf(run_or_checkpoint: str, out: str, dtype: torch.dtype = torch.bfloat16,
                 tokenizer: str | None = None, max_shard_size: int | str = MAX_SHARD_SIZE) -> str:
    """A Composer run folder (its latest checkpoint) or one checkpoint -> an HF Llama folder; returns the checkpoint."""
    from omegaconf import OmegaConf

    from llmfoundry_ext.config import ModelConfig, build

    checkpoint = latest_checkpoint(run_or_checkpoint)
    config_file = run_config_file(checkpoint)
    if not os.path.isfile(config_file):
        raise CheckpointError(f'{config_file}: missing; it is written by train.py and gives the architecture')
    run = OmegaConf.to_container(OmegaConf.load(config_file))
    config = build(ModelConfig, run['model'], 'model').llama()
    tensors = read_composer_model(checkpoint)
    with torch.device('meta'):
        check_compatible(Transformer(config), tensors)
    save_hf(tensors, config, out, dtype, tokenizer or run.get('data', {}).get('tokenizer'), max_shard_size)
    return checkpoint


def import_from_hf(hf_folder: str, out: str, max_shard_size: int | str = MAX_SHARD_SIZE) -> LlamaConfig:
    """An HF Llama folder -> a native folder (our names, llama_config.json) for ``model.init_from``."""
    config, tensors = load_hf(hf_folder)
    with torch.device('meta'):
        check_compatible(Transformer(config), tensors)
    save_native(tensors, config, out, max_shard_size)
    return config
