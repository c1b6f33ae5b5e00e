"""Training tokens/s a GPU, predicted from FLOPs, a fitted efficiency and memory traffic (no GPU).

A step's compute runs ``flops_per_token`` (torchtitan's convention, as our MFU) for each token a GPU trains, at a
fraction of the GPU's dense bf16 peak that grows with the work of one GEMM (tokens x width):
``EFFICIENCY_MAX x w / (w + HALF_WORK)`` x the GPU's ``efficiency``; a mixture of experts' grouped GEMMs see the
tokens routed to one expert (micro-batch x k / E). Then memory traffic at the GPU's bandwidth: the optimizer step
reads and writes ``OPTIMIZER_BYTES`` a parameter of its shard (fused AdamW and the gradient norm), and one process
(autocast over fp32 weights) casts every weight to bf16 and its gradient back each micro-batch (``WEIGHT_BYTES``):
what makes small micro-batches slower, and a mixture of experts (weights several times those a token runs through)
slower than its FLOPs. Fitted (the largest error over the recorded runs, each within 2.3 %) to the 1B on one H200
at eight settings, the 1B on one H100 and the 8B on two H200s; the H100's ``efficiency`` (0.967) to the 1B on one
H100 at 2 and 4 samples. On that:
- **FSDP2 over several GPUs** exposes some of its communication: ``SHARDED_EFFICIENCY`` (8B over two H200s);
- **float8** runs the blocks' linear layers ``FLOAT8_GEMM_SPEEDUP`` times faster, casts included (1B on one H100
  1.13x overall, on one H200 1.14-1.15x; 8B on two H200s 1.17x), and the output layer's where it is float8 too
  (``float8_output``, ``FLOAT8_OUTPUT_SPEEDUP``: the 1B on one H200 1.05-1.06x more); a mixture of experts' grouped
  GEMMs gain nothing (float8 experts on one H200, Mixtral's width: 0.97x float8 on the attention alone), so there
  float8 speeds the attention's linears only;
- **activation checkpointing** adds the recomputed forward's FLOPs at ``RECOMPUTE_COST`` of their time (8B over two
  H200s: selective 0.92x, full 0.83x of none; the 1B on one H200: 0.93x, 0.83x);
- **resharding after forward** (FSDP2 over several GPUs) gathers the weights again for the backward:
  ``RESHARD_FACTOR`` (8B over two H200s).
Communication between nodes is not modelled: figures for many nodes assume it overlaps as within one. Under FSDP2
the weights' copies are inside ``SHARDED_EFFICIENCY`` (dense models): a mixture of experts over several GPUs has not
been measured. Mixtral's width with 2 layers on one H200, micro-batch 1, selective checkpointing (issue 67's run,
52,655 tokens/s): 55,748 predicted (+5.9 %; +41 % without the weights' casts); at micro-batch 4, no checkpointing
(auto's choice): 84,057 against 78,547 in bf16 (+7.0 %), 85,280 against 80,157 with float8 (+6.4 %).
"""
from llmfoundry_ext.plan.memory import Setting, active_ffn_width, expert_params

EFFICIENCY_MAX = 0.62
HALF_WORK = 1.5e5           # tokens x width at which the efficiency is half its maximum
OPTIMIZER_BYTES = 32        # fused AdamW: parameter, gradient and two moments read, three written (fp32); the norm
WEIGHT_BYTES = 22           # one process, a parameter a micro-batch: fp32 read and bf16 copy written (6), the copy's
#                             gradient written and read (4), cast to fp32 and added to the gradient (12)
RECAST_BYTES = 6            # the recomputed forward's casts
SHARDED_EFFICIENCY = 0.921
FLOAT8_GEMM_SPEEDUP = 1.26
FLOAT8_OUTPUT_SPEEDUP = 1.6  # the output layer's one wide GEMM (tokens x 128,256): fitted to the 1B on one H200
RECOMPUTE_COST = {'selective': 1.0, 'full': 0.65, 'full_except_attention': 0.65}
RESHARD_FACTOR = 0.975


def efficiency(tokens: float, width: int) -> float:
    work = tokens * width
    return EFFICIENCY_MAX * work / (work + HALF_WORK)


def expert_flops_share(arch, seq_len: int) -> float:
    """The share of a token's FLOPs in a mixture of experts' grouped GEMMs (0 for a dense model)."""
    routed = getattr(arch, 'experts_per_token', 0) * 3 * arch.dim * arch.ffn_dim
    return 6 * arch.n_layers * routed / arch.flops_per_token(seq_len)


def compute_efficiency(arch, micro_tokens: int, seq_len: int) -> float:
    """The efficiency of a micro-batch's GEMMs together: an expert's grouped GEMM runs on the tokens routed to it
    (micro-batch x k / E on average: fewer than one token where E > micro-batch x k), the other GEMMs on the whole
    micro-batch."""
    share = expert_flops_share(arch, seq_len)
    dense = efficiency(micro_tokens, arch.dim)
    if not share:
        return dense
    routed = efficiency(micro_tokens * arch.experts_per_token / arch.n_experts, arch.dim)
    return 1 / ((1 - share) / dense + share / routed)


def weight_traffic_seconds(arch, setting: Setting, micro_batches: int, gpu) -> float:
    """One process under autocast, a step: each micro-batch casts every weight to bf16 and its gradient back
    (``WEIGHT_BYTES``, ``RECAST_BYTES`` more where checkpointing recomputes the forward), at the GPU's bandwidth:
    a mixture of experts' weights are several times the ones a token runs through."""
    per_parameter = WEIGHT_BYTES + (RECAST_BYTES if setting.checkpointing != 'none' else 0)
    return micro_batches * per_parameter * arch.num_params() / gpu.bandwidth


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


def float8_matmul_params(arch) -> int:
    """Parameters of one block's linear layers that float8 speeds, those a token runs through: all of them, but a
    mixture of experts' grouped GEMMs (module docstring)."""
    experts = 3 * arch.dim * active_ffn_width(arch) if expert_params(arch) else 0
    return block_matmul_params(arch) - experts


def compute_time_factor(arch, setting: Setting, seq_len: int, checkpoint_every: int,
                        float8_output: bool = False) -> float:
    """A token's compute time relative to bf16 without checkpointing: float8's faster GEMMs, the recomputation."""
    flops = arch.flops_per_token(seq_len)
    matmul_share = 6 * arch.n_layers * float8_matmul_params(arch) / flops
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
    rate = gpu.bf16_flops * compute_efficiency(arch, micro_tokens, seq_len) * gpu.efficiency
    if sharded:
        rate *= SHARDED_EFFICIENCY * (RESHARD_FACTOR if setting.reshard_after_forward else 1.0)
    compute = step_tokens * arch.flops_per_token(seq_len) * compute_time_factor(arch, setting, seq_len,
                                                                                checkpoint_every, float8_output) / rate
    optimizer = OPTIMIZER_BYTES * arch.num_params() / shard_ranks / gpu.bandwidth
    casts = 0 if sharded else weight_traffic_seconds(arch, setting, step_tokens // micro_tokens, gpu)
    return step_tokens / (compute + optimizer + casts)
