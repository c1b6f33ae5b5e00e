"""TrainConfig -> the objects Composer's Trainer takes (model, data, optimizer, callbacks, ...)."""
import os
from dataclasses import dataclass

import torch
from composer import Trainer
from composer.utils import FSDP2Config, dist

from llmfoundry_ext import registry
from llmfoundry_ext.checkpoint import load_into, load_weights_folder
from llmfoundry_ext.config import TrainConfig, eos_token_id, mask_token_id
from llmfoundry_ext.data.collate import Collator
from llmfoundry_ext.data.dataloader import build_dataloader
from llmfoundry_ext.model.composer_model import LlamaLM
from llmfoundry_ext.model.llama import Transformer


def build_model(config: TrainConfig) -> LlamaLM:
    """On ``meta`` (materialised shard by shard after FSDP2 wraps it) or on the CPU, initialised, and
    loaded from ``model.init_from`` but for the ``init_skip`` tensors, which keep their fresh init."""
    init_device = resolve_init_device(config)
    with torch.device(init_device):
        transformer = Transformer(config.model.llama())
    speed_up(transformer, config)
    model = LlamaLM(transformer)
    if init_device == 'meta':
        model.model.param_init_fn = model.model.init_module  # Composer's meta_init calls it per module
        return model
    model.model.init_weights()
    if config.model.init_from:
        _, tensors = load_weights_folder(config.model.init_from)
        load_into(model.model, tensors, skip=tuple(config.model.init_skip))
    return model


def resolve_init_device(config: TrainConfig) -> str:
    """auto: ``meta`` under FSDP2 on GPUs, but rank 0 builds on the CPU to load ``init_from`` (Composer then
    broadcasts its weights to the other ranks' shards); ``cpu`` otherwise."""
    if config.model.init_device != 'auto':
        return config.model.init_device
    if not (torch.cuda.is_available() and config.parallelism.fsdp):
        return 'cpu'
    return 'cpu' if config.model.init_from and dist.get_global_rank() == 0 else 'meta'


def speed_up(transformer: Transformer, config: TrainConfig) -> None:
    """Float8 linears (torchao), per-block torch.compile, and which blocks Composer checkpoints; applied before
    Composer wraps the blocks for activation checkpointing and shards them."""
    if config.model.float8:
        from torchao.float8 import convert_to_float8_training
        init_stds = {name: m.init_std for name, m in transformer.layers.named_modules() if hasattr(m, 'init_std')}
        convert_to_float8_training(transformer.layers, module_filter_fn=float8_eligible)
        for name, std in init_stds.items():  # the swapped-in Float8Linear modules keep the depth-scaled init
            transformer.layers.get_submodule(name).init_std = std
    if config.model.compile:
        for block in transformer.layers:
            block.compile()
    transformer.checkpoint_every = checkpoint_every(config)


def checkpoint_every(config: TrainConfig) -> int:
    """Activation checkpointing of every k-th block: 0 none, 1 full, ``checkpoint_every`` selective."""
    fsdp = config.parallelism.fsdp
    if fsdp is None or fsdp.activation_checkpointing == 'none':
        return 0
    return 1 if fsdp.activation_checkpointing == 'full' else fsdp.checkpoint_every


def float8_eligible(module: torch.nn.Module, name: str) -> bool:
    """float8 GEMMs need both dimensions divisible by 16."""
    return isinstance(module, torch.nn.Linear) and module.in_features % 16 == 0 and module.out_features % 16 == 0


@dataclass
class MeshFSDP2Config(FSDP2Config):
    """Composer 0.32's FSDP2Config always asks for a 1-D mesh; this one asks Composer's State for a (replicate,
    shard) mesh when ``replicate_degree`` > 1, which makes ``fully_shard`` HSDP."""
    replicate_degree: int = 1

    @property
    def data_parallel_replicate_degree(self) -> int | None:
        return self.replicate_degree if self.replicate_degree > 1 else None


def build_parallelism(config: TrainConfig):
    """Composer's FSDP2 over all ranks, or HSDP with ``replicate_degree`` replicas."""
    fsdp = config.parallelism.fsdp
    if fsdp is None:
        return None
    return {'fsdp': MeshFSDP2Config(
        replicate_degree=fsdp.replicate_degree, reshard_after_forward=fsdp.reshard_after_forward,
        activation_checkpointing=fsdp.activation_checkpointing != 'none', state_dict_type=fsdp.state_dict_type,
        mixed_precision=fsdp.mixed_precision)}


def build_named(kind: str, entries: dict, defaults: dict | None = None) -> list:
    """Instances of ``name: {kwargs}`` entries; ``defaults[name]`` fills arguments the YAML leaves out."""
    defaults = defaults or {}
    return [registry.build(kind, name, {**defaults.get(name, {}), **(kwargs or {})}) for name, kwargs in entries.items()]


def logger_defaults(config: TrainConfig) -> dict:
    """TensorBoard logs go next to the checkpoints (``<save_folder>/tensorboard/<run_name>``)."""
    return {'tensorboard': {'log_dir': os.path.join(config.checkpoint_folder or '.', 'tensorboard')}}


def build_collator(config: TrainConfig) -> Collator:
    objective = config.objective
    return Collator(
        max_seq_len=config.max_seq_len, objective=objective.name, seed=config.seed,
        eos_id=eos_token_id(config) if config.data.document_masking else None,
        mask_probability=objective.mask_probability,
        mask_token_id=mask_token_id(config) if objective.name == 'mlm' else None)


def build_trainer(config: TrainConfig, device=None, extra_callbacks: list = (), model=None) -> Trainer:
    """Composer's Trainer for the run; ``model`` replaces the config's Llama (same data, optimizer, FSDP2)."""
    model = model or build_model(config)
    optimizer_name, optimizer_kwargs = registry.named_entries(config.optimizer, 'optimizer')
    optimizer = registry.build('optimizer', optimizer_name, optimizer_kwargs, model.parameters())
    schedulers = []
    if config.scheduler is not None:
        schedulers.append(registry.build('scheduler', *registry.named_entries(config.scheduler, 'scheduler')))
    data = config.data
    collator = build_collator(config)
    eval_dataloader = None
    if data.eval is not None:
        eval_dataloader = build_dataloader(data.eval, config.device_batch_size, collator)
    checkpoint = config.checkpoint
    return Trainer(
        run_name=config.run_name,
        device=device,
        model=model,
        train_dataloader=build_dataloader(data.train, config.device_batch_size, collator),
        eval_dataloader=eval_dataloader,
        eval_interval=config.eval_interval if eval_dataloader else 1,
        eval_subset_num_batches=config.eval_subset_num_batches,
        max_duration=config.max_duration,
        optimizers=optimizer,
        schedulers=schedulers,
        precision=config.precision,
        device_train_microbatch_size=config.device_microbatch_size or config.device_batch_size,
        parallelism_config=build_parallelism(config),
        callbacks=build_named('callbacks', config.callbacks) + list(extra_callbacks),
        algorithms=build_named('algorithms', config.algorithms),
        loggers=build_named('loggers', config.loggers, logger_defaults(config)),
        save_folder=checkpoint.save_folder,
        save_interval=checkpoint.save_interval,
        save_num_checkpoints_to_keep=checkpoint.save_num_checkpoints_to_keep,
        autoresume=checkpoint.autoresume,
        load_path=checkpoint.load_path,
        progress_bar=config.progress_bar,
        log_to_console=not config.progress_bar,
        console_log_interval=config.log_interval,
        seed=config.seed,
    )
