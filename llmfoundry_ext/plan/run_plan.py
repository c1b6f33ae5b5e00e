"""The run plan: the settings a run trains with on its machine, settled once (``settle``) from the config and the
machine, with what they are predicted to cost. Every key set to ``auto`` (``device_microbatch_size``,
``parallelism.fsdp.activation_checkpointing``, ``.reshard_after_forward``, ``.replicate_degree``, ``model.float8``)
becomes the fastest setting predicted to fit the GPU's memory; an explicit setting is obeyed, and one predicted not
to fit is refused before any process group or GPU memory exists, naming a setting that fits (``fit_check: false``
trains it all the same).

A setting fits when its predicted peak (``memory.estimate``: torch's peak allocated) plus ``FIT_MARGIN`` of it,
plus ``FIT_RESERVE`` for what lies outside torch's allocator (CUDA context, cuBLAS workspaces, NCCL buffers), is at
most the GPU's memory. Speed is ``speed.tokens_per_second``. Without a GPU (training on the CPU) nothing is refused
and ``auto`` is chosen by the speed an H100 would have.
"""
import dataclasses
import itertools
from dataclasses import dataclass
from typing import Optional

from llmfoundry_ext.config import TrainConfig
from llmfoundry_ext.errors import ConfigError
from llmfoundry_ext.machine import GIB, GPUS, Machine
from llmfoundry_ext.plan import memory, speed
from llmfoundry_ext.plan.memory import Layout, MemoryEstimate, Setting

FIT_MARGIN = 0.05
FIT_RESERVE = 2 * GIB
CHECKPOINTING_CHOICES = ('none', 'selective', 'full')
# The families auto may train in float8, decided by issue 66's grid (`measure_learning.py --decide` over its runs):
# a recipe must hold bf16's held-out loss within 0.5 % in every cell (2 corpora x 2 learning rates). float8 on the
# blocks ended 2.3 % above bf16 on Python source at lr 3e-4 (the shipped tied 1B, step 400), so auto takes bf16 for
# every family; `model.float8: true` trains in float8 at that cost. PRECISION_REPORT is the report it rests on.
FLOAT8_FAMILIES = ()
PRECISION_REPORT = 'benchmarks/time-to-quality_h200_2026-11-29.md'
KEYS = {'micro_batch': 'device_microbatch_size', 'checkpointing': 'parallelism.fsdp.activation_checkpointing',
        'reshard_after_forward': 'parallelism.fsdp.reshard_after_forward', 'float8': 'model.float8'}


@dataclass(frozen=True)
class Candidate:
    """One setting and its predictions: peak memory a GPU, tokens/s a GPU (an H100's without a GPU), whether it
    fits (None without a GPU)."""
    setting: Setting
    memory: MemoryEstimate
    tokens_per_second: float
    fits: Optional[bool]


@dataclass(frozen=True)
class RunPlan:
    config: TrainConfig          # the run's config, every ``auto`` resolved
    machine: Machine
    shards_the_model: bool       # FSDP2 (or HSDP) over the ranks (``shards_the_model``)
    shard_ranks: int             # the ranks a parameter is sharded over (1: unsharded)
    init_device: str             # where the model is built (``init_device``)
    chosen: Candidate
    candidates: tuple            # every setting weighed (only the chosen one when nothing is auto)
    auto_keys: tuple             # the YAML keys that were ``auto``

    @property
    def sharded_checkpoints(self) -> bool:
        """Composer writes a folder of shards under FSDP2 with ``state_dict_type: sharded``, else one file."""
        return self.shards_the_model and self.config.parallelism.fsdp.state_dict_type == 'sharded'

    @property
    def flops_per_token(self) -> int:
        return self.config.model.architecture().flops_per_token(self.config.max_seq_len)

    def mfu(self, tokens_per_second: float) -> float:
        return tokens_per_second * self.flops_per_token / self.machine.gpu.bf16_flops

    def total_tokens(self) -> Optional[int]:
        """The tokens to ``max_duration`` (None for a duration in epochs, which depends on the data)."""
        return duration_tokens(self.config.max_duration, self.config)

    def seconds_for(self, tokens: int, candidate: Optional['Candidate'] = None) -> float:
        """Seconds to train ``tokens`` on the machine at the chosen setting's speed (or ``candidate``'s)."""
        return tokens / ((candidate or self.chosen).tokens_per_second * self.machine.world_size)

    def summary(self) -> list[str]:
        """The start summary's lines: the settings (which were auto) and the predictions."""
        setting, auto = self.chosen.setting, set(self.auto_keys)
        marks = {field: ' (auto)' if key in auto else '' for field, key in KEYS.items()}
        if marks['float8']:
            marks['float8'] = f' (auto; held-out loss: {PRECISION_REPORT})'
        lines = [f'  plan: micro-batch {setting.micro_batch}{marks["micro_batch"]}, activation checkpointing '
                 f'{setting.checkpointing}{marks["checkpointing"]}, reshard after forward '
                 f'{text(setting.reshard_after_forward)}{marks["reshard_after_forward"]}, float8 '
                 f'{text(setting.float8)}{marks["float8"]}']
        gpu = self.machine.gpu
        if gpu is not None:
            line = (f'  predicted: peak {gib(self.chosen.memory.peak)} GiB allocated a GPU of {gib(gpu.memory_bytes)} '
                    f'({gpu.name}), {self.chosen.tokens_per_second:,.0f} tokens/s a GPU '
                    f'(MFU {self.mfu(self.chosen.tokens_per_second):.0%})')
            tokens = self.total_tokens()
            if tokens:
                line += f', {format_duration(self.seconds_for(tokens))} to {self.config.max_duration}'
            lines.append(line)
        return lines


