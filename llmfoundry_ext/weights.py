"""Weight folders: HF model folders (config.json + safetensors, any family of ``model.families``) and native ones
(``from-hf`` output: our architecture config + safetensors in our names) -> a model, and a model's tensors -> them.

Only safetensors are read (no unpickling of foreign files); folders are written atomically.
"""
import dataclasses
import json
import os
import shutil

import torch
from huggingface_hub import split_torch_state_dict_into_shards
from safetensors.torch import load_file, save_file

from llmfoundry_ext.atomic import atomic_folder
from llmfoundry_ext.errors import CheckpointError
from llmfoundry_ext.model.families import FAMILIES, Family
from llmfoundry_ext.model.llama_hf import EXPORT_KEY
from llmfoundry_ext.tokenizer import tokenizer_file

NATIVE_CONFIG = 'llama_config.json'   # a from-hf folder: {'family': ..., architecture fields} + our names
HF_CONFIG = 'config.json'
MAX_SHARD_SIZE = '5GB'                # per safetensors file written, as transformers' save_pretrained


def hf_family(hf: dict) -> Family:
    """The family whose HF ``model_type`` a config.json has."""
    for family in FAMILIES.values():
        if family.hf.MODEL_TYPE == hf.get('model_type'):
            return family
    types = ' or '.join(repr(family.hf.MODEL_TYPE) for family in FAMILIES.values())
    names = ' and '.join(name.capitalize() for name in FAMILIES)  # 'Llama and Mixtral'
    raise CheckpointError(f"config.json: model_type is {hf.get('model_type')!r}, not {types}; only {names} "
                          f"checkpoints convert")


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


def read_hf_architecture(folder: str) -> tuple[Family, object]:
    """An HF model folder's family and, from its config.json, our architecture config."""
    if not os.path.isfile(os.path.join(folder, HF_CONFIG)):
        raise CheckpointError(f'{folder}: no {HF_CONFIG}; give the folder of an HF Llama or Mixtral model '
                              f'(config.json and *.safetensors)')
    with open(os.path.join(folder, HF_CONFIG)) as file:
        hf = json.load(file)
    family = hf_family(hf)
    return family, family.hf.config_from_hf(hf)


def load_hf(folder: str) -> tuple[object, dict[str, torch.Tensor]]:
    """An HF model folder -> (our architecture config, tensors in our names)."""
    family, config = read_hf_architecture(folder)
    return config, family.hf.from_hf(read_safetensors(folder))


def read_native_config(folder: str):
    """A native folder's architecture (files written before the family was recorded are Llama's; keys that are no
    longer architecture, such as the kernels written by earlier versions, are left out)."""
    with open(os.path.join(folder, NATIVE_CONFIG)) as file:
        saved = json.load(file)
    family = FAMILIES[saved.pop('family', 'llama')]
    names = {spec.name for spec in dataclasses.fields(family.config)}
    return family.config(**{name: value for name, value in saved.items() if name in names})


def read_weights_config(folder: str):
    """The architecture of an HF folder (config.json) or a native one (llama_config.json)."""
    if os.path.isfile(os.path.join(folder, NATIVE_CONFIG)):
        return read_native_config(folder)
    if os.path.isfile(os.path.join(folder, HF_CONFIG)):
        return read_hf_architecture(folder)[1]
    raise CheckpointError(f'{folder}: neither {HF_CONFIG} (an HF model) nor {NATIVE_CONFIG} (from-hf output) '
                          f'is there')


def load_weights_folder(folder: str) -> tuple[object, dict[str, torch.Tensor]]:
    """(config, tensors in our names) of an HF folder or a native one."""
    config = read_weights_config(folder)
    return config, read_weights_tensors(folder, family_of(config))


def read_weights_tensors(folder: str, family: Family) -> dict[str, torch.Tensor]:
    """The tensors, in our names, of an HF folder or a native one of ``family``, whose architecture the run has
    already read (``config.apply_preset``): its config is not read again."""
    tensors = read_safetensors(folder)
    return tensors if os.path.isfile(os.path.join(folder, NATIVE_CONFIG)) else family.hf.from_hf(tensors)


def check_compatible(model: torch.nn.Module, tensors: dict[str, torch.Tensor], skip: tuple[str, ...] = ()) -> None:
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


