"""Training throughput of YAML runs on synthetic tokens: tokens/s per GPU, MFU, step time and peak memory.

A row is ``NAME SOURCE [key=value ...]``, its SOURCE saying what trains:
  ``yamls/x.yaml``        our model, as the YAML and its overrides configure it;
  ``hf:yamls/x.yaml``     transformers' model of that YAML's family and shape (LlamaForCausalLM, MixtralForCausalLM;
                          sdpa; the experts as that transformers runs them by default), under the same Composer
                          FSDP2 settings (as llm-foundry's ``hf_causal_lm`` does);
  ``hf-loop:yamls/x.yaml`` the same with transformers' per-expert loop (``experts_implementation='eager'``, the only
                          one of transformers 4);
  ``torchtitan:SETTING``  torchtitan through its anchor script (``.anchors/run.sh SETTING``, KEY=VALUE its env).
Our and HF rows run in their own ``composer -n GPUS`` process (fresh GPU memory and compile caches) over one data
folder the parent wrote for every rank; rank 0 writes the row's figures to a JSON file the parent reads.
"""
import dataclasses
import functools
import itertools
import json
import os
import re
import shlex
import statistics
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from importlib.metadata import version

import torch
from composer.callbacks.speed_monitor import get_gpu_flops_available
from composer.core import Callback, State
from composer.loggers import Logger
from composer.models import ComposerModel
from composer.utils import dist

from llmfoundry_ext import preflight
from llmfoundry_ext.measure import REPO
from llmfoundry_ext.measure.gpu_clocks import GpuSampler, format_clocks
from llmfoundry_ext.measure.profiling import allocator_counts, reserved_by_stream
from llmfoundry_ext.measure.synthetic import synthetic_run_yaml
from llmfoundry_ext.clipping import GradientClipping
from llmfoundry_ext.launch import LAUNCHER
from llmfoundry_ext.model.composer_model import batch_flops, token_mean_cross_entropy
from llmfoundry_ext.weights import family_of, save_hf
from llmfoundry_ext.train import train

SOURCES = {'hf:': 'hf', 'hf-loop:': 'hf-loop', 'torchtitan:': 'torchtitan'}  # SOURCE prefix -> model; none: ours
GIB = 2 ** 30


@dataclass
class Row:
    """One benchmarked configuration: a name, a YAML (or torchtitan setting) and its overrides (or env)."""
    name: str
    source: str
    overrides: list[str] = field(default_factory=list)
    model: str = 'ours'

    @classmethod
    def parse(cls, text: str) -> 'Row':
        """'NAME SOURCE key=value ...' (shell quoting); SOURCE 'hf:YAML', 'torchtitan:SETTING' or a YAML."""
        name, source, *overrides = shlex.split(text)
        for prefix, model in SOURCES.items():
            if source.startswith(prefix):
                return cls(name, source.removeprefix(prefix), overrides, model)
        return cls(name, source, overrides, 'ours')

    def text(self) -> str:
        """The row as ``parse`` reads it."""
        prefix = next((prefix for prefix, model in SOURCES.items() if model == self.model), '')
        return shlex.join([self.name, prefix + self.source, *self.overrides])


