"""Preflight: the run's configuration checked against this machine before any process group or GPU memory exists,
and the values that depend on it resolved once (the run plan: ``auto`` settings and predictions; token ids from the
tokenizer, the attention backend, the family's architecture and kernels), into the ``Run`` that ``build`` turns into
a Trainer.

Each problem is a ``ConfigError``: one line naming the key and the fix.
"""
import dataclasses
import importlib
import json
import os
from dataclasses import dataclass
from typing import Optional

import torch
from omegaconf import OmegaConf

from llmfoundry_ext import registry, run_lock
from llmfoundry_ext.cli import unwritable_reason
from llmfoundry_ext.config import LoaderConfig, ModelConfig, TrainConfig, first_line, load
from llmfoundry_ext.data.mds import file_sha256, read_manifest
from llmfoundry_ext.errors import CheckpointError, ConfigError
from llmfoundry_ext.machine import Machine, global_rank, gpu_of_this_machine
from llmfoundry_ext.model.attention import CONTEXT_PARALLEL_BACKENDS, choose_backend, has_module, missing_reason
from llmfoundry_ext.model.fused import fused_kernels_problem
from llmfoundry_ext.model.kernels import KernelConfig
from llmfoundry_ext.model.llama import weight_fields
from llmfoundry_ext.plan.run_plan import RunPlan, settle
from llmfoundry_ext.resumption import checkpoints_newest_first
from llmfoundry_ext.tokenizer import read_tokenizer, tokenizer_file
from llmfoundry_ext.weights import safetensors_files, skipped


@dataclass(frozen=True)
class Run:
    """A run ready to build: its config (every ``auto`` resolved) and what preflight resolved from the machine."""
    config: TrainConfig
    plan: RunPlan
    architecture: object          # the family's architecture config (model.architecture())
    kernels: KernelConfig         # the model's kernels, ``attn_impl`` resolved to the backend that runs
    eos_token_id: Optional[int]   # with data.document_masking
    mask_token_id: Optional[int]  # with objective mlm
    downstream_tasks: Optional[object] = None  # with downstream: its tasks loaded (downstream.LoadedTasks)
    default_arguments: dict = dataclasses.field(default_factory=dict)  # section -> the arguments it took from the
    #                                                                      default (registry.with_default_arguments)


def prepare(yaml_path: str, overrides: list[str] = ()) -> Run:
    """``config.load`` and ``check``: what ``train.py`` runs before training."""
    return check(load(yaml_path, overrides))


def check(config: TrainConfig) -> Run:
    """Every check against the machine, in the order a user fixes them; the resolved Run."""
    check_hardware(config)
    config, default_arguments = registry.with_default_arguments(config)
    plan = settle(config, Machine.from_environment(gpu_of_this_machine()), float8_problem() is None)
    config = plan.config
    kernels = resolve_kernels(config)
    check_init_from(config.model)
    check_checkpoint_paths(config, plan.sharded_checkpoints)
    vocabulary = Vocabulary(config)
    for split in ('train', 'eval'):
        loader = getattr(config.data, split)
        if loader is not None:
            for name, stream in loader.streams.items():
                if stream.remote is None:
                    check_local_stream(stream.local, f'data.{split}.streams.{name}.local', config.max_seq_len)
                elif '://' not in stream.remote:  # a folder on this machine; an object store is reached in training
                    check_local_stream(stream.remote, f'data.{split}.streams.{name}.remote', config.max_seq_len)
            vocabulary.check_streams(loader, f'data.{split}')
    check_resumed_architecture(config)
    registry.check_all(config)
    return Run(config, plan, config.model.architecture(), kernels,
               eos_token_id=vocabulary.eos_token_id() if config.data.document_masking else None,
               mask_token_id=vocabulary.mask_token_id() if config.objective.name == 'mlm' else None,
               downstream_tasks=load_downstream_tasks(config), default_arguments=default_arguments)


def load_downstream_tasks(config: TrainConfig):
    """The harness installed, every downstream task loaded from disk, and a tokenizer it can read, loaded once for
    the run (``downstream.LoadedTasks``; None without downstream)."""
    if config.downstream is None:
        return None
    from llmfoundry_ext.downstream import load_run_tasks
    return load_run_tasks(config.downstream, config.data.tokenizer)


