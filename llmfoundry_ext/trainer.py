"""Composer's Trainer, its optimizer stepped after the backward instead of from inside a closure."""
import composer


class Trainer(composer.Trainer):
    """Composer 0.32 runs each batch's forward and backward inside ``optimizer.step(closure)`` unless the precision
    is amp_fp16, and the closure returns ``loss.item()``: the host waits for the backward to end before it starts the
    optimizer step, and the GPU idles while the host dispatches it (5-7 ms a step of the 8B on 2 H200s: fused AdamW
    over FSDP2's DTensors; ``scripts/profile_run.py --syncs``). Stepped after the backward, the host is far ahead
    of the GPU by then. A closure is for optimizers that re-evaluate the loss (LBFGS, SAM); none is offered."""

    def _use_closures(self) -> bool:
        return False