class StepTimer(Callback):
    """Each step's time over the batches after ``warmup``, the peak GPU memory in that window and the caching
    allocator's cudaMalloc, cudaFree and out-of-memory retries in it (a row near the memory limit frees and retries
    every step, each cudaFree waiting for the whole GPU: slow without a sign in its peak), and at the training's end
    what each stream's pool holds (``profiling.reserved_by_stream``: who holds the memory reserved beyond the peak).
    It synchronises at the end of every batch from the warm-up's last (so each step ends when the GPU has finished),
    as torchtitan's anchor reads its loss back every step (``log_freq = 1``): both rows pay a host sync a step. The
    steps one by one tell a row slowed by a few stalls from one slow throughout. Held-out evaluations between
    batches are left out of the time, as torchtitan's tokens/s leaves its validation out."""

    def __init__(self, warmup: int):
        self.warmup = warmup
        self.batches = 0
        self.ends = []  # perf_counter at the end of the warm-up's last batch and of each timed batch, evaluations out
        self.evaluating = 0.0  # seconds spent in evaluations so far
        self.evaluation_start = None
        self.allocator_counts = []  # allocator_counts() at the warm-up's end and at the training's (fit_end)
        self.pools = []  # reserved_by_stream() at the training's end

    def batch_end(self, state: State, logger: Logger) -> None:
        self.batches += 1
        if self.batches < self.warmup:
            return
        if self.batches == self.warmup:
            self.allocator_counts = [allocator_counts()]  # read before the clock: outside the first step's time
        self.ends.append(synchronized_time() - self.evaluating)
        if self.batches == self.warmup and torch.cuda.is_available():
            torch.cuda.reset_peak_memory_stats()

    def fit_end(self, state: State, logger: Logger) -> None:
        self.allocator_counts.append(allocator_counts())
        self.pools = reserved_by_stream()

    def eval_start(self, state: State, logger: Logger) -> None:
        self.evaluation_start = synchronized_time()

    def eval_end(self, state: State, logger: Logger) -> None:
        self.evaluating += synchronized_time() - self.evaluation_start

    def each_step_seconds(self) -> list[float]:
        return [end - start for start, end in zip(self.ends, self.ends[1:])]

    def step_seconds(self) -> float:
        return (self.ends[-1] - self.ends[0]) / (len(self.ends) - 1)

    def allocator(self) -> dict[str, int]:
        """The allocator's counts over the timed steps and any evaluation among them (``profiling.ALLOCATOR_COUNTS``;
        none without a GPU)."""
        first, last = self.allocator_counts
        return {key: count - first[key] for key, count in last.items()}


def synchronized_time() -> float:
    """perf_counter once the GPU has finished what was queued."""
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return time.perf_counter()


class HeldOutRecorder(Callback):
    """After each held-out evaluation (``data.eval`` every ``eval_interval``): the batches trained and the mean token
    loss over the evaluated tokens (the model's ``LanguageCrossEntropy``, over the ranks)."""

    def __init__(self):
        self.evaluations = []

    def eval_end(self, state: State, logger: Logger) -> None:
        loss = state.eval_metric_values.get('LanguageCrossEntropy')
        if loss is not None:
            self.evaluations.append([int(state.timestamp.batch), float(loss)])


class LossRecorder(Callback):
    """Every batch's training loss (over its micro-batches, weighted by their samples, as Composer logs it; its
    ``state.loss`` at a batch's end is the last micro-batch's; over the ranks, as our Trainer logs it), and its
    gradients' norm before clipping where our ``GradientClipping`` clips inside the optimizer, kept on the device
    until the run ends (no host sync per step)."""

    def __init__(self):
        self.losses, self.grad_norms, self.micro_batches = [], [], []

    def after_loss(self, state: State, logger: Logger) -> None:
        loss = state.loss['total'] if isinstance(state.loss, dict) else state.loss
        self.micro_batches.append((loss.detach(), len(state.batch['input_ids'])))

    def batch_end(self, state: State, logger: Logger) -> None:
        samples = sum(count for _, count in self.micro_batches)
        self.losses.append(sum(loss * (count / samples) for loss, count in self.micro_batches))
        self.micro_batches.clear()
        clipping = next((a for a in state.algorithms if isinstance(a, GradientClipping)), None)
        if clipping is not None and clipping.last_norm is not None:
            self.grad_norms.append(clipping.last_norm.detach())

    def values(self) -> list[float]:
        """Each batch's loss, the mean over the ranks (each rank's is its own samples', under context parallelism
        its share of its group's: ``Trainer._train_batch``'s mean): one all-reduce, called on every rank."""
        if not self.losses:
            return []
        losses = torch.stack(self.losses).float()
        dist.all_reduce(losses)  # a no-op on one process
        return (losses / dist.get_world_size()).tolist()

    def norms(self) -> list[float]:
        """One a batch, or none where no norm was kept."""
        return torch.stack(self.grad_norms).float().tolist() if len(self.grad_norms) == len(self.losses) else []


