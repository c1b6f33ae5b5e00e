"""Attention backends behind one call: ``attend(q, k, v, causal, backend, mask)``.

q [B, H, S, D]; k, v [B, K, S, D] with H a multiple of K (grouped-query attention). Document masking (attention
kept within each packed document) is prepared once per forward by ``attention_mask`` in the form the backend
takes: a bool matrix (sdpa, eager), cu_seqlens (varlen, flash) or a BlockMask (flex).
"""
import functools
import importlib.util
import inspect
from typing import Any, NamedTuple, Optional

import torch
import torch.nn.functional as F

BACKENDS = ('auto', 'sdpa', 'flash', 'varlen', 'flex', 'eager')
SDPA_KERNELS = ('auto', 'cudnn', 'flash', 'efficient', 'math')


class BackendUnavailableError(RuntimeError):
    """An attention backend was asked for by name and cannot run here."""


def has_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:
        return False


def missing_reason(backend: str) -> Optional[str]:
    """Why ``backend`` cannot run in this installation, or None if it can."""
    if backend not in BACKENDS:
        return f"attn_impl '{backend}' is unknown; choose one of {', '.join(BACKENDS)}"
    if backend == 'flash' and not has_module('flash_attn'):
        return ("attn_impl 'flash' needs the flash-attn package, which is not installed: "
                "pip install 'llmfoundry_ext[gpu]' (or the ROCm build on AMD), or set model.attn_impl=auto")
    if backend == 'varlen' and not has_module('torch.nn.attention.varlen'):
        return (f"attn_impl 'varlen' needs torch.nn.attention.varlen (PyTorch >= 2.10; this is {torch.__version__}): "
                f"upgrade torch, or set model.attn_impl=flex, flash or auto")
    if backend == 'flex' and not has_module('torch.nn.attention.flex_attention'):
        return (f"attn_impl 'flex' needs torch.nn.attention.flex_attention (PyTorch >= 2.5; this is "
                f"{torch.__version__}): upgrade torch, or set model.attn_impl=auto")
    return None


def check_backend(backend: str) -> None:
    """Raise one clear line if ``backend`` is unknown or not installed."""
    reason = missing_reason(backend)
    if reason:
        raise BackendUnavailableError(reason)


CONTEXT_PARALLEL_BACKENDS = ('sdpa', 'flex')  # those PyTorch's context parallelism runs: ring SDPA, flex on all K/V


def choose_backend(impl: str, document_masking: bool, on_gpu: bool, context_parallel: bool = False) -> str:
    """The backend ``impl`` runs as: ``auto`` picks the fastest one here that supports the masking.

    Unmasked: sdpa (PyTorch picks cuDNN on H100: 518 TFLOP/s causal fwd+bwd against FA-2's 285). Masked on a GPU:
    varlen (FA-2 over documents: no FLOPs across them), else flex, else the flash-attn package, else sdpa with
    an explicit mask (correct, slow); under context parallelism flex. On the CPU: sdpa.
    """
    if impl != 'auto':
        check_backend(impl)
        return impl
    if not (document_masking and on_gpu):
        return 'sdpa'
    masking = ('flex',) if context_parallel else ('varlen', 'flex', 'flash')
    return next((backend for backend in masking if missing_reason(backend) is None), 'sdpa')


class Documents(NamedTuple):
    """cu_seqlens [N + 1] int32 over the flattened batch, and the longest document's bound."""
    cu_seqlens: torch.Tensor
    max_seqlen: int


def attention_mask(backend: str, position_ids: Optional[torch.Tensor], causal: bool, batch: int, seq_len: int,
                   device) -> Any:
    """The mask ``attend`` takes, built once per forward: from ``position_ids`` (0 starts each packed document) if
    given, else one sequence per row (None for sdpa and eager, whose kernels mask causally by themselves)."""
    if position_ids is not None:
        return document_mask(backend, position_ids, causal)
    if backend == 'flex':
        return flex_block_mask(torch.zeros(batch, seq_len, dtype=torch.int32, device=device), causal)
    if backend in ('varlen', 'flash'):
        rows = torch.arange(0, (batch + 1) * seq_len, seq_len, dtype=torch.int32, device=device)
        return Documents(rows, seq_len)
    return None


def document_mask(backend: str, position_ids: torch.Tensor, causal: bool) -> Any:
    """position_ids [B, S] (0 starts each packed document) -> the mask ``attend`` takes for ``backend``."""
    starts = position_ids == 0
    if backend in ('varlen', 'flash'):
        return Documents(cu_seqlens(starts), position_ids.shape[1])  # no document is longer than a row
    document_ids = starts.cumsum(-1)
    if backend == 'flex':
        return flex_block_mask(document_ids, causal)
    return allowed(document_ids, causal)


