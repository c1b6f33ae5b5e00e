"""How the model is spread over the devices: where it is built (``meta`` under FSDP2), float8 linears, activation
checkpointing, per-block compile, and Composer's FSDP2 / HSDP over a (replicate, shard) mesh.

Applied in torchtitan's order (``parallelize_llama``): float8 swaps the blocks' linears, activation checkpointing
goes inside each chosen block, each block is compiled (checkpointing included), and Composer's FSDP2 then shards
each block as its own unit. Checkpointing thus runs inside the FSDP2 unit: the recomputation sees the inputs
FSDP2 already cast to bf16, as the forward did (Composer's own checkpoint wrapper sits outside the unit, where the
recomputation got the uncast fp32 RoPE tables and stopped with a CheckpointError).
"""
from collections import defaultdict
from dataclasses import dataclass

import torch
from composer.core import Callback
from composer.utils import FSDP2Config, dist
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

from llmfoundry_ext.callbacks.float8_scales import Float8ScalePrecompute
from llmfoundry_ext.config import TrainConfig, world_size
from llmfoundry_ext.model.llama import Transformer

# Selective checkpointing keeps these ops' outputs and recomputes the rest (norms, RoPE, SwiGLU, casts):
# torchtitan's list, with the experts' grouped GEMMs. Every second matmul is recomputed too (``selective_recompute``).
SAVED_OPS = ('aten.mm.default', 'aten._grouped_mm.default', 'aten._scaled_dot_product_efficient_attention.default',
             'aten._scaled_dot_product_flash_attention.default', 'aten._scaled_dot_product_cudnn_attention.default',
             'aten._scaled_dot_product_attention_math.default',
             'aten._scaled_dot_product_fused_attention_overrideable.default',
             '_c10d_functional.reduce_scatter_tensor.default', 'aten.max.default', 'torch_attn._varlen_attn.default')
SAVED_HIGHER_ORDER_OPS = ('flex_attention', 'inductor_compiled_code')


def init_device(config: TrainConfig) -> str:
    """``model.init_device``; auto: ``meta`` under FSDP2 on GPUs (each rank materialises its shards), but rank 0
    builds on the CPU to load ``init_from`` (Composer then broadcasts its weights to the other ranks' shards);
    ``cpu`` otherwise."""
    if config.model.init_device != 'auto':
        return config.model.init_device
    if not (torch.cuda.is_available() and config.parallelism.fsdp):
        return 'cpu'
    return 'cpu' if config.model.init_from and dist.get_global_rank() == 0 else 'meta'


def parallelize(transformer: Transformer, config: TrainConfig) -> list[Callback]:
    """Float8, activation checkpointing and compile on the blocks, before Composer shards them. Returns the
    callbacks these need in training (float8's scale precompute for its fp8 all-gather)."""
    callbacks = []
    if config.model.float8:
        sharded = config.parallelism.fsdp is not None and world_size() > 1
        convert_to_float8(transformer, fp8_all_gather=sharded)
        if sharded:
            callbacks.append(Float8ScalePrecompute())
    options = checkpoint_options(config)
    for block in checkpointed_blocks(transformer, config):
        block.checkpointing = options
    if config.model.compile:
        for block in transformer.layers:
            block.compile()
    return callbacks


def checkpointed_blocks(transformer: Transformer, config: TrainConfig) -> list:
    """Every ``checkpoint_every``-th block (the first included), none without activation checkpointing."""
    fsdp = config.parallelism.fsdp
    if fsdp is None or fsdp.activation_checkpointing == 'none':
        return []
    return [block for block in transformer.layers if block.layer_id % fsdp.checkpoint_every == 0]


def describe_checkpointing(config: TrainConfig) -> str:
    """'no activation checkpointing', 'full activation checkpointing of every block', 'selective ... every 2nd'."""
    fsdp = config.parallelism.fsdp
    if fsdp is None or fsdp.activation_checkpointing == 'none':
        return 'no activation checkpointing'
    every = fsdp.checkpoint_every
    blocks = 'every block' if every == 1 else f'every {every}{ORDINAL_SUFFIX.get(every, "th")} block'
    return f'{fsdp.activation_checkpointing} activation checkpointing of {blocks}'


ORDINAL_SUFFIX = {2: 'nd', 3: 'rd'}


def checkpoint_options(config: TrainConfig) -> dict:
    """torch.utils.checkpoint's options for the run's mode: full recomputes the whole block (its default),
    selective only what ``selective_recompute`` does not keep."""
    fsdp = config.parallelism.fsdp
    return {'context_fn': selective_recompute} if fsdp and fsdp.activation_checkpointing == 'selective' else {}


def selective_recompute():
    """Per-op selective checkpointing as torchtitan's ``op`` mode: keep matmul and attention outputs, but recompute
    every second matmul (in the Llama block: keep q, v, gate, down; recompute k, o, up) and all else."""
    saved = saved_ops()
    matmuls = defaultdict(int)

    def policy(context, op, *args, **kwargs):
        if op is torch.ops.aten.mm.default:
            phase = 'recompute' if context.is_recompute else 'forward'
            matmuls[phase] += 1
            if matmuls[phase] % 2 == 0:
                return CheckpointPolicy.PREFER_RECOMPUTE
        return CheckpointPolicy.MUST_SAVE if op in saved else CheckpointPolicy.PREFER_RECOMPUTE

    return create_selective_checkpoint_contexts(policy)


def saved_ops() -> set:
    """SAVED_OPS and SAVED_HIGHER_ORDER_OPS that this torch has."""
    ops = set()
    for name in SAVED_OPS:
        namespace, op, overload = name.split('.')
        try:
            ops.add(getattr(getattr(getattr(torch.ops, namespace), op), overload))
        except (AttributeError, RuntimeError):
            continue
    higher_order = torch._higher_order_ops
    return ops | {getattr(higher_order, name) for name in SAVED_HIGHER_ORDER_OPS if hasattr(higher_order, name)}


def convert_to_float8(transformer: Transformer, fp8_all_gather: bool) -> None:
    """torchao's tensorwise float8 training for the blocks' linears; sharded over several GPUs, the weights are
    all-gathered in float8 (half the bytes), with scales computed once per step by ``Float8ScalePrecompute``."""
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    layers = transformer.layers
    init_stds = {name: m.init_std for name, m in layers.named_modules() if hasattr(m, 'init_std')}
    convert_to_float8_training(layers, config=Float8LinearConfig(enable_fsdp_float8_all_gather=fp8_all_gather),
                               module_filter_fn=float8_eligible)
    for name, std in init_stds.items():  # the swapped-in Float8Linear modules keep the depth-scaled init
        layers.get_submodule(name).init_std = std


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


def composer_parallelism(config: TrainConfig):
    """Composer's ``parallelism_config``: FSDP2 over all ranks, or HSDP with ``replicate_degree`` replicas; None
    for DDP. Activation checkpointing is ours (``parallelize``), so Composer's own stays off."""
    fsdp = config.parallelism.fsdp
    if fsdp is None:
        return None
    return {'fsdp': MeshFSDP2Config(
        replicate_degree=fsdp.replicate_degree, reshard_after_forward=fsdp.reshard_after_forward,
        activation_checkpointing=False, state_dict_type=fsdp.state_dict_type, mixed_precision=fsdp.mixed_precision)}