class HFCausalLM(ComposerModel):
    """transformers' model of our architecture's family with sdpa attention, each decoder layer its own FSDP2 unit;
    the loss as transformers trains it (with a mixture of experts, + router_aux_loss_coef x its aux loss)."""

    def __init__(self, config, experts_implementation: str | None = None, weights: str | None = None):
        super().__init__()
        from transformers import AutoConfig, AutoModelForCausalLM

        hf = AutoConfig.for_model(**family_of(config).hf.hf_config(config, torch.float32))
        self.routed = hasattr(hf, 'num_local_experts')
        if self.routed:
            hf.output_router_logits = True
        self.model = (AutoModelForCausalLM.from_pretrained(weights, config=hf, attn_implementation='sdpa',
                                                           dtype=torch.float32) if weights  # init_from
                      else AutoModelForCausalLM.from_config(hf, attn_implementation='sdpa'))
        if experts_implementation and hasattr(self.model, 'set_experts_implementation'):  # transformers 5
            self.model.set_experts_implementation(experts_implementation)
        self.experts_implementation = getattr(hf, '_experts_implementation', None) or 'eager'  # 4: only eager
        decoder_layer = type(self.model.model.layers[0])
        self.model.fsdp_wrap_fn = lambda module: isinstance(module, decoder_layer)
        self.config = config

    def forward(self, batch: dict):
        return self.model(input_ids=batch['input_ids'])

    def loss(self, outputs, batch: dict) -> torch.Tensor:
        loss = token_mean_cross_entropy(outputs.logits, batch['labels'])
        return loss + self.config.router_aux_loss_coef * outputs.aux_loss if self.routed else loss

    def rank_flops(self, batch: dict) -> int:
        return batch_flops(self.config, batch)


HF_EXPERTS = {'hf': None, 'hf-loop': 'eager'}  # row model -> transformers' experts_implementation


def prepare(row: Row, folder: str, warmup: int, steps: int, mean_document_tokens: int) -> str:
    """The row's run YAML over random tokens in ``folder``, written once for all ranks (streaming refuses ranks
    of one node reading different folders); returns its path."""
    overrides = [*row.overrides, f'max_duration={warmup + steps}ba']
    return synthetic_run_yaml(row.source, overrides, folder, warmup + steps + 2, mean_document_tokens)


def measure(row: Row, yaml: str, warmup: int, steps: int, export: str | None = None) -> dict:
    """Train the prepared ``yaml`` (in this process group) and return the row's figures; with ``export``, the
    trained weights and the held-out batches for transformers to score (``export_for_transformers``)."""
    run = preflight.prepare(yaml)
    config = run.config
    timer, recorder, held_out = StepTimer(warmup), LossRecorder(), HeldOutRecorder()
    model = (HFCausalLM(run.architecture, HF_EXPERTS[row.model], config.model.init_from)
             if row.model in HF_EXPERTS else None)
    plan = run.plan.chosen
    named = {'name': row.name, 'source': row.source, 'overrides': row.overrides, 'model': row.model,
             'setting': dataclasses.asdict(plan.setting), 'predicted_peak_gib': plan.memory.peak / GIB,
             'predicted_fits': plan.fits, 'predicted_tokens_per_second_per_gpu': plan.tokens_per_second}
    try:
        trainer = train(run, extra_callbacks=[timer, recorder, held_out], model=model)
    except torch.OutOfMemoryError:
        return {**named, 'error': 'out of memory'}
    hf = {} if model is None else {'transformers': version('transformers'), 'experts': model.experts_implementation}
    if export:
        export_for_transformers(trainer, run, export)
    peak_flops = get_gpu_flops_available(trainer.state) if torch.cuda.is_available() else 0
    trainer.close()
    seconds = timer.step_seconds()
    tokens_per_gpu = config.tokens_per_step / dist.get_world_size() / seconds
    flops_per_token = run.architecture.flops_per_token(config.max_seq_len)
    on_gpu = torch.cuda.is_available()
    return {
        **named, 'gpus': dist.get_world_size(), 'device': torch.cuda.get_device_name() if on_gpu else 'cpu',
        'torch': torch.__version__, 'step_seconds': seconds, 'each_step_seconds': timer.each_step_seconds(),
        'tokens_per_second_per_gpu': tokens_per_gpu,
        'mfu': tokens_per_gpu * flops_per_token / peak_flops if peak_flops else None,
        'peak_allocated_gib': torch.cuda.max_memory_allocated() / GIB if on_gpu else None,
        'peak_reserved_gib': torch.cuda.max_memory_reserved() / GIB if on_gpu else None,
        'document_masking': config.data.document_masking, 'timed_steps': steps, 'losses': recorder.values(),
        'grad_norms': recorder.norms(), 'held_out': held_out.evaluations, 'tokens_per_step': config.tokens_per_step,
        'allocator': timer.allocator(), 'reserved_by_stream': timer.pools, **hf,
    }


