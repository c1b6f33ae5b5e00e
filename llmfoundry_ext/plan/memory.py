"""Peak GPU memory of a training step, predicted from the architecture and the settings (no GPU needed).

Derived analytically, tensor by tensor, as PyTorch allocates them in our step (bytes; P parameters, N the ranks a
parameter is sharded over, T tokens a GPU in a micro-batch, L blocks, d model width, kv the key/value width, f the
feed-forward width a token runs through, V the vocabulary):
- **states**: fp32 parameters and AdamW's two fp32 moments, 12 P / N; **gradients** fp32, 4 P / N, alive from the
  backward to the optimizer step and, with several micro-batches a step, through the next micro-batch's forward.
- **weights for compute** in bf16: under FSDP2 each block's gathered parameters, for all blocks from forward to
  backward when ``reshard_after_forward`` is false, else the block running and the one prefetched; one GPU (no
  FSDP2): autocast's bf16 copies of every linear weight, kept for the backward. float8 halves them (fp8 all-gather,
  fp8 weights saved), but a mixture of experts' experts, whose grouped GEMMs stay bf16.
- **activations** a block, bytes a token, what the backward keeps: none: the residual stream in and after
  attention (fp32 under autocast on one GPU, bf16 under FSDP2), both norms' outputs, q, k, v, the attention output
  and its log-sum-exp, SwiGLU's gate, up and product: R + 2 (4d + 2kv + 3f) + 4 heads, and a mixture of experts'
  routed copies, the experts' input rows and their output rows before the routing weights (4 k d); selective
  (torchtitan's op policy: every other matmul kept) the block input, q, v, the attention output, gate and down: R/2 + 2 (3d + kv +
  f); full: the block input R/2; full_except_attention: R/2 + 2d; float8 without checkpointing keeps the linears'
  inputs in fp8, 0.85 to 1.7 (3d + f) less (``FLOAT8_ACTIVATION_SAVING``; a mixture of experts 2d, the attention's
  alone: its grouped GEMMs keep their inputs in bf16, torchao's float8 ones too).
- **the loss**: liger's fused kernel computes the output layer's fp32 gradient (4 V d) in the forward; the compiled
  loss keeps bf16 logits and their gradient (4 V a token), and with the output layer in float8 the gradient's two
  float8 casts (2 V a token more); the eager loss fp32 logits too (10 V a token). They are
  freed before the backward recomputes its first checkpointed block (the block's activations without checkpointing),
  so the larger of the two counts; a mixture of experts' first grouped GEMM in the backward (the experts' down
  projection) adds, while every activation is still kept, its weights' gradient (bf16, and on one process its fp32
  copy: 6 bytes a weight) and its input's (2 T k f_expert), counted in the same largest.
- at the backward's end the largest FSDP2 unit's unsharded fp32 gradient and gathered weights (6 P_unit), and with
  checkpointing the block recomputed last: its activations (as without checkpointing) beside every gradient.
- a mixture of experts under expert parallelism (degree X): a block's experts are a unit of their own, and a rank
  gathers the X-th of them its group holds; their SwiGLU runs eager (the dispatch is outside the compiled block),
  keeping SiLU's output as well (2 f a token more, without checkpointing).

The peak is the larger of the forward's end (the backward's start) and the backward's end. Within 6 % of the
peaks measured (``tests/plan/test_memory.py``): those recorded in ``benchmarks/results`` (1B on one H100, 8B on two
H200s, every checkpointing mode, float8, reshard on and off; two of them fitted the float8 saving) and the 1B on one
H200 at eight settings (``benchmarks/results/plan``; docs/planning.md), Mixtral's width with 2 layers on one H200
in bf16, float8 and float8 experts (``benchmarks/results/mixtral-float8_h200``), at six settings
(``benchmarks/results/mixtral-auto_h200``) and at 8 and 16 samples a micro-batch
(``benchmarks/results/mixtral-mfu_h200x2``), and with 8 layers on two H200s, FSDP2 alone and expert parallel 2 with
the weights kept gathered, and FSDP2 resharded after the forward (``benchmarks/results/ep-mixtral_h200x2``). Not:
Mixtral with 2 layers over two H200s (34.8 GiB in the shipped test, 31.7 predicted, -8.9 %; not explained yet). The
counter it predicts is ``torch.cuda.max_memory_allocated``; the allocator (expandable segments) and the
CUDA context come on top, which the plan's fit margin covers (``run_plan.usable_bytes``) for dense models and Mixtral
on one GPU. Not for Mixtral over two H200s: at 8 layers the allocator reserved all 138 GiB it could, 14-28 GiB beyond
the allocated peak, and freed and retried its cache every one or two steps (2.4x and 1.5x slower than predicted, kept
gathered and resharded).
"""
import math
from dataclasses import dataclass

