"""Gradient clipping by norm, folded into a fused optimizer's step where the optimizer can take it."""
import torch
from composer import algorithms
from composer.core import Event, Precision, State
from composer.loggers import Logger
from composer.utils import ensure_tuple
from torch.distributed.tensor import DTensor


class GradientClipping(algorithms.GradientClipping):
    """Composer's ``GradientClipping``, but ``clipping_type: norm`` (not under amp_fp16, whose GradScaler unscales
    first: Composer's) clips as torch's ``clip_grad_norm_`` over FSDP2's meshes, one of them the experts' under
    expert parallelism (``total_norm``), which torch's takes one at a time. Under a fused torch optimizer (AdamW
    ``fused: true``) the clip is handed to the optimizer: its kernel divides each gradient by ``grad_scale``
    (``max(1, norm / threshold)``, a GPU scalar) as it reads it, so the separate pass that multiplies every
    gradient in place (8.8 ms a step of the 8B on 2 H200s) is not run; the gradients end clipped as with
    ``clip_grad_norm_`` (the kernel stores them unscaled). Other types clip as Composer does. ``last_norm``: the
    gradients' total norm before clipping at the last step, a device tensor (None where Composer clips), as
    ``clip_grad_norm_`` returns it and torchtitan logs it."""

    last_norm: torch.Tensor | None = None

    def apply(self, event: Event, state: State, logger: Logger) -> None:
        if event != Event.AFTER_TRAIN_BATCH or self.clipping_type != 'norm' or state.precision == Precision.AMP_FP16:
            super().apply(event, state, logger)
            return
        groups = parameters_by_mesh(state.model.parameters())
        self.last_norm = total_norm(groups)
        optimizers = ensure_tuple(state.optimizers)
        if self.folds_into(optimizers):
            scale = torch.clamp((self.last_norm + 1e-6) / self.clipping_threshold, min=1.0)
            for optimizer in optimizers:
                optimizer.grad_scale = scale  # the reciprocal of clip_grad_norm_'s min(1, max_norm / (norm + 1e-6))
            return
        for parameters in groups.values():
            torch.nn.utils.clip_grads_with_norm_(parameters, self.clipping_threshold, self.last_norm, foreach=True)

    @staticmethod
    def folds_into(optimizers: tuple) -> bool:
        return bool(optimizers) and all(getattr(optimizer, '_step_supports_amp_scaling', False)
                                        for optimizer in optimizers)


def parameters_by_mesh(parameters) -> dict:
    """The parameters that have gradients, by their gradients' DTensor mesh (None: plain tensors)."""
    groups = {}
    for parameter in parameters:
        if parameter.grad is not None:
            grad = parameter.grad
            groups.setdefault(grad.device_mesh if isinstance(grad, DTensor) else None, []).append(parameter)
    return groups


def total_norm(groups: dict) -> torch.Tensor:
    """The gradients' total 2-norm over ``parameters_by_mesh``'s groups, left on the device (no host sync): each
    mesh's is its shards' partial norms reduced over it (a DTensor's ``full_tensor``), and the meshes' are joined."""
    norms = [torch.nn.utils.get_total_norm([parameter.grad for parameter in parameters], foreach=True)
             for parameters in groups.values()] or [torch.zeros(())]
    norms = [norm.full_tensor() if isinstance(norm, DTensor) else norm for norm in norms]
    return norms[0] if len(norms) == 1 else torch.linalg.vector_norm(torch.stack(norms))
