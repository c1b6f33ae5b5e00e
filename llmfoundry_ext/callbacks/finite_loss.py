"""Stop on a non-finite training loss before the batch that produced it is checkpointed."""
import math

import torch
from composer.core import State, Time, TimeUnit
from composer.loggers import Logger, LoggerDestination

from llmfoundry_ext.callbacks.console_line import total_batches
from llmfoundry_ext.errors import TrainingStopped

TOTAL_LOSS = 'loss/train/total'


class StopOnNonFiniteLoss(LoggerDestination):
    """Holds each batch's logged training loss (a device tensor, the mean over the ranks, alike on every rank) and
    reads them back together at every batch a checkpoint may be written at (``checkpoint_every``; every batch when
    checkpoints are not counted in batches), every ``check_every`` and the last: the first non-finite one stops
    every rank with the same one-line TrainingStopped. One read-back per interval instead of a host sync a batch."""

    def __init__(self, check_every: str, checkpoint_every: str | None):
        self.every = [Time.from_timestring(check_every)]
        if checkpoint_every is not None:
            self.every.append(Time.from_timestring(checkpoint_every))
        self.pending: list[tuple[int, torch.Tensor]] = []  # (batch, loss on the device)
        self.batch = 0

    def log_metrics(self, metrics: dict, step: int | None = None) -> None:
        if TOTAL_LOSS in metrics:
            self.pending.append((self.batch + 1, metrics[TOTAL_LOSS]))

    def batch_start(self, state: State, logger: Logger) -> None:
        self.batch = int(state.timestamp.batch)

    def batch_end(self, state: State, logger: Logger) -> None:
        batch = int(state.timestamp.batch)
        if batch == total_batches(state) or any(
                every.unit != TimeUnit.BATCH or batch % every.value == 0 for every in self.every):
            self.check()

    def fit_end(self, state: State, logger: Logger) -> None:
        self.check()

    def check(self) -> None:
        if not self.pending:
            return
        batches = [batch for batch, _ in self.pending]
        values = torch.stack([loss for _, loss in self.pending]).float().tolist()  # one read-back
        self.pending = []
        for batch, value in zip(batches, values):
            if not math.isfinite(value):
                raise TrainingStopped(
                    f'non-finite training loss {value} at batch {batch}: stopped before checkpointing it; the same '
                    f'command resumes from the last checkpoint (lower the learning rate or check the data first)')
