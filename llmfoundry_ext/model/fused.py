"""Opt-in fused kernels from liger-kernel (Triton, GPU only): ``model.fused_kernels: [cross_entropy, ...]``.

cross_entropy fuses the output layer into the loss in chunks, so the [tokens x vocab] logits (4 GiB in fp32 for
8,192 tokens of Llama-3's 128,256) never exist; the others replace a few elementwise kernels each.
"""
import importlib.metadata

import torch

from llmfoundry_ext.model.attention import has_module

FUSED_KERNELS = ('cross_entropy', 'rms_norm', 'swiglu', 'rope')

# liger's fused cross-entropy holds at most this many times the hidden states' size of logits at a time. Its
# default, 1, cuts 8,192 tokens of the 8B (4,096 wide, 128,256 words) into 32 chunks of 256, whose weight-gradient
# updates and narrow GEMMs cost 64.8 ms per micro-batch on an H100; 8 (chunks of 2,048, 0.4 GiB more) cost 41.5 ms,
# against 38.8 ms for the whole logits and a compiled loss at 2.4 GiB more (scripts/measure_step_parts.py).
CROSS_ENTROPY_CHUNK_MEMORY = 8
LIGER_MINIMUM = (0, 8, 3)  # the first with chunk_mem_const


def fused_kernels_problem(names: list[str], on_gpu: bool) -> str | None:
    """Why ``names`` cannot run here (one line with the fix), or None."""
    unknown = [name for name in names if name not in FUSED_KERNELS]
    if unknown:
        return f"unknown fused kernel '{unknown[0]}'; choose from {', '.join(FUSED_KERNELS)}"
    if names and not has_module('liger_kernel'):
        return ("fused kernels need the liger-kernel package, which is not installed: "
                "pip install 'llmfoundry_ext[gpu]', or set model.fused_kernels=[]")
    if names and (version := liger_version()) < LIGER_MINIMUM:
        return (f"fused kernels need liger-kernel >= {'.'.join(map(str, LIGER_MINIMUM))} (installed: "
                f"{'.'.join(map(str, version))}): pip install -U liger-kernel, or set model.fused_kernels=[]")
    if names and not on_gpu:
        return 'fused kernels (liger-kernel, Triton) need a GPU; set model.fused_kernels=[] on the CPU'
    return None


def liger_version() -> tuple[int, ...]:
    """The installed liger-kernel's release numbers, e.g. (0, 8, 5)."""
    release = importlib.metadata.version('liger-kernel').split('+')[0].split('.')
    return tuple(int(part) for part in release if part.isdigit())


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    from liger_kernel.transformers.functional import liger_rms_norm
    return liger_rms_norm(x, weight, eps, in_place=False)


def swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    from liger_kernel.transformers.functional import liger_swiglu
    return liger_swiglu(gate, up)


def rope(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """q [B, H, S, D], k [B, K, S, D]; cos/sin [B or 1, 1, S, D]."""
    from liger_kernel.transformers.functional import liger_rope
    return liger_rope(q, k, cos.squeeze(1), sin.squeeze(1))


def linear_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """mean over labels != -100 of CE(hidden @ weight.T, labels), without materialising the logits."""
    return LinearCrossEntropy.apply(hidden.flatten(0, 1), weight, labels.flatten())


class LinearCrossEntropy(torch.autograd.Function):
    """liger's chunked output layer + loss, whose forward also computes the gradients of ``hidden`` and ``weight``;
    the backward scales them by the incoming gradient on the GPU. liger's own backward first compares that gradient
    with 1.0 on the host (``torch.equal``), a sync that left the GPU idle ~3 ms at the start of every backward of the
    8B on 2 H200s while the CPU started the backward (scripts/profile_run.py's idle stretches)."""

    @staticmethod
    @torch.amp.custom_fwd(device_type='cuda')
    def forward(ctx, hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        from liger_kernel.ops.fused_linear_cross_entropy import fused_linear_cross_entropy_forward
        loss, *_, grad_hidden, grad_weight, _ = fused_linear_cross_entropy_forward(
            hidden, weight, labels, ignore_index=-100, chunk_mem_const=CROSS_ENTROPY_CHUNK_MEMORY)
        ctx.save_for_backward(grad_hidden, grad_weight)
        return loss

    @staticmethod
    @torch.amp.custom_bwd(device_type='cuda')
    def backward(ctx, grad_loss: torch.Tensor):
        grad_hidden, grad_weight = ctx.saved_tensors  # scaled in place: this backward runs once
        return grad_hidden.mul_(grad_loss), None if grad_weight is None else grad_weight.mul_(grad_loss), None
