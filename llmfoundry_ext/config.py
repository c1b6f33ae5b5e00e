"""Typed run configuration: YAML + ``key=value`` overrides -> a ``TrainConfig`` whose values are checked against
each other. Checks against the machine (files, packages, GPUs, tokenizer) are ``preflight``'s.

Every error a user can make in a YAML file is raised as ``ConfigError`` with one line that names the key
(``data.train.streams.code.local``) and, for unknown keys, the nearest valid one.
"""
import dataclasses
import difflib
import functools
import os
import types
import typing
from dataclasses import dataclass, field
from typing import Any, Literal, Optional

import yaml
from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from llmfoundry_ext.bounds import (AllOrPositiveInt, Bounds, NonNegativeInt, PositiveFloat, PositiveInt,
                                   SeedInt)
from llmfoundry_ext.errors import CheckpointError, ConfigError
from llmfoundry_ext.machine import world_size
from llmfoundry_ext.model.families import FAMILIES, Family
from llmfoundry_ext.model.kernels import KernelConfig
from llmfoundry_ext.model.llama import weight_fields
from llmfoundry_ext.model.mixtral import MixtralConfig
from llmfoundry_ext.weights import family_of, read_weights_config

Auto = Literal['auto']  # a key that also takes 'auto': the run plan chooses (plan/run_plan.py)


FLOAT8_RECIPES = ('tensorwise', 'rowwise')  # torchao's Float8LinearRecipeName values we offer
AC_MODES = ('none', 'full', 'selective', 'full_except_attention')  # and auto (the plan's choice among the first three)
# The optimizer and the schedule when a YAML names none. A YAML that names one replaces the dict, but keeps these
# arguments where its component takes them and it sets none (registry.with_default_arguments).
OPTIMIZER_DEFAULT = {'name': 'decoupled_adamw', 'lr': 3e-4}
SCHEDULER_DEFAULT = {'name': 'cosine_with_warmup', 't_warmup': '100ba'}


@dataclass(frozen=True)
class ModelConfig(KernelConfig):
    """What to build and how: the family, its preset, the kernels, where the weights start. A run's model config is
    ``model_config_class(family)``: this plus the family's architecture fields, each a ``model.`` key in the YAML
    (from the preset unless set)."""
    family: str = 'llama'            # llama or mixtral (model/families.py)
    preset: str = 'debug'            # the architecture's defaults: 1b, 8b, 70b, mixtral-8x7b, debug, ...
    init_device: Literal['auto', 'meta', 'cpu', 'cuda'] = 'auto'  # auto: meta under FSDP2 on GPUs (cpu to load init_from under expert parallelism), else cpu
    init_from: Optional[str] = None  # HF Llama/Mixtral folder or from-hf output to start from
    init_skip: list[str] = field(default_factory=list)  # e.g. [embed_tokens, lm_head] for a new vocabulary
    compile: bool = False            # torch.compile each transformer block (fuses norms, RoPE, SwiGLU) and the loss
    float8: bool | Auto = False      # torchao float8 training for the blocks' linears (H100 and newer); auto: where
    #                                  the GPU has float8, the held-out loss grid let the family through (none yet:
    #                                  +2.3 % on Python source) and the plan predicts it faster
    float8_recipe: Literal[FLOAT8_RECIPES] = 'tensorwise'  # torchao's: tensorwise (one scale a tensor; fp8 all-gather) or rowwise
    float8_output: bool = False      # with float8 and compile: the output layer's GEMMs in float8 too (faster; held-out
    #                                  loss +3.3 % on the tied 1B: benchmarks/time-to-quality_h200_2026-11-29.md);
    #                                  not with fused_kernels [cross_entropy]
    float8_experts: bool = False     # with float8, a mixture of experts: the experts' grouped GEMMs in float8 too
    #                                  (torchao's rowwise float8 grouped GEMM; held-out loss not measured yet)

    @property
    def float8_output_layer(self) -> bool:
        """The output layer's training GEMMs run in float8 (``parallelism.compiled_float8_matmul``)."""
        return self.output_layer_in_float8(self.float8 is True)

    def output_layer_in_float8(self, float8: bool) -> bool:
        """Whether the output layer's GEMMs run in float8 where the blocks' do (``float8``): the run plan asks it of
        each setting it weighs, before ``model.float8: auto`` is settled."""
        return float8 and self.float8_output  # with compile and the compiled loss (check_float8_output)

    @property
    def experts_in_float8(self) -> bool:
        """The experts' grouped GEMMs run in float8 (``parallelism.convert_experts_to_float8``)."""
        return self.float8 is True and self.float8_experts

    def family_entry(self) -> Family:
        return FAMILIES[self.family]

    def architecture(self):
        """The family's architecture config (what the weights are)."""
        config_class = self.family_entry().config
        return config_class(**{spec.name: getattr(self, spec.name) for spec in dataclasses.fields(config_class)})


