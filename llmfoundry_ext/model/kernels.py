"""How a model's operations run, as against what it computes (its architecture config): the attention backend,
the SDPA kernel and liger-kernel fusions. Not part of trained weights."""
from dataclasses import dataclass, field
from typing import Literal

from llmfoundry_ext.model.attention import SDPA_KERNELS


@dataclass(frozen=True)
class KernelConfig:
    attn_impl: str = 'auto'    # auto, sdpa, flash, varlen, flex, eager (attention.py); preflight resolves auto
    sdpa_kernel: Literal[SDPA_KERNELS] = 'auto'  # sdpa only: auto (PyTorch picks), cudnn, flash, efficient, math
    fused_kernels: list[str] = field(default_factory=list)  # liger-kernel: cross_entropy, rms_norm, swiglu, rope

    @property
    def fused_loss(self) -> bool:
        """The output layer and cross-entropy fused (liger's chunked kernel): the logits never exist."""
        return 'cross_entropy' in self.fused_kernels
