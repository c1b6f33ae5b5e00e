"""Attention backends behind one call: ``attend(q, k, v, causal, impl, document_ids)``.

q [B, H, S, D]; k, v [B, K, S, D] with H a multiple of K (grouped-query attention). ``document_ids`` [B, S]
(optional) keeps attention within each packed document.
"""
import importlib.util

import torch
import torch.nn.functional as F

BACKENDS = ('auto', 'sdpa', 'eager', 'flash')


class BackendUnavailableError(RuntimeError):
    """An attention backend was asked for by name and cannot run here."""


def check_backend(impl: str) -> None:
    """Raise one clear line if ``impl`` is unknown or not installed."""
    if impl not in BACKENDS:
        raise BackendUnavailableError(f"attn_impl '{impl}' is unknown; choose one of {', '.join(BACKENDS)}")
    if impl == 'flash' and importlib.util.find_spec('flash_attn') is None:
        raise BackendUnavailableError(
            "attn_impl 'flash' needs the flash-attn package, which is not installed: "
            "pip install 'llmfoundry_ext[gpu]' (or the ROCm build on AMD), or set model.attn_impl=auto")


MASKING_BACKENDS = ('auto', 'sdpa', 'eager')  # those that take document_ids


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, impl: str = 'auto',
           document_ids: torch.Tensor | None = None) -> torch.Tensor:
    """Scaled dot-product attention; returns [B, H, S, D]."""
    if impl in ('auto', 'sdpa'):
        if document_ids is None:
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=k.shape[1] != q.shape[1])
        return F.scaled_dot_product_attention(q, k, v, attn_mask=allowed(document_ids, causal),
                                              enable_gqa=k.shape[1] != q.shape[1])
    if impl == 'eager':
        return eager_attention(q, k, v, causal, document_ids)
    if impl == 'flash':
        return flash_attention(q, k, v, causal)
    check_backend(impl)
    raise AssertionError(impl)


def allowed(document_ids: torch.Tensor | None, causal: bool, seq_len: int = 0, device=None) -> torch.Tensor:
    """[B or 1, 1, S, S] bool: query i may attend key j (same document, and j <= i if causal)."""
    if document_ids is None:
        mask = torch.ones(1, 1, seq_len, seq_len, dtype=torch.bool, device=device)
    else:
        mask = (document_ids.unsqueeze(-1) == document_ids.unsqueeze(-2)).unsqueeze(1)
    return mask.tril() if causal else mask


def eager_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
                    document_ids: torch.Tensor | None = None) -> torch.Tensor:
    """Reference: softmax(q k^T / sqrt(D)) v in fp32, with key/value heads repeated for GQA."""
    groups = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    scores = (q.float() @ k.float().transpose(-1, -2)) * q.shape[-1] ** -0.5
    scores = scores.masked_fill(~allowed(document_ids, causal, q.shape[2], q.device), float('-inf'))
    return (scores.softmax(-1) @ v.float()).to(q.dtype)


def flash_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
    """The flash-attn package (FA-2; its ROCm build on AMD), which takes [B, S, heads, D]."""
    check_backend('flash')
    from flash_attn import flash_attn_func
    out = flash_attn_func(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal=causal)
    return out.transpose(1, 2)


def resolved_backend(impl: str) -> str:
    """The backend ``impl`` runs as here (``auto`` -> ``sdpa``)."""
    return 'sdpa' if impl == 'auto' else impl