@functools.cache
def model_config_class(family: str) -> type:
    """ModelConfig with the family's architecture fields (``LlamaModelConfig``, ``MixtralModelConfig``)."""
    architecture = family_named(family).config
    name = architecture.__name__.replace('Config', 'ModelConfig')
    return dataclass(frozen=True)(type(name, (architecture, ModelConfig), {'__doc__': ModelConfig.__doc__}))


@dataclass
class StreamConfig:
    """One MDS folder of a data mixture (streaming's ``Stream``)."""
    local: str                      # the MDS folder on this machine (a convert_to_mds.py --out split)
    remote: Optional[str] = None    # where streaming downloads shards from into local (s3://, gs://, a path)
    proportion: Optional[PositiveFloat] = None  # the stream's share of each epoch's samples (streaming's proportion)
    repeat: Optional[PositiveFloat] = None  # or: each of its samples this many times an epoch
    choose: Optional[PositiveInt] = None  # or: this many of its samples an epoch


@dataclass
class LoaderConfig:
    """A StreamingDataset over streams, read by a StreamingDataLoader."""
    streams: dict[str, StreamConfig]  # name -> one MDS folder of the mixture
    shuffle: bool = True              # shuffle the samples (a fixed order from shuffle_seed; resumption keeps it)
    shuffle_seed: SeedInt = 9176      # the sample order's seed (not the run's seed: data order stays when seed changes)
    shuffle_algo: Literal['py1e', 'py1br', 'py1s', 'py2s', 'naive'] = 'py1e'  # streaming's shuffle algorithm
    num_canonical_nodes: Optional[PositiveInt] = None  # streaming's; fixed, the sample order survives a change in node count
    epoch_size: Optional[PositiveInt] = None  # samples per epoch (default: all samples of the streams, once)
    num_workers: NonNegativeInt = 0   # loader worker processes a rank
    prefetch_factor: Optional[PositiveInt] = None  # batches each worker prepares ahead (read with num_workers > 0)
    drop_last: bool = True            # drop an epoch's last incomplete batch


@dataclass
class DataConfig:
    train: LoaderConfig
    eval: Optional[LoaderConfig] = None
    tokenizer: Optional[str] = None  # folder with tokenizer.json; its vocabulary must fit model.vocab_size
    document_masking: bool = False   # attention stays within documents (split at EOS); adds position_ids
    eos_token: str = '<|end_of_text|>'  # the token that ends each document (document masking splits at it)
    eos_token_id: Optional[NonNegativeInt] = None  # None: eos_token looked up in the tokenizer


@dataclass
class ObjectiveConfig:
    """clm: next-token prediction; mlm: predict the tokens replaced by the mask token (bidirectional)."""
    name: Literal['clm', 'mlm'] = 'clm'  # clm (causal, next token) or mlm (masked, bidirectional)
    mask_probability: float = 0.3    # mlm: the share of tokens masked
    mask_token: str = '<|reserved_special_token_100|>'  # mlm: the token that replaces them
    mask_token_id: Optional[NonNegativeInt] = None  # None: mask_token looked up in data.tokenizer


@dataclass
class FSDPConfig:
    """Composer's FSDP2 (``FSDP2Config``): per-block ``fully_shard``, bf16 params and fp32 gradient reduction
    under amp_bf16 (``mixed_precision: DEFAULT``)."""
    reshard_after_forward: bool | Auto = True  # false: keep gathered params from forward to backward (more memory)
    activation_checkpointing: Literal[(*AC_MODES, 'auto')] = 'none'  # none; full: recompute whole blocks; selective: keep matmul and
    #                                         attention outputs, recompute the rest (torchtitan's per-op mode);
    #                                         full_except_attention: recompute all but attention (long context);
    #                                         auto: the fastest the plan predicts to fit
    checkpoint_every: PositiveInt = 1  # apply it to every k-th block (full with 2: every other block recomputed)
    replicate_degree: PositiveInt | Auto = 1  # > 1: HSDP, params sharded within groups of world/replicate_degree GPUs;
    #                                   auto: a replica a node where the model fits sharded over one node
    state_dict_type: Literal['sharded', 'full'] = 'sharded'  # sharded: each rank writes its shard (DCP); full: rank 0 writes one file
    mixed_precision: Literal['DEFAULT', 'PURE', 'FULL'] = 'DEFAULT'  # Composer's FSDP2 mixed precision; DEFAULT: bf16
    #                                                                 params, fp32 gradient reduction


