"""Llama 2 and 3.x in plain PyTorch, with Hugging Face parameter names and rotate-half RoPE.

Shapes: B batch, S sequence, H query heads, K key/value heads, D head dim.
The module tree mirrors transformers' LlamaModel (``embed_tokens``, ``layers.{i}.self_attn.q_proj``,
``layers.{i}.mlp.gate_proj``, ``norm``) so HF conversion is a rename of the ``model.`` prefix.
"""
import math
from dataclasses import dataclass, field, fields
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from llmfoundry_ext.bounds import AtLeastOneFloat, PositiveFloat, PositiveInt
from llmfoundry_ext.model import fused
from llmfoundry_ext.model.attention import attend, attention_mask, choose_backend
from llmfoundry_ext.model.kernels import KernelConfig


# How fresh weights are drawn. torchtitan (v0.2.2's llama3 ``init_weights``, depth_init): token embeddings N(0, 1)
# (untied), q/k/v/gate 0.02, o/down/up 0.02 / sqrt(2 (layer + 1)); gpt2 (GPT-2's scaled residual init): embeddings
# 0.02, o/down 0.02 / sqrt(2 layers), the rest 0.02. Both: an untied output layer dim^-0.5, cut at 3 std. On the
# learning benchmark (docs/learning.md; 1B, 220 steps, one seed) the last 50 steps' loss was 2.97 with gpt2's, 2.62
# with torchtitan's (torchtitan itself: 2.46).
INIT_SCHEMES = ('torchtitan', 'gpt2')


@dataclass(frozen=True)
class LlamaConfig:
    """Architecture of one Llama model; every field matches an HF ``LlamaConfig`` key by meaning. Fields marked
    ``weights: False`` describe how the weights are used, not the weights (``weight_fields``)."""
    dim: PositiveInt = 4096                   # model width
    n_layers: PositiveInt = 32                # transformer blocks
    n_heads: PositiveInt = 32                 # attention (query) heads
    n_kv_heads: PositiveInt = 8               # key/value heads (grouped-query attention)
    ffn_dim: PositiveInt = 14336              # SwiGLU feed-forward width
    vocab_size: PositiveInt = 128256          # embedding rows; the tokenizer's ids must fit
    norm_eps: PositiveFloat = 1e-5            # RMSNorm's epsilon
    rope_theta: PositiveFloat = 500000.0      # RoPE's base
    rope_scaling_factor: AtLeastOneFloat = 8.0  # Llama-3.1 frequency scaling; 1.0 turns it off
    rope_low_freq_factor: PositiveFloat = 1.0  # Llama-3.1 scaling's low-frequency bound
    rope_high_freq_factor: PositiveFloat = 4.0  # Llama-3.1 scaling's high-frequency bound
    rope_original_max_seq_len: PositiveInt = 8192  # the context the scaling starts from
    max_seq_len: PositiveInt = field(default=131072, metadata={'weights': False})  # the RoPE range trained for
    tie_embeddings: bool = False              # the output layer shares the embeddings' weight
    causal: bool = field(default=True, metadata={'weights': False})  # False: bidirectional attention (masked LM)
    init_scheme: Literal[INIT_SCHEMES] = field(default='torchtitan', metadata={'weights': False})  # fresh weights:
    #                                           torchtitan's depth-scaled init, or gpt2's

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads

    def feed_forward_params(self, active: bool = False) -> int:
        """Parameters of one block's feed-forward (``active``: those one token runs through; the same here)."""
        return 3 * self.dim * self.ffn_dim

    def block_params(self, active: bool = False) -> int:
        """Parameters of one block: attention, feed-forward (``active``: those a token runs through), two norms."""
        kv_dim = self.n_kv_heads * self.head_dim
        attention = self.dim * (2 * self.dim + 2 * kv_dim)
        return attention + self.feed_forward_params(active) + 2 * self.dim

    def num_params(self, include_embedding: bool = True, active: bool = False) -> int:
        """Parameter count from the config alone (tied output counted once); ``active``: per token."""
        embedding = self.vocab_size * self.dim
        output = 0 if self.tie_embeddings else embedding
        return self.n_layers * self.block_params(active) + self.dim + output + (embedding if include_embedding else 0)

    def flops_per_token(self, seq_len: int) -> int:
        """Training FLOPs per token (forward + backward), torchtitan's convention for MFU.

        6 x (active parameters in matmuls, the output layer included) + 12 x layers x dim x seq_len for
        attention scores and values (no causal discount, so MFU figures compare with torchtitan's).
        """
        matmul_params = self.num_params(include_embedding=False, active=True)
        if self.tie_embeddings:
            matmul_params += self.vocab_size * self.dim
        return 6 * matmul_params + 12 * self.n_layers * self.dim * seq_len


