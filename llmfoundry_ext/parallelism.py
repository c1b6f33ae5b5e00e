"""How the model is spread over the devices: where it is built (``meta`` under FSDP2), float8 linears, activation
checkpointing, per-block compile, Composer's FSDP2 / HSDP over a (replicate, shard) mesh, and context parallelism.

Applied in torchtitan's order (``parallelize_llama``): float8 swaps the blocks' linears, activation checkpointing
goes inside each chosen block, each block is compiled (checkpointing included), and Composer's FSDP2 then shards
each block as its own unit. Checkpointing thus runs inside the FSDP2 unit: the recomputation sees the inputs
FSDP2 already cast to bf16, as the forward did (Composer's own checkpoint wrapper sits outside the unit, where the
recomputation got the uncast fp32 RoPE tables and stopped with a CheckpointError).

Context parallelism (``ContextParallel``) splits each sequence over groups of consecutive ranks, innermost: FSDP2
shards over all ranks of a shard group as ever (shard x context flattened), each group reads the same samples, and
its ranks hold their load-balanced parts of every sequence.

Expert parallelism (``shard_experts``) splits each block's experts over groups of consecutive ranks, innermost, as
torchtitan does: a (expert_shard, expert) mesh, the experts' weights DTensors split over ``expert``, and FSDP2 over
``expert_shard`` (the ranks that hold the same experts) as a unit of their own inside the block's; the rest of the
model is FSDP2's over all ranks as ever. Checkpoints hold the experts' whole tensors (DCP), so a run resumes at
another degree.
"""
from collections import defaultdict
from dataclasses import dataclass

import torch
from composer.core import Callback
from composer.utils import FSDP2Config, dist
from torch.distributed.fsdp import FSDPModule
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

from llmfoundry_ext.callbacks.float8_scales import Float8ScalePrecompute
from llmfoundry_ext.config import TrainConfig
from llmfoundry_ext.model.attention import attention_mask
from llmfoundry_ext.model.llama import Transformer
from llmfoundry_ext.model.mixtral import GroupedExperts

# The attention kernels' ops (SDPA's, on GPUs and the CPU, and varlen's; flex's higher-order op, and compiled code,
# which inside an eager block is flex's compiled kernel). Under context parallelism the SDPA op is the ring: keeping
# its outputs keeps the recomputation off the ring and its communication.
ATTENTION_OPS = ('aten._scaled_dot_product_efficient_attention.default',
                 'aten._scaled_dot_product_flash_attention.default', 'aten._scaled_dot_product_cudnn_attention.default',
                 'aten._scaled_dot_product_attention_math.default',
                 'aten._scaled_dot_product_fused_attention_overrideable.default',
                 'aten._scaled_dot_product_flash_attention_for_cpu.default', 'torch_attn._varlen_attn.default')
ATTENTION_HIGHER_ORDER_OPS = ('flex_attention', 'inductor_compiled_code')
# Selective checkpointing keeps these ops' outputs and recomputes the rest (norms, RoPE, SwiGLU, casts):
# torchtitan's list, with the experts' grouped GEMMs (bf16 and float8). Every second matmul is recomputed too
# (``selective_recompute``).
SAVED_OPS = ('aten.mm.default', 'aten._grouped_mm.default', 'aten._scaled_grouped_mm.default', *ATTENTION_OPS,
             '_c10d_functional.reduce_scatter_tensor.default', 'aten.max.default')