@dataclass
class ParallelismConfig:
    fsdp: Optional[FSDPConfig] = field(default_factory=FSDPConfig)  # null: plain DDP
    context_parallel_degree: PositiveInt = 1  # > 1: each sequence split over this many consecutive GPUs (long context)
    expert_parallel_degree: PositiveInt = 1  # > 1 (mixtral): each block's experts split over groups of this many
    #                                          consecutive ranks, tokens sent to their experts by all-to-all; FSDP2
    #                                          shards each expert over the ranks that hold it


@dataclass
class CheckpointConfig:
    save_folder: Optional[str] = 'checkpoints/{run_name}'  # null: no checkpoints; {run_name} is filled in
    save_interval: str = '500ba'     # a checkpoint every this many batches (ba) or epochs (ep)
    save_num_checkpoints_to_keep: AllOrPositiveInt = -1  # the newest kept, across restarts; -1: all
    autoresume: bool = True          # the same command resumes from the newest sealed checkpoint in save_folder
    load_path: Optional[str] = None  # a checkpoint to start from when save_folder has none


@dataclass
class DownstreamConfig:
    """lm-evaluation-harness tasks scored during training (``downstream.py``; pip install 'llmfoundry_ext[eval]')."""
    tasks: list[str] = field(default_factory=list)    # the harness's task names, or those of include's YAMLs
    include: list[str] = field(default_factory=list)  # task YAML files or folders (their data on disk)
    limit: Optional[PositiveFloat] = None  # examples per task (a fraction of each below 1); None: all
    num_fewshot: Optional[NonNegativeInt] = None  # None: each task's own
    interval: Optional[str] = None     # in batches, e.g. 1000ba; None: eval_interval
    batch_tokens: PositiveInt = 8192   # tokens a forward (requests sorted by length, padded to a batch's longest)
    generation_rows: PositiveInt = 128  # contexts generated together (a KV cache of rows x (context + generated)
    #                                    tokens a layer: 1B 32 KiB a token, 8B 128 KiB)

    def interval_batches(self, eval_interval: str) -> int | None:
        """The interval (or ``eval_interval``) as a number of batches; None if it is not one."""
        text = self.interval or eval_interval
        digits = text.removesuffix('ba')
        return int(digits) if text.endswith('ba') and digits.isdigit() and int(digits) > 0 else None