_LLAMA2 = dict(vocab_size=32000, norm_eps=1e-5, rope_theta=10000.0, rope_scaling_factor=1.0, max_seq_len=4096)
_LLAMA3_ROPE = dict(rope_theta=500000.0, vocab_size=128256, norm_eps=1e-5, n_kv_heads=8,
                    rope_low_freq_factor=1.0, rope_high_freq_factor=4.0, rope_original_max_seq_len=8192)
PRESETS = {
    'debug': LlamaConfig(dim=256, n_layers=4, n_heads=8, n_kv_heads=4, ffn_dim=768, vocab_size=8000,
                         rope_theta=10000.0, rope_scaling_factor=1.0, max_seq_len=2048, tie_embeddings=True),
    '1b': LlamaConfig(dim=2048, n_layers=16, n_heads=32, ffn_dim=8192, rope_scaling_factor=32.0,
                      tie_embeddings=True, **_LLAMA3_ROPE),
    '3b': LlamaConfig(dim=3072, n_layers=28, n_heads=24, ffn_dim=8192, rope_scaling_factor=32.0,
                      tie_embeddings=True, **_LLAMA3_ROPE),
    '8b': LlamaConfig(dim=4096, n_layers=32, n_heads=32, ffn_dim=14336, rope_scaling_factor=8.0, **_LLAMA3_ROPE),
    '70b': LlamaConfig(dim=8192, n_layers=80, n_heads=64, ffn_dim=28672, rope_scaling_factor=8.0, **_LLAMA3_ROPE),
    'llama2-7b': LlamaConfig(dim=4096, n_layers=32, n_heads=32, n_kv_heads=32, ffn_dim=11008, **_LLAMA2),
    'llama2-13b': LlamaConfig(dim=5120, n_layers=40, n_heads=40, n_kv_heads=40, ffn_dim=13824, **_LLAMA2),
    'llama2-70b': LlamaConfig(dim=8192, n_layers=80, n_heads=64, n_kv_heads=8, ffn_dim=28672, **_LLAMA2),
}


def weight_fields(config_class) -> list[str]:
    """The fields of an architecture config that trained weights fix (their shapes and the positions they learned)."""
    return [spec.name for spec in fields(config_class) if spec.metadata.get('weights', True)]


def rope_inverse_frequencies(config: LlamaConfig) -> torch.Tensor:
    """[D/2] fp32 inverse frequencies, with Llama-3.1's smooth low/high-frequency scaling (as HF computes it)."""
    exponents = torch.arange(0, config.head_dim, 2, dtype=torch.int64).float() / config.head_dim
    inv_freq = 1.0 / (config.rope_theta ** exponents)
    factor = config.rope_scaling_factor
    if factor == 1.0:
        return inv_freq
    wavelength = 2 * math.pi / inv_freq
    low_freq_wavelength = config.rope_original_max_seq_len / config.rope_low_freq_factor
    high_freq_wavelength = config.rope_original_max_seq_len / config.rope_high_freq_factor
    scaled = torch.where(wavelength > low_freq_wavelength, inv_freq / factor, inv_freq)
    smooth = (config.rope_original_max_seq_len / wavelength - config.rope_low_freq_factor) / (
        config.rope_high_freq_factor - config.rope_low_freq_factor)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = ~(wavelength < high_freq_wavelength) & ~(wavelength > low_freq_wavelength)
    return torch.where(is_medium, smoothed, scaled)


INIT_STD = 0.02


