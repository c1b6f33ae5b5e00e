"""Downstream tasks during training (the YAML's ``downstream`` section): every ``interval`` batches the harness scores
the tasks through the (sharded) model (``downstream.HarnessModel``). Composer's evaluators run a dataloader through
the model's metrics, where a harness task is requests built from documents, scored and aggregated by the harness, so
this is a callback around the harness's own evaluation."""
import json
import os
import time

import torch
from composer.core import Callback, State
from composer.loggers import Logger
from tqdm import tqdm

from llmfoundry_ext.atomic import write_atomically
from llmfoundry_ext.config import DownstreamConfig
from llmfoundry_ext.downstream import HarnessModel, LoadedTasks, metrics_of, run_tasks

SECONDS = 'metrics/downstream/seconds'
AUTOCAST = {'amp_bf16': torch.bfloat16, 'amp_fp8': torch.bfloat16, 'amp_fp16': torch.float16}


class DownstreamEvaluation(Callback):
    """Every ``every`` batches, each rank runs its share of the tasks' requests through the (sharded) model; rank 0
    logs the harness's metrics as ``metrics/downstream/<task>/<metric>`` to every logger, prints them and, where the
    run saves checkpoints, writes the harness's results as ``<results_folder>/ba<N>.json``."""

    def __init__(self, config: DownstreamConfig, tasks: LoadedTasks, every: int, max_length: int, precision: str,
                 results_folder: str | None):
        self.config, self.tasks, self.every = config, tasks, every
        self.max_length, self.autocast_dtype = max_length, AUTOCAST.get(precision)
        self.results_folder = results_folder
        self.history: list[tuple[int, dict[str, float], float]] = []  # rank 0: (batch, metrics, seconds) each time

    def batch_end(self, state: State, logger: Logger) -> None:
        batch = int(state.timestamp.batch)
        if batch % self.every == 0:
            self.evaluate(state, logger, batch)

    def evaluate(self, state: State, logger: Logger, batch: int) -> None:
        started = time.perf_counter()
        model = state.model.model
        model.eval()
        harness = HarnessModel(model, self.tasks.tokenizer, self.max_length, self.config.batch_tokens,
                               next(model.parameters()).device, self.autocast_dtype, self.config.generation_rows)
        limit = self.config.limit
        results = run_tasks(harness, self.tasks.tasks,
                            int(limit) if limit is not None and limit >= 1 else limit, self.config.num_fewshot)
        model.train()
        if harness.process_rank != 0:  # every process holds the results; rank 0 reports them
            return
        seconds = time.perf_counter() - started
        metrics = metrics_of(results)
        logger.log_metrics({**metrics, SECONDS: seconds})
        self.history.append((batch, metrics, seconds))
        tqdm.write(f'downstream at batch {batch}  ' + '  '.join(
            f"{name.removeprefix('metrics/downstream/')} {value:.4f}" for name, value in metrics.items())
            + f'  ({seconds:.1f} s)')
        if self.results_folder:
            os.makedirs(self.results_folder, exist_ok=True)
            write_atomically(os.path.join(self.results_folder, f'ba{batch}.json'), json.dumps(
                {key: results[key] for key in ('results', 'samples', 'n-samples', 'configs')}, default=str))