@dataclass
class TrainConfig:
    run_name: str                    # names the run: its checkpoint folder and logs
    model: ModelConfig
    data: DataConfig
    max_seq_len: PositiveInt         # tokens a sample (the shards' windows)
    global_batch_size: PositiveInt   # samples a step over all GPUs
    max_duration: str                # training length: batches (ba), epochs (ep) or tokens (tok)
    device_microbatch_size: Optional[PositiveInt | Auto] = None  # None: the whole per-device batch at once; auto: the
    #                                                     fastest the plan predicts to fit
    optimizer: dict[str, Any] = field(default_factory=lambda: dict(OPTIMIZER_DEFAULT))  # name + its arguments
    #                                  (registry.OPTIMIZERS: adamw, decoupled_adamw, ...); one a YAML names keeps the
    #                                  default's lr (3e-4) unless it sets its own
    scheduler: Optional[dict[str, Any]] = field(default_factory=lambda: dict(SCHEDULER_DEFAULT))  # name + arguments
    #                                  (registry.SCHEDULERS: Composer's); one a YAML names keeps the default's
    #                                  t_warmup (100ba) where it takes a warm-up and sets none; null: a constant rate
    objective: ObjectiveConfig = field(default_factory=ObjectiveConfig)
    precision: Literal['fp32', 'amp_bf16', 'amp_fp16', 'amp_fp8'] = 'amp_bf16'  # Composer's: amp_bf16 (bf16 matmuls, fp32 weights), fp32, amp_fp16, amp_fp8
    seed: SeedInt = 17               # weights' initialisation, dropout and Composer's RNGs
    parallelism: ParallelismConfig = field(default_factory=ParallelismConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    callbacks: dict[str, dict[str, Any]] = field(default_factory=dict)  # name -> arguments (registry.CALLBACKS)
    algorithms: dict[str, dict[str, Any]] = field(default_factory=dict)  # name -> arguments (registry.ALGORITHMS)
    loggers: dict[str, dict[str, Any]] = field(default_factory=lambda: {'tensorboard': {}})  # name -> arguments
    #                                  (registry.LOGGERS: tensorboard, wandb, ...)
    eval_interval: str = '500ba'     # held-out loss on data.eval every this many batches
    eval_subset_num_batches: AllOrPositiveInt = -1  # batches a GPU an evaluation; -1: all of data.eval
    log_interval: str = '1ba'        # a console line and logged metrics every this many batches
    console: Literal['line', 'full'] = 'line'  # line: one line per log_interval on rank 0; full: Composer's metric dump
    progress_bar: Optional[bool] = None    # None: Composer's progress bar when the console is a terminal
    node_timeout_s: PositiveFloat = 30.0   # a job over several nodes stops when one is silent this long (node_watch)
    fit_check: bool = True                 # false: train settings the plan predicts not to fit (plan/run_plan.py)
    downstream: Optional[DownstreamConfig] = None  # harness tasks evaluated every downstream.interval

    @property
    def data_parallel_size(self) -> int:
        """The GPUs that read different samples: the ranks of a context-parallel group read the same."""
        return world_size() // self.parallelism.context_parallel_degree

    @property
    def device_batch_size(self) -> int:
        return self.global_batch_size // self.data_parallel_size

    @property
    def tokens_per_step(self) -> int:
        return self.global_batch_size * self.max_seq_len

    @property
    def checkpoint_folder(self) -> Optional[str]:
        """``checkpoint.save_folder`` with the run name filled in."""
        folder = self.checkpoint.save_folder
        return folder.format(run_name=self.run_name) if folder else None


DURATION_KEYS = ('max_duration', 'eval_interval', 'log_interval', 'checkpoint.save_interval', 'downstream.interval')


def load(yaml_path: str, overrides: list[str] = ()) -> TrainConfig:
    """YAML file + ``key=value`` overrides -> a TrainConfig whose values are consistent (``variables:`` resolved,
    then dropped; the model's preset and ``init_from`` weights fill the architecture keys the YAML leaves out)."""
    raw = read_yaml(yaml_path, overrides)
    apply_preset(raw)
    config = build(TrainConfig, raw, '')
    validate(config)
    return config


def read_yaml(yaml_path: str, overrides: list[str] = ()) -> dict:
    """The YAML (with the files it includes) merged with the overrides, ``variables:`` resolved and dropped, as plain
    data."""
    if not os.path.isfile(yaml_path):
        raise ConfigError(f'{yaml_path}: no such YAML file')
    try:
        merged = OmegaConf.merge(composed(os.path.normpath(yaml_path)), parse_overrides(overrides))
        raw = OmegaConf.to_container(merged, resolve=True)
    except OmegaConfBaseException as error:
        raise ConfigError(f'{yaml_path}: {first_line(error)}') from None
    if not isinstance(raw, dict):
        raise ConfigError(f'{yaml_path}: expected a mapping of keys at the top level')
    raw.pop('variables', None)
    return raw


def composed(yaml_path: str, includers: tuple[str, ...] = ()):
    """The YAML file over the files its ``include:`` lists (paths relative to it, each composed the same way), merged
    in order: a later file's keys replace an earlier's, the file's own replace all (a list is replaced whole).
    OmegaConf has no include of its own; the shipped YAMLs share yamls/common/ so."""
    if yaml_path in includers:
        raise ConfigError(f'{includers[0]}: the includes go round: {" -> ".join((*includers, yaml_path))}')
    if not os.path.isfile(yaml_path):
        raise ConfigError(f'{includers[-1]}: include {yaml_path}: no such YAML file')
    try:
        own = OmegaConf.load(yaml_path)
    except yaml.MarkedYAMLError as error:
        raise ConfigError(yaml_error_line(yaml_path, error)) from None
    if not isinstance(own, DictConfig) or 'include' not in own:
        return own
    includes = own.pop('include')
    if not isinstance(includes, ListConfig) or not all(isinstance(name, str) for name in includes):
        raise ConfigError(f'{yaml_path}: include: expected a list of YAML paths relative to this file, '
                          f'got {describe(includes)}')
    folder = os.path.dirname(yaml_path)
    return OmegaConf.merge(*(composed(os.path.normpath(os.path.join(folder, name)), (*includers, yaml_path))
                             for name in includes), own)


def yaml_error_line(path: str, error: yaml.MarkedYAMLError) -> str:
    """A YAML syntax error (a tab in the indentation, a key given twice) as file:line:column and what is wrong."""
    mark = error.problem_mark or error.context_mark
    if mark is None:
        return f'{path}: {first_line(error)}'
    with open(path) as file:
        line = (file.read().splitlines() + [''])[mark.line]
    if line[mark.column:mark.column + 1] == '\t':
        problem = 'a tab in the indentation; indent with spaces'
    else:
        problem = error.problem or error.context or 'not valid YAML'
        problem += '; give each key once' if 'duplicate' in problem else ''
    return f'{path}:{mark.line + 1}:{mark.column + 1}: {problem}'


def parse_overrides(overrides: list[str]):
    for item in overrides:
        if '=' not in item:
            raise ConfigError(f"override '{item}': expected key=value, e.g. global_batch_size=64")
    return OmegaConf.from_dotlist(list(overrides))


def first_line(error: Exception) -> str:
    return str(error).strip().splitlines()[0]


def apply_preset(raw: dict) -> None:
    """Fill ``model`` with its family's preset architecture, then that of the ``model.init_from`` weights (and the gpt2
    init scheme for what they lack), under the keys the YAML sets itself. The family is the YAML's, else that of the
    weights, else Llama."""
    model = raw.get('model')
    if not isinstance(model, dict):
        return
    weights = weights_config(model.get('init_from'))
    weights_family = family_of(weights) if weights is not None else None
    family = family_named(model.get('family', weights_family.name if weights_family else 'llama'))
    if weights_family not in (None, family):
        raise ConfigError(f"model.family: '{family.name}' but the weights in {model['init_from']} are "
                          f"'{weights_family.name}'; set model.family={weights_family.name}")
    preset = model.get('preset', 'debug')
    if preset not in family.presets:
        raise ConfigError(f"model.preset: unknown preset '{preset}' of family {family.name}; choose one of "
                          f"{', '.join(family.presets)}")
    from_weights = {} if weights is None else {
        **{name: getattr(weights, name) for name in (*weight_fields(type(weights)), 'max_seq_len')},
        'init_scheme': 'gpt2'}  # fresh tensors beside trained ones (a new vocabulary) at their scale, not N(0, 1)
    if weights is not None:
        check_weights_match(model, weights)
    raw['model'] = {**dataclasses.asdict(family.presets[preset]), **from_weights, 'family': family.name, **model}


def check_weights_match(model: dict, weights) -> None:
    """The architecture keys the YAML sets are those of the ``init_from`` weights (the vocabulary aside when both
    embeddings are drawn afresh); the run reads the weights' config.json here alone."""
    new_vocabulary = {'embed_tokens', 'lm_head'} <= set(model.get('init_skip') or [])
    for name in weight_fields(type(weights)):
        theirs = getattr(weights, name)
        if name in model and model[name] != theirs and not (name == 'vocab_size' and new_vocabulary):
            raise ConfigError(f"model.{name}: {model[name]} but the weights in {model['init_from']} have {theirs}; "
                              f"set model.{name}={theirs}")


def family_named(name: str) -> Family:
    if name not in FAMILIES:
        raise ConfigError(f"model.family: unknown family '{name}'{suggest(name, FAMILIES, 'families')}")
    return FAMILIES[name]


def weights_config(folder):
    """The architecture of the weights in ``folder`` (None without a folder)."""
    if not isinstance(folder, str):
        return None
    try:
        return read_weights_config(folder)
    except CheckpointError as error:
        raise ConfigError(f'model.init_from: {error}') from None


def build(cls, value, path: str):
    """Convert plain YAML data to the dataclass/typing annotation ``cls``, checking every key and type (a model's
    keys: its family's)."""
    if cls is ModelConfig and isinstance(value, dict):
        cls = model_config_class(value.get('family', 'llama'))
    if dataclasses.is_dataclass(cls):
        return build_dataclass(cls, value, path)
    origin, args = typing.get_origin(cls), typing.get_args(cls)
    if origin is typing.Annotated:
        return build_bounded(args, value, path)
    if origin is Literal:
        return build_choice(args, value, path)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        return build(inner[0], value, path) if len(inner) == 1 else build_or_auto(inner, value, path)
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f'{path}: expected a mapping, got {describe(value)}')
        return {key: build(args[1], item, join(path, key)) for key, item in value.items()}
    if origin is list:
        if not isinstance(value, list):
            raise ConfigError(f'{path}: expected a list, got {describe(value)}')
        return [build(args[0], item, f'{path}[{i}]') for i, item in enumerate(value)]
    return build_scalar(cls, value, path)