def export_for_transformers(trainer, run, folder: str) -> None:
    """A one-process row's trained weights as an fp32 HF folder, and in it ``held_out.pt``: the batches its
    held-out evaluations read (input_ids and labels), for ``transformers_held_out_loss`` to score again."""
    if dist.get_world_size() != 1:
        raise ValueError('the transformers check exports a one-process row')
    weights = {name: tensor.detach().cpu() for name, tensor in trainer.state.model.model.state_dict().items()}
    save_hf(weights, run.architecture, folder, torch.float32)
    loader = trainer.state.evaluators[0].dataloader.dataloader
    batches = list(itertools.islice(loader, run.config.eval_subset_num_batches))
    torch.save({key: torch.cat([batch[key] for batch in batches]) for key in ('input_ids', 'labels')},
               os.path.join(folder, 'held_out.pt'))


def transformers_held_out_loss(folder: str, device: str) -> float:
    """transformers' AutoModelForCausalLM on an ``export_for_transformers`` folder (fp32, sdpa): the mean token
    loss over its held-out batches, a sample at a time; the evaluator's check, by other code on the same weights."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation='sdpa')
    model.to(device).eval()
    saved = torch.load(os.path.join(folder, 'held_out.pt'))
    total, tokens = 0.0, 0
    with torch.no_grad():
        for input_ids, labels in zip(saved['input_ids'].split(1), saved['labels'].split(1)):
            counted = int((labels != -100).sum())
            loss = token_mean_cross_entropy(model(input_ids=input_ids.to(device)).logits, labels.to(device))
            total, tokens = total + loss.item() * counted, tokens + counted
    return total / tokens


def run_row(script: str, row: Row, gpus: int, warmup: int, steps: int, folder: str, prepare_yaml,
            export: str | None = None) -> dict:
    """One row in its own processes: its figures, or the error it ended with. ``prepare_yaml(row, folder)`` writes
    an ours or hf row's run YAML into ``folder`` and returns its path; ``script`` is scripts/measure_speed.py (its
    ``--worker`` mode trains the row). The GPUs' clocks and power while it trains join its figures (``gpu_clocks``).
    ``export``: an ours row's trained weights and held-out batches go there (``export_for_transformers``)."""
    os.makedirs(folder)
    with GpuSampler() as sampler:
        if row.model == 'torchtitan':
            result = run_torchtitan(row, gpus, warmup, steps, folder)
        else:
            result = run_ours(script, row, gpus, warmup, steps, folder, prepare_yaml, export)
    return result if 'error' in result else result | sampler.summary()


def run_ours(script: str, row: Row, gpus: int, warmup: int, steps: int, folder: str, prepare_yaml,
             export: str | None = None) -> dict:
    """An ours or hf row under ``composer -n GPUS``: rank 0's figures, or the exit status."""
    out = os.path.join(folder, 'result.json')
    command = [*LAUNCHER, '-n', str(gpus), script, '--worker',
               row.text(), '--worker-yaml', prepare_yaml(row, folder),
               '--warmup', str(warmup), '--steps', str(steps), '--json', out, *(['--export', export] if export else [])]
    print(f'--- {row.name}: {shlex.join(command[len(LAUNCHER):])}', flush=True)
    result = subprocess.run(command, env={**os.environ, 'PYTHONUNBUFFERED': '1'})
    if result.returncode != 0 or not os.path.isfile(out):
        return {'name': row.name, 'model': row.model, 'error': f'exit status {result.returncode}'}
    with open(out) as file:
        return json.load(file)


