"""GPU time of parts of the training step for a preset's shapes (``scripts/measure_step_parts.py``: what each part
measures is there)."""
import json
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F

from llmfoundry_ext.machine import world_size
from llmfoundry_ext.model.attention import SDPA_KERNELS, sdpa_backend
from llmfoundry_ext.model.llama import PRESETS, InnerAttention, LlamaConfig, Transformer
from llmfoundry_ext.parallelism import ContextParallel


def cuda_ms(fn, warmup: int = 3, repeat: int = 10) -> float:
    """Mean GPU milliseconds of ``fn()`` over ``repeat`` calls after ``warmup``."""
    for _ in range(warmup):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(repeat):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / repeat


def peak_gib_above(fn, baseline: int) -> float:
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - baseline) / 2**30


def loss_rows(config: LlamaConfig, tokens: int, chunk_consts: list[int]) -> list[dict]:
    from liger_kernel.transformers.functional import liger_fused_linear_cross_entropy

    hidden = torch.randn(tokens, config.dim, device='cuda', dtype=torch.bfloat16, requires_grad=True)
    weight = (torch.randn(config.vocab_size, config.dim, device='cuda', dtype=torch.bfloat16) * 0.02).requires_grad_()
    labels = torch.randint(0, config.vocab_size, (tokens,), device='cuda')
    compiled_ce = torch.compile(lambda logits, target: F.cross_entropy(logits.float(), target))

    def liger(const):
        return lambda: liger_fused_linear_cross_entropy(hidden, weight, labels, chunk_mem_const=const).backward()

    variants = {f'liger chunk_mem_const={c}': liger(c) for c in chunk_consts}
    variants['logits GEMM + compiled cross-entropy'] = lambda: compiled_ce(hidden @ weight.t(), labels).backward()
    baseline = torch.cuda.memory_allocated()
    rows = []
    for name, fn in variants.items():
        rows.append({'part': 'loss', 'variant': name, 'ms': round(cuda_ms(fn), 2),
                     'peak_gib': round(peak_gib_above(fn, baseline), 2)})
        hidden.grad = weight.grad = None
    return rows


