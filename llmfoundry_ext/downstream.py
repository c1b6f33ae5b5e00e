"""Downstream evaluation through lm-evaluation-harness (``pip install 'llmfoundry_ext[eval]'``): our model as the
harness's language model, so the tasks, prompts and metrics are the harness's own and the numbers are the ones its
HF backend reports for the same weights.

The harness leaves one thing to a model, scoring token sequences, and that is what ``HarnessModel`` does: the
requests sorted by length and cut into batches of at most ``batch_tokens`` tokens, each padded only to its longest
request (not to the model's context), the log-probabilities taken at the continuation's positions alone. On several
ranks each scores its share through the sharded model, and every rank runs the same number of forwards (FSDP2
gathers each block's weights in a forward, with every rank taking part).

During training (the YAML's ``downstream`` section) ``DownstreamEvaluation`` runs the harness every ``interval``
batches: Composer's evaluators run a dataloader through the model's metrics, where a harness task is requests built
from documents, scored and aggregated by the harness, so it is a callback around the harness's own evaluation.
"""
import json
import os
import time
from dataclasses import dataclass
from typing import Iterable

import torch
import torch.distributed as dist
from composer.core import Callback, State
from composer.loggers import Logger
from tqdm import tqdm

from llmfoundry_ext.atomic import write_atomically
from llmfoundry_ext.checkpoint import read_checkpoint_weights
from llmfoundry_ext.config import DownstreamConfig
from llmfoundry_ext.errors import ConfigError
from llmfoundry_ext.weights import HF_CONFIG, NATIVE_CONFIG, family_of, load_into, load_weights_folder

try:
    from lm_eval import utils as harness_utils
    from lm_eval.api.model import TemplateLM
except ImportError:  # the optional extra: ``require_harness`` says what to install
    harness_utils, TemplateLM = None, object

HARNESS_MISSING = ("downstream evaluation needs lm-evaluation-harness, which is not installed: pip install "
                   "'llmfoundry_ext[eval]'")


class HarnessModel(TemplateLM):
    """``lm_eval.api.model.TemplateLM`` over our ``Transformer`` and an HF tokenizer: ``loglikelihood`` (multiple
    choice, LAMBADA-style) and ``loglikelihood_rolling`` (perplexity) as the harness's HF backend computes them;
    generation is refused. ``rank``, ``world_size`` and the gathers are the default process group's."""

    def __init__(self, transformer: torch.nn.Module, tokenizer, max_length: int, batch_tokens: int = 8192,
                 device: str | torch.device = 'cpu', autocast_dtype: torch.dtype | None = None):
        require_harness()
        super().__init__()
        self.transformer, self.tokenizer = transformer, tokenizer
        self._max_length, self.batch_tokens = max_length, batch_tokens
        self._device = torch.device(device)
        self.autocast_dtype = autocast_dtype
        if dist.is_available() and dist.is_initialized():
            self._rank, self._world_size = dist.get_rank(), dist.get_world_size()

    @property
    def eot_token_id(self) -> int:
        return self.tokenizer.eos_token_id

    @property
    def prefix_token_id(self) -> int:
        """What an empty context starts from: the tokenizer's BOS where it has one, as the HF backend."""
        bos = self.tokenizer.bos_token_id
        return bos if bos is not None else self.eot_token_id

    @property
    def max_length(self) -> int:
        return self._max_length

    @property
    def tokenizer_name(self) -> str:
        return getattr(self.tokenizer, 'name_or_path', '') or type(self.tokenizer).__name__

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs) -> list[int]:
        """As the HF backend for a causal model: no special tokens added."""
        return self.tokenizer.encode(string, add_special_tokens=bool(add_special_tokens))

    def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, **kwargs) -> list[tuple[float, bool]]:
        """(sum of the continuation's log-probabilities, whether greedy decoding gives it) per request."""
        inputs = [model_input(context, continuation, self.max_length) for _, context, continuation in requests]
        results = [None] * len(requests)
        for batch in self.same_count_on_every_rank(token_batches([len(tokens) for tokens, _ in inputs],
                                                                 self.batch_tokens)):
            scores = self.score([inputs[index] for index in batch] or [([self.eot_token_id], [])])
            for index, score in zip(batch, scores):
                results[index] = score
        return results

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        """Each text's log-likelihood in windows of ``max_length`` tokens, each window predicting from the tokens
        before it (the HF backend's windows: ``get_rolling_token_windows``, ``make_disjoint_window``)."""
        windows, owners = [], []
        for owner, (text,) in enumerate(request.args for request in requests):
            for window in harness_utils.get_rolling_token_windows(
                    token_list=self.tok_encode(text), prefix_token=self.prefix_token_id,
                    max_seq_len=self.max_length, context_len=1):
                windows.append((None, *harness_utils.make_disjoint_window(window)))
                owners.append(owner)
        totals = [0.0] * len(requests)
        for owner, (loglikelihood, _) in zip(owners, self._loglikelihood_tokens(windows)):
            totals[owner] += loglikelihood
        return totals

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        raise NotImplementedError('generation tasks are not evaluated in training (they need sampling loops); '
                                  'pick log-likelihood tasks (multiple choice, LAMBADA-style, perplexity)')

    def same_count_on_every_rank(self, batches: list[list[int]]) -> Iterable[list[int]]:
        """``batches``, then empty ones until every rank has run as many (an empty batch runs one token)."""
        count = torch.tensor(len(batches), device=self.device)
        if self.world_size > 1:
            dist.all_reduce(count, op=dist.ReduceOp.MAX)
        return batches + [[]] * (int(count) - len(batches))

    @torch.no_grad()
    def score(self, batch: list[tuple[list[int], list[int]]]) -> list[tuple[float, bool]]:
        """One forward over the batch's inputs, right-padded to the longest: each continuation's log-likelihood and
        whether it is the greedy one."""
        longest = max(len(tokens) for tokens, _ in batch)
        ids = torch.zeros(len(batch), longest, dtype=torch.long)
        rows, positions, targets = [], [], []
        for row, (tokens, continuation) in enumerate(batch):
            ids[row, :len(tokens)] = torch.tensor(tokens)
            rows += [row] * len(continuation)
            positions += range(len(tokens) - len(continuation), len(tokens))
            targets += continuation
        with torch.autocast(self.device.type, self.autocast_dtype, enabled=self.autocast_dtype is not None):
            logits = self.transformer(ids.to(self.device))
        logprobs = torch.log_softmax(logits[rows, positions].float(), dim=-1)
        targets = torch.tensor(targets, device=logprobs.device)
        picked = logprobs.gather(-1, targets[:, None]).squeeze(-1).cpu()
        greedy = (logprobs.argmax(-1) == targets).cpu()
        sizes = [len(continuation) for _, continuation in batch]
        return [(float(part.sum()), bool(hits.all()))
                for part, hits in zip(picked.split(sizes), greedy.split(sizes))]

    def all_gather(self, tensor: torch.Tensor) -> torch.Tensor:
        parts = [torch.zeros_like(tensor) for _ in range(self.world_size)]
        dist.all_gather(parts, tensor)
        return torch.stack(parts) if tensor.dim() == 0 else torch.cat(parts)

    def gather_object(self, obj, dst: int = 0):
        gathered = [None] * self.world_size if self.rank == dst else None
        dist.gather_object(obj, gathered, dst=dst)
        return gathered

    def barrier(self) -> None:
        dist.barrier()