# float8 without checkpointing keeps this many times (3d + f) bytes a token a block less, fitted on one measurement
# each: the 1B on one H100 (autocast; its compiled block also stops keeping parts of the fp32 residual) and the 8B
# over two H200s (FSDP2).
FLOAT8_ACTIVATION_SAVING = {'one GPU': 1.7, 'sharded': 0.85}


@dataclass(frozen=True)
class Setting:
    """The choices the plan makes (``auto``) or obeys: what changes speed and memory."""
    micro_batch: int
    checkpointing: str = 'none'     # none, selective, full, full_except_attention
    reshard_after_forward: bool = True
    float8: bool = False


@dataclass(frozen=True)
class Layout:
    """What else of the run the memory depends on."""
    seq_len: int                 # tokens of a sequence a GPU holds (max_seq_len / context_parallel_degree)
    shard_ranks: int = 1         # N: the ranks each parameter is sharded over (1: unsharded)
    sharded: bool = False        # FSDP2 over several ranks (else one process under autocast, or DDP)
    accumulating: bool = False   # several micro-batches a step
    loss: str = 'fused'          # fused (liger), compiled, eager
    float8_output: bool = False  # the output layer's GEMMs in float8 (ModelConfig.output_layer_in_float8); with the
    #                              compiled loss alone
    checkpoint_every: int = 1
    expert_parallel: int = 1     # each block's experts split over this many ranks: FSDP2 gathers that share of them


@dataclass(frozen=True)
class MemoryEstimate:
    parts: dict       # name -> bytes at the peak
    peak: int         # bytes: torch.cuda.max_memory_allocated predicted
    phase: str        # 'forward' (its end) or 'backward' (its end)


def expert_params(arch) -> int:
    """A block's experts' weights (a mixture of experts' three matrices each), or 0."""
    return getattr(arch, 'n_experts', 0) * 3 * arch.dim * arch.ffn_dim


def active_ffn_width(arch) -> int:
    """f: the feed-forward width a token runs through (a Mixtral token runs through ``experts_per_token``)."""
    return arch.ffn_dim * getattr(arch, 'experts_per_token', 1)


def activation_bytes_per_token(arch, mode: str, sharded: bool, float8: bool, eager_experts: bool = False) -> int:
    """What one block keeps for its backward, a token (module docstring); ``eager_experts``: the experts' SwiGLU
    runs outside the compiled block (expert parallelism's dispatch) and keeps its SiLU's output too."""
    d, kv, f = arch.dim, arch.n_kv_heads * arch.head_dim, active_ffn_width(arch)
    residual = (4 if sharded else 8) * d  # the block's input and the residual after attention
    log_sum_exp = 4 * arch.n_heads
    if mode == 'none':
        experts = expert_params(arch) > 0
        routed_copies = 4 * arch.experts_per_token * d if experts else 0
        kept = residual + 2 * (4 * d + 2 * kv + (4 if eager_experts else 3) * f) + routed_copies + log_sum_exp
        saving = FLOAT8_ACTIVATION_SAVING['sharded' if sharded else 'one GPU']
        float8_inputs = 2 * d if experts else 3 * d + f
        return kept - (int(saving * float8_inputs) if float8 else 0)
    if mode == 'selective':
        return residual // 2 + 2 * (3 * d + kv + f) + log_sum_exp
    if mode == 'full_except_attention':
        return residual // 2 + 2 * d + log_sum_exp
    if mode == 'full':
        return residual // 2
    raise ValueError(f'unknown activation checkpointing mode {mode!r}')


