"""Downstream evaluation through lm-evaluation-harness (``pip install 'llmfoundry_ext[eval]'``): our model as the
harness's language model, so the tasks, prompts and metrics are the harness's own and the numbers are the ones its
HF backend reports for the same weights.

The harness leaves one thing to a model, scoring token sequences, and that is what ``HarnessModel`` does: the
requests sorted by length and cut into batches of at most ``batch_tokens`` tokens, each padded only to its longest
request (not to the model's context), the log-probabilities taken at the continuation's positions alone. On several
ranks each scores its share through the sharded model, and every rank runs the same number of forwards (FSDP2
gathers each block's weights in a forward, with every rank taking part).

During training (the YAML's ``downstream`` section) ``downstream_callback.py`` runs the harness every
``interval`` batches; this module imports no Composer, so ``scripts/evaluate.py`` does not.
"""
import contextlib
import functools
import json
import os
import sys
import zlib
from dataclasses import dataclass, field
from importlib.metadata import version
from typing import Iterable, Iterator

import torch
import torch.distributed as dist

from llmfoundry_ext.atomic import write_atomically
from llmfoundry_ext.checkpoint import read_checkpoint_weights
from llmfoundry_ext.config import DownstreamConfig
from llmfoundry_ext.errors import CheckpointError, ConfigError
from llmfoundry_ext.machine import world_size
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
        """(sum of the continuation's log-probabilities, whether greedy decoding gives it) per request; requests
        that share a context (a multiple-choice question's choices) are scored in one row (``SharedContext``)."""
        inputs = [model_input(context, continuation, self.max_length) for _, context, continuation in requests]
        results = [(0.0, True) if not continuation else None for _, continuation in inputs]  # nothing to score
        shared = shared_contexts(inputs)
        for batch in self.same_count_on_every_rank(token_batches([len(row) for row in shared], self.batch_tokens)):
            for index, score in self.score([shared[index] for index in batch] or [SharedContext([self.eot_token_id])]):
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
    def score(self, batch: list['SharedContext']) -> list[tuple[int, tuple[float, bool]]]:
        """One forward over the batch's rows, right-padded to the longest: (request index, (its continuation's
        log-likelihood, whether it is the greedy one)) for each of their requests. Rows with several branches are
        masked so that each branch sees the context and itself alone (``branch_mask``)."""
        longest = max(len(row) for row in batch)
        ids = torch.zeros(len(batch), longest, dtype=torch.long)
        positions = torch.arange(longest).repeat(len(batch), 1)
        segments = torch.full((len(batch), longest), -1)
        places, targets, owners = ([], []), [], []
        for row_index, row in enumerate(batch):
            ids[row_index, :len(row)] = torch.tensor(row.tokens())
            segments[row_index, :len(row.context)] = 0
            for branch, (index, tokens, continuation) in enumerate(row.branches, start=1):
                start, end = row.branch_start(branch - 1), row.branch_start(branch)
                positions[row_index, start:end] = torch.arange(len(row.context), len(row.context) + len(tokens))
                segments[row_index, start:end] = branch
                places[0].extend([row_index] * len(continuation))
                places[1].extend([len(row.context) - 1, *range(start, end)])
                targets += continuation
                owners.append((index, len(continuation)))
        branched = any(len(row.branches) > 1 for row in batch)
        mask = branch_mask(segments).to(self.device) if branched else None
        with torch.autocast(self.device.type, self.autocast_dtype, enabled=self.autocast_dtype is not None):
            logits = self.transformer(ids.to(self.device), positions.to(self.device) if branched else None,
                                      attention_mask=mask,
                                      logits_at=tuple(torch.tensor(part, dtype=torch.long, device=self.device)
                                                      for part in places))
        if isinstance(logits, tuple):  # a mixture of experts': (logits, router statistics)
            logits = logits[0]
        logprobs = torch.log_softmax(logits.float(), dim=-1)
        targets = torch.tensor(targets, dtype=torch.long, device=logprobs.device)
        picked = logprobs.gather(-1, targets[:, None]).squeeze(-1).cpu()
        greedy = (logprobs.argmax(-1) == targets).cpu()
        sizes = [size for _, size in owners]
        return [(index, (float(part.sum()), bool(hits.all())))
                for (index, _), part, hits in zip(owners, picked.split(sizes), greedy.split(sizes))]

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
    ``max_length`` + 1 tokens, less the last, as the harness's HF backend; a continuation longer than that window
    is scored on its tokens the window predicts (the HF backend fails on one)."""
    tokens = (context + continuation)[-(max_length + 1):][:-1]
    return tokens, continuation[-len(tokens):] if len(continuation) > len(tokens) else continuation


@dataclass
class SharedContext:
    """One row of scoring: a context and the branches that continue it, each (request index, its tokens after
    the context: the continuation less its last token, the continuation scored). The context's last position
    predicts every continuation's first token; a branch's positions predict the rest. A four-choice question's
    context is computed once instead of four times."""
    context: list[int]
    branches: list[tuple[int, list[int], list[int]]] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.context) + sum(len(tokens) for _, tokens, _ in self.branches)

    def tokens(self) -> list[int]:
        return self.context + [token for _, tokens, _ in self.branches for token in tokens]

    def branch_start(self, branch: int) -> int:
        """Where branch ``branch`` starts in the row (``len(self.branches)``: where the row ends)."""
        return len(self.context) + sum(len(tokens) for _, tokens, _ in self.branches[:branch])


def shared_contexts(inputs: list[tuple[list[int], list[int]]]) -> list[SharedContext]:
    """``model_input``s with a continuation, grouped by the tokens before it: the first position each scores
    from on is its context's last."""
    rows: dict[tuple, SharedContext] = {}
    for index, (tokens, continuation) in enumerate(inputs):
        if continuation:
            split = len(tokens) - len(continuation) + 1
            context = tuple(tokens[:split])
            rows.setdefault(context, SharedContext(list(context))).branches.append(
                (index, tokens[split:], continuation))
    return list(rows.values())