# bash ../shared/anchors/prepare.sh puts torchtitan and its script into the checkout's .anchors/
TORCHTITAN_SCRIPT = os.path.join(REPO, '.anchors', 'run.sh')


def run_torchtitan(row: Row, gpus: int, warmup: int, steps: int, folder: str) -> dict:
    """torchtitan's own trainer through the anchor script, ``warmup + steps`` steps; tokens/s over the timed steps
    as ours are counted (total tokens over total time: the harmonic mean of its per-step figures). ``INIT_HF=FOLDER``
    among the row's settings: it starts from those HF weights (``torchtitan_loading``) instead of its own init;
    ``HELD_OUT=FOLDER EVAL_EVERY=N EVAL_BATCHES=K``: it evaluates FOLDER's documents (``torchtitan_validating``)."""
    env = {**os.environ, 'NGPU': str(gpus), 'STEPS': str(warmup + steps), 'OUT': folder,
           **dict(item.split('=', 1) for item in row.overrides)}
    print(f"--- {row.name}: bash {TORCHTITAN_SCRIPT} {row.source} ({' '.join(row.overrides)})", flush=True)
    with open(TORCHTITAN_SCRIPT) as file:
        script = file.read()
    if env.get('INIT_HF'):
        script = torchtitan_loading(script, env['INIT_HF'])
    if env.get('HELD_OUT'):
        script = torchtitan_validating(script, env['HELD_OUT'], int(env['EVAL_EVERY']), int(env['EVAL_BATCHES']))
    result = subprocess.run(['bash', '-c', script, TORCHTITAN_SCRIPT, row.source], env=env)  # $0: the script's path
    summary_path = os.path.join(folder, 'tt_summary.json')
    if result.returncode != 0 or not os.path.isfile(summary_path):
        return {'name': row.name, 'model': row.model, 'error': f'exit status {result.returncode}'}
    with open(summary_path) as file:
        steps_logged = json.load(file)[row.source]['rows']
    timed = [step for step in steps_logged if step['step'] > warmup]
    if len(timed) < steps:
        return {'name': row.name, 'model': row.model, 'error': f'{len(steps_logged)} of {warmup + steps} steps logged'}
    tokens_per_gpu = statistics.harmonic_mean(step['tps'] for step in timed)
    return {
        'name': row.name, 'source': row.source, 'overrides': row.overrides, 'model': row.model, 'gpus': gpus,
        'tokens_per_second_per_gpu': tokens_per_gpu, 'mfu': statistics.mean(step['mfu'] for step in timed) / 100,
        'step_seconds': None, 'peak_allocated_gib': None,
        'peak_reserved_gib': max(step['mem_gib'] for step in timed), 'timed_steps': steps,
        'losses': [step['loss'] for step in steps_logged],
        'grad_norms': torchtitan_grad_norms(os.path.join(folder, f'tt_{row.source}.log')),
        'held_out': torchtitan_held_out(os.path.join(folder, f'tt_{row.source}.log')),
        'tokens_per_step': int(env.get('LBS', 1)) * int(env.get('SEQ', 8192)) * gpus,  # .anchors/run.sh's defaults
    }


TORCHTITAN_STEP = re.compile(r'step:\s*(\d+)\s+loss:\s*[\d.]+\s+grad_norm:\s*([\d.]+)')


def torchtitan_grad_norms(log: str) -> list[float]:
    """torchtitan's gradient norm at each step, from its log lines ("step: 1  loss: 12.30882  grad_norm: 27.0577
    memory: ..."; ``.anchors/run.sh``'s summary keeps losses only)."""
    with open(log) as file:
        logged = {int(m[1]): float(m[2]) for m in TORCHTITAN_STEP.finditer(file.read())}
    return [logged[step] for step in sorted(logged)]


TORCHTITAN_VALIDATION = re.compile(r'validate step:\s*(\d+)\s+loss:\s*([\d.]+)')