def residual_init_std(config: LlamaConfig, layer_id: int) -> float:
    """Init std of the projections that write into the residual stream (attention's o, the feed-forward's down)."""
    depth = layer_id + 1 if config.init_scheme == 'torchtitan' else config.n_layers
    return INIT_STD / math.sqrt(2 * depth)


def up_init_std(config: LlamaConfig, layer_id: int) -> float:
    """Init std of SwiGLU's up projection: torchtitan scales it as the residual projections (its w3), gpt2 does not."""
    return residual_init_std(config, layer_id) if config.init_scheme == 'torchtitan' else INIT_STD


def embedding_init_std(config: LlamaConfig) -> float:
    """Init std of the token embeddings: torchtitan's 1.0 unless tied to the output layer (whose logits it would
    blow up), else 0.02."""
    return 1.0 if config.init_scheme == 'torchtitan' and not config.tie_embeddings else INIT_STD


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    first, second = x.chunk(2, dim=-1)
    return torch.cat((-second, first), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [B, heads, S, D]; cos/sin [B or 1, 1, S, D]."""
    return (x * cos + rotate_half(x) * sin).to(x.dtype)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float, fused_kernel: bool = False):
        super().__init__()
        self.eps = eps
        self.fused_kernel = fused_kernel
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.fused_kernel:
            return fused.rms_norm(x, self.weight, self.eps)
        x32 = x.float()
        normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * normed.to(x.dtype)


class InnerAttention(nn.Module):
    """``attend`` as a module of its own (no parameters), so context parallelism can wrap it: PyTorch's
    ``_ContextParallel`` style turns q, k, v into sequence-sharded DTensors for ring SDPA, or all-gathers k, v for
    flex (``parallelism.ContextParallel``)."""

    def forward(self, q, k, v, causal: bool, backend: str, mask, sdpa_kernel: str) -> torch.Tensor:
        return attend(q, k, v, causal, backend, mask, sdpa_kernel)


class Attention(nn.Module):
    def __init__(self, config: LlamaConfig, kernels: KernelConfig, layer_id: int):
        super().__init__()
        self.config, self.kernels = config, kernels
        kv_dim = config.n_kv_heads * config.head_dim
        self.q_proj = nn.Linear(config.dim, config.dim, bias=False)
        self.k_proj = nn.Linear(config.dim, kv_dim, bias=False)
        self.v_proj = nn.Linear(config.dim, kv_dim, bias=False)
        self.o_proj = nn.Linear(config.dim, config.dim, bias=False)
        self.o_proj.init_std = residual_init_std(config, layer_id)
        self.inner_attention = InnerAttention()
        self.kv_cache = None  # while generating, the keys and values read so far (model/kv_cache.py)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, backend: str, mask=None) -> torch.Tensor:
        """``backend`` and ``mask`` come from ``Transformer.attention_backend`` / ``attention_mask``."""
        batch, seq_len, _ = x.shape
        config = self.config
        q = self.q_proj(x).view(batch, seq_len, -1, config.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(batch, seq_len, -1, config.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(batch, seq_len, -1, config.head_dim).transpose(1, 2)
        if 'rope' in self.kernels.fused_kernels:
            q, k = fused.rope(q, k, cos, sin)
        else:
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if self.kv_cache is not None:
            k, v = self.kv_cache.append(k, v)
        out = self.inner_attention(q, k, v, config.causal, backend, mask, self.kernels.sdpa_kernel)
        return self.o_proj(out.transpose(1, 2).reshape(batch, seq_len, -1))


class FeedForward(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x))."""

    def __init__(self, config: LlamaConfig, kernels: KernelConfig, layer_id: int):
        super().__init__()
        self.fused_kernel = 'swiglu' in kernels.fused_kernels
        self.gate_proj = nn.Linear(config.dim, config.ffn_dim, bias=False)
        self.up_proj = nn.Linear(config.dim, config.ffn_dim, bias=False)
        self.down_proj = nn.Linear(config.ffn_dim, config.dim, bias=False)
        self.down_proj.init_std = residual_init_std(config, layer_id)
        self.up_proj.init_std = up_init_std(config, layer_id)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.fused_kernel:
            return self.down_proj(fused.swiglu(self.gate_proj(x), self.up_proj(x)))
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


def make_norm(config: LlamaConfig, kernels: KernelConfig) -> RMSNorm:
    return RMSNorm(config.dim, config.norm_eps, fused_kernel='rms_norm' in kernels.fused_kernels)


class TransformerBlock(nn.Module):
    feed_forward_class = FeedForward

    def __init__(self, config: LlamaConfig, kernels: KernelConfig, layer_id: int):
        super().__init__()
        self.layer_id = layer_id
        self.input_layernorm = make_norm(config, kernels)
        self.self_attn = Attention(config, kernels, layer_id)
        self.post_attention_layernorm = make_norm(config, kernels)
        self.mlp = self.feed_forward_class(config, kernels, layer_id)
        self.checkpointing = None  # activation checkpointing: torch.utils.checkpoint's options (parallelism.py)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, backend: str, mask=None) -> torch.Tensor:
        """x [B, S, dim] -> [B, S, dim]; with ``checkpointing`` set, activations are recomputed in backward."""
        if self.checkpointing is None:
            return self.compute(x, cos, sin, backend, mask)
        return checkpoint(self.compute, x, cos, sin, backend, mask, use_reentrant=False, preserve_rng_state=False,
                          **self.checkpointing)

    def compute(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, backend: str, mask=None):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, backend, mask)
        return self.add_feed_forward(x)

    def add_feed_forward(self, x: torch.Tensor):
        return x + self.mlp(self.post_attention_layernorm(x))