def branch_mask(segments: torch.Tensor) -> torch.Tensor:
    """[B, S] segment ids (0: the shared context, k: branch k, -1: padding) -> [B, 1, S, S] bool: causal, and a
    branch's queries see the context and their own branch alone."""
    causal = torch.ones(segments.shape[1], segments.shape[1], dtype=torch.bool).tril()
    keys, queries = segments[:, None, :], segments[:, :, None]
    return (causal & ((keys == 0) | (keys == queries))).unsqueeze(1)


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


def load_tasks(tasks: list[str], include: list[str]) -> tuple[dict, dict[str, int]]:
    """Each task of ``tasks`` (the harness's, or those of the task YAML files or folders of ``include``) built by
    the harness's TaskManager, which loads its dataset, and counted: an unknown name or a task whose data cannot be
    loaded is one line, before any scoring. Returns the tasks as ``TaskManager.load`` gives them, built once for
    every evaluation, and each task's number of examples.

    The manager indexes the ``include`` folders alone first: indexing the harness's own ~14,000 task YAMLs as well
    takes 6-27 s a process, in every rank of a run. They are indexed only for a task that is the harness's (its
    names known from ``harness_task_names``, without the index) or for a local group that does not build from the
    folders alone (a group of the harness's tasks); a name that is neither, or a local task whose data are missing,
    is reported at once."""
    require_harness()
    from lm_eval.tasks import TaskManager
    for path in include:
        if not os.path.exists(path):
            raise ConfigError(f'{path}: no such task file or folder; give harness task YAMLs (or a folder of them)')
        check_task_yamls(path)
    folders = sorted({path if os.path.isdir(path) else os.path.dirname(os.path.abspath(path)) for path in include})
    local = TaskManager(include_path=folders, include_defaults=False) if folders else None  # a file's folder is read
    local_names = set(local.all_tasks) if local else set()
    for name in tasks:
        if name not in local_names and name not in harness_task_names():
            raise ConfigError(f"downstream task '{name}' is neither one of the harness's nor in "
                              f"{', '.join(include) or 'an --include path'}; check the name (lm_eval ls tasks)")
    if all(name in local_names for name in tasks):
        try:
            return built_tasks(local, tasks, include)
        except ConfigError:
            if not any(name in local.all_groups for name in tasks):
                raise
    return built_tasks(TaskManager(include_path=folders or None), tasks, include)


def check_task_yamls(path: str) -> None:
    """Each task YAML at ``path`` (a file, or a folder's, recursively) parses: the harness's TaskManager skips one
    that does not with a log line, and its task would then be reported as unknown. Tags such as ``!function`` are
    the harness's to resolve and are accepted here as they are."""
    import yaml

    class TaskLoader(yaml.SafeLoader):
        pass

    TaskLoader.add_multi_constructor('!', lambda loader, tag, node: None)
    files = [path] if os.path.isfile(path) else [os.path.join(folder, name) for folder, _, names in os.walk(path)
                                                 for name in sorted(names) if name.endswith(('.yaml', '.yml'))]
    for file in files:
        try:
            with open(file) as text:
                yaml.load(text, Loader=TaskLoader)
        except yaml.YAMLError as error:
            mark = getattr(error, 'problem_mark', None)
            where = f' at line {mark.line + 1}, column {mark.column + 1}' if mark else ''
            problem = getattr(error, 'problem', None) or str(error).splitlines()[0]
            raise ConfigError(f'{file}: not a valid task YAML: {problem}{where}; fix the file or move it out of '
                              f'the include path') from None


