"""Composer run checkpoints -> weights: the model tensors of a sharded FSDP2 folder or a monolithic .pt, and a
run's latest checkpoint exported as an HF model folder (``scripts/convert_checkpoint.py to-hf``)."""
import os
from typing import NamedTuple

import torch
import torch.distributed.checkpoint as dcp
from omegaconf import OmegaConf

from llmfoundry_ext.config import ModelConfig, build
from llmfoundry_ext.errors import CheckpointError
from llmfoundry_ext.resumption import CHECKPOINT_NAME, LATEST, METADATA, problem
from llmfoundry_ext.weights import MAX_SHARD_SIZE, check_compatible, save_hf

COMPOSER_MODEL_PREFIX = 'state.model.model.'


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
    reader = dcp.FileSystemReader(folder)
    metadata = reader.read_metadata().state_dict_metadata
    state = {key: torch.empty(meta.size, dtype=meta.properties.dtype)
             for key, meta in metadata.items() if key.startswith(COMPOSER_MODEL_PREFIX)}
    dcp.load(state, storage_reader=reader, no_dist=True)
    return {key.removeprefix(COMPOSER_MODEL_PREFIX): tensor for key, tensor in state.items()}


def latest_checkpoint(run_folder: str) -> str:
    """A run folder -> the checkpoint its ``latest-rank0.pt`` link names; a checkpoint path stays itself. Either must
    be complete and intact (``resumption.problem``)."""
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


class CheckpointWeights(NamedTuple):
    checkpoint: str                     # the checkpoint read (a run folder's latest)
    config: object                      # its model's architecture
    tensors: dict[str, torch.Tensor]    # its model's tensors, our names
    tokenizer: str | None               # the run's data.tokenizer folder
    run: dict                           # the run's resolved config.yaml


def read_checkpoint_weights(run_or_checkpoint: str) -> CheckpointWeights:
    """A Composer run folder (its latest checkpoint) or one checkpoint -> its weights and what its run says."""
    checkpoint = latest_checkpoint(run_or_checkpoint)
    config_file = run_config_file(checkpoint)
    if not os.path.isfile(config_file):
        raise CheckpointError(f'{config_file}: missing; it is written by train.py and gives the architecture')
    run = OmegaConf.to_container(OmegaConf.load(config_file))
    model = build(ModelConfig, run['model'], 'model')
    config = model.architecture()
    tensors = read_composer_model(checkpoint)
    with torch.device('meta'):
        check_compatible(model.family_entry().module(config), tensors)
    return CheckpointWeights(checkpoint, config, tensors, (run.get('data') or {}).get('tokenizer'), run)


def training_record(checkpoint: str, run: dict) -> dict:
    """What a checkpoint's weights were trained for, from its name and its run's config: an HF export keeps it in
    config.json (its max_position_embeddings is the RoPE range, ``llama_hf.position_range``)."""
    name = os.path.basename(checkpoint.rstrip('/'))
    batches = int(CHECKPOINT_NAME.match(name)[1])
    return {'run_name': run['run_name'], 'checkpoint': name, 'objective': run['objective']['name'],
            'trained_sequence_length': run['max_seq_len'], 'trained_batches': batches,
            'trained_tokens': batches * run['global_batch_size'] * run['max_seq_len']}


def export_to_hf(run_or_checkpoint: str, out: str, dtype: torch.dtype = torch.bfloat16,
                 tokenizer: str | None = None, max_shard_size: int | str = MAX_SHARD_SIZE) -> str:
    """A Composer run folder (its latest checkpoint) or one checkpoint -> an HF model folder; returns the checkpoint."""
    weights = read_checkpoint_weights(run_or_checkpoint)
    save_hf(weights.tensors, weights.config, out, dtype, tokenizer or weights.tokenizer, max_shard_size,
            trained=training_record(weights.checkpoint, weights.run))
    return weights.checkpoint
