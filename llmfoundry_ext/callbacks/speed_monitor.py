"""Composer's SpeedMonitor, its FLOPs counted on the host."""
from composer import callbacks
from composer.core import State
from composer.loggers import Logger
from composer.utils import dist


class SpeedMonitor(callbacks.SpeedMonitor):
    """Composer all-reduces each rank's ``flops_per_batch`` on the GPU and reads the sum back: a host sync every
    batch. Our models' FLOPs depend on the batch's shape alone, the same on every rank, so the sum is the world size
    times this rank's ``rank_flops`` (named apart so Composer's path is not also taken); MFU as Composer's."""

    def batch_end(self, state: State, logger: Logger) -> None:
        rank_flops = getattr(state.model, 'rank_flops', None)
        if rank_flops is not None:
            self.history_flops.append(rank_flops(state.batch) * dist.get_world_size())
        super().batch_end(state, logger)
