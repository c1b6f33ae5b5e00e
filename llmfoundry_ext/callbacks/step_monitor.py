"""Per-step wall time and this process's memory and CPU use (Composer's monitors cover GPU and system-wide)."""
import time

import psutil
import torch
from composer.core import Callback, State
from composer.loggers import Logger

GIB = 2 ** 30


class StepMonitor(Callback):
    """Logs ``time/step_seconds`` (GPU work included), ``process/memory_rss_gib`` and ``process/cpu_percent``."""

    def __init__(self):
        self.process = psutil.Process()
        self.step_start = 0.0

    def batch_start(self, state: State, logger: Logger) -> None:
        self.step_start = time.perf_counter()

    def batch_end(self, state: State, logger: Logger) -> None:
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        logger.log_metrics({
            'time/step_seconds': time.perf_counter() - self.step_start,
            'process/memory_rss_gib': self.process.memory_info().rss / GIB,
            'process/cpu_percent': self.process.cpu_percent(),
        })