def shard_shapes(config: LlamaConfig, shards: int) -> list[tuple[int, ...]]:
    """One rank's FSDP2 shard (dim 0 split) of each parameter of the model."""
    with torch.device('meta'):
        model = Transformer(config)
    return [(-(-p.shape[0] // shards), *p.shape[1:]) for p in model.parameters()]


def optimizer_rows(config: LlamaConfig, shards: int) -> list[dict]:
    shapes = shard_shapes(config, shards)
    params = [torch.nn.Parameter(torch.randn(shape, device='cuda') * 0.02) for shape in shapes]
    for param in params:
        param.grad = torch.randn_like(param) * 1e-3
    rows = []
    for name, kwargs in {'AdamW fused': {'fused': True}, 'AdamW foreach': {'foreach': True}}.items():
        optimizer = torch.optim.AdamW(params, lr=1e-5, betas=(0.9, 0.95), weight_decay=0.1, **kwargs)
        rows.append({'part': 'optimizer', 'variant': name, 'ms': round(cuda_ms(optimizer.step), 2)})
        optimizer.state.clear()
    clip = lambda: torch.nn.utils.clip_grad_norm_(params, max_norm=1.0, foreach=True)
    rows.append({'part': 'optimizer', 'variant': 'clip_grad_norm_ (foreach)', 'ms': round(cuda_ms(clip), 2)})
    numel = sum(p.numel() for p in params)
    for row in rows[-3:]:
        row['params'] = numel
    return rows


class PinnedGQA(torch.nn.Module):
    """SDPA restricted to one kernel, key/value heads passed as they are (``enable_gqa``)."""

    def __init__(self, kernel: str):
        super().__init__()
        self.kernel = kernel

    def forward(self, q, k, v, causal: bool, *_) -> torch.Tensor:
        from torch.nn.attention import sdpa_kernel

        with sdpa_kernel(sdpa_backend(self.kernel)):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)


def top_kernel(fn) -> str:
    """The GPU kernel with the most time in one call of ``fn``."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as profile:
        fn()
        torch.cuda.synchronize()
    events = [e for e in profile.key_averages() if e.device_type == torch.autograd.DeviceType.CUDA]
    return max(events, key=lambda e: e.self_device_time_total).key[:70] if events else '-'


def attention_rows(config: LlamaConfig, tokens: int) -> list[dict]:
    """Causal attention fwd+bwd of one layer over a ``tokens``-long sequence, per SDPA choice, on this rank's
    share of it (context parallel over all ranks when there are several)."""
    world = world_size()
    ring = ContextParallel(world, 'sdpa', causal=True) if world > 1 else None
    local = tokens // world
    shape = (1, config.n_heads, local, config.head_dim)
    q = torch.randn(shape, device='cuda', dtype=torch.bfloat16, requires_grad=True)
    k, v = (torch.randn(1, config.n_kv_heads, local, config.head_dim, device='cuda', dtype=torch.bfloat16,
                        requires_grad=True) for _ in range(2))
    flops = 7 * tokens * tokens * config.n_heads * config.head_dim / world
    variants = {f'sdpa_kernel={kernel}': (InnerAttention(), kernel) for kernel in SDPA_KERNELS if kernel != 'math'}
    variants.update({f'{kernel} pinned, enable_gqa': (PinnedGQA(kernel), kernel) for kernel in ('cudnn', 'flash')})
    rows = []
    for name, (module, kernel) in variants.items():
        if ring is not None:
            ring.wrap(module)
        step = lambda: module(q, k, v, True, 'sdpa', None, kernel).sum().backward()
        try:
            ms, kernel_name = cuda_ms(step), top_kernel(step)
        except Exception as error:  # noqa: BLE001 - a kernel that cannot run is a row of the table
            rows.append({'part': 'attention', 'variant': name, 'error': str(error).splitlines()[0][:100]})
            continue
        rows.append({'part': 'attention', 'variant': name, 'ms': round(ms, 2),
                     'tflops_per_gpu': round(flops / ms / 1e9, 1), 'kernel': kernel_name})
    return rows


def run(args) -> int:
    """The parts ``args`` (the script's) names, a table on stdout (rank 0) and optionally JSON."""
    config = PRESETS[args.preset]
    gpus = world_size()
    if gpus > 1:  # torchrun: attention on a ring of its processes
        dist.init_process_group('nccl')
        torch.cuda.set_device(int(os.environ['LOCAL_RANK']))
    rows = []
    if 'attention' in args.parts:
        rows += attention_rows(config, args.tokens)
    if 'loss' in args.parts:
        rows += loss_rows(config, args.tokens, args.chunk_mem_const)
    if 'optimizer' in args.parts:
        rows += optimizer_rows(config, args.shards)
    device = f'{gpus} x {torch.cuda.get_device_name()}, torch {torch.__version__}'
    if gpus > 1 and dist.get_rank() > 0:
        return 0
    print(f'{args.preset}, {args.tokens} tokens, optimizer on 1/{args.shards} of the parameters; {device}')
    print(f"{'part':10} {'variant':40} {'ms':>9} {'peak GiB':>9} {'TFLOP/s':>8}  kernel")
    for row in rows:
        if 'error' in row:
            print(f"{row['part']:10} {row['variant']:40} error: {row['error']}")
            continue
        print(f"{row['part']:10} {row['variant']:40} {row['ms']:>9.2f} {row.get('peak_gib', ''):>9} "
              f"{row.get('tflops_per_gpu', ''):>8}  {row.get('kernel', '')}")
    if args.json:
        with open(args.json, 'w') as file:
            json.dump({'preset': args.preset, 'tokens': args.tokens, 'shards': args.shards, 'device': device,
                       'rows': rows}, file, indent=1)
    return 0