def check_hardware(config: TrainConfig) -> None:
    if config.precision != 'fp32' and not torch.cuda.is_available():
        raise ConfigError(f"precision: {config.precision} needs a GPU and none is visible; use precision=fp32 on CPU")


def float8_problem() -> Optional[str]:
    """Why float8 training cannot run here (it needs a GPU with float8 tensor cores and torchao), or None."""
    if not (torch.cuda.is_available() and torch.cuda.get_device_capability() >= (8, 9)):
        return 'float8 training needs an H100-class GPU (compute capability 8.9+); set model.float8=false'
    if not has_module('torchao'):
        return 'needs the torchao package, which is not installed: pip install torchao'
    return None


def resolve_kernels(config: TrainConfig) -> KernelConfig:
    """Attention backend, fused kernels and float8: each installed and able to run here; the kernels with
    ``attn_impl`` resolved to the backend that runs (``auto``: the fastest here that masks as the data asks)."""
    model = config.model
    on_gpu = torch.cuda.is_available()
    problems = {'model.attn_impl': missing_reason(model.attn_impl) or gpu_only_problem(model.attn_impl, on_gpu),
                'model.fused_kernels': fused_kernels_problem(model.fused_kernels, on_gpu)}
    if model.float8:
        problems['model.float8'] = float8_problem()
    for key, problem in problems.items():
        if problem:
            raise ConfigError(f'{key}: {problem}')
    context_parallel = config.parallelism.context_parallel_degree > 1
    backend = choose_backend(model.attn_impl, config.data.document_masking, on_gpu, context_parallel)
    if context_parallel:
        check_context_parallel_kernels(config, backend, on_gpu)
    check_checkpointing_kernel(config, backend)
    return KernelConfig(attn_impl=backend, sdpa_kernel=model.sdpa_kernel, fused_kernels=model.fused_kernels)


def check_checkpointing_kernel(config: TrainConfig, backend: str) -> None:
    """full_except_attention keeps the outputs of the attention kernel's op, which eager attention and SDPA's math
    kernel (plain matmuls and softmax) and the flash-attn package's functions do not give torch's checkpointing."""
    fsdp = config.parallelism.fsdp
    if not fsdp or fsdp.activation_checkpointing != 'full_except_attention':
        return
    runs = f"attn_impl '{backend}'"
    if backend == 'sdpa' and config.model.sdpa_kernel == 'math':
        runs = "sdpa_kernel 'math'"
    elif backend in KEPT_ATTENTION_BACKENDS:
        return
    raise ConfigError(f"parallelism.fsdp.activation_checkpointing: full_except_attention keeps the attention kernel's "
                      f"outputs, and {runs} runs no kernel op it can keep; set model.attn_impl to "
                      f"{', '.join(KEPT_ATTENTION_BACKENDS)} (sdpa_kernel not math), or activation_checkpointing=full")


KEPT_ATTENTION_BACKENDS = ('sdpa', 'flex', 'varlen')


def check_context_parallel_kernels(config: TrainConfig, backend: str, on_gpu: bool) -> None:
    """PyTorch's context parallelism runs ring SDPA (its flash, efficient and cuDNN kernels: causal or full
    attention) and flex over all-gathered keys and values (any mask, documents included), on GPUs."""
    key = 'parallelism.context_parallel_degree'
    degree = config.parallelism.context_parallel_degree
    if not on_gpu:
        raise ConfigError(f'{key}: context parallelism needs GPUs (ring attention runs CUDA kernels) and none is '
                          f'visible; set {key}=1')
    if not has_context_parallelism():
        raise ConfigError(f"{key}: needs PyTorch's context parallelism with load balancers (torch 2.10 or later; this "
                          f"is {torch.__version__}): upgrade torch, or set {key}=1")
    if backend not in CONTEXT_PARALLEL_BACKENDS:
        raise ConfigError(f"model.attn_impl: '{backend}' cannot run under context parallelism (PyTorch's covers "
                          f"sdpa and flex); set model.attn_impl=auto")
    if backend == 'sdpa' and config.data.document_masking:
        raise ConfigError('model.attn_impl: sdpa under context parallelism masks only causally, not by document; '
                          'set model.attn_impl=auto (flex) or data.document_masking=false')
    if backend == 'sdpa' and config.model.sdpa_kernel == 'math':
        raise ConfigError("model.sdpa_kernel: 'math' has no ring attention under context parallelism; set "
                          "model.sdpa_kernel=auto")
    if backend == 'sdpa' and config.precision == 'fp32':
        raise ConfigError('precision: fp32 runs SDPA on its math kernel, which has no ring attention under context '
                          'parallelism; use precision=amp_bf16, or model.attn_impl=flex')
    block = FLEX_BLOCK * degree
    if backend == 'flex' and config.max_seq_len % block:
        raise ConfigError(f'max_seq_len: {config.max_seq_len} is not divisible by {block} ({FLEX_BLOCK}-token '
                          f'flex blocks x {key} {degree}), which flex under context parallelism needs')