def torchtitan_held_out(log: str) -> list[list]:
    """[step, loss] of each of torchtitan's validations, from its log lines ("validate step: 100  loss:  2.1234
    memory: ..."); none where it did not validate."""
    with open(log) as file:
        return [[int(m[1]), float(m[2])] for m in TORCHTITAN_VALIDATION.finditer(file.read())]


TORCHTITAN_TRAIN = '-m torchtitan.train'
SAME_HELD_OUT = os.path.join(REPO, 'llmfoundry_ext', 'measure', 'torchtitan_validation.py')


def torchtitan_validating(script: str, held_out: str, every: int, batches: int) -> str:
    """The anchor script with its (disabled) validation section made to evaluate the documents of ``held_out`` (a
    folder of one JSON-lines file, packed as its training data is) at step 1 and every ``every`` steps: ``batches``
    batches of the training's local batch and sequence length (torchtitan's Validator: the mean of each batch's
    token-mean loss; its tokens/s leaves the validation out), the same batches every time (its trainer started
    through ``torchtitan_validation.py``)."""
    section = (f'[validation]\nenable = true\ndataset = "c4_test"\ndataset_path = "{held_out}"\nfreq = {every}\n'
               f'steps = {batches}\nlocal_batch_size = $LBS\nseq_len = $SEQ\n')
    return anchor_replaced(script, {'[validation]\nenable = false\n': section, TORCHTITAN_TRAIN: SAME_HELD_OUT})


def torchtitan_loading(script: str, hf_folder: str) -> str:
    """The anchor script with its (disabled) checkpoint section made to load ``hf_folder``'s safetensors as the
    initial model through torchtitan's own HF state-dict adapter, and to save nothing (the script has no option)."""
    return anchor_replaced(script, {'[checkpoint]\nenable = false\n': f'[checkpoint]\nenable = true\nload_only = true\n'
                                    f'initial_load_path = "{hf_folder}"\ninitial_load_in_hf = true\n'})


def anchor_replaced(script: str, replacements: dict[str, str]) -> str:
    """The anchor script with each text of ``replacements`` replaced, or the one line naming a text it lacks (an
    anchor script of another version)."""
    for text, replacement in replacements.items():
        if text not in script:
            raise ValueError(f'{TORCHTITAN_SCRIPT}: no "{text!r}" to replace; re-run bash ../shared/anchors/prepare.sh')
        script = script.replace(text, replacement)
    return script


def format_table(results: list[dict], baseline: str | None) -> str:
    """One line per row; ``vs base`` is tokens/s relative to the baseline row."""
    base = next((r for r in results if r['name'] == baseline and 'error' not in r), None)
    lines = [f"{'run':<26}{'model':<11}{'tok/s/GPU':>10}{'MFU':>7}{'step s':>8}{'alloc GiB':>10}{'resv GiB':>9}"
             f"{'vs base':>8}{'predicted: GiB':>15}{'tok/s':>8}"]
    for r in results:
        if 'error' in r:
            lines.append(f"{r['name']:<26}{r['model']:<11}failed: {r['error']}{predictions(r)}")
            continue
        ratio = f"{r['tokens_per_second_per_gpu'] / base['tokens_per_second_per_gpu']:.2f}x" if base else '-'
        lines.append(f"{r['name']:<26}{r['model']:<11}{r['tokens_per_second_per_gpu']:>10,.0f}"
                     f"{optional(r['mfu'], '{:.1%}'):>7}{optional(r['step_seconds'], '{:.3f}'):>8}"
                     f"{optional(r['peak_allocated_gib'], '{:.1f}'):>10}{optional(r['peak_reserved_gib'], '{:.1f}'):>9}"
                     f"{ratio:>8}{predictions(r)}{allocator_note(r)}")
    return '\n'.join(lines)


