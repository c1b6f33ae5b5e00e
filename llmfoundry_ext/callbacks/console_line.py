"""The console a person reads: one line per log interval on rank 0 (``console: line``, the default)."""
import datetime
import time

from composer.core import State, Time, TimeUnit
from composer.loggers import Logger, LoggerDestination
from composer.utils import dist
from tqdm import tqdm

LOSS, EVAL_LOSS = 'loss/train/total', 'metrics/eval/LanguageCrossEntropy'
TOKENS_PER_SECOND, MFU, PEAK_MEMORY = 'throughput/device/tokens_per_sec', 'throughput/device/mfu', \
    'memory/peak_allocated_mem'


class ConsoleLine(LoggerDestination):
    """Every ``interval`` batches (and at the last), rank 0 prints e.g. ``batch 120/2000  loss 3.412  lr 3.00e-04
    9,542 tokens/s/GPU  MFU 55.9%  peak 97.2 GB  0:14:32 elapsed, 3:41:10 left`` (one line).

    tokens/s/GPU and MFU are the speed monitor's where it logs them, else tokens/s/GPU over the interval; the time
    left is the interval's time per batch times the batches left. Evaluations get a line of their own."""

    def __init__(self, interval: str):
        self.interval = Time.from_timestring(interval)  # in batches (config.check_console)
        self.metrics: dict[str, float] = {}
        self.started = self.mark = time.monotonic()
        self.mark_batch = self.mark_token = 0

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        self.metrics.update(metrics)

    def fit_start(self, state: State, logger: Logger) -> None:
        self.started = self.mark = time.monotonic()
        self.mark_batch, self.mark_token = int(state.timestamp.batch), int(state.timestamp.token)

    def batch_end(self, state: State, logger: Logger) -> None:
        batch = int(state.timestamp.batch)
        total = total_batches(state)
        if batch % self.interval.value and batch != total:
            return
        line = self.line(state, batch, total)
        self.mark, self.mark_batch, self.mark_token = time.monotonic(), batch, int(state.timestamp.token)
        if dist.get_global_rank() == 0:
            tqdm.write(line)

    def eval_end(self, state: State, logger: Logger) -> None:
        if EVAL_LOSS in self.metrics and dist.get_global_rank() == 0:
            tqdm.write(f'eval at batch {int(state.timestamp.batch)}  loss {self.metrics[EVAL_LOSS]:.4f}')

    def line(self, state: State, batch: int, total: int | None) -> str:
        now = time.monotonic()
        seconds, batches = now - self.mark, batch - self.mark_batch
        parts = [f'batch {batch}/{total}' if total else f'batch {batch}']
        if LOSS in self.metrics:
            parts.append(f'loss {self.metrics[LOSS]:.4f}')
        parts.append(f"lr {state.optimizers[0].param_groups[0]['lr']:.2e}")
        tokens = self.metrics.get(TOKENS_PER_SECOND)
        if tokens is None and seconds > 0:
            tokens = (int(state.timestamp.token) - self.mark_token) / seconds / dist.get_world_size()
        if tokens:
            parts.append(f'{tokens:,.0f} tokens/s/GPU')
        if MFU in self.metrics:
            parts.append(f'MFU {self.metrics[MFU]:.1%}')
        if PEAK_MEMORY in self.metrics:
            parts.append(f'peak {self.metrics[PEAK_MEMORY]:.1f} GB')
        elapsed = f'{clock(now - self.started)} elapsed'
        if total and batches:
            elapsed += f', {clock(seconds / batches * (total - batch))} left'
        return '  '.join(parts + [elapsed])


def total_batches(state: State) -> int | None:
    """The run's length in batches, where its duration is given in batches."""
    duration = state.max_duration
    return int(duration.value) if duration is not None and duration.unit == TimeUnit.BATCH else None


def clock(seconds: float) -> str:
    """0:14:32, or 1 day, 2:13:05."""
    return str(datetime.timedelta(seconds=round(seconds)))