def build_dataclass(cls, value, path: str):
    if not isinstance(value, dict):
        raise ConfigError(f'{path or "config"}: expected a mapping, got {describe(value)}')
    fields_by_name = {f.name: f for f in dataclasses.fields(cls) if f.init}
    for key in value:
        if key not in fields_by_name:
            raise ConfigError(f"{join(path, key)}: unknown key{suggest(key, fields_by_name)}")
    hints = typing.get_type_hints(cls, include_extras=True)
    kwargs = {}
    for name, spec in fields_by_name.items():
        if name in value:
            kwargs[name] = build(hints[name], value[name], join(path, name))
        elif spec.default is dataclasses.MISSING and spec.default_factory is dataclasses.MISSING:
            raise ConfigError(f'{join(path, name)}: missing required key')
    return cls(**kwargs)


def build_or_auto(types_: list, value, path: str):
    """A key typed ``X | Auto``: 'auto', or a value of type X."""
    (other,) = [kind for kind in types_ if kind is not Auto]
    if value == 'auto':
        return value
    try:
        return build(other, value, path)
    except ConfigError as error:
        if not str(error).startswith(f'{path}: expected '):
            raise  # of the right type, out of its range
        raise ConfigError(f"{path}: expected {type_name(other)} or 'auto', got {describe(value)}") from None