def parallelize(transformer: Transformer, config: TrainConfig, context_parallel: 'ContextParallel | None' = None,
                sharded: bool = False) -> list[Callback]:
    """Context parallelism, float8, activation checkpointing and compile on the blocks, before Composer shards them
    (``sharded``: FSDP2 will, the plan's ``shards_the_model``). Returns the callbacks these need in training (float8's
    scale precompute for its fp8 all-gather)."""
    callbacks = []
    if context_parallel is not None:
        context_parallel.apply(transformer)
    if config.model.float8:
        fp8_all_gather = config.model.float8_recipe == 'tensorwise' and sharded
        convert_to_float8(transformer, config.model.float8_recipe, fp8_all_gather)
        if config.model.float8_output_layer:
            transformer.lm_head.float8_matmul = compiled_float8_matmul(transformer.lm_head, config.model.float8_recipe)
        if config.model.experts_in_float8:
            convert_experts_to_float8(transformer.layers)
        if fp8_all_gather:
            callbacks.append(Float8ScalePrecompute())
    fsdp = config.parallelism.fsdp
    options = checkpoint_options(fsdp.activation_checkpointing if fsdp else 'none')
    for block in checkpointed_blocks(transformer, config):
        block.checkpointing = options
    if config.model.compile:
        compile_blocks(transformer, context_parallel)
    return callbacks


