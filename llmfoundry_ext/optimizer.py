"""AdamW stepping each parameter through one kernel that torch.compile generates (``optimizer.name:
compiled_adamw``).

Ours because torch has no AdamW that runs at the GPU's memory bandwidth and takes our clipping's ``grad_scale``:
its fused AdamW moved 3.16B fp32 parameters (Mixtral's width, 2 layers) in 29.7 ms on an H200, 2.9 TB/s, where one
generated kernel a parameter took 20.9 ms, the 4.25 TB/s of a plain copy (``scripts/measure_optimizer.py``); its
compiled optimizer (foreach under torch.compile) takes no ``grad_scale``, so clipping would cost another pass over
the gradients. Where the optimizer steps every weight of the model (one GPU; a mixture of experts, whose weights are
several times those a token runs through) that is 4 % of a step.

The update, state (``step``, ``exp_avg``, ``exp_avg_sq``) and checkpoints are torch's AdamW's (a checkpoint of one
resumes with the other): each step divides the gradient by ``grad_scale`` (the clipping's, 1 where none), decays the
weight by ``lr x weight_decay``, and moves it by ``lr / (1 - beta1^t) x exp_avg / (sqrt(exp_avg_sq / (1 -
beta2^t)) + eps)``. The gradients are left as the backward wrote them (torch's fused AdamW writes them back
clipped; nothing reads them after the step)."""
import torch
from torch.distributed.tensor import DTensor


class CompiledAdamW(torch.optim.AdamW):
    """torch's fused AdamW (no amsgrad or maximize), each parameter's update one generated kernel on GPUs (eager on
    the CPU: the same arithmetic). Its groups say ``fused``, as its state is kept (a checkpoint loaded into torch's
    AdamW makes that fused too), so ``clipping.GradientClipping`` hands it its clip as ``grad_scale``. It skips no
    step on inf gradients (amp_fp16's GradScaler): that refuses it."""

    def __init__(self, params, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 1e-2):
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, fused=True)
        self._compiled = torch.compile(adamw_update, dynamic=True, fullgraph=True)
        self._on_device: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}  # lr and 1, a device's

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        if getattr(self, 'found_inf', None) is not None:
            raise RuntimeError('compiled_adamw does not skip steps on inf gradients (precision: amp_fp16): use '
                               'optimizer.name: adamw with fused: true')
        for group in self.param_groups:
            scalars = {}  # a device's, for this group
            for param in group['params']:
                if param.grad is not None:
                    device = local(param).device
                    if device not in scalars:
                        scalars[device] = self.scalars(group['lr'], device)
                    self.update(param, group, scalars[device])
        return loss

    def update(self, param: torch.Tensor, group: dict, scalars: tuple[torch.Tensor, torch.Tensor]) -> None:
        """``param``'s step: its state made where it has none, as torch's fused AdamW makes it (the step count on
        the parameter's device, where the kernel reads it)."""
        state = self.state[param]
        weights = local(param)
        if not state:
            state['step'] = torch.zeros((), dtype=torch.float32, device=weights.device)
            state['exp_avg'] = torch.zeros_like(param, memory_format=torch.preserve_format)
            state['exp_avg_sq'] = torch.zeros_like(param, memory_format=torch.preserve_format)
        if state['step'].device != weights.device:  # loaded from a checkpoint of torch's (non-fused) AdamW
            state['step'] = state['step'].to(weights.device, torch.float32)
        tensors = [local(t).view(-1) for t in (param, param.grad, state['exp_avg'], state['exp_avg_sq'])]
        kernel = self._compiled if weights.is_cuda else adamw_update
        beta1, beta2 = group['betas']
        kernel(*tensors, state['step'], *scalars, beta1, beta2, group['weight_decay'], group['eps'])

    def scalars(self, lr: float, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """The lr and the gradients' divisor as device scalars: a new value each step is a new argument, not a new
        kernel (torch.compile specialises on a Python float). One lr tensor a device, filled again for each group:
        each group's kernels read it before the next fill, in the stream's order."""
        if device not in self._on_device:
            self._on_device[device] = (torch.empty((), device=device), torch.ones((), device=device))
        lr_tensor, one = self._on_device[device]
        lr_tensor.fill_(lr)
        grad_scale = getattr(self, 'grad_scale', None)  # set by the clipping each step, as for torch's fused AdamW
        scale = one if grad_scale is None else grad_scale.to(device=device, dtype=torch.float32)
        return lr_tensor, scale


def local(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's shard of a DTensor (FSDP2, expert parallelism), or the tensor."""
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def adamw_update(param: torch.Tensor, grad: torch.Tensor, exp_avg: torch.Tensor, exp_avg_sq: torch.Tensor,
                 step: torch.Tensor, lr: torch.Tensor, grad_scale: torch.Tensor, beta1: float, beta2: float,
                 weight_decay: float, eps: float) -> None:
    """One AdamW step of one parameter in place, as torch's capturable AdamW: 1-D views, device scalars."""
    step.add_(1)
    grad = grad / grad_scale
    param.mul_(1 - lr * weight_decay)
    exp_avg.mul_(beta1).add_(grad, alpha=1 - beta1)
    exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
    bias_correction1 = 1 - beta1 ** step
    bias_correction2_sqrt = (1 - beta2 ** step).sqrt()
    param.sub_(lr / bias_correction1 * exp_avg / (exp_avg_sq.sqrt() / bias_correction2_sqrt + eps))