def gib(size: float) -> str:
    return f'{size / GIB:.1f}'


def format_duration(seconds: float) -> str:
    hours = seconds / 3600
    return f'{hours * 60:.0f} min' if hours < 1 else f'{hours:.1f} h' if hours < 48 else f'{hours / 24:.1f} days'


def duration_tokens(duration: str, config: TrainConfig) -> Optional[int]:
    from composer.core import Time, TimeUnit  # here alone: the plan needs Composer only to read a duration
    time = Time.from_timestring(duration)
    per_unit = {TimeUnit.BATCH: config.tokens_per_step, TimeUnit.TOKEN: 1, TimeUnit.SAMPLE: config.max_seq_len}
    return int(time.value) * per_unit[time.unit] if time.unit in per_unit else None


def usable_bytes(gpu) -> int:
    """The predicted peak a GPU can hold (the margins in the module docstring)."""
    return int((gpu.memory_bytes - FIT_RESERVE) / (1 + FIT_MARGIN))


def settle(config: TrainConfig, machine: Machine, float8_available: bool) -> RunPlan:
    """The plan for ``config`` on ``machine``. ``float8_available``: float8 can run there (the GPU has it, torchao is
    installed). A ConfigError when an explicit setting, or every ``auto`` choice, is predicted not to fit."""
    fsdp = config.parallelism.fsdp
    auto_keys = tuple(key for field, key in KEYS.items() if value_of(config, key) == 'auto')
    replicate_auto = fsdp is not None and fsdp.replicate_degree == 'auto'
    choices = setting_choices(config, machine, float8_available)
    if replicate_auto:
        replicas = machine.nodes if machine.nodes > 1 and fits_any(config, machine, choices, machine.nodes) else 1
        auto_keys += ('parallelism.fsdp.replicate_degree',)
    else:
        replicas = fsdp.replicate_degree if fsdp is not None else 1
    candidates = weigh(config, machine, choices, replicas)
    chosen = choose(config, machine, candidates, auto_keys, replicas)
    resolved = resolve(config, chosen.setting, replicas)
    shards = shards_the_model(config, machine)
    return RunPlan(resolved, machine, shards, shard_ranks(config, machine, replicas),
                   init_device(resolved, machine, shards), chosen, tuple(candidates), auto_keys)


def shards_the_model(config: TrainConfig, machine: Machine) -> bool:
    """FSDP2 (or HSDP) over the ranks: ``parallelism.fsdp`` set and more than one process. One process trains a plain
    module under autocast, as torchtitan does on one GPU: FSDP2 over one rank only copies the parameters in and the
    gradients out each step, and keeps the residual stream in bf16 (its parameter dtype) where autocast keeps it in
    fp32. Its checkpoints are one file; autoresume converts between the two formats (``resumption``)."""
    return config.parallelism.fsdp is not None and machine.world_size > 1


