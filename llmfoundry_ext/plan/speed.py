"""Training tokens/s a GPU, predicted from FLOPs, a fitted efficiency and the optimizer's memory traffic (no GPU).

A step's compute runs ``flops_per_token`` (torchtitan's convention, as our MFU) for each token a GPU trains, at a
fraction of the GPU's dense bf16 peak that grows with the work of one GEMM (tokens a micro-batch x width):
``EFFICIENCY_MAX x w / (w + HALF_WORK)`` x the GPU's ``efficiency``. Then the optimizer step reads and writes
``OPTIMIZER_BYTES`` a parameter of its shard (fused AdamW and the gradient norm) at the GPU's memory bandwidth.
Fitted to the 1B on one H200, 8 samples a step in micro-batches of 1, 2, 4, 8 (53,477 to 57,061 tokens/s, within
0.7 %); the H100's ``efficiency`` (0.967) to the 1B on one H100 at 2 and 4 samples. On that:
- **FSDP2 over several GPUs** exposes some of its communication: ``SHARDED_EFFICIENCY`` (8B over two H200s);
- **float8** runs the blocks' linear layers ``FLOAT8_GEMM_SPEEDUP`` times faster, casts included (1B on one H100
  1.13x overall, on one H200 1.14-1.15x; 8B on two H200s 1.17x), and the output layer's where it is float8 too
  (``float8_output``, ``FLOAT8_OUTPUT_SPEEDUP``: the 1B on one H200 1.05-1.06x more);
- **activation checkpointing** adds the recomputed forward's FLOPs at ``RECOMPUTE_COST`` of their time (8B over two
  H200s: selective 0.92x, full 0.83x of none; the 1B on one H200: 0.93x, 0.83x);
- **resharding after forward** (FSDP2 over several GPUs) gathers the weights again for the backward:
  ``RESHARD_FACTOR`` (8B over two H200s).
Communication between nodes is not modelled: figures for many nodes assume it overlaps as within one.
"""
from llmfoundry_ext.plan.memory import Setting, active_ffn_width

EFFICIENCY_MAX = 0.626
HALF_WORK = 1.3e6           # tokens x width at which the efficiency is half its maximum
OPTIMIZER_BYTES = 32        # fused AdamW: parameter, gradient and two moments read, three written (fp32); the norm
SHARDED_EFFICIENCY = 0.958
FLOAT8_GEMM_SPEEDUP = 1.26
FLOAT8_OUTPUT_SPEEDUP = 1.6  # the output layer's one wide GEMM (tokens x 128,256): fitted to the 1B on one H200
RECOMPUTE_COST = {'selective': 1.0, 'full': 0.65, 'full_except_attention': 0.65}
RESHARD_FACTOR = 0.975


def efficiency(tokens: int, width: int) -> float:
    work = tokens * width
    return EFFICIENCY_MAX * work / (work + HALF_WORK)


def block_matmul_params(arch) -> int:
    """Parameters of one block's linear layers that a token runs through."""
    kv_dim = arch.n_kv_heads * arch.head_dim
    return arch.dim * (2 * arch.dim + 2 * kv_dim) + 3 * arch.dim * active_ffn_width(arch)


def recomputed_flops_per_token(arch, mode: str, seq_len: int, checkpointed_blocks: int) -> float:
    """The forward FLOPs a token's checkpointed blocks run again in the backward."""
    d, kv, f = arch.dim, arch.n_kv_heads * arch.head_dim, active_ffn_width(arch)
    if mode == 'none':
        return 0
    if mode == 'selective':  # every other matmul: k, o, up
        per_block = 2 * (d * kv + d * d + d * f)
    elif mode == 'full_except_attention':
        per_block = 2 * block_matmul_params(arch)
    else:
        per_block = 2 * block_matmul_params(arch) + 4 * d * seq_len
    return checkpointed_blocks * per_block


def compute_time_factor(arch, setting: Setting, seq_len: int, checkpoint_every: int,
                        float8_output: bool = False) -> float:
    """A token's compute time relative to bf16 without checkpointing: float8's faster GEMMs, the recomputation."""
    flops = arch.flops_per_token(seq_len)
    matmul_share = 6 * arch.n_layers * block_matmul_params(arch) / flops
    output_share = 6 * arch.vocab_size * arch.dim / flops if float8_output else 0
    factor = 1.0
    if setting.float8:
        factor -= matmul_share * (1 - 1 / FLOAT8_GEMM_SPEEDUP) + output_share * (1 - 1 / FLOAT8_OUTPUT_SPEEDUP)
    if setting.checkpointing != 'none':
        blocks = -(-arch.n_layers // checkpoint_every)
        recomputed = recomputed_flops_per_token(arch, setting.checkpointing, seq_len, blocks)
        factor += RECOMPUTE_COST[setting.checkpointing] * recomputed / flops
    return factor


def tokens_per_second(arch, setting: Setting, seq_len: int, micro_tokens: int, step_tokens: int, shard_ranks: int,
                      sharded: bool, gpu, checkpoint_every: int = 1, float8_output: bool = False) -> float:
    """Predicted training tokens/s a GPU. ``seq_len``: the whole sequence (attention's FLOPs); ``micro_tokens`` and
    ``step_tokens``: one GPU's tokens in a micro-batch and in a step; ``shard_ranks``: the ranks the optimizer's
    state is sharded over; ``float8_output``: the output layer's GEMMs in float8 too (with the setting's float8)."""
    rate = gpu.bf16_flops * efficiency(micro_tokens, arch.dim) * gpu.efficiency
    if sharded:
        rate *= SHARDED_EFFICIENCY * (RESHARD_FACTOR if setting.reshard_after_forward else 1.0)
    compute = step_tokens * arch.flops_per_token(seq_len) * compute_time_factor(arch, setting, seq_len,
                                                                                checkpoint_every, float8_output) / rate
    optimizer = OPTIMIZER_BYTES * arch.num_params() / shard_ranks / gpu.bandwidth
    return step_tokens / (compute + optimizer)