def shard_experts(transformer: Transformer, config: TrainConfig) -> None:
    """``parallelism.expert_parallel_degree`` > 1: each block's experts split over groups of that many consecutive
    ranks (their current weights, the same on every rank, distributed), then FSDP2 over the ranks holding the same
    experts. Each expert's gradient sums the copies of every rank's tokens routed to it, so FSDP2 divides it by the
    world size, as the dense weights' by theirs (the mean over the data-parallel ranks)."""
    from composer.core import Precision
    from composer.distributed.fsdp2 import create_mixed_precision_policy
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import Shard, distribute_tensor

    degree, fsdp, world = config.parallelism.expert_parallel_degree, config.parallelism.fsdp, dist.get_world_size()
    device = 'cuda' if torch.cuda.is_available() else 'cpu'
    mesh = init_device_mesh(device, (world // degree, degree), mesh_dim_names=('expert_shard', 'expert'))
    policy = create_mixed_precision_policy(Precision(config.precision), fsdp.mixed_precision)
    for block in transformer.layers:
        experts = block.mlp.experts
        for name in ('w1', 'w2', 'w3'):
            weight = getattr(experts, name)
            setattr(experts, name, torch.nn.Parameter(distribute_tensor(weight.detach(), mesh['expert'], [Shard(0)])))
        experts.expert_group = mesh['expert'].get_group()
        fully_shard(experts, mesh=mesh['expert_shard'], mp_policy=policy,
                    reshard_after_forward=fsdp.reshard_after_forward is not False)
        experts.set_gradient_divide_factor(float(world))


def compile_blocks(transformer: Transformer, context_parallel: 'ContextParallel | None') -> None:
    """torch.compile each block; under context parallelism without Inductor's peak-memory reordering (below)."""
    options = CONTEXT_PARALLEL_COMPILE_OPTIONS if context_parallel is not None else None
    for block in transformer.layers:
        block.compile(options=options)


# Inductor's peak-memory reordering is a heuristic on buffer sizes, and under context parallelism each rank's graph
# has its own (the ring pairs each rank's shards differently). 8B at 131k over 2 H200s, it ordered the blocks'
# backward differently on the two ranks: rank 1 ran the MLP's weight-gradient GEMMs before the ring's attention
# backward, rank 0 after it. Each collective then waited for the other rank: 3.4 s of communication in a 27.3 s step
# (torchtitan's order: 0.4 s). Off, both ranks keep one order: 0.5 s, peak memory unchanged (86.4 GB).
CONTEXT_PARALLEL_COMPILE_OPTIONS = {'reorder_for_peak_memory': False}


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


def checkpoint_options(mode: str) -> dict:
    """torch.utils.checkpoint's options for an activation-checkpointing mode: full recomputes the whole block (its
    default), selective and full_except_attention only what their policies do not keep."""
    context_fn = CONTEXT_FUNCTIONS.get(mode)
    return {'context_fn': context_fn} if context_fn else {}


def selective_recompute():
    """Per-op selective checkpointing as torchtitan's ``op`` mode: keep matmul and attention outputs, but recompute
    every second matmul (in the Llama block: keep q, v, gate, down; recompute k, o, up) and all else."""
    saved = named_ops(SAVED_OPS, ATTENTION_HIGHER_ORDER_OPS)
    matmuls = defaultdict(int)

    def policy(context, op, *args, **kwargs):
        if op is torch.ops.aten.mm.default:
            phase = 'recompute' if context.is_recompute else 'forward'
            matmuls[phase] += 1
            if matmuls[phase] % 2 == 0:
                return CheckpointPolicy.PREFER_RECOMPUTE
        return CheckpointPolicy.MUST_SAVE if op in saved else CheckpointPolicy.PREFER_RECOMPUTE

    return create_selective_checkpoint_contexts(policy)


def recompute_all_but_attention():
    """full_except_attention: the whole block is recomputed but its attention, whose outputs (and log-sum-exp) are
    kept: a few MB a block beside full checkpointing, and the recomputation skips attention's FLOPs and, under context
    parallelism, the ring's communication. Under flex with context parallelism the keys and values are all-gathered
    again (keeping them would cost 2 x sequence x kv width a block)."""
    kept = named_ops(ATTENTION_OPS, ATTENTION_HIGHER_ORDER_OPS)

    def policy(context, op, *args, **kwargs):
        return CheckpointPolicy.MUST_SAVE if op in kept else CheckpointPolicy.PREFER_RECOMPUTE

    return create_selective_checkpoint_contexts(policy)


CONTEXT_FUNCTIONS = {'selective': selective_recompute, 'full_except_attention': recompute_all_but_attention}


def named_ops(names: tuple, higher_order_names: tuple) -> set:
    """The ops of ``names`` ('namespace.op.overload') and higher-order ops of ``higher_order_names`` this torch has."""
    ops = set()
    for name in names:
        namespace, op, overload = name.split('.')
        try:
            ops.add(getattr(getattr(getattr(torch.ops, namespace), op), overload))
        except (AttributeError, RuntimeError):
            continue
    higher_order = torch._higher_order_ops
    return ops | {getattr(higher_order, name) for name in higher_order_names if hasattr(higher_order, name)}


def convert_to_float8(transformer: Transformer, recipe: str, fp8_all_gather: bool) -> None:
    """torchao's float8 training for the blocks' linears, by its ``recipe`` (tensorwise: one scale a tensor, cuBLAS;
    rowwise: one a row, CUTLASS, power-of-2 scales). Tensorwise sharded over several GPUs all-gathers the weights in
    float8 (half the bytes), with scales computed once per step by ``Float8ScalePrecompute``."""
    from torchao.float8 import convert_to_float8_training

    layers = transformer.layers
    init_stds = {name: m.init_std for name, m in layers.named_modules() if hasattr(m, 'init_std')}
    config = float8_linear_config(recipe, fp8_all_gather)
    convert_to_float8_training(layers, config=config, module_filter_fn=float8_eligible)
    for name, std in init_stds.items():  # the swapped-in Float8Linear modules keep the depth-scaled init
        layers.get_submodule(name).init_std = std


FLOAT8_GROUP_ALIGNMENT = 16  # rows: torchao's float8 grouped GEMM takes each expert's group in multiples of 16


def convert_experts_to_float8(model: torch.nn.Module) -> None:
    """torchao's rowwise float8 grouped GEMMs for ``model``'s experts (``model.float8_experts``, torchtitan's
    ``quantize.grouped_mm.float8``): each expert weight wrapped in torchao's training tensor, whose grouped GEMMs
    quantize both operands as they run; each expert's group of rows padded to the multiple of 16 that its kernel
    takes (``GroupedExperts.group_alignment``)."""
    from torchao.prototype.moe_training.config import Float8TrainingOpConfig
    from torchao.quantization import quantize_

    quantize_(model, Float8TrainingOpConfig(), filter_fn=lambda module, name: isinstance(module, GroupedExperts))
    for module in model.modules():
        if isinstance(module, GroupedExperts):
            module.group_alignment = FLOAT8_GROUP_ALIGNMENT


def float8_linear_config(recipe: str, fp8_all_gather: bool = False):
    """torchao's ``Float8LinearConfig`` for ``recipe``."""
    from torchao.float8 import Float8LinearConfig

    if recipe == 'tensorwise':
        return Float8LinearConfig(enable_fsdp_float8_all_gather=fp8_all_gather)
    return Float8LinearConfig.from_recipe_name(recipe)


def compiled_float8_matmul(linear: torch.nn.Linear, recipe: str):
    """(hidden, weight) -> ``linear``'s output through torchao's float8 matmul by ``recipe``, compiled (the output
    layer's three GEMMs in float8; torchtitan's llama3 configs leave that layer in bf16). Not a swap to
    ``Float8Linear``: the output weight may be tied to the embeddings, which a float8 all-gather must not touch.
    Compiled, the casts of the [tokens x vocab] gradient fuse; eager, torchao's casts go through fp32 copies of it:
    the 1B at micro-batch 4 ran at 0.87x the bf16 output layer's speed with 38 GiB more (366c6dd,
    benchmarks/float8_gpu_2026-11-28.md)."""
    from torchao.float8.float8_linear import Float8Linear, matmul_with_hp_or_float8_args

    config = float8_linear_config(recipe)
    mm_config = Float8Linear(linear.in_features, linear.out_features, bias=False, config=config,
                             device='meta').linear_mm_config

    def float8_matmul(hidden: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        if torch.is_autocast_enabled(hidden.device.type):  # as Float8Linear: its matmul takes autocast's dtype
            hidden = hidden.to(torch.get_autocast_dtype(hidden.device.type))
        return matmul_with_hp_or_float8_args.apply(hidden, weight.t(), mm_config, config)

    return torch.compile(float8_matmul, dynamic=False)


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


def composer_parallelism(config: TrainConfig, sharded: bool):
    """Composer's ``parallelism_config``: FSDP2 over all ranks, or HSDP with ``replicate_degree`` replicas, where the
    plan shards the model (``sharded``); None for DDP and for one process. Activation checkpointing is ours
    (``parallelize``), so Composer's own stays off."""
    fsdp = config.parallelism.fsdp
    if not sharded:
        return None
    return {'fsdp': MeshFSDP2Config(
        replicate_degree=fsdp.replicate_degree, reshard_after_forward=fsdp.reshard_after_forward,
        activation_checkpointing=False, state_dict_type=fsdp.state_dict_type, mixed_precision=fsdp.mixed_precision)}


def reduce_replicas_by_sum_on_gloo(model: torch.nn.Module, config: TrainConfig) -> None:
    """HSDP on gloo (CPU processes): FSDP2 averages the replicas' gradients with ``ReduceOp.AVG``, which gloo's
    all-reduce lacks; summed, then divided by FSDP2 (``set_force_sum_reduction_for_comms``), they are the same mean.
    NCCL keeps its native average; FSDP alone is left as it is."""
    fsdp = config.parallelism.fsdp
    if fsdp is None or fsdp.replicate_degree == 1 or torch.distributed.get_backend() != 'gloo':
        return
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.set_force_sum_reduction_for_comms(True)


class ContextParallel:
    """Each sequence split over a group of ``degree`` consecutive ranks, with PyTorch's context parallelism
    (``torch.distributed.tensor.experimental``, applied as torchtitan v0.2.2 does).

    Every rank of a group is given the same samples (streaming's ``replication``); ``shard``, Composer's
    micro-batch transform, keeps this rank's part of each sequence: a head and a tail chunk under causal SDPA
    (balanced work for causal attention), flex's block-level balancing (PTRR) for document masks. Attention then runs
    on the shards: ring SDPA passes keys and values around the group, flex all-gathers them.
    """

    def __init__(self, degree: int, backend: str, causal: bool):
        from torch.distributed.device_mesh import init_device_mesh

        self.degree, self.backend, self.causal = degree, backend, causal
        device = 'cuda' if torch.cuda.is_available() else 'cpu'
        world = dist.get_world_size()
        self.mesh = init_device_mesh(device, (world // degree, degree), mesh_dim_names=('data', 'context'))['context']

    def apply(self, transformer: Transformer) -> None:
        """Wrap every block's inner attention (``wrap``)."""
        for block in transformer.layers:
            self.wrap(block.self_attn.inner_attention)
        transformer.context_parallel = self

    def wrap(self, attention: torch.nn.Module) -> None:
        """``attention(q, k, v, ...)`` [B, H, S, D] on this rank's shards: SDPA through the CP dispatcher (ring
        attention), flex with keys and values all-gathered."""
        from torch.distributed.tensor.experimental._attention import (
            _ContextParallel, _enable_context_parallel_dispatcher)
        from torch.distributed.tensor.parallel import parallelize_module

        if self.backend == 'flex':
            style = _ContextParallel(seq_dim=2, attention_type=_ContextParallel.AttentionType.FLEX)
        else:
            _enable_context_parallel_dispatcher()
            style = _ContextParallel(seq_dim=2, attention_type=_ContextParallel.AttentionType.SDPA)
        parallelize_module(attention, self.mesh, style)

    def shard(self, batch: dict) -> dict:
        """The whole micro-batch -> this rank's part of it: ``input_ids``, ``labels`` and ``position_ids`` (RoPE
        positions, per document where masked) along the sequence, the ``attention_mask`` for its queries over the
        group's keys (flex; None for SDPA, which masks causally), and the ``loss_scale`` that makes its loss its
        share of the group's token mean."""
        from torch.distributed.tensor.experimental._attention import (
            _context_parallel_shard, _HeadTailLoadBalancer, _PTRRLoadBalancer)

        input_ids, labels = batch['input_ids'], batch['labels']
        batch_size, seq_len = input_ids.shape
        positions = batch.get('position_ids')
        mask = None
        if self.backend == 'flex':
            mask = attention_mask('flex', positions, self.causal, batch_size, seq_len, input_ids.device)
            balancer = _PTRRLoadBalancer(mask, self.degree)
        else:
            balancer = _HeadTailLoadBalancer(seq_len, self.degree, input_ids.device)
        if positions is None:
            positions = torch.arange(seq_len, device=input_ids.device).expand(batch_size, -1)
        input_ids, labels, positions = _context_parallel_shard(
            self.mesh, (input_ids, labels, positions), (1, 1, 1), balancer)
        if mask is not None:
            mask, = _context_parallel_shard(self.mesh, (mask,), (2,), balancer)
        return {**batch, 'input_ids': input_ids, 'labels': labels, 'position_ids': positions,
                'attention_mask': mask, 'loss_scale': self.loss_scale(labels)}

    def loss_scale(self, labels: torch.Tensor) -> torch.Tensor:
        """degree x this rank's labelled tokens / the group's. A rank's token-mean loss times this, averaged over the
        group (as Composer logs it, and as FSDP2 averages gradients over all ranks), is the mean over every labelled
        token of the group's sequences, however unevenly the -100 labels fall."""
        local = (labels != -100).sum().float()
        group = local.clone()
        torch.distributed.all_reduce(group, group=self.mesh.get_group())
        return local * self.degree / group

    def samples(self, batch: dict) -> float:
        """This rank's share of the batch's samples (Composer sums them over ranks: each sample counted once)."""
        return batch['input_ids'].shape[0] / self.degree

    def tokens(self, batch: dict) -> int:
        """This rank's share of the batch's tokens, for Composer's token counts and tokens/s."""
        return batch['input_ids'].numel() // self.degree


def context_parallel(config: TrainConfig, backend: str) -> ContextParallel | None:
    """The run's ContextParallel (after the process group exists), or None at degree 1."""
    degree = config.parallelism.context_parallel_degree
    return ContextParallel(degree, backend, config.model.causal) if degree > 1 else None