def model_input(context: list[int], continuation: list[int], max_length: int) -> tuple[list[int], list[int]]:
    """(the tokens the model reads, the continuation it is scored on): context and continuation cut from the left to
    ``max_length`` + 1 tokens, less the last, as the harness's HF backend."""
    return (context + continuation)[-(max_length + 1):][:-1], continuation


def token_batches(lengths: list[int], batch_tokens: int) -> list[list[int]]:
    """Indices of ``lengths`` longest first, in batches whose rows padded to their longest hold at most
    ``batch_tokens`` tokens (a longer request alone)."""
    batches, batch = [], []
    for index in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        if batch and lengths[batch[0]] * (len(batch) + 1) > batch_tokens:
            batches.append(batch)
            batch = []
        batch.append(index)
    return batches + [batch] if batch else batches


def require_harness() -> None:
    if harness_utils is None:
        raise ConfigError(HARNESS_MISSING)


def load_tasks(tasks: list[str], include: list[str]) -> tuple[object, dict[str, int]]:
    """The harness's TaskManager over its own tasks and the task YAML files or folders of ``include``, and each task
    of ``tasks`` built (which loads its dataset) and counted: an unknown name or a task whose data cannot be loaded
    is one line, before any scoring. Returns the manager and each task's number of examples."""
    require_harness()
    from lm_eval.tasks import TaskManager, get_task_dict
    for path in include:
        if not os.path.exists(path):
            raise ConfigError(f'{path}: no such task file or folder; give harness task YAMLs (or a folder of them)')
    folders = sorted({path if os.path.isdir(path) else os.path.dirname(os.path.abspath(path)) for path in include})
    manager = TaskManager(include_path=folders or None)  # it reads folders: a file's is read (its neighbours too)
    for name in tasks:
        if name not in manager.all_tasks:
            raise ConfigError(f"downstream task '{name}' is neither one of the harness's nor in "
                              f"{', '.join(include) or 'an --include path'}; check the name (lm_eval ls tasks)")
    examples = {}
    for name in tasks:
        try:
            built = get_task_dict([name], manager)
        except Exception as error:  # the harness and datasets raise anything from ValueError to FileNotFoundError
            raise ConfigError(f"downstream task '{name}' cannot be loaded ({type(error).__name__}: "
                              f"{str(error).splitlines()[0] if str(error) else ''}); put its data on disk and point "
                              f"the task at it (dataset_path: json, data_files)") from None
        if 'generate_until' in output_types(built):
            raise ConfigError(f"downstream task '{name}' generates text (output_type generate_until), which is not "
                              f"scored here; pick log-likelihood tasks (multiple choice, loglikelihood, perplexity)")
        examples[name] = count_examples(built)
    return manager, examples