def cu_seqlens(starts: torch.Tensor) -> torch.Tensor:
    """starts [B, S] bool (True where a document begins; each row's first token does) -> [N + 1] int32 offsets of
    the N documents in the flattened batch, as varlen kernels take them."""
    offsets = torch.nonzero(starts.flatten()).flatten()
    total = torch.tensor([starts.numel()], device=starts.device)
    return torch.cat([offsets, total]).to(torch.int32)


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, backend: str = 'sdpa',
           mask: Any = None, sdpa_kernel: str = 'auto') -> torch.Tensor:
    """Scaled dot-product attention; returns [B, H, S, D]. ``mask`` comes from ``attention_mask`` (sdpa and eager
    take None: causal or full attention)."""
    if backend == 'sdpa':
        return sdpa_attention(q, k, v, causal, mask, sdpa_kernel)
    if backend == 'eager':
        return eager_attention(q, k, v, causal, mask)
    if backend == 'flex':
        return flex_attention(q, k, v, mask)
    if backend in ('varlen', 'flash'):
        return varlen_attention(q, k, v, causal, mask, backend)
    check_backend(backend)
    raise AssertionError(backend)


def sdpa_attention(q, k, v, causal: bool, mask: Optional[torch.Tensor], kernel: str) -> torch.Tensor:
    gqa = k.shape[1] != q.shape[1]
    if kernel == 'auto':
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal and mask is None,
                                              enable_gqa=gqa)
    from torch.nn.attention import sdpa_kernel
    if gqa and kernel != 'math':  # key/value heads repeated to the query heads for a pinned kernel
        groups = q.shape[1] // k.shape[1]
        k, v, gqa = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1), False
    with sdpa_kernel(sdpa_backend(kernel)):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal and mask is None,
                                              enable_gqa=gqa)


def sdpa_backend(kernel: str):
    """The ``SDPBackend`` that ``model.sdpa_kernel`` pins (all but auto)."""
    from torch.nn.attention import SDPBackend
    return {'cudnn': SDPBackend.CUDNN_ATTENTION, 'flash': SDPBackend.FLASH_ATTENTION,
            'efficient': SDPBackend.EFFICIENT_ATTENTION, 'math': SDPBackend.MATH}[kernel]


def allowed(document_ids: Optional[torch.Tensor], causal: bool, seq_len: int = 0, device=None) -> torch.Tensor:
    """[B or 1, 1, S, S] bool: query i may attend key j (same document, and j <= i if causal)."""
    if document_ids is None:
        mask = torch.ones(1, 1, seq_len, seq_len, dtype=torch.bool, device=device)
    else:
        mask = (document_ids.unsqueeze(-1) == document_ids.unsqueeze(-2)).unsqueeze(1)
    return mask.tril() if causal else mask


def eager_attention(q, k, v, causal: bool, mask: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Reference: softmax(q k^T / sqrt(D)) v in fp32, with key/value heads repeated for GQA."""
    groups = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    scores = (q.float() @ k.float().transpose(-1, -2)) * q.shape[-1] ** -0.5
    if mask is None:
        mask = allowed(None, causal, q.shape[2], q.device)
    scores = scores.masked_fill(~mask, float('-inf'))
    return (scores.softmax(-1) @ v.float()).to(q.dtype)


def varlen_attention(q, k, v, causal: bool, documents: Documents, backend: str) -> torch.Tensor:
    """FA-2 over [B x S, heads, D] tokens: PyTorch's varlen_attn or the flash-attn package (ROCm build on AMD)."""
    batch, heads, seq_len, head_dim = q.shape
    q, k, v = (t.transpose(1, 2).reshape(batch * seq_len, t.shape[1], head_dim) for t in (q, k, v))
    cu, longest = documents
    if backend == 'flash':
        check_backend('flash')
        from flash_attn import flash_attn_varlen_func
        out = flash_attn_varlen_func(q, k, v, cu, cu, longest, longest, causal=causal)
    else:
        out = torch_varlen(q, k, v, cu, longest, causal)
    return out.view(batch, seq_len, heads, head_dim).transpose(1, 2)


def torch_varlen(q, k, v, cu_seqlens, max_seqlen: int, causal: bool) -> torch.Tensor:
    """``torch.nn.attention.varlen.varlen_attn``; causal is ``window_size=(-1, 0)`` (2.11) or ``is_causal`` (2.10)."""
    from torch.nn.attention.varlen import varlen_attn
    if 'window_size' in inspect.signature(varlen_attn).parameters:
        causality = {'window_size': (-1, 0) if causal else (-1, -1)}
    else:
        causality = {'is_causal': causal}
    return varlen_attn(q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, **causality)


def flex_block_mask(document_ids: torch.Tensor, causal: bool):
    """A BlockMask that keeps each query within its document (and causal): fully masked tiles are skipped."""
    from torch.nn.attention.flex_attention import create_block_mask

    def same_document(batch, head, query, key):
        keep = document_ids[batch, query] == document_ids[batch, key]
        return keep & (key <= query) if causal else keep

    batch, seq_len = document_ids.shape
    compiled = {'_compile': True} if '_compile' in inspect.signature(create_block_mask).parameters else {}
    return create_block_mask(same_document, batch, None, seq_len, seq_len, device=document_ids.device, **compiled)


def flex_attention(q, k, v, block_mask) -> torch.Tensor:
    return compiled_flex()(q, k, v, block_mask=block_mask, enable_gqa=k.shape[1] != q.shape[1])


@functools.lru_cache(maxsize=None)
def compiled_flex():
    """flex_attention runs as a fused kernel only when compiled (eager it materialises the scores)."""
    check_backend('flex')
    from torch.nn.attention.flex_attention import flex_attention as flex
    return torch.compile(flex, dynamic=False)