def init_device(config: TrainConfig, machine: Machine, shards: bool) -> str:
    """``model.init_device``; auto: ``meta`` under FSDP2 on GPUs (each rank materialises its shards), but rank 0
    builds on the CPU to load ``init_from`` (Composer then broadcasts its weights to the other ranks' shards); the
    GPU itself for one process; ``cpu`` otherwise. Under expert parallelism ``meta`` too (the experts split while on
    meta, each rank's share drawn on its GPU: ``parallelism.shard_experts``), but ``cpu`` on every rank to load
    ``init_from``, whose experts are split from whole weights."""
    if config.model.init_device != 'auto':
        return config.model.init_device
    if machine.gpu is None:
        return 'cpu'
    if config.parallelism.expert_parallel_degree > 1:
        return 'cpu' if config.model.init_from else 'meta'
    if not shards:
        return 'cuda' if machine.world_size == 1 else 'cpu'
    return 'cpu' if config.model.init_from and machine.rank == 0 else 'meta'


def value_of(config: TrainConfig, key: str):
    value = config
    for part in key.split('.'):
        if value is None:
            return None
        value = getattr(value, part)
    return value


def setting_choices(config: TrainConfig, machine: Machine, float8_available: bool) -> list[Setting]:
    """Every setting to weigh: each ``auto`` key over its choices, the others as set."""
    fsdp = config.parallelism.fsdp
    device_batch = config.device_batch_size
    micro = config.device_microbatch_size
    micro_batches = ([size for size in range(1, device_batch + 1) if device_batch % size == 0] if micro == 'auto'
                     else [micro or device_batch])
    mode = fsdp.activation_checkpointing if fsdp is not None else 'none'
    modes = CHECKPOINTING_CHOICES if mode == 'auto' else (mode,)
    reshard = fsdp.reshard_after_forward if fsdp is not None else False
    if not shards_the_model(config, machine):
        reshards = (False,)  # nothing is sharded, so nothing is gathered again: the plan records false
    else:
        reshards = (False, True) if reshard == 'auto' else (reshard,)
    float8 = config.model.float8
    tokens = config.max_seq_len // config.parallelism.context_parallel_degree  # float8 GEMMs: a multiple of 16
    proven = float8_available and config.model.family in FLOAT8_FAMILIES and tokens % 16 == 0
    float8s = ((False, True) if proven else (False,)) if float8 == 'auto' else (float8,)
    return [Setting(*values) for values in itertools.product(micro_batches, modes, reshards, float8s)]


def shard_ranks(config: TrainConfig, machine: Machine, replicas: int) -> int:
    return machine.world_size // replicas if config.parallelism.fsdp is not None else 1


def layout(config: TrainConfig, machine: Machine, replicas: int, setting: Setting) -> Layout:
    fsdp, model = config.parallelism.fsdp, config.model
    micro_batches = config.device_batch_size // setting.micro_batch
    loss = 'fused' if model.fused_loss else 'compiled' if model.compile else 'eager'
    ranks = shard_ranks(config, machine, replicas)
    return Layout(seq_len=config.max_seq_len // config.parallelism.context_parallel_degree, shard_ranks=ranks,
                  sharded=shards_the_model(config, machine), accumulating=micro_batches > 1, loss=loss,
                  float8_output=model.output_layer_in_float8(setting.float8),
                  checkpoint_every=fsdp.checkpoint_every if fsdp is not None else 1,
                  expert_parallel=config.parallelism.expert_parallel_degree)


def weigh(config: TrainConfig, machine: Machine, choices: list[Setting], replicas: int) -> list[Candidate]:
    architecture = config.model.architecture()
    candidates = []
    for setting in choices:
        shape = layout(config, machine, replicas, setting)
        estimate = memory.estimate(architecture, setting, shape)
        tokens_per_second = speed.tokens_per_second(
            architecture, setting, config.max_seq_len, setting.micro_batch * shape.seq_len,
            config.device_batch_size * shape.seq_len, shape.shard_ranks, shape.sharded, machine.gpu or GPUS['h100'],
            shape.checkpoint_every, shape.float8_output)
        fits = None if machine.gpu is None else estimate.peak <= usable_bytes(machine.gpu)
        candidates.append(Candidate(setting, estimate, tokens_per_second, fits))
    return candidates