def load_into(model: torch.nn.Module, tensors: dict[str, torch.Tensor], skip: tuple[str, ...] = ()) -> None:
    """Copy ``tensors`` into ``model`` in place, leaving the ``skip`` prefixes as they are (freshly initialised)."""
    check_compatible(model, tensors, skip)
    with torch.no_grad():
        for name, parameter in model.state_dict().items():
            if not skipped(name, skip) and name in tensors:
                parameter.copy_(tensors[name])


def family_of(config) -> Family:
    """The family whose architecture config ``config`` is (exactly: a Mixtral config is also a Llama one)."""
    return next(family for family in FAMILIES.values() if type(config) is family.config)


def save_hf(tensors: dict[str, torch.Tensor], config, out: str, dtype: torch.dtype,
            tokenizer: str | None = None, max_shard_size: int | str = MAX_SHARD_SIZE,
            trained: dict | None = None) -> None:
    """Write an HF model folder (config.json, safetensors weights, tokenizer files), atomically; ``trained``: what the
    weights were trained for (``checkpoint.training_record``), kept in config.json's ``llmfoundry_ext`` entry."""
    hf_tensors = family_of(config).hf.to_hf({k: v.to(dtype) for k, v in tensors.items()
                                              if not (config.tie_embeddings and k == 'lm_head.weight')})
    hf_config = family_of(config).hf.hf_config(config, dtype)
    hf_config[EXPORT_KEY].update(trained or {})
    with atomic_folder(out) as partial:
        write_safetensors(hf_tensors, partial, max_shard_size)
        with open(os.path.join(partial, HF_CONFIG), 'w') as file:
            json.dump(hf_config, file, indent=2)
        if tokenizer:
            write_hf_tokenizer(tokenizer, partial)


def write_safetensors(tensors: dict[str, torch.Tensor], folder: str, max_shard_size: int | str) -> None:
    """``model.safetensors``, or shards ``model-0000k-of-0000n.safetensors`` of at most ``max_shard_size`` (a
    larger tensor alone in its shard) with the ``model.safetensors.index.json`` that transformers reads."""
    tensors = {name: tensor.contiguous() for name, tensor in tensors.items()}  # as safetensors stores them
    split = split_torch_state_dict_into_shards(tensors, max_shard_size=max_shard_size)
    for filename, names in split.filename_to_tensors.items():
        save_file({name: tensors[name] for name in names}, os.path.join(folder, filename), metadata={'format': 'pt'})
    if split.is_sharded:
        with open(os.path.join(folder, 'model.safetensors.index.json'), 'w') as file:
            json.dump({'metadata': split.metadata, 'weight_map': split.tensor_to_filename}, file, indent=2)


def write_hf_tokenizer(tokenizer: str, folder: str) -> None:
    """tokenizer.json (+ a tokenizer_config.json naming PreTrainedTokenizerFast) for AutoTokenizer."""
    shutil.copy(tokenizer_file(tokenizer), os.path.join(folder, 'tokenizer.json'))
    for name in ('tokenizer_config.json', 'special_tokens_map.json'):
        if os.path.isdir(tokenizer) and os.path.isfile(os.path.join(tokenizer, name)):
            shutil.copy(os.path.join(tokenizer, name), os.path.join(folder, name))
    if not os.path.isfile(os.path.join(folder, 'tokenizer_config.json')):
        with open(os.path.join(folder, 'tokenizer_config.json'), 'w') as file:
            json.dump({'tokenizer_class': 'PreTrainedTokenizerFast'}, file)


def save_native(tensors: dict[str, torch.Tensor], config, out: str,
                max_shard_size: int | str = MAX_SHARD_SIZE) -> None:
    """Our names + our architecture config (what ``model.init_from`` reads fastest), atomically."""
    with atomic_folder(out) as partial:
        write_safetensors(tensors, partial, max_shard_size)
        with open(os.path.join(partial, NATIVE_CONFIG), 'w') as file:
            json.dump({'family': family_of(config).name, **dataclasses.asdict(config)}, file, indent=2)


def import_from_hf(hf_folder: str, out: str, max_shard_size: int | str = MAX_SHARD_SIZE):
    """An HF model folder -> a native folder (our names, llama_config.json) for ``model.init_from``; returns its
    architecture."""
    config, tensors = load_hf(hf_folder)
    with torch.device('meta'):
        check_compatible(family_of(config).module(config), tensors)
    save_native(tensors, config, out, max_shard_size)
    return config