def allocator_note(row: dict) -> str:
    """The allocator's frees and retries in the timed steps, where it made any (a steady run makes none), and then
    the GiB each stream's pool reserved (allocated) at the end, where a side stream reserved 1 GiB or more."""
    counts = row.get('allocator') or {}
    frees, retries = counts.get('num_device_free', 0), counts.get('num_alloc_retries', 0)
    note = f'  allocator: {frees} cudaFree, {retries} retries' if frees or retries else ''
    pools = row.get('reserved_by_stream') or []
    if any(stream != 0 and reserved >= GIB for stream, reserved, _ in pools):
        note += '  pools: ' + ', '.join(f'{"default" if stream == 0 else f"stream {stream}"} '
                                        f'{reserved / GIB:.1f} ({allocated / GIB:.1f})'
                                        for stream, reserved, allocated in pools if reserved >= GIB)
    return note


def predictions(row: dict) -> str:
    """The run plan's predicted peak allocated GiB (and whether it fits) and tokens/s a GPU, for our rows."""
    if 'predicted_peak_gib' not in row:
        return ''
    fits = {True: '', False: ' (no fit)', None: ''}[row['predicted_fits']]
    return f"{row['predicted_peak_gib']:>15.1f}{row['predicted_tokens_per_second_per_gpu']:>8,.0f}{fits}"


def optional(value, form: str) -> str:
    return '-' if value is None else form.format(value)


def comparisons(results: list[dict], pairs: list[str]) -> list[dict]:
    """'OURS:THEIRS' row-name pairs -> {ours, theirs, ratio} of their tokens/s per GPU (None if either failed)."""
    by_name = {r['name']: r for r in results}
    compared = []
    for pair in pairs:
        names = pair.split(':')
        ours, theirs = (by_name.get(name, {'error': 'no such row'}) for name in names)
        ratio = None
        if 'error' not in ours and 'error' not in theirs:
            ratio = ours['tokens_per_second_per_gpu'] / theirs['tokens_per_second_per_gpu']
        compared.append({'ours': names[0], 'theirs': names[1], 'ratio': ratio})
    return compared


def format_comparisons(compared: list[dict]) -> str:
    return '\n'.join(f"{c['ours']:<26} / {c['theirs']:<26} {optional(c['ratio'], '{:.3f}x'):>8}" for c in compared)


SCRIPT = os.path.join(REPO, 'scripts', 'measure_speed.py')  # each row runs it again, under composer -n GPUS (--worker)


def run_rows(args) -> int:
    """``scripts/measure_speed.py``'s arguments -> each row in its own process, the table, the ratios, JSON; 1 if a row
    failed."""
    rows = [Row.parse(text) for text in args.row]
    synthetic = functools.partial(prepare, warmup=args.warmup, steps=args.steps,
                                  mean_document_tokens=args.mean_document_tokens)
    results = []
    with tempfile.TemporaryDirectory() as folder:
        for i, row in enumerate(rows):
            results.append(run_row(SCRIPT, row, args.gpus, args.warmup, args.steps,
                                   os.path.join(folder, str(i)), synthetic))
            print('=== ' + format_table(results[-1:], None).splitlines()[1], flush=True)
    compared = comparisons(results, args.versus)
    first = next((r for r in results if 'device' in r), None)
    if first:
        print(f"\n{first['gpus']} x {first['device']}, torch {first['torch']}; tokens/s over {args.steps} steps after "
              f"{args.warmup} warm-up; documents of {args.mean_document_tokens} tokens on average")
    print(format_table(results, args.baseline or rows[0].name))
    if compared:
        print(format_comparisons(compared))
    if clocks := format_clocks(results):
        print(f'GPUs while busy (nvidia-smi, utilization >= 90 %): median SM clock and power\n{clocks}')
    if args.json:
        with open(args.json, 'w') as file:
            json.dump({'rows': results, 'versus': compared, 'warmup': args.warmup, 'steps': args.steps,
                       'mean_document_tokens': args.mean_document_tokens}, file, indent=2)
    return 0 if all('error' not in r for r in results) else 1


def work(args) -> int:
    """One row inside ``composer -n GPUS`` (``--worker``): rank 0 writes its figures to ``args.json``."""
    result = measure(Row.parse(args.worker), args.worker_yaml, args.warmup, args.steps, args.export)
    if dist.get_global_rank() == 0:
        with open(args.json, 'w') as file:
            json.dump(result, file)
    return 0
