"""A mixture of experts' load per step: how the router spread the tokens over the experts."""
import torch
from composer.core import Callback, State
from composer.loggers import Logger
from composer.utils import dist


class ExpertLoad(Callback):
    """Logs, per batch over every micro-batch and rank: ``router/load/expert_{e}``, the share of routed tokens each
    expert got over all layers (1/E each when balanced), and ``router/max_load``, the busiest expert of any layer
    against a balanced share (1.0 when balanced, E/k when one expert takes every token). The load-balancing loss
    itself is the loss's ``router_aux`` (``loss/train/router_aux``)."""

    def __init__(self):
        self.chosen = None  # [layers, E] this batch

    def after_forward(self, state: State, logger: Logger) -> None:
        chosen = state.outputs[1].detach()[:, 0]
        self.chosen = chosen.clone() if self.chosen is None else self.chosen + chosen  # contiguous, for NCCL

    def batch_end(self, state: State, logger: Logger) -> None:
        chosen, self.chosen = self.chosen, None
        dist.all_reduce(chosen)
        logger.log_metrics(load_metrics(chosen))


def load_metrics(chosen: torch.Tensor) -> dict[str, float]:
    """``chosen`` [layers, E]: times each layer's router chose each expert -> the logged figures, read from the GPU
    in one copy (one host sync a step, not one per figure)."""
    per_expert = chosen.sum(dim=0) / chosen.sum()
    max_load = (chosen / chosen.sum(dim=1, keepdim=True)).max() * chosen.shape[1]
    *shares, max_load = torch.cat((per_expert, max_load.view(1))).tolist()
    return {**{f'router/load/expert_{expert}': share for expert, share in enumerate(shares)},
            'router/max_load': max_load}
