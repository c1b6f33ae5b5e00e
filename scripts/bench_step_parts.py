"""GPU time of the training step's parts outside the transformer blocks, for a preset's shapes on one GPU.

  python scripts/bench_step_parts.py --preset 8b --tokens 8192 [--shards 2] [--json out.json]

loss: the output layer and cross-entropy, forward and backward, from bf16 hidden states and weight: liger's
fused kernel at several ``chunk_mem_const`` (its transient logits are at most that many times the hidden
states; 1, liger's default, cuts 8,192 tokens of the 8B into 32 chunks) beside the logits GEMM with a compiled
cross-entropy (torchtitan's loss path). optimizer: AdamW (fused / foreach) and norm clipping on one rank's fp32
shard of the preset's parameters (``--shards``: the FSDP degree), as in the 8B on 2 GPUs.
"""
import argparse
import json
import sys

import torch
import torch.nn.functional as F

from llmfoundry_ext.model.llama import PRESETS, LlamaConfig, Transformer


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


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--preset', default='8b', choices=sorted(PRESETS))
    parser.add_argument('--tokens', type=int, default=8192, help='tokens per micro-batch (batch x sequence)')
    parser.add_argument('--shards', type=int, default=2, help='FSDP degree: the optimizer sees 1/shards of the model')
    parser.add_argument('--chunk-mem-const', type=int, nargs='+', default=[1, 2, 4, 8, 16, 32])
    parser.add_argument('--parts', nargs='+', default=['loss', 'optimizer'], choices=['loss', 'optimizer'])
    parser.add_argument('--json', help='also write the rows here')
    args = parser.parse_args(argv)
    config = PRESETS[args.preset]
    rows = []
    if 'loss' in args.parts:
        rows += loss_rows(config, args.tokens, args.chunk_mem_const)
    if 'optimizer' in args.parts:
        rows += optimizer_rows(config, args.shards)
    device = f'{torch.cuda.get_device_name()}, torch {torch.__version__}'
    print(f'{args.preset}, {args.tokens} tokens, optimizer on 1/{args.shards} of the parameters; {device}')
    print(f"{'part':10} {'variant':40} {'ms':>9} {'peak GiB':>9}")
    for row in rows:
        print(f"{row['part']:10} {row['variant']:40} {row['ms']:>9.2f} {row.get('peak_gib', ''):>9}")
    if args.json:
        with open(args.json, 'w') as file:
            json.dump({'preset': args.preset, 'tokens': args.tokens, 'shards': args.shards, 'device': device,
                       'rows': rows}, file, indent=1)
    return 0


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