def has_context_parallelism() -> bool:
    """torch's module-wrapping context parallelism and its balancers, as ``parallelism.ContextParallel`` uses them."""
    try:
        module = importlib.import_module('torch.distributed.tensor.experimental._attention')
    except ImportError:
        return False
    names = ('_context_parallel_shard', '_ContextParallel', '_HeadTailLoadBalancer', '_PTRRLoadBalancer')
    return all(hasattr(module, name) for name in names)


FLEX_BLOCK = 128  # flex attention's block size: its context-parallel masks need whole blocks per rank


def gpu_only_problem(attn_impl: str, on_gpu: bool) -> Optional[str]:
    """varlen and flash are FA-2 kernels, GPU only; flex on the CPU stops at the first backward with an inductor
    IndexError (seen with torch 2.7): each refused before the run."""
    if on_gpu or attn_impl not in ('flex', 'varlen', 'flash'):
        return None
    why = (f"on the CPU, torch {torch.__version__}'s inductor fails to compile its backward" if attn_impl == 'flex'
           else 'its FA-2 kernels have no CPU version')
    return f"'{attn_impl}' trains only on a GPU ({why}); set model.attn_impl=auto or sdpa on the CPU"


def check_init_from(model: ModelConfig) -> None:
    """The weights to start from are safetensors files (their architecture was read and checked against the YAML
    by ``config.apply_preset``)."""
    if model.init_from is None:
        return
    try:
        safetensors_files(model.init_from)
    except CheckpointError as error:
        raise ConfigError(f'model.init_from: {error}') from None
    with torch.device('meta'):
        names = [name for name, _ in model.family_entry().module(model.architecture()).named_parameters()]
    for prefix in model.init_skip:
        if not any(skipped(name, (prefix,)) for name in names):
            raise ConfigError(f"model.init_skip: '{prefix}' names no tensor of the model; give name prefixes such as "
                              f"embed_tokens, lm_head or layers.0")


class Vocabulary:
    """data.tokenizer, read once: the ids the run looks up in it and the streams it must have tokenized."""

    def __init__(self, config: TrainConfig):
        self.config = config
        self.path = config.data.tokenizer
        self.tokenizer = read_tokenizer_or_fail(self.path) if self.path is not None else None
        if self.tokenizer is None:
            return
        size = self.tokenizer.get_vocab_size()
        if size > config.model.vocab_size:
            raise ConfigError(f'data.tokenizer: its vocabulary has {size:,} ids but model.vocab_size is '
                              f'{config.model.vocab_size:,}; set model.vocab_size >= {size}')
        self.digest = file_sha256(tokenizer_file(self.path))  # what the streams' manifests must record

    def token_id(self, token: str, given: Optional[int], key: str) -> int:
        """``given`` if set, else ``token`` looked up in data.tokenizer; checked against the vocabulary."""
        if given is None:
            if self.tokenizer is None:
                raise ConfigError(f'{key}: not set and no data.tokenizer to look up {token!r} in; set one of them')
            given = self.tokenizer.token_to_id(token)
            if given is None:
                raise ConfigError(f'{key}: data.tokenizer has no token {token!r}; set {key} to the id to use')
        if not 0 <= given < self.config.model.vocab_size:
            raise ConfigError(f'{key}: {given} is outside the vocabulary (model.vocab_size '
                              f'{self.config.model.vocab_size})')
        return given

    def eos_token_id(self) -> int:
        return self.token_id(self.config.data.eos_token, self.config.data.eos_token_id, 'data.eos_token_id')

    def mask_token_id(self) -> int:
        objective = self.config.objective
        return self.token_id(objective.mask_token, objective.mask_token_id, 'objective.mask_token_id')

    def check_streams(self, loader: LoaderConfig, path: str) -> None:
        """Each local stream was tokenized with data.tokenizer (as its manifest records)."""
        if self.tokenizer is None:
            return
        for name, stream in loader.streams.items():
            used = (read_manifest(stream.local) or {}).get('tokenizer_sha256')
            if used is not None and used != self.digest:
                raise ConfigError(f'{path}.streams.{name}: its shards were tokenized with another tokenizer than '
                                  f'data.tokenizer {self.path} (sha256 {used[:12]} vs {self.digest[:12]}); point '
                                  f'data.tokenizer at the one named in {stream.local}/manifest.json or re-convert')