@functools.cache
def harness_task_names() -> frozenset[str]:
    """The names of the harness's own tasks, groups and tags. Its TaskManager finds them by indexing ~14,000 YAML
    files (6-27 s), so they are kept on disk once per harness version and install (only the names: what a task is
    still comes from the harness's own index when it is loaded)."""
    import lm_eval.tasks
    install = zlib.crc32(os.path.dirname(lm_eval.tasks.__file__).encode())
    cache = os.path.join(os.environ.get('XDG_CACHE_HOME') or os.path.expanduser('~/.cache'), 'llmfoundry_ext',
                         f"lm_eval-{version('lm_eval')}-{install:08x}-task-names.json")
    try:
        with open(cache) as file:
            return frozenset(json.load(file))
    except (OSError, ValueError):
        pass
    names = sorted(lm_eval.tasks.TaskManager().all_tasks)
    os.makedirs(os.path.dirname(cache), exist_ok=True)
    write_atomically(cache, json.dumps(names))
    return frozenset(names)


def built_tasks(manager, tasks: list[str], include: list[str]) -> tuple[dict, dict[str, int]]:
    """``load_tasks`` with one TaskManager."""
    for name in tasks:
        if name not in manager.all_tasks:
            raise ConfigError(f"downstream task '{name}' is neither one of the harness's nor in "
                              f"{', '.join(include) or 'an --include path'}; check the name (lm_eval ls tasks)")
    examples, built = {}, []
    for name in tasks:
        try:
            loaded = manager.load([name])
        except Exception as error:  # the harness and datasets raise anything from ValueError to FileNotFoundError
            raise ConfigError(f"downstream task '{name}' cannot be loaded ({type(error).__name__}: "
                              f"{str(error).splitlines()[0] if str(error) else ''}); put its data on disk and point "
                              f"the task at it (dataset_path: json, data_files)") from None
        if any(task.OUTPUT_TYPE == 'generate_until' for task in loaded['tasks'].values()):
            raise ConfigError(f"downstream task '{name}' generates text (output_type generate_until), which is not "
                              f"scored here; pick log-likelihood tasks (multiple choice, loglikelihood, perplexity)")
        examples[name] = sum(len(task.eval_docs) for task in loaded['tasks'].values())
        built += [loaded['groups'][name]] if name in loaded['groups'] else list(loaded['tasks'].values())
    return manager.load(built), examples


@dataclass(frozen=True)
class LoadedTasks:
    """A run's downstream tasks as preflight loads them, once, before any model: the tasks (``load_tasks``), each
    task's number of examples, and the tokenizer the harness tokenizes them with."""
    tasks: dict
    examples: dict[str, int]
    tokenizer: object


def load_run_tasks(config: DownstreamConfig, tokenizer: str | None) -> LoadedTasks:
    """``load_tasks`` for a run's ``downstream`` section, with the run's tokenizer (``data.tokenizer``)."""
    tasks, examples = load_tasks(config.tasks, config.include)
    if tokenizer is None:
        raise ConfigError("downstream: needs data.tokenizer (the harness tokenizes the tasks' text with it); set "
                          "data.tokenizer")
    return LoadedTasks(tasks, examples, harness_tokenizer(tokenizer))


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


FEWSHOT_SEED = 1234  # simple_evaluate's default fewshot_random_seed