def fits_any(config: TrainConfig, machine: Machine, choices: list[Setting], replicas: int) -> bool:
    return any(candidate.fits is not False for candidate in weigh(config, machine, choices, replicas))


def ranked(candidates: list[Candidate]) -> list[Candidate]:
    """Fastest first, then the least memory."""
    return sorted(candidates, key=lambda c: (-c.tokens_per_second, c.memory.peak))


def choose(config: TrainConfig, machine: Machine, candidates: list[Candidate], auto_keys: tuple,
           replicas: int) -> Candidate:
    fitting = [candidate for candidate in candidates if candidate.fits is not False or not config.fit_check]
    if fitting:
        return ranked(fitting)[0]
    smallest = min(candidates, key=lambda c: c.memory.peak)
    raise ConfigError(refusal(config, machine, smallest, bool(auto_keys), replicas))


def refusal(config: TrainConfig, machine: Machine, smallest: Candidate, some_auto: bool, replicas: int) -> str:
    """One line for settings predicted not to fit (the explicit one, or the smallest that ``auto`` may take): the
    keys to change to the fastest setting that fits, if any does, keeping an explicit ``model.float8``."""
    gpu = machine.gpu
    subject = (f'the smallest setting auto may take here ({describe(smallest.setting)})' if some_auto
               else describe(smallest.setting))
    needs = (f'{subject} is predicted to need {gib(smallest.memory.peak)} GiB a GPU, more than the '
             f'{gib(usable_bytes(gpu))} GiB that fits {gpu.name} ({gib(gpu.memory_bytes)} GiB, less '
             f'{FIT_MARGIN:.0%} and {gib(FIT_RESERVE)} GiB outside the allocator)')
    everything = every_key_auto(config)
    if config.model.float8 != 'auto':
        everything = dataclasses.replace(everything, model=config.model)
    choices = setting_choices(everything, machine, gpu.has_float8)
    alternatives = [candidate for candidate in weigh(everything, machine, choices, replicas) if candidate.fits]
    best = ranked(alternatives)[0] if alternatives else None
    changes = [f'{KEYS[field]}={text(getattr(best.setting, field))}' for field in KEYS
               if best and getattr(best.setting, field) != getattr(smallest.setting, field)
               and value_of(config, KEYS[field]) != 'auto']
    if not changes:
        return (f'device_microbatch_size: {needs}, and no setting fits; use more GPUs, '
                f'parallelism.context_parallel_degree, or a shorter max_seq_len')
    return (f'{changes[0].split("=")[0]}: {needs}; set {" ".join(changes)} (predicted {gib(best.memory.peak)} GiB, '
            f'{best.tokens_per_second:,.0f} tokens/s a GPU), or auto')


def every_key_auto(config: TrainConfig) -> TrainConfig:
    """``config`` with every setting key ``auto``: the alternatives a refusal names, ``scripts/plan.py``'s rows."""
    fsdp = config.parallelism.fsdp
    if fsdp is not None:
        fsdp = dataclasses.replace(fsdp, activation_checkpointing='auto', reshard_after_forward='auto')
    return dataclasses.replace(config, device_microbatch_size='auto',
                               model=dataclasses.replace(config.model, float8='auto'),
                               parallelism=dataclasses.replace(config.parallelism, fsdp=fsdp))


def text(value) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def describe(setting: Setting) -> str:
    return (f'micro-batch {setting.micro_batch}, checkpointing {setting.checkpointing}, reshard '
            f'{text(setting.reshard_after_forward)}, float8 {text(setting.float8)}')


def resolve(config: TrainConfig, setting: Setting, replicas: int) -> TrainConfig:
    """``config`` with every ``auto`` replaced by the chosen setting (explicit values are already it)."""
    fsdp = config.parallelism.fsdp
    if fsdp is not None:
        fsdp = dataclasses.replace(fsdp, activation_checkpointing=setting.checkpointing,
                                   reshard_after_forward=setting.reshard_after_forward, replicate_degree=replicas)
    micro = config.device_microbatch_size
    return dataclasses.replace(
        config, device_microbatch_size=setting.micro_batch if micro == 'auto' else micro,
        model=dataclasses.replace(config.model, float8=setting.float8),
        parallelism=dataclasses.replace(config.parallelism, fsdp=fsdp))