def check_local_stream(folder: str, key: str, max_seq_len: int) -> None:
    """An MDS index that reads, windows at least ``max_seq_len`` long, and (on rank 0, which alone reads every
    shard's size) each shard file there with the size its index gives."""
    index_file = os.path.join(folder, 'index.json')
    if not os.path.isfile(index_file):
        unset = ' and no remote set' if key.endswith('.local') else ''
        raise ConfigError(f'{key}: no MDS dataset at {folder} (index.json missing){unset}; run '
                          f'data_prep/convert_to_mds.py or fix the path')
    try:
        with open(index_file) as file:
            shards = json.load(file)['shards']
        manifest = read_manifest(folder) or {}
    except (ValueError, KeyError, TypeError) as error:
        raise ConfigError(f'{key}: {index_file} or its manifest is unreadable ({first_line(error)}); re-convert '
                          f'the stream with data_prep/convert_to_mds.py') from None
    window = manifest.get('window')
    if not sum(shard.get('samples', 0) for shard in shards):
        raise ConfigError(f'{key}: {folder} holds no samples (its documents filled no window of '
                          f'{window or max_seq_len} tokens); convert more data into it or leave the stream out')
    if window is not None and window < max_seq_len:
        raise ConfigError(f'{key}: its windows have {window} tokens, fewer than max_seq_len {max_seq_len}; set '
                          f'max_seq_len={window} or re-convert with --concat-tokens {max_seq_len}')
    problem = shard_problem(folder, shards) if global_rank() == 0 else None
    if problem:
        raise ConfigError(f'{key}: {problem}; re-convert the stream with data_prep/convert_to_mds.py')


def shard_problem(folder: str, shards: list[dict]) -> Optional[str]:
    """A shard file that is missing, or one of its files (compressed, or already decompressed beside it: streaming
    reads that one) not the size its index gives."""
    for shard in shards:
        forms = [shard[kind] for kind in ('zip_data', 'raw_data') if shard.get(kind)]
        present = [form for form in forms if os.path.isfile(os.path.join(folder, form['basename']))]
        if not present:
            return f"shard {forms[0]['basename']} is missing"
        for form in present:
            path = os.path.join(folder, form['basename'])
            size = os.path.getsize(path)
            if size != form['bytes']:
                return f"shard {form['basename']} has {size:,} bytes where its index says {form['bytes']:,}"
            problem = (raw_header_problem(path, shard['samples']) if form is shard.get('raw_data') else
                       zstd_header_problem(path, shard['raw_data']['bytes'])
                       if str(shard.get('compression')).startswith('zstd') else None)
            if problem:
                return f"shard {form['basename']}: {problem}"
    return None


def raw_header_problem(path: str, samples: int) -> Optional[str]:
    """An MDS shard's header: its sample count, then the samples' offsets, rising to the file's end (a read of
    4 x (samples + 2) bytes; for 1 TB of 64 MB shards, ~16,000 reads of ~30 KB)."""
    with open(path, 'rb') as file:
        header = file.read(4 * (samples + 2))
    count = int.from_bytes(header[:4], 'little')
    offsets = [int.from_bytes(header[i:i + 4], 'little') for i in range(4, len(header), 4)]
    if count != samples or len(offsets) != samples + 1:
        return f'its header counts {count:,} samples where its index says {samples:,}'
    if any(b < a for a, b in zip(offsets, offsets[1:])) or offsets[-1] != os.path.getsize(path):
        return 'its header\'s sample offsets do not rise to its end'
    return None