def first_expert_gradient_bytes(arch, tokens: int, layout: 'Layout') -> int:
    """A mixture of experts' first grouped GEMM in the backward: its weights' gradient and its input's (module
    docstring); 0 for a dense model."""
    down_projections = expert_params(arch) // 3 // layout.expert_parallel  # a third of the rank's experts' weights
    if not down_projections:
        return 0
    return (2 if layout.sharded else 6) * down_projections + 2 * tokens * active_ffn_width(arch)


def loss_bytes(arch, tokens: int, loss: str, float8_output: bool = False) -> int:
    if loss == 'fused':
        return 4 * arch.vocab_size * arch.dim
    if loss == 'compiled':
        return (6 if float8_output else 4) * arch.vocab_size * tokens
    return 10 * arch.vocab_size * tokens


def estimate(arch, setting: Setting, layout: Layout) -> MemoryEstimate:
    """The predicted peak and its parts (module docstring)."""
    params, per_block, layers = arch.num_params(), arch.block_params(), arch.n_layers
    output_params = arch.vocab_size * arch.dim
    experts = expert_params(arch)
    experts_share = experts // layout.expert_parallel
    if layout.expert_parallel > 1:  # the experts a unit of their own, a rank gathering its group's share
        units = (per_block - experts, experts_share)
        per_block = sum(units)
    else:
        units = (per_block,)
    tokens = setting.micro_batch * layout.seq_len
    shards = layout.shard_ranks
    linear_bytes = 1 if setting.float8 else 2  # a weight's bytes for compute; the experts' stay bf16 under float8
    block_bytes = linear_bytes * (per_block - experts_share) + 2 * experts_share
    if layout.sharded:
        gathered_blocks = layers if not setting.reshard_after_forward else 2
        compute_weights = gathered_blocks * block_bytes + 2 * output_params
    else:  # autocast's copies: the norms' weights are not cast
        compute_weights = layers * (block_bytes - linear_bytes * 2 * arch.dim) + 2 * output_params
    checkpointed = 0 if setting.checkpointing == 'none' else math.ceil(layers / layout.checkpoint_every)
    plain = activation_bytes_per_token(arch, 'none', layout.sharded, setting.float8, layout.expert_parallel > 1)
    kept = activation_bytes_per_token(arch, setting.checkpointing, layout.sharded, False) if checkpointed else 0
    recomputed_block = tokens * plain if checkpointed else 0  # one block's activations, rebuilt in the backward
    states, gradients = 12 * params // shards, 4 * params // shards
    forward = {
        'parameters and optimizer state': states,
        'gradients': gradients if layout.accumulating else 0,
        'weights for compute': compute_weights,
        'activations': tokens * ((layers - checkpointed) * plain + checkpointed * kept + 4 * arch.dim),
        # the loss's tensors are freed before the backward recomputes its first checkpointed block
        'loss, the block recomputed first, or the first experts\' gradients': max(
            loss_bytes(arch, tokens, layout.loss, layout.float8_output), recomputed_block,
            first_expert_gradient_bytes(arch, tokens, layout)),
    }
    largest_unit = max(*units, output_params)
    backward = {'parameters and optimizer state': states, 'gradients': gradients,
                'largest unit gathered, its gradient unsharded': (6 if layout.sharded else 0) * largest_unit,
                'the block recomputed last': recomputed_block}
    forward_peak, backward_peak = sum(forward.values()), sum(backward.values())
    if forward_peak >= backward_peak:
        return MemoryEstimate(forward, forward_peak, 'forward')
    return MemoryEstimate(backward, backward_peak, 'backward')
