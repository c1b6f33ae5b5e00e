"""Stop on a non-finite training loss before the batch that produced it is checkpointed."""
import math

from composer.core import Callback, State
from composer.loggers import Logger

from llmfoundry_ext.errors import TrainingStopped

TOTAL_LOSS = 'loss/train/total'


class StopOnNonFiniteLoss(Callback):
    """At each batch's end (before Composer's checkpoint event) the loss averaged over the ranks, which every rank
    holds alike, must be finite; otherwise every rank stops with the same one-line TrainingStopped."""

    def batch_end(self, state: State, logger: Logger) -> None:
        loss = (state.total_loss_dict or {}).get(TOTAL_LOSS)
        if loss is not None and not math.isfinite(loss):
            raise TrainingStopped(f'non-finite training loss {loss} at batch {int(state.timestamp.batch)}: stopped '
                                  f'before checkpointing it; the same command resumes from the last checkpoint (lower '
                                  f'the learning rate or check the data first)')