ZSTD_MAGIC = bytes.fromhex('28b52ffd')


def zstd_header_problem(path: str, raw_bytes: int) -> Optional[str]:
    """A zstd frame's magic number and the content size its header records (18 bytes read; damage past the header
    shows when training decompresses the shard, and stops the run naming it: ``data/dataloader.py``)."""
    with open(path, 'rb') as file:
        header = file.read(18)
    if header[:4] != ZSTD_MAGIC:
        return 'not a zstd frame (its first bytes are damaged)'
    descriptor = header[4]
    single_segment, dictionary = descriptor >> 5 & 1, descriptor & 3
    start = 5 + (not single_segment) + (0, 1, 2, 4)[dictionary]
    width = (single_segment, 2, 4, 8)[descriptor >> 6]
    if not width:
        return None  # the frame does not record its content size
    content = int.from_bytes(header[start:start + width], 'little') + (256 if width == 2 else 0)
    if content != raw_bytes:
        return f'its zstd header records {content:,} bytes where the index says {raw_bytes:,} decompressed'
    return None


def check_checkpoint_paths(config: TrainConfig, sharded: bool) -> None:
    """A save folder that can be written, and a load_path (a local one) that exists in the format the run reads
    (``sharded``: a folder of shards, the plan's ``sharded_checkpoints``)."""
    folder, load_path = config.checkpoint_folder, config.checkpoint.load_path
    if folder and (reason := unwritable_reason(folder)):
        raise ConfigError(f'checkpoint.save_folder: {reason}; choose a folder you can write')
    run_lock.check_free(folder, global_rank())
    if not load_path or '://' in load_path:
        return
    if not os.path.exists(load_path):
        raise ConfigError(f'checkpoint.load_path: {load_path} does not exist; give a checkpoint (ep0-ba100/ or '
                          f'ep0-ba100-rank0.pt) or remove load_path')
    if os.path.isdir(load_path) != sharded:
        mode, out = ('torch_to_dcp', 'ep0-ba100') if sharded else ('dcp_to_torch', 'ep0-ba100-rank0.pt')
        raise ConfigError(f'checkpoint.load_path: {load_path} is {"one file" if sharded else "a folder of shards"} '
                          f'and this run reads {"shards (FSDP2)" if sharded else "one file (one process)"}; convert '
                          f'it (python -m torch.distributed.checkpoint.format_utils {mode} {load_path} {out}) or put '
                          f'the run in checkpoint.save_folder, whose autoresume converts it')


def check_resumed_architecture(config: TrainConfig) -> None:
    """A save folder with checkpoints resumes a model of the shape they hold: the architecture its ``config.yaml``
    recorded (``train.write_resolved_config``, written when a run starts training) against this run's."""
    folder = config.checkpoint_folder
    recorded = os.path.join(folder or '', 'config.yaml')
    if not (config.checkpoint.autoresume and os.path.isfile(recorded) and checkpoints_newest_first(folder, True)):
        return
    before = OmegaConf.to_container(OmegaConf.load(recorded)).get('model') or {}
    now = dataclasses.asdict(config.model)
    for key in ('family', *weight_fields(type(config.model.architecture()))):
        if key in before and before[key] != now[key]:
            raise ConfigError(f'model.{key}: {now[key]}, but the checkpoints in {folder} are of a model with '
                              f'{before[key]}; set model.{key}={before[key]} to resume them, or give a new '
                              f'checkpoint.save_folder to start another run')


def read_tokenizer_or_fail(path: str):
    """data.tokenizer (a folder or a tokenizer.json) read; a ConfigError if it is missing or not one."""
    file = tokenizer_file(path)
    if not os.path.isfile(file):
        raise ConfigError(f'data.tokenizer: no tokenizer.json at {path}; give the folder the shards were '
                          f'tokenized with')
    try:
        return read_tokenizer(file)
    except ValueError as error:
        raise ConfigError(f'data.tokenizer: {error}; give the folder the shards were tokenized with') from None