class OutputLayer(nn.Linear):
    """Hidden states -> logits; or, given labels, the fused output layer and cross-entropy (no logits). Both go
    through the module's call, so FSDP2 gathers the weight when the layer is its own unit; and both run inside the
    Transformer's forward: Composer's FSDP2 reshards the root unit (the tied output weight's) when it returns.
    ``float8_matmul`` (hidden, weight) -> logits: where set (``parallelism.float8_output``), training's logits come
    from it; evaluation's stay bf16."""
    float8_matmul = None

    def forward(self, hidden: torch.Tensor, labels: torch.Tensor | None = None) -> torch.Tensor:
        if labels is not None:
            return fused.linear_cross_entropy(hidden, self.weight, labels)
        if self.float8_matmul is not None and self.training:
            return self.float8_matmul(hidden, self.weight)
        return super().forward(hidden)


def at(hidden: torch.Tensor, places: tuple | None) -> torch.Tensor:
    """``hidden`` [B, S, D] at ``places`` (rows, positions) -> [N, D]; all of it where ``places`` is None."""
    return hidden if places is None else hidden[places]


class Transformer(nn.Module):
    """Token ids [B, S] -> logits [B, S, vocab], run with the given kernels."""
    block_class = TransformerBlock
    context_parallel = None  # parallelism.ContextParallel once applied: inputs come as its shards

    def __init__(self, config: LlamaConfig, kernels: KernelConfig = KernelConfig()):
        super().__init__()
        self.config, self.kernels = config, kernels
        self.embed_tokens = nn.Embedding(config.vocab_size, config.dim)
        self.layers = nn.ModuleList(self.block_class(config, kernels, i) for i in range(config.n_layers))
        self.norm = make_norm(config, kernels)
        self.lm_head = OutputLayer(config.dim, config.vocab_size, bias=False)
        if config.tie_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        else:
            self.lm_head.init_std = config.dim ** -0.5
        self.register_buffer('inv_freq', rope_inverse_frequencies(config), persistent=False)

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor | None = None,
                labels: torch.Tensor | None = None, attention_mask=None, logits_at: tuple | None = None
                ) -> torch.Tensor:
        """Logits [B, S, vocab]; or, given ``labels`` (with the fused cross_entropy kernel), the mean loss; or, given
        ``logits_at`` (rows, positions), the logits at those places alone [N, vocab] (scoring: the output layer, a
        fifth of a 1B's compute, runs only where it is read). ``attention_mask``: under context parallelism the
        shard's part of the mask; otherwise an explicit one (``layer_inputs``)."""
        return self.lm_head(at(self.hidden_states(input_ids, position_ids, attention_mask), logits_at), labels)

    def hidden_states(self, input_ids: torch.Tensor, position_ids: torch.Tensor | None = None,
                      attention_mask=None) -> torch.Tensor:
        """Final-norm hidden states [B, S, dim]."""
        x, *context = self.layer_inputs(input_ids, position_ids, attention_mask)
        for layer in self.layers:
            x = layer(x, *context)
        return self.norm(x)

    def layer_inputs(self, input_ids: torch.Tensor, position_ids: torch.Tensor | None, given_mask=None) -> tuple:
        """(embeddings, cos, sin, backend, mask): what every block takes.

        Given ``position_ids`` (packed documents, restarting at 0), attention stays within each document. Under
        context parallelism the inputs are one rank's shard (``ContextParallel.shard``): ``position_ids`` are then
        its tokens' RoPE positions and ``given_mask`` its part of the mask, both made from the whole sequence.
        Otherwise a ``given_mask`` [B, 1, S, S] bool (True: may attend; causality included) is SDPA's (eager's
        where that is the backend), with ``position_ids`` as the RoPE positions alone: scoring choices that share
        a context (``downstream.SharedContext``).
        """
        if self.context_parallel is not None:
            backend, mask = self.context_parallel.backend, given_mask
        elif given_mask is not None:
            backend, mask = 'eager' if self.kernels.attn_impl == 'eager' else 'sdpa', given_mask
        else:
            backend = self.attention_backend(position_ids is not None, input_ids.is_cuda)
            mask = attention_mask(backend, position_ids, self.config.causal, *input_ids.shape, input_ids.device)
        if position_ids is None:
            position_ids = torch.arange(input_ids.shape[1], device=input_ids.device).unsqueeze(0)
        cos, sin = self.rope_tables(position_ids)
        return self.embed_tokens(input_ids), cos, sin, backend, mask

    def attention_backend(self, document_masking: bool, on_gpu: bool) -> str:
        """The backend to run: the one named (preflight resolves ``auto`` for a run), or for ``auto`` the fastest
        here that masks as asked."""
        impl = self.kernels.attn_impl
        return impl if impl != 'auto' else choose_backend(impl, document_masking, on_gpu)

    def rope_tables(self, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [B or 1, 1, S, D] in fp32 for the given positions [B or 1, S]."""
        angles = position_ids.float().unsqueeze(-1) * self.inv_freq.float()
        angles = torch.cat((angles, angles), dim=-1).unsqueeze(1)
        return angles.cos(), angles.sin()

    def init_weights(self):
        """Fresh initialisation of every parameter (and the RoPE table)."""
        for module in self.modules():
            self.init_module(module)

    def init_module(self, module: nn.Module):
        """Initialise ``module``'s own parameters; also Composer's ``param_init_fn`` after a meta build."""
        if module is self:
            self.inv_freq.copy_(rope_inverse_frequencies(self.config).to(self.inv_freq.device))
        elif isinstance(module, RMSNorm):
            nn.init.ones_(module.weight)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, std=embedding_init_std(self.config))
        elif isinstance(module, nn.Linear) and module.weight is not self.embed_tokens.weight:
            std = getattr(module, 'init_std', INIT_STD)
            bound = 3 * std if module is self.lm_head else 2.0  # the output layer cut at 3 std, the rest at +-2
            nn.init.trunc_normal_(module.weight, std=std, a=-bound, b=bound)

    def fsdp_wrap_fn(self, module: nn.Module) -> bool | dict:
        """Composer's FSDP2 units, torchtitan's layout: each block; and, unless tied, the embeddings and the output
        layer, so their gathers and gradient reductions overlap the blocks' compute instead of bracketing the step
        (the output layer stays gathered from its forward to its backward, which follows at once)."""
        if isinstance(module, TransformerBlock):
            return True
        if self.config.tie_embeddings:
            return False
        if module is self.lm_head:
            return {'reshard_after_forward': False}
        return module is self.embed_tokens

