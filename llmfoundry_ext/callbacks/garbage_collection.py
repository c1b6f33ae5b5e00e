"""Python's garbage collection at batch boundaries instead of whenever allocations cross its threshold.

An automatic collection can start mid-step on one rank and not on the others, which then wait for it at the next
collective; its pause grows with the heap (a process that has just compiled may hold more objects than one that
loaded the same kernels from Inductor's cache: not measured). torchtitan (``training.gc_freq``, 50), OLMo-core and
llm-foundry (``ScheduledGarbageCollector``) switch it off while training and collect on a schedule; Composer has no
such callback, hence this one.
"""
import gc

from composer.core import Callback, State
from composer.loggers import Logger

from llmfoundry_ext.errors import ConfigError


class GarbageCollection(Callback):
    """Automatic collection off from the fit's start to its end (or the trainer's close); a generation-1 collection
    (the young objects a step leaves behind) every ``interval`` batches and after each evaluation."""

    def __init__(self, interval: int = 50):
        if interval < 1:
            raise ConfigError(f'callbacks.garbage_collection.interval: {interval}; it is a number of batches, at '
                              f'least 1 (torchtitan collects every 50)')
        self.interval = interval
        self.was_enabled = None  # gc.isenabled() when the fit started; None outside a fit

    def fit_start(self, state: State, logger: Logger) -> None:
        self.was_enabled = gc.isenabled()
        gc.disable()
        gc.collect(1)

    def batch_end(self, state: State, logger: Logger) -> None:
        if int(state.timestamp.batch) % self.interval == 0:
            gc.collect(1)

    def eval_end(self, state: State, logger: Logger) -> None:
        gc.collect(1)

    def fit_end(self, state: State, logger: Logger) -> None:
        self.restore()

    def close(self, state: State, logger: Logger) -> None:
        self.restore()

    def restore(self) -> None:
        if self.was_enabled:
            gc.enable()
        self.was_enabled = None
