"""float8 all-gather under FSDP2: the weights' scales for the next step, computed once after each optimizer step."""
from composer.core import Callback, State
from composer.loggers import Logger


class Float8ScalePrecompute(Callback):
    """torchao's ``precompute_float8_dynamic_scale_for_fsdp`` after each optimizer step, as torchtitan does: one
    fused amax over all float8 weights instead of one per weight inside every all-gather."""

    def batch_end(self, state: State, logger: Logger) -> None:
        from torchao.float8 import precompute_float8_dynamic_scale_for_fsdp
        precompute_float8_dynamic_scale_for_fsdp(state.model)
