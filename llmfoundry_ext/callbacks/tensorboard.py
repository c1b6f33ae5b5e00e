"""Composer's TensorBoard logger, reading logged tensors back once per flush."""
import torch
from composer import loggers
from composer.loggers import Logger
from composer.utils import dist


class TensorboardLogger(loggers.TensorboardLogger):
    """Tensors (the training loss, logged on the device) are held until the log is flushed (every
    ``flush_interval`` batches, each evaluation and the run's end: when Composer writes the file) and read back
    together there, instead of one host sync each as they are logged."""

    def __init__(self, log_dir: str | None = None, flush_interval: int = 100, rank_zero_only: bool = True):
        super().__init__(log_dir=log_dir, flush_interval=flush_interval, rank_zero_only=rank_zero_only)
        self.pending: list[tuple[str, torch.Tensor, int | None]] = []

    def log_metrics(self, metrics: dict, step: int | None = None) -> None:
        tensors = {tag: value for tag, value in metrics.items() if isinstance(value, torch.Tensor)}
        if tensors and not (self.rank_zero_only and dist.get_global_rank() != 0):
            self.current_metrics.update(tensors)
            self.pending.extend((tag, value.detach(), step) for tag, value in tensors.items())
        super().log_metrics({tag: value for tag, value in metrics.items() if tag not in tensors}, step)

    def _flush(self, logger: Logger) -> None:
        if self.pending and self.writer is not None:
            values = torch.stack([value.reshape(()).float() for _, value, _ in self.pending]).tolist()
            for (tag, _, step), value in zip(self.pending, values):
                self.writer.add_scalar(tag, value, global_step=step)
        self.pending = []
        super()._flush(logger)