def run_tasks(model: 'HarnessModel', tasks: dict, limit: int | float | None = None,
              num_fewshot: int | None = None) -> dict:
    """The harness's ``evaluate`` of ``load_tasks``'s tasks with our model, each task set up as ``simple_evaluate``
    sets it (``num_fewshot`` where given and the task's own is not 0, else its own or 0; the few-shot sampler
    seeded), its templates compiled once (``compiled_templates``). Not ``simple_evaluate`` itself: on every call it
    builds the tasks again (loading their data) and collects the machine's environment (``pip list``, nvidia-smi:
    1.4 s on an H100 host), and it reseeds Python's, numpy's and torch's generators unless told not to.
    No bootstrapped standard errors: for them (perplexity's, by default 100,000 resamples) the harness forks a pool
    of processes, and a fork of a process running loader, CUDA or NCCL threads can hang (it hung a CI worker in
    this suite); acc's comes in closed form."""
    from lm_eval.evaluator import evaluate
    for task in tasks['tasks'].values():
        own = task.get_config('num_fewshot')
        if num_fewshot is not None and own != 0:
            task.set_config(key='num_fewshot', value=num_fewshot)
        elif num_fewshot is None and own is None:
            task.set_config(key='num_fewshot', value=0)
        task.set_fewshot_seed(seed=FEWSHOT_SEED)
    with compiled_templates():
        return evaluate(lm=model, task_dict=tasks, limit=limit, log_samples=True, bootstrap_iters=0)


@contextlib.contextmanager
def compiled_templates():
    """The harness's ``utils.apply_template`` with each Jinja template compiled once: the harness compiles the
    template again for every document it renders (7,003 compiles, 3-6 s of a 1,000-question multiple-choice
    evaluation on an H100 host). The rendered text is the same."""
    original = harness_utils.apply_template
    compile_template = functools.lru_cache(maxsize=None)(harness_utils.env.from_string)
    harness_utils.apply_template = lambda template, doc: compile_template(template).render(**doc)
    try:
        yield
    finally:
        harness_utils.apply_template = original


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


@contextlib.contextmanager
def launched_processes(on_gpu: bool) -> Iterator[torch.device]:
    """The launcher's process group (NCCL on GPUs, gloo on the CPU) while inside; this process's device. Destroyed on
    the way out, before the interpreter's teardown: there a gloo worker thread still holding a collective's tensors
    can need the GIL and abort the process (SIGABRT, pytorch/pytorch#179291). Not the cure of the rare abort (-6) of
    one rank of 2 under torch 2.15: 1 in 88 runs with this on a 2-core machine, cause unknown."""
    dist.init_process_group('nccl' if on_gpu else 'gloo')
    try:
        if on_gpu:
            torch.cuda.set_device(int(os.environ.get('LOCAL_RANK', '0')))
            yield torch.device('cuda', torch.cuda.current_device())
        else:
            yield torch.device('cpu')
    finally:
        dist.destroy_process_group()


def shard_over_processes(model: torch.nn.Module) -> None:
    """FSDP2 over the process group, each block a unit and the rest the root's, as training shards it."""
    from torch.distributed.fsdp import fully_shard
    for block in model.layers:
        fully_shard(block)
    fully_shard(model)


def report_results(results: dict, json_path: str | None) -> None:
    """The harness's table on stdout; with ``json_path`` its results and each sample's log-likelihoods there."""
    from lm_eval.utils import make_table
    print(make_table(results))
    if dist.is_initialized():
        print(f'scored by {dist.get_world_size()} processes, each its share of the documents')
    if json_path:
        with open(json_path, 'w') as file:
            json.dump({key: results[key] for key in ('results', 'samples', 'n-samples', 'configs')}, file,
                      indent=1, default=str)


def evaluate_weights(source: str, tasks: list[str], include: list[str], limit: float | None,
                     num_fewshot: int | None, tokenizer: str | None, batch_tokens: int, device: str, dtype: str,
                     json_path: str | None) -> int:
    """``scripts/evaluate.py``: the tasks scored on the weights of ``source`` (under a launcher, the model sharded over
    its processes, each scoring its share); rank 0 prints the table. 2 with one line for a bad task, source or
    tokenizer, before any weights reach a device."""
    try:
        loaded, _ = load_tasks(tasks, include)
        model, harness_tokens, max_length = model_from_weights(source, tokenizer)
    except (ConfigError, CheckpointError) as error:
        print(f'error: {error}', file=sys.stderr)
        return 2
    on_gpu, launched = device.startswith('cuda'), world_size() > 1
    with launched_processes(on_gpu) if launched else contextlib.nullcontext(torch.device(device)) as place:
        if launched:
            shard_over_processes(model.to(place))
        harness = HarnessModel(model.to(place), harness_tokens, max_length, batch_tokens, place,
                               getattr(torch, dtype) if on_gpu and dtype != 'float32' else None)
        results = run_tasks(harness, loaded, limit if limit is None or limit < 1 else int(limit), num_fewshot)
        if results is not None:  # rank 0: the harness gathered the results there
            report_results(results, json_path)
    return 0


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