@dataclass(frozen=True)
class LoadedTasks:
    """A run's downstream tasks as preflight loads them, once, before any model: the harness's TaskManager, each
    task's number of examples, and the tokenizer the harness tokenizes them with."""
    manager: object
    examples: dict[str, int]
    tokenizer: object


def load_run_tasks(config: DownstreamConfig, tokenizer: str | None) -> LoadedTasks:
    """``load_tasks`` for a run's ``downstream`` section, with the run's tokenizer (``data.tokenizer``)."""
    manager, examples = load_tasks(config.tasks, config.include)
    if tokenizer is None:
        raise ConfigError("downstream: needs data.tokenizer (the harness tokenizes the tasks' text with it); set "
                          "data.tokenizer")
    return LoadedTasks(manager, examples, harness_tokenizer(tokenizer))


def output_types(built: dict) -> set[str]:
    """The output types of a ``get_task_dict`` result's tasks."""
    return set().union(*(output_types(task) if isinstance(task, dict) else {task.OUTPUT_TYPE}
                         for task in built.values()))


def count_examples(built: dict) -> int:
    """The examples of a ``get_task_dict`` result (a group's: its tasks')."""
    return sum(count_examples(task) if isinstance(task, dict) else len(task.eval_docs) for task in built.values())


def metrics_of(results: dict) -> dict[str, float]:
    """``metrics/downstream/<task>/<metric>`` of the harness's results ('metric,filter' keys; their standard errors
    left out)."""
    metrics = {}
    for task, values in results['results'].items():
        for key, value in values.items():
            metric, comma, _ = key.partition(',')
            if comma and isinstance(value, (int, float)) and not isinstance(value, bool) and not metric.endswith(
                    '_stderr'):
                metrics[f'metrics/downstream/{task}/{metric}'] = float(value)
    return metrics


def run_tasks(model: 'HarnessModel', tasks: list[str], manager, limit: int | float | None = None,
              num_fewshot: int | None = None) -> dict:
    """The harness's ``simple_evaluate`` with our model, leaving the process's random generators as they are (it
    reseeds Python's, numpy's and torch's unless told not to), and without bootstrapped standard errors: for them
    (perplexity's, by default 100,000 resamples) the harness forks a pool of processes, and a fork of a process
    running loader, CUDA or NCCL threads can hang (it hung a CI worker in this suite); acc's comes in closed form."""
    from lm_eval import simple_evaluate
    return simple_evaluate(model=model, tasks=list(tasks), task_manager=manager, limit=limit,
                           num_fewshot=num_fewshot, log_samples=True, random_seed=None, numpy_random_seed=None,
                           torch_random_seed=None, bootstrap_iters=0)


def model_from_weights(source: str, tokenizer: str | None = None) -> tuple[torch.nn.Module, object, int]:
    """An HF or native weights folder, or a run folder (its latest checkpoint) or one checkpoint -> (our model with
    those weights, in eval mode on the CPU; the tokenizer of ``tokenizer`` or of the source; its context length)."""
    if any(os.path.isfile(os.path.join(source, name)) for name in (HF_CONFIG, NATIVE_CONFIG)):
        config, tensors = load_weights_folder(source)
        tokenizer = tokenizer or source
    else:
        _, config, tensors, run_tokenizer = read_checkpoint_weights(source)
        tokenizer = tokenizer or run_tokenizer
    model = family_of(config).module(config).eval()
    load_into(model, tensors)
    return model, harness_tokenizer(tokenizer), config.max_seq_len


def harness_tokenizer(folder: str | None):
    """transformers' tokenizer of a tokenizer folder, as the harness's HF backend reads one; it must name its EOS."""
    if folder is None or not os.path.isfile(os.path.join(folder, 'tokenizer_config.json')):
        raise ConfigError(f'{folder}: no tokenizer_config.json naming the tokenizer\'s eos_token (and bos_token, if it '
                          f'has one); add one, or use a tokenizer folder that has it')
    from transformers import AutoTokenizer
    tokenizer = AutoTokenizer.from_pretrained(folder)
    if tokenizer.eos_token_id is None:
        raise ConfigError(f'{folder}/tokenizer_config.json: names no eos_token; add it (the harness ends texts with '
                          f'it)')
    return tokenizer


SECONDS = 'metrics/downstream/seconds'
AUTOCAST = {'amp_bf16': torch.bfloat16, 'amp_fp8': torch.bfloat16, 'amp_fp16': torch.float16}


class DownstreamEvaluation(Callback):
    """Every ``every`` batches, each rank scores its share of the tasks through the (sharded) model; rank 0 logs the
    harness's metrics as ``metrics/downstream/<task>/<metric>`` to every logger, prints them and, where the run saves
    checkpoints, writes the harness's results as ``<results_folder>/ba<N>.json``."""

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
                               next(model.parameters()).device, self.autocast_dtype)
        limit = self.config.limit
        results = run_tasks(harness, self.config.tasks, self.tasks.manager,
                            int(limit) if limit is not None and limit >= 1 else limit, self.config.num_fewshot)
        model.train()
        if harness.rank != 0:  # the harness gathers the results on rank 0
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