def build_bounded(args: tuple, value, path: str):
    """A number whose type declares its range (``Annotated[int, Bounds(1)]``: bounds.py)."""
    number = build(args[0], value, path)
    for bounds in args[1:]:
        problem = bounds.problem(number) if isinstance(bounds, Bounds) else None
        if problem:
            raise ConfigError(f'{path}: {problem}')
    return number


def build_choice(choices: tuple, value, path: str):
    """A named choice (``Literal['line', 'full']``): one of its names, else the names and the nearest one."""
    if not isinstance(value, str):
        raise ConfigError(f'{path}: expected str, got {describe(value)}')
    if value in choices:
        return value
    close = difflib.get_close_matches(value, choices, n=1, cutoff=0.7)
    nearest = f"; did you mean '{close[0]}'?" if close else ''
    raise ConfigError(f"{path}: '{value}' is not one of {', '.join(choices)}{nearest}")


def type_name(annotation) -> str:
    """'int' for int and for ``Annotated[int, ...]``."""
    if typing.get_origin(annotation) is typing.Annotated:
        annotation = typing.get_args(annotation)[0]
    return getattr(annotation, '__name__', str(annotation))


def build_scalar(cls, value, path: str):
    if cls is Any:
        return value
    if path in DURATION_KEYS and isinstance(value, int) and not isinstance(value, bool):
        raise ConfigError(f'{path}: {value} has no unit; write {value}ba (batches), {value}ep, {value}tok or '
                          f'{value}sp')
    if cls is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if cls is int and isinstance(value, bool) or not isinstance(value, cls):
        raise ConfigError(f'{path}: expected {cls.__name__}, got {describe(value)}')
    return value


def describe(value) -> str:
    return f'{type(value).__name__} {value!r}' if value is not None else 'null'


def join(path: str, key) -> str:
    return f'{path}.{key}' if path else str(key)


def suggest(key: str, valid, noun: str = 'keys') -> str:
    """'; did you mean X?' for the nearest valid name, else the list of valid ones."""
    close = difflib.get_close_matches(str(key), list(valid), n=1, cutoff=0.5)
    return f"; did you mean '{close[0]}'?" if close else f"; valid {noun}: {', '.join(valid)}"


def validate(config: TrainConfig) -> None:
    """Cross-field checks of the values themselves (the machine is ``preflight``'s)."""
    check_context_parallel(config)
    check_expert_parallel(config)
    check_batch_split(config)
    check_model(config.model, config.max_seq_len)
    check_compiled_experts(config)
    check_objective(config)
    check_parallelism(config.parallelism.fsdp)
    if config.checkpoint.autoresume and not config.checkpoint.save_folder:
        raise ConfigError('checkpoint.autoresume: needs checkpoint.save_folder to resume from; set a save_folder '
                          'or checkpoint.autoresume=false')
    for key in ('max_duration', 'eval_interval', 'log_interval', 'checkpoint.save_interval'):
        check_duration(config, key)
    check_console(config)
    check_downstream(config)
    for split in ('train', 'eval'):
        loader = getattr(config.data, split)
        if loader is not None:
            check_loader(loader, f'data.{split}')


def check_batch_split(config: TrainConfig) -> None:
    ranks = config.data_parallel_size
    if config.global_batch_size % ranks:
        degree = config.parallelism.context_parallel_degree
        what = (f'the world size {ranks}' if degree == 1 else
                f'the data-parallel size {ranks} (world size {world_size()} / context_parallel_degree {degree})')
        raise ConfigError(f'global_batch_size: {config.global_batch_size} is not divisible by {what}; use a multiple '
                          f'of {ranks}')
    micro = config.device_microbatch_size
    if micro == 'auto':
        micro = None
    if micro is not None and config.device_batch_size % micro:
        raise ConfigError(f'device_microbatch_size: {micro} does not divide the per-device batch '
                          f'{config.device_batch_size} (global_batch_size {config.global_batch_size} / '
                          f'{ranks} devices); pick a divisor of {config.device_batch_size}')
    tokens = (micro or config.device_batch_size) * config.max_seq_len // config.parallelism.context_parallel_degree
    if config.model.float8 is True and tokens % 16:
        raise ConfigError(f'model.float8: a micro-batch is {tokens:,} tokens a GPU, and float8 GEMMs need a multiple '
                          f'of 16 (their weight gradients sum over the tokens); make max_seq_len a multiple of 16')


