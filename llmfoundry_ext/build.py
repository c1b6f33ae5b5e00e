"""A preflighted Run -> the objects Composer's Trainer takes (model, data, optimizer, callbacks, ...)."""
import os
import sys

import torch

from llmfoundry_ext import registry
from llmfoundry_ext.callbacks.console_line import ConsoleLine
from llmfoundry_ext.callbacks.expert_load import ExpertLoad
from llmfoundry_ext.callbacks.finite_loss import StopOnNonFiniteLoss
from llmfoundry_ext.callbacks.recovery_line import RecoveryLine
from llmfoundry_ext.checkpoint_saver import SealedCheckpointSaver
from llmfoundry_ext.config import TrainConfig
from llmfoundry_ext.data.collate import Collator
from llmfoundry_ext.data.dataloader import build_dataloader
from llmfoundry_ext.downstream_callback import DownstreamEvaluation
from llmfoundry_ext.model.composer_model import LanguageModel
from llmfoundry_ext.parallelism import (ContextParallel, composer_parallelism, context_parallel, parallelize,
                                       reduce_replicas_by_sum_on_gloo, shard_experts)
from llmfoundry_ext.preflight import Run
from llmfoundry_ext.trainer import Trainer
from llmfoundry_ext.weights import load_into, read_weights_tensors


def build_model(run: Run, context_parallel: ContextParallel | None = None) -> tuple[LanguageModel, list]:
    """On ``meta`` (materialised shard by shard after FSDP2 wraps it) or on the CPU, initialised, and
    loaded from ``model.init_from`` but for the ``init_skip`` tensors, which keep their fresh init; float8,
    activation checkpointing and compile applied (``parallelism.parallelize``). Returns the model and the
    callbacks those need (and, for a mixture of experts, its load logger)."""
    config = run.config
    device = run.plan.init_device
    with torch.device(device):
        transformer = config.model.family_entry().module(run.architecture, run.kernels)
    callbacks = parallelize(transformer, config, context_parallel, run.plan.shards_the_model)
    model = LanguageModel(transformer, compile_loss=config.model.compile)
    if model.routed:
        callbacks.append(ExpertLoad())
    if device == 'meta':  # split before Composer materialises each rank's shards and initialises them
        model.model.param_init_fn = model.model.init_module  # Composer's meta_init calls it per module
    else:
        model.model.init_weights()
        if config.model.init_from:
            tensors = read_weights_tensors(config.model.init_from, config.model.family_entry())
            load_into(model.model, tensors, skip=tuple(config.model.init_skip))
    if config.parallelism.expert_parallel_degree > 1:  # the experts' whole weights (or meta), split
        shard_experts(transformer, config)
    return model, callbacks


def build_named(kind: str, entries: dict, defaults: dict | None = None) -> list:
    """Instances of ``name: {kwargs}`` entries; ``defaults[name]`` fills arguments the YAML leaves out."""
    defaults = defaults or {}
    return [registry.build(kind, name, {**defaults.get(name, {}), **(kwargs or {})}) for name, kwargs in entries.items()]


def logger_defaults(config: TrainConfig) -> dict:
    """TensorBoard logs go next to the checkpoints (``<save_folder>/tensorboard/<run_name>``)."""
    return {'tensorboard': {'log_dir': os.path.join(config.checkpoint_folder or '.', 'tensorboard')}}


def console_options(config: TrainConfig) -> dict:
    """The Trainer's console arguments: our one line per interval, or Composer's dump; Composer's progress bar when
    asked for, or by default when the console is a terminal."""
    progress_bar = sys.stdout.isatty() if config.progress_bar is None else config.progress_bar
    return {'progress_bar': progress_bar, 'log_to_console': config.console == 'full' and not progress_bar,
            'console_log_interval': config.log_interval}


def build_loggers(config: TrainConfig) -> list:
    line = [ConsoleLine(config.log_interval)] if config.console == 'line' else []
    checkpoints = config.checkpoint.save_interval if config.checkpoint.save_folder else None
    return [StopOnNonFiniteLoss(config.log_interval, checkpoints),
            *build_named('loggers', config.loggers, logger_defaults(config)), *line]


