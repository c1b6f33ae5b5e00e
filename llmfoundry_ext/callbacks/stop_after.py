"""Stop this invocation gracefully, with a checkpoint, after a number of batches or minutes.

For queue limits: set ``minutes`` a little under the job's wall time; the run saves a checkpoint and
exits cleanly, and re-running the same command autoresumes from it.
"""
import time
from typing import Optional

import torch
from composer.core import Callback, State
from composer.loggers import Logger
from composer.utils import dist


class StopAfter(Callback):
    """Calls ``state.stop_training()`` once this process has trained ``batches`` batches or ``minutes``."""

    def __init__(self, batches: Optional[int] = None, minutes: Optional[float] = None):
        if batches is None and minutes is None:
            raise ValueError('stop_after needs batches or minutes')
        self.batches = batches
        self.minutes = minutes
        self.batches_done = 0
        self.start = time.monotonic()

    def fit_start(self, state: State, logger: Logger) -> None:
        self.batches_done = 0
        self.start = time.monotonic()

    def batch_end(self, state: State, logger: Logger) -> None:
        self.batches_done += 1
        if self.limit_reached(state):
            logger.log_metrics({'stop_after/stopped_at_batch': int(state.timestamp.batch)})
            state.stop_training()

    def limit_reached(self, state: State) -> bool:
        """The same answer on every rank (time-based stops are agreed on by an all-reduce: a host sync a batch
        on several processes, none on one)."""
        if self.batches is not None and self.batches_done >= self.batches:
            return True
        if self.minutes is None:
            return False
        if dist.get_world_size() == 1:
            return time.monotonic() - self.start >= 60 * self.minutes
        over_time = state.device.tensor_to_device(
            torch.tensor([time.monotonic() - self.start >= 60 * self.minutes], dtype=torch.int32))
        dist.all_reduce(over_time, reduce_operation='MAX')
        return bool(over_time.item())