def check_model(model: ModelConfig, max_seq_len: int) -> None:
    if model.dim % model.n_heads:
        raise ConfigError(f'model.dim: {model.dim} is not divisible by model.n_heads {model.n_heads}')
    if model.n_heads % model.n_kv_heads:
        raise ConfigError(f'model.n_kv_heads: {model.n_kv_heads} does not divide model.n_heads {model.n_heads}')
    if max_seq_len > model.max_seq_len:
        raise ConfigError(f'max_seq_len: {max_seq_len} exceeds model.max_seq_len {model.max_seq_len}; '
                          f'raise model.max_seq_len or shorten max_seq_len')
    if model.rope_high_freq_factor <= model.rope_low_freq_factor:
        raise ConfigError(f'model.rope_high_freq_factor: {model.rope_high_freq_factor} is not above '
                          f'model.rope_low_freq_factor {model.rope_low_freq_factor} (Llama 3 scales the wavelengths '
                          f'between them)')
    if model.init_skip and model.init_from is None:
        raise ConfigError('model.init_skip: names tensors not to take from model.init_from, which is not set; set '
                          'model.init_from or remove init_skip')
    if model.init_from is not None and model.init_device == 'meta':
        raise ConfigError('model.init_device: meta leaves no rank to read model.init_from; use auto (rank 0 reads '
                          'the weights on the CPU and they are broadcast)')
    if isinstance(model, MixtralConfig) and model.experts_per_token > model.n_experts:
        raise ConfigError(f'model.experts_per_token: {model.experts_per_token} is not between 1 and model.n_experts '
                          f'{model.n_experts}')
    check_float8_output(model)
    check_float8_experts(model)


def check_float8_is_on(key: str, model: ModelConfig) -> None:
    """``key`` adds to float8 training, which must be on: under auto, which takes bf16 where the held-out loss grid
    says so, it would be dropped without a word."""
    if model.float8 is not True:
        raise ConfigError(f'{key}: needs model.float8=true (it is {model.float8}); set both, or neither')


def check_float8_output(model: ModelConfig) -> None:
    """``model.float8_output`` asks for float8 and the compiled loss, inside which the output layer's GEMMs run in
    float8 (``parallelism.compiled_float8_matmul``)."""
    if not model.float8_output:
        return
    check_float8_is_on('model.float8_output', model)
    if not model.compile or model.fused_loss:
        raise ConfigError('model.float8_output: the output layer runs in float8 inside the compiled loss; set '
                          'model.compile=true without cross_entropy in model.fused_kernels, or model.float8_output='
                          'false')


def check_float8_experts(model: ModelConfig) -> None:
    """``model.float8_experts`` asks for a mixture of experts, float8, and the shapes torchao's grouped GEMM takes."""
    if not model.float8_experts:
        return
    if not isinstance(model, MixtralConfig):
        raise ConfigError(f'model.float8_experts: model.family {model.family} has no experts; remove it or use a '
                          'mixture of experts (model.family mixtral)')
    check_float8_is_on('model.float8_experts', model)
    if model.dim % 16 or model.ffn_dim % 16:
        raise ConfigError(f'model.float8_experts: float8 grouped GEMMs need model.dim ({model.dim}) and '
                          f'model.ffn_dim ({model.ffn_dim}) divisible by 16')


def check_compiled_experts(config: TrainConfig) -> None:
    """torch's grouped GEMM compiles for bf16 inputs only (its meta kernel's check, torch 2.11): compiled experts
    under fp32 or fp16 would fail at the first batch with a long trace."""
    if isinstance(config.model, MixtralConfig) and config.model.compile and config.precision != 'amp_bf16':
        raise ConfigError(f"model.compile: the experts' compiled grouped GEMMs take bf16 only, and precision is "
                          f'{config.precision}; use precision=amp_bf16 or model.compile=false')


def check_objective(config: TrainConfig) -> None:
    objective = config.objective
    if not 0 < objective.mask_probability < 1:
        raise ConfigError(f'objective.mask_probability: must be between 0 and 1, got {objective.mask_probability}')
    if objective.name == 'clm' and not config.model.causal:
        raise ConfigError('model.causal: false lets every position see its label under objective clm; '
                          'set model.causal=true or objective.name=mlm')
    if objective.name == 'mlm' and config.model.causal:
        raise ConfigError('model.causal: masked LM needs bidirectional attention; set model.causal=false')


