"""Downstream evaluation through lm-evaluation-harness (``pip install 'llmfoundry_ext[eval]'``): our model as the
harness's language model, so the tasks, prompts and metrics are the harness's own and the numbers are the ones its
HF backend reports for the same weights.

The harness leaves one thing to a model, scoring and continuing token sequences, and that is what ``HarnessModel``
does: the requests sorted by length and cut into batches of at most ``batch_tokens`` tokens, each padded only to its
longest request (not to the model's context), the log-probabilities taken at the continuation's positions alone;
generation greedy, with a KV cache. On several ranks every rank builds all the requests, as one process does, runs
its share of the batches through the sharded model and gets every result back; every rank runs the same number of
forwards (FSDP2 gathers each block's weights in a forward, with every rank taking part).

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
from typing import Iterator, NoReturn

import torch
import torch.distributed as dist
from torch.nn.attention import SDPBackend, sdpa_kernel

from llmfoundry_ext.atomic import write_atomically
from llmfoundry_ext.checkpoint import latest_checkpoint, read_checkpoint_weights
from llmfoundry_ext.config import DownstreamConfig
from llmfoundry_ext.errors import CheckpointError, ConfigError
from llmfoundry_ext.machine import world_size
from llmfoundry_ext.model.kv_cache import caching
from llmfoundry_ext.refusal import default_sigterm, exit_2_on_sigterm, refuse
from llmfoundry_ext.weights import HF_CONFIG, NATIVE_CONFIG, family_of, load_into, load_weights_folder

try:
    from lm_eval import utils as harness_utils
    from lm_eval.api.model import TemplateLM
    from lm_eval.models import utils as harness_model_utils
except ImportError:  # the optional extra: ``require_harness`` says what to install
    harness_utils, harness_model_utils, TemplateLM = None, None, object

ATTENTION_WITHOUT_CUDNN = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
HARNESS_MISSING = ("downstream evaluation needs lm-evaluation-harness, which is not installed: pip install "
                   "'llmfoundry_ext[eval]'")


class HarnessModel(TemplateLM):
    """``lm_eval.api.model.TemplateLM`` over our ``Transformer`` and an HF tokenizer: ``loglikelihood`` (multiple
    choice, LAMBADA-style), ``loglikelihood_rolling`` (perplexity) and greedy ``generate_until`` as the harness's HF
    backend computes them.

    To the harness it is one process (its ``rank`` 0 of 1), on every process of a run: each builds a task's requests
    as the one-process harness does (the same documents, the same few-shot draws) and gets every result back, so
    any number of processes gives the one-process metrics. The harness's own multi-process runs build each rank's
    requests from its share of the documents, which changes the few-shot draws. The work is what is shared out:
    each process runs its share of the batches (``process_rank``, ``processes``: the default process group's) and
    the results are summed over the group."""

    def __init__(self, transformer: torch.nn.Module, tokenizer, max_length: int, batch_tokens: int = 8192,
                 device: str | torch.device = 'cpu', autocast_dtype: torch.dtype | None = None,
                 generation_rows: int = DownstreamConfig.generation_rows):
        require_harness()
        super().__init__()
        self.transformer, self.tokenizer = transformer, tokenizer
        self._max_length, self.batch_tokens, self.generation_rows = max_length, batch_tokens, generation_rows
        self._device = torch.device(device)
        self.autocast_dtype = autocast_dtype
        launched = dist.is_available() and dist.is_initialized()
        self.process_rank, self.processes = (dist.get_rank(), dist.get_world_size()) if launched else (0, 1)

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
        """As the HF backend: unless told, the tokenizer's own special tokens (Llama 3's adds its BOS), none where
        the text starts with the BOS already."""
        options = {} if add_special_tokens is None else {'add_special_tokens': add_special_tokens}
        if add_special_tokens is None and harness_model_utils.has_bos_prefix(
                string, self.tokenizer.decode(self.prefix_token_id)):
            options['add_special_tokens'] = False
        return self.tokenizer.encode(string, **options)

    def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, **kwargs) -> list[tuple[float, bool]]:
        """(sum of the continuation's log-probabilities, whether greedy decoding gives it) per request; requests
        that share a context (a multiple-choice question's choices) are scored in one row (``SharedContext``)."""
        inputs = [model_input(context, continuation, self.max_length) for _, context, continuation in requests]
        shared = shared_contexts(inputs)
        scores = {}
        for batch in self.my_share(token_batches([len(row) for row in shared], self.batch_tokens)):
            scores.update(self.score([shared[index] for index in batch] or [SharedContext([self.eot_token_id])]))
        totals = self.summed(scores, len(requests))
        return [(float(totals[0, index]), bool(totals[1, index])) if continuation else (0.0, True)  # nothing scored
                for index, (_, continuation) in enumerate(inputs)]

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
        """Greedy continuations as the HF backend's (``HFLM.generate_until``): the context cut from the left to
        leave room for ``max_gen_toks`` (256 unless the task says), tokens generated until one of the stop strings
        (``until``, and the EOS) shows in the last few (``Generation.finished``), the text cut before the first.
        Each process decodes its share of the batches (``generation_rows`` contexts each) with a KV cache, all in
        step: a decoding step costs about as much for many rows as for few (its kernels are small), so the rows of a
        batch are many."""
        eos = self.tokenizer.decode([self.eot_token_id], skip_special_tokens=False)
        generations = [Generation.of(self, context, settings, eos) for context, settings in
                       (request.args for request in requests)]
        steps = max(generation.max_new for generation in generations)
        texts = {}
        for batch in self.my_share(generation_batches(generations, self.generation_rows)):
            rows = [generations[index] for index in batch] or [Generation([self.eot_token_id], 0, ())]
            for index, tokens in zip(batch, self.decode_greedily(rows, steps)):
                texts[index] = generations[index].text(self.tokenizer, tokens)
        if self.processes > 1:
            shares = [None] * self.processes
            dist.all_gather_object(shares, texts)
            texts = {index: text for share in shares for index, text in share.items()}
        return [texts[index] for index in range(len(requests))]

    @torch.no_grad()
    def decode_greedily(self, rows: list['Generation'], steps: int) -> list[list[int]]:
        """Each row's generated tokens: its context left-padded to the longest (RoPE positions from each row's
        first token, padding masked from every query) and read in parts of at most ``batch_tokens`` tokens, then
        one token a row a forward, until every row on every process has finished (rows that have go on and are not
        read; at most ``steps`` forwards after the contexts). Every process runs as many forwards. Eager (the
        keys grow each step), and not cuDNN's attention: it builds a plan for each new shape (on an H200, 128 1B
        questions took 8.1 s with new shapes, 2.2 s with their plans built)."""
        longest = max(len(row.context) for row in rows)
        tokens = torch.full((len(rows), longest), self.eot_token_id)
        valid = torch.zeros(len(rows), longest, dtype=torch.bool)
        for index, row in enumerate(rows):
            tokens[index, longest - len(row.context):] = torch.tensor(row.context)
            valid[index, longest - len(row.context):] = True
        positions = (valid.cumsum(-1) - 1).clamp(min=0)
        causal = torch.ones(longest, longest, dtype=torch.bool).tril()
        mask = (causal & valid[:, None, :]) | torch.eye(longest, dtype=torch.bool)  # a padding query sees itself
        size = max(1, self.batch_tokens // longest)
        parts = [slice(start, start + size) for start in range(0, len(rows), size)]
        generated = [[] for _ in rows]
        done = [row.max_new == 0 for row in rows]
        eager, attention = torch.compiler.set_stance('force_eager'), sdpa_kernel(ATTENTION_WITHOUT_CUDNN)
        with caching(self.transformer, len(rows), longest + steps) as caches, eager, attention:
            following = []
            for part in range(self.largest(len(parts))):
                if part < len(parts):
                    caches.rows(parts[part], filled=0)
                    following += self.next_tokens(tokens[parts[part]], positions[parts[part]], mask[parts[part], None])
                else:
                    with caches.paused():
                        self.next_tokens(tokens[:1, -1:], positions[:1, -1:], mask[:1, None, -1:, -1:])
            caches.rows(slice(None), filled=longest)
            while True:
                for index, row in enumerate(rows):
                    if not done[index]:
                        generated[index].append(following[index])
                        done[index] = row.finished(generated[index], self.eot_token_id, self.tokenizer)
                if not self.largest(not all(done)):
                    return generated
                tokens, positions = torch.tensor(following)[:, None], positions[:, -1:] + 1
                valid = torch.cat([valid, torch.ones(len(rows), 1, dtype=torch.bool)], dim=1)
                following = self.next_tokens(tokens, positions, valid[:, None, None, :])

    def next_tokens(self, tokens: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor) -> list[int]:
        """The greedy token after each row's last: one forward of ``tokens`` [B, S] after those cached."""
        rows = torch.arange(len(tokens), device=self.device)
        last = torch.full_like(rows, tokens.shape[1] - 1)
        return self.logits_at(tokens, positions, mask, (rows, last)).float().argmax(-1).tolist()

    def logits_at(self, tokens: torch.Tensor, positions: torch.Tensor | None, mask: torch.Tensor | None,
                  places: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        """The logits [N, vocab] at ``places`` (rows, positions) of one forward of ``tokens`` [B, S] with the given
        RoPE positions and attention mask (None: the model's own), under the autocast dtype where there is one."""
        with torch.autocast(self.device.type, self.autocast_dtype, enabled=self.autocast_dtype is not None):
            logits = self.transformer(tokens.to(self.device), None if positions is None else positions.to(self.device),
                                      attention_mask=None if mask is None else mask.to(self.device), logits_at=places)
        return logits[0] if isinstance(logits, tuple) else logits  # a mixture of experts': (logits, router statistics)

    def my_share(self, batches: list[list[int]]) -> list[list[int]]:
        """This process's batches of ``batches`` (every process holds them all), then empty ones until every
        process has as many: FSDP2 gathers each block's weights in a forward, with every process taking part (an
        empty batch runs one token)."""
        share = batches[self.process_rank::self.processes]
        return share + [[]] * (-(-len(batches) // self.processes) - len(share))

    def largest(self, value: int) -> int:
        """The largest ``value`` of the processes'."""
        if self.processes == 1:
            return value
        values = torch.tensor(int(value), device=self.device)
        dist.all_reduce(values, op=dist.ReduceOp.MAX)
        return int(values)

    def summed(self, scores: dict[int, tuple[float, bool]], count: int) -> torch.Tensor:
        """[2, count] float64: each request's (log-likelihood, greedy) from the process that scored it (the others
        hold zeros there: the sum is exact)."""
        totals = torch.zeros(2, count, dtype=torch.float64)
        for index, (loglikelihood, greedy) in scores.items():
            totals[:, index] = torch.tensor([loglikelihood, float(greedy)], dtype=torch.float64)
        if self.processes > 1:
            totals = totals.to(self.device)
            dist.all_reduce(totals)
        return totals.cpu()

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
        logits = self.logits_at(ids, positions if branched else None, branch_mask(segments) if branched else None,
                                tuple(torch.tensor(part, dtype=torch.long, device=self.device) for part in places))
        logprobs = torch.log_softmax(logits.float(), dim=-1)
        targets = torch.tensor(targets, dtype=torch.long, device=logprobs.device)
        picked = logprobs.gather(-1, targets[:, None]).squeeze(-1).cpu()
        greedy = (logprobs.argmax(-1) == targets).cpu()
        sizes = [size for _, size in owners]
        return [(index, (float(part.sum()), bool(hits.all())))
                for (index, _), part, hits in zip(owners, picked.split(sizes), greedy.split(sizes))]


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


GENERATED_TOKENS = 256  # the HF backend's max_gen_toks where a task sets none


@dataclass(frozen=True)
class Generation:
    """One ``generate_until`` request as the HF backend runs it: the context's tokens (cut from the left to leave
    room for ``max_new``), the most tokens to generate, and the stop strings (the task's ``until`` and the EOS),
    each with how many of the last tokens are read for it (its own and 2, as ``MultiTokenEOSCriteria``)."""
    context: list[int]
    max_new: int
    stops: tuple[tuple[str, int], ...]

    @classmethod
    def of(cls, model: HarnessModel, context: str, settings: dict, eos: str) -> 'Generation':
        settings = harness_model_utils.normalize_gen_kwargs(settings, GENERATED_TOKENS)
        until = harness_model_utils.handle_stop_sequences(settings['until'], eos=eos)
        max_new, length = settings['max_gen_toks'], model.max_length
        if max_new >= length:
            raise ConfigError(f'a generation task asks for {max_new} tokens (max_gen_toks), not fewer than the '
                              f"model's context of {length}; lower max_gen_toks in its generation_kwargs")
        stops = tuple((stop, len(model.tokenizer.encode(stop, add_special_tokens=False)) + 2) for stop in until)
        return cls(model.tok_encode(context)[-(length - max_new):], max_new, stops)

    def finished(self, generated: list[int], eos_id: int, tokenizer) -> bool:
        return (len(generated) >= self.max_new or generated[-1] == eos_id
                or any(stop in tokenizer.decode(generated[-lookback:]) for stop, lookback in self.stops))

    def text(self, tokenizer, generated: list[int]) -> str:
        """The generated text, cut before its first stop string."""
        return harness_model_utils.postprocess_generated_text(
            tokenizer.decode(generated, skip_special_tokens=True), [stop for stop, _ in self.stops], None)


def generation_batches(generations: list[Generation], rows: int) -> list[list[int]]:
    """Indices of ``generations`` longest context first, ``rows`` a batch."""
    order = sorted(range(len(generations)), key=lambda index: -len(generations[index].context))
    return [order[start:start + rows] for start in range(0, len(order), rows)]


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


CLI_KEYS = ('--tasks', '--include')  # what load_tasks' errors name: scripts/evaluate.py's options, or a run's keys
RUN_KEYS = ('downstream.tasks', 'downstream.include')


def load_tasks(tasks: list[str], include: list[str], keys: tuple[str, str] = CLI_KEYS) -> tuple[dict, dict[str, int]]:
    """Each task of ``tasks`` (the harness's, or those of the task YAML files or folders of ``include``) built by
    the harness's TaskManager, which loads its dataset, and counted: an unknown name or a task whose data cannot be
    loaded is one line, before any scoring. Returns the tasks as ``TaskManager.load`` gives them, built once for
    every evaluation, and each task's number of examples.

    The manager indexes the ``include`` folders alone first: indexing the harness's own ~14,000 task YAMLs as well
    takes 6-27 s a process, in every rank of a run. They are indexed only for a task that is the harness's (its
    names known from ``harness_task_names``, without the index) or for a local group that does not build from the
    folders alone (a group of the harness's tasks); a name that is neither, or a local task whose data are missing,
    is reported at once. Each error names the option or key (``keys``: the tasks', the include paths')."""
    require_harness()
    from lm_eval.tasks import TaskManager
    for path in include:
        if not os.path.exists(path):
            raise ConfigError(f'{keys[1]}: {path}: no such task file or folder; give harness task YAMLs (or a folder '
                              f'of them)')
        check_task_yamls(path)
    folders = sorted({path if os.path.isdir(path) else os.path.dirname(os.path.abspath(path)) for path in include})
    local = TaskManager(include_path=folders, include_defaults=False) if folders else None  # a file's folder is read
    local_names = set(local.all_tasks) if local else set()
    for name in tasks:
        if name not in local_names and name not in harness_task_names():
            raise unknown_task(name, include, keys)
    if all(name in local_names for name in tasks):
        try:
            return built_tasks(local, tasks, include, keys)
        except ConfigError:
            if not any(name in local.all_groups for name in tasks):
                raise
    return built_tasks(TaskManager(include_path=folders or None), tasks, include, keys)


def unknown_task(name: str, include: list[str], keys: tuple[str, str]) -> ConfigError:
    return ConfigError(f"{keys[0]}: '{name}' is neither one of the harness's tasks nor in {keys[1]} "
                       f"({', '.join(include) or 'none given'}); check the name (lm_eval ls tasks)")


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


def built_tasks(manager, tasks: list[str], include: list[str], keys: tuple[str, str]) -> tuple[dict, dict[str, int]]:
    """``load_tasks`` with one TaskManager."""
    for name in tasks:
        if name not in manager.all_tasks:
            raise unknown_task(name, include, keys)
    examples, built = {}, []
    for name in tasks:
        try:
            loaded = manager.load([name])
        except Exception as error:  # the harness and datasets raise anything from ValueError to FileNotFoundError
            raise ConfigError(f"{keys[0]}: task '{name}' cannot be loaded ({type(error).__name__}: "
                              f"{str(error).splitlines()[0] if str(error) else ''}); put its data on disk and point "
                              f"the task at it (dataset_path: json, data_files)") from None
        if any(sampled(task) for task in loaded['tasks'].values()):
            raise ConfigError(f"{keys[0]}: task '{name}' samples its generations (do_sample or a temperature above "
                              f"0); only greedy decoding runs here: set do_sample: false in its generation_kwargs")
        examples[name] = sum(len(task.eval_docs) for task in loaded['tasks'].values())
        built += [loaded['groups'][name]] if name in loaded['groups'] else list(loaded['tasks'].values())
    return manager.load(built), examples


def sampled(task) -> bool:
    """Whether ``task`` generates by sampling, as the harness reads its ``generation_kwargs``."""
    return task.OUTPUT_TYPE == 'generate_until' and harness_model_utils.normalize_gen_kwargs(
        task.config.generation_kwargs or {})['do_sample']


@dataclass(frozen=True)
class LoadedTasks:
    """A run's downstream tasks as preflight loads them, once, before any model: the tasks (``load_tasks``), each
    task's number of examples, and the tokenizer the harness tokenizes them with."""
    tasks: dict
    examples: dict[str, int]
    tokenizer: object


def load_run_tasks(config: DownstreamConfig, tokenizer: str | None) -> LoadedTasks:
    """``load_tasks`` for a run's ``downstream`` section, with the run's tokenizer (``data.tokenizer``)."""
    tasks, examples = load_tasks(config.tasks, config.include, RUN_KEYS)
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


def is_weights_folder(source: str) -> bool:
    return any(os.path.isfile(os.path.join(source, name)) for name in (HF_CONFIG, NATIVE_CONFIG))


def check_source(source: str) -> None:
    """A source that is neither a weights folder nor a run folder or checkpoint, refused from its files alone (no
    weights read), so that it is named before the tasks load (over the network, where they are not on disk)."""
    if not is_weights_folder(source):
        latest_checkpoint(source)


def model_from_weights(source: str, tokenizer: str | None = None) -> tuple[torch.nn.Module, object, int]:
    """An HF or native weights folder, or a run folder (its latest checkpoint) or one checkpoint -> (our model with
    those weights, in eval mode on the CPU; the tokenizer of ``tokenizer`` or of the source; its context length)."""
    if is_weights_folder(source):
        config, tensors = load_weights_folder(source)
        tokenizer = tokenizer or source
    else:
        weights = read_checkpoint_weights(source)
        config, tensors, tokenizer = weights.config, weights.tensors, tokenizer or weights.tokenizer
    model = family_of(config).module(config).eval()
    load_into(model, tensors)
    return model, harness_tokenizer(tokenizer), config.max_seq_len


@contextlib.contextmanager
def launched_processes(on_gpu: bool) -> Iterator[torch.device]:
    """The launcher's process group (NCCL on GPUs, gloo on the CPU) while inside; this process's device. Destroyed
    on the way out; a process that used it ends with ``exit_process``."""
    dist.init_process_group('nccl' if on_gpu else 'gloo')
    try:
        if on_gpu:
            torch.cuda.set_device(int(os.environ.get('LOCAL_RANK', '0')))
            yield torch.device('cuda', torch.cuda.current_device())
        else:
            yield torch.device('cpu')
    finally:
        dist.destroy_process_group()


def exit_process(code: int) -> NoReturn:
    """End this process with ``code`` after flushing stdout and stderr, without the interpreter's teardown.

    A gloo worker thread lets go of a collective's tensors after the collective has returned to the caller
    (``ProcessGroupGloo::runLoop`` resets its work after executing it), and one still busy when the interpreter
    tears itself down aborts the process ("terminate called without an active exception", SIGABRT, -6; see
    pytorch/pytorch#179291): the rare abort of one rank of ``composer -n 2 scripts/evaluate.py`` (1 in 88 runs
    under torch 2.15, once in 2 under 2.11 on a loaded 2-core machine). ``destroy_process_group`` does not end
    the threads: the group lives on in DTensor's sharding caches, which hold the FSDP2 mesh. Nothing else needs
    the teardown here: the results are written and closed."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


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
        print(f'scored by {dist.get_world_size()} processes, each its share of the requests built as one process '
              f'builds them')
    if json_path:
        with open(json_path, 'w') as file:
            json.dump({key: results[key] for key in ('results', 'samples', 'n-samples', 'configs')}, file,
                      indent=1, default=str)


def evaluate_weights(source: str, tasks: list[str], include: list[str], limit: float | None,
                     num_fewshot: int | None, tokenizer: str | None, batch_tokens: int, generation_rows: int,
                     device: str, dtype: str, json_path: str | None) -> int:
    """``scripts/evaluate.py``: the tasks scored on the weights of ``source`` (under a launcher, the model sharded over
    its processes, each running its share of the requests); rank 0 prints the table. 2 with one line for a bad task,
    source or tokenizer, before any weights reach a device."""
    exit_2_on_sigterm()
    try:
        check_source(source)
        loaded, _ = load_tasks(tasks, include)
        model, harness_tokens, max_length = model_from_weights(source, tokenizer)
    except (ConfigError, CheckpointError) as error:
        return refuse(f'error: {error}')
    on_gpu, launched = device.startswith('cuda'), world_size() > 1
    with launched_processes(on_gpu) if launched else contextlib.nullcontext(torch.device(device)) as place:
        default_sigterm()
        model = model.to(place, getattr(torch, dtype) if on_gpu else torch.float32)  # as the HF backend's dtype
        if launched:
            shard_over_processes(model)
        harness = HarnessModel(model, harness_tokens, max_length, batch_tokens, place, None, generation_rows)
        results = run_tasks(harness, loaded, limit if limit is None or limit < 1 else int(limit), num_fewshot)
        if harness.process_rank == 0:  # every process holds the results
            report_results(results, json_path)
    return 0


def harness_tokenizer(folder: str | None):
    """transformers' tokenizer of a tokenizer folder, as the harness's HF backend reads one; it must name its EOS."""
    if folder is not None and not os.path.isdir(folder):
        raise ConfigError(f"{folder}: no such tokenizer folder (a run's relative data.tokenizer is relative to the "
                          f"folder it trained in); run from there, or give --tokenizer")
    if folder is None or not os.path.isfile(os.path.join(folder, 'tokenizer_config.json')):
        raise ConfigError(f'{folder}: no tokenizer_config.json naming the tokenizer\'s eos_token (and bos_token, if it '
                          f'has one); add one, or use a tokenizer folder that has it')
    from transformers import AutoTokenizer
    tokenizer = AutoTokenizer.from_pretrained(folder)
    if tokenizer.eos_token_id is None:
        raise ConfigError(f'{folder}/tokenizer_config.json: names no eos_token; add it (the harness ends texts with '
                          f'it)')
    return tokenizer