def build_collator(run: Run) -> Collator:
    config = run.config
    return Collator(max_seq_len=config.max_seq_len, objective=config.objective.name, seed=config.seed,
                    eos_id=run.eos_token_id, mask_probability=config.objective.mask_probability,
                    mask_token_id=run.mask_token_id, vocab_size=run.architecture.vocab_size)


def downstream_callbacks(run: Run) -> list:
    """The harness tasks' evaluation every ``downstream.interval`` batches, where the YAML asks for it, over the
    tasks preflight loaded."""
    config, downstream = run.config, run.config.downstream
    if downstream is None:
        return []
    results = os.path.join(config.checkpoint_folder, 'downstream') if config.checkpoint_folder else None
    return [DownstreamEvaluation(downstream, run.downstream_tasks, downstream.interval_batches(config.eval_interval),
                                 config.model.max_seq_len, config.precision, results)]  # the model's context


def recovery_callbacks(run: Run) -> list:
    """The recovery line under torchrun's elastic agent (restarts allowed), where the run keeps checkpoints on a
    file system."""
    folder, machine = run.config.checkpoint_folder, run.plan.machine
    return [RecoveryLine(folder, machine)] if machine.elastic and folder and '://' not in folder else []


def build_trainer(run: Run, device=None, extra_callbacks: list = (), model=None) -> Trainer:
    """Composer's Trainer for the run; ``model`` replaces the config's model (same data, optimizer, FSDP2)."""
    config = run.config
    split_sequences = context_parallel(config, run.kernels.attn_impl)
    model, parallelism_callbacks = (model, []) if model is not None else build_model(run, split_sequences)
    optimizer_name, optimizer_kwargs = registry.named_entries(config.optimizer, 'optimizer')
    optimizer = registry.build('optimizer', optimizer_name, optimizer_kwargs, model.parameters())
    schedulers = []
    if config.scheduler is not None:
        schedulers.append(registry.build('scheduler', *registry.named_entries(config.scheduler, 'scheduler')))
    data = config.data
    collator = build_collator(run)
    eval_dataloader = None
    if data.eval is not None:
        eval_dataloader = build_dataloader(data.eval, config.device_batch_size, collator, held_out=True,
                                           context_parallel=split_sequences)
    checkpoint = config.checkpoint
    savers = [SealedCheckpointSaver(
        folder=checkpoint.save_folder, remote_file_name=None, save_interval=checkpoint.save_interval,
        num_checkpoints_to_keep=checkpoint.save_num_checkpoints_to_keep)] if checkpoint.save_folder else []
    trainer = Trainer(
        run_name=config.run_name,
        device=device,
        model=model,
        train_dataloader=build_dataloader(data.train, config.device_batch_size, collator,
                                          context_parallel=split_sequences),
        eval_dataloader=eval_dataloader,
        eval_interval=config.eval_interval if eval_dataloader else 1,
        eval_subset_num_batches=config.eval_subset_num_batches,
        max_duration=config.max_duration,
        optimizers=optimizer,
        schedulers=schedulers,
        precision=config.precision,
        device_train_microbatch_size=config.device_microbatch_size or config.device_batch_size,
        parallelism_config=composer_parallelism(config, run.plan.shards_the_model),
        # the saver last: at a batch's end the others run before it saves
        callbacks=[*build_named('callbacks', config.callbacks), *parallelism_callbacks, *downstream_callbacks(run),
                   *recovery_callbacks(run), *extra_callbacks, *savers],
        algorithms=build_named('algorithms', config.algorithms),
        loggers=build_loggers(config),
        autoresume=checkpoint.autoresume,
        load_path=checkpoint.load_path,
        **console_options(config),
        seed=config.seed,
    )
    reduce_replicas_by_sum_on_gloo(trainer.state.model, config)  # sharded by now
    return trainer