def check_parallelism(fsdp: Optional[FSDPConfig]) -> None:
    if fsdp is None:
        return
    if fsdp.replicate_degree != 'auto' and world_size() % fsdp.replicate_degree:
        raise ConfigError(f'parallelism.fsdp.replicate_degree: {fsdp.replicate_degree} does not divide the world '
                          f'size {world_size()}')


def check_context_parallel(config: TrainConfig) -> None:
    """The degree splits the world into groups (within FSDP2's shard groups) and each sequence into its
    load-balanced halves (head and tail chunks: 2 x degree of them)."""
    degree = config.parallelism.context_parallel_degree
    key = 'parallelism.context_parallel_degree'
    if degree == 1:
        return
    if world_size() % degree:
        raise ConfigError(f'{key}: {degree} does not divide the world size {world_size()}; use a divisor of it')
    fsdp = config.parallelism.fsdp
    if fsdp is None:
        raise ConfigError(f'{key}: context parallelism runs under FSDP2; set parallelism.fsdp (not null)')
    replicas = 1 if fsdp.replicate_degree == 'auto' else fsdp.replicate_degree
    if (world_size() // replicas) % degree:
        raise ConfigError(f'{key}: {degree} does not divide the {world_size() // replicas} GPUs of an '
                          f'FSDP2 shard group (world size / parallelism.fsdp.replicate_degree)')
    if config.max_seq_len % (2 * degree):
        raise ConfigError(f'max_seq_len: {config.max_seq_len} is not divisible by 2 x {key} = {2 * degree} (each '
                          f'rank takes a head and a tail chunk of every sequence)')


def check_expert_parallel(config: TrainConfig) -> None:
    """The degree splits the world into groups of consecutive ranks and each block's experts evenly over a group;
    it runs under FSDP2 alone (not yet beside HSDP or context parallelism)."""
    degree = config.parallelism.expert_parallel_degree
    key = 'parallelism.expert_parallel_degree'
    if degree == 1:
        return
    experts = getattr(config.model, 'n_experts', None)
    if experts is None:
        raise ConfigError(f'{key}: {degree} splits experts, and model.family {config.model.family} has none; set '
                          f'{key}=1')
    if experts % degree:
        raise ConfigError(f'{key}: {degree} does not divide model.n_experts {experts}; use a divisor of it')
    if world_size() % degree:
        raise ConfigError(f'{key}: {degree} does not divide the world size {world_size()}; use a divisor of it')
    fsdp = config.parallelism.fsdp
    if fsdp is None or fsdp.replicate_degree != 1 or config.parallelism.context_parallel_degree != 1:
        raise ConfigError(f'{key}: expert parallelism runs under FSDP2 over all ranks (parallelism.fsdp set, '
                          f'replicate_degree 1, context_parallel_degree 1); set those, or {key}=1')


def check_console(config: TrainConfig) -> None:
    if config.console == 'line' and not config.log_interval.endswith('ba'):
        raise ConfigError(f'log_interval: {config.log_interval}: the console line is printed every so many batches; '
                          f'give batches (e.g. 10ba) or set console=full')


def check_downstream(config: TrainConfig) -> None:
    downstream = config.downstream
    if downstream is None:
        return
    if not downstream.tasks:
        raise ConfigError('downstream.tasks: name at least one task (the harness\'s, or one of downstream.include\'s '
                          'YAMLs), or set downstream=null')
    if not downstream.interval_batches(config.eval_interval):
        raise ConfigError(f'downstream.interval: {downstream.interval or config.eval_interval} (default eval_interval) '
                          f'is not a number of batches; give e.g. 1000ba')


def check_duration(config: TrainConfig, key: str) -> None:
    from composer.core import Time  # here alone: reading a config (scripts/evaluate.py) needs no Composer
    value = config
    for part in key.split('.'):
        value = getattr(value, part)
    try:
        duration = Time.from_timestring(value)
    except (ValueError, TypeError):
        raise ConfigError(f"{key}: '{value}' is not a duration; write e.g. 1000ba, 2ep, 1000000tok or 5000sp") from None
    if duration.value <= 0:
        never = {'max_duration': 'trains nothing', 'checkpoint.save_interval': 'never saves'}.get(key, 'never comes')
        fix = '; set checkpoint.save_folder=null to save no checkpoints' if key == 'checkpoint.save_interval' else ''
        raise ConfigError(f"{key}: '{value}' {never}; give a positive duration, e.g. 1000ba{fix}")


def check_loader(loader: LoaderConfig, path: str) -> None:
    if not loader.streams:
        raise ConfigError(f'{path}.streams: needs at least one stream')
    with_proportion = [s.proportion is not None for s in loader.streams.values()]
    if any(with_proportion) and not all(with_proportion):
        raise ConfigError(f'{path}.streams: give a proportion to every stream or to none')
