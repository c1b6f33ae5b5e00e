"""One process of a two-process context-parallel check (``tests/forked_launch.py -n 2``): the same model and batch
run whole on rank 0 and split over the two (``parallelism.ContextParallel``), the split one's blocks
checkpointed as ``--checkpointing`` says; rank 0 writes the losses, the gradients' relative difference and (eager)
how many attention forwards the split run's backward ran again, as JSON. The gradients of the split run are averaged
over the ranks, as FSDP2 does.

    python tests/forked_launch.py -n 2 tests/context_parallel_worker.py OUT.json \\
        --device cuda --backend sdpa --seq 16384 [--documents] [--bf16] [--compile] [--forward-only] \\
        [--checkpointing none|full|selective|full_except_attention]
"""
import argparse
import contextlib
import copy
import json
import sys
import time

import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode

from llmfoundry_ext.data.collate import document_positions, next_token_labels
from llmfoundry_ext.model.composer_model import token_mean_cross_entropy
from llmfoundry_ext.model.kernels import KernelConfig
from llmfoundry_ext.model.llama import LlamaConfig, Transformer
from llmfoundry_ext.parallelism import (ATTENTION_OPS, ContextParallel, checkpoint_options, compile_blocks,
                                       named_ops)

SMALL = LlamaConfig(dim=256, n_layers=2, n_heads=8, n_kv_heads=2, ffn_dim=512, vocab_size=1024, max_seq_len=131072,
                    rope_theta=500000.0, rope_scaling_factor=1.0, tie_embeddings=False)
EOS = 7


def batch(seq_len: int, documents: bool, device) -> dict:
    """Two sequences of random ids with EOS about every 1,000 tokens; some labels -100 beyond the last, unevenly
    placed, so the ranks' shares of labelled tokens differ."""
    generator = torch.Generator().manual_seed(1)
    input_ids = torch.randint(8, SMALL.vocab_size, (2, seq_len), generator=generator)
    input_ids[torch.rand(2, seq_len, generator=generator) < 1e-3] = EOS
    labels = next_token_labels(input_ids)
    labels[0, : seq_len // 8] = -100
    result = {'input_ids': input_ids, 'labels': labels}
    if documents:
        result['position_ids'] = document_positions(input_ids, EOS)
    return {key: value.to(device) for key, value in result.items()}


class CountAttentions(TorchDispatchMode):
    """How many attention forwards ran (the ring's SDPA op, seen before DTensor runs the ring)."""
    def __init__(self):
        super().__init__()
        self.ops, self.count = named_ops(ATTENTION_OPS, ()), 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += func in self.ops
        return func(*args, **(kwargs or {}))


def loss_and_grads(model: Transformer, data: dict, bf16: bool, counter=None) -> tuple[torch.Tensor, dict]:
    precision = torch.autocast(data['input_ids'].device.type, torch.bfloat16) if bf16 else contextlib.nullcontext()
    with precision:
        logits = model(data['input_ids'], data.get('position_ids'), None, data.get('attention_mask'))
    loss = token_mean_cross_entropy(logits, data['labels']) * data.get('loss_scale', 1.0)
    if not torch.is_grad_enabled():
        return loss.detach(), {}
    with counter or contextlib.nullcontext():
        loss.backward()
    return loss.detach(), {name: p.grad.float() for name, p in model.named_parameters()}


def relative_difference(grads: dict, expected: dict) -> float:
    difference = sum((grads[name] - grad).norm() ** 2 for name, grad in expected.items()) ** 0.5
    return (difference / sum(grad.norm() ** 2 for grad in expected.values()) ** 0.5).item()


def progress(rank: int, done: str, started: float) -> None:
    """A line on stderr as each part ends: a run cut by a time limit shows where it was."""
    print(f'rank {rank}: {done} done at {time.perf_counter() - started:.1f} s', file=sys.stderr, flush=True)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument('out')
    parser.add_argument('--device', default='cuda')
    parser.add_argument('--backend', default='sdpa')
    parser.add_argument('--seq', type=int, default=16384)
    parser.add_argument('--documents', action='store_true')
    parser.add_argument('--bf16', action='store_true')
    parser.add_argument('--compile', action='store_true')
    parser.add_argument('--forward-only', action='store_true')
    parser.add_argument('--checkpointing', default='none')
    args = parser.parse_args()
    dist.init_process_group('nccl' if args.device == 'cuda' else 'gloo')
    rank = dist.get_rank()
    device = torch.device(args.device, rank) if args.device == 'cuda' else torch.device('cpu')
    if args.device == 'cuda':
        torch.cuda.set_device(device)
    torch.manual_seed(0)
    whole = Transformer(SMALL, KernelConfig(attn_impl=args.backend)).to(device)
    split = copy.deepcopy(whole)
    context_parallel = ContextParallel(2, args.backend, causal=True)
    context_parallel.apply(split)
    for block in split.layers if args.checkpointing != 'none' else ():
        block.checkpointing = checkpoint_options(args.checkpointing)
    counter = None if args.compile else CountAttentions()  # a compiled backward is one op the mode cannot see into
    if args.compile:
        compile_blocks(whole, None)
        compile_blocks(split, context_parallel)
    data = batch(args.seq, args.documents, device)
    started = time.perf_counter()
    with torch.set_grad_enabled(not args.forward_only):
        if rank == 0:  # the reference, which rank 0 alone compares with (rank 1 would compile and run it again)
            expected_loss, expected = loss_and_grads(whole, data, args.bf16)
            progress(rank, 'the whole sequence', started)
        loss, grads = loss_and_grads(split, split.context_parallel.shard(data), args.bf16, counter)
        progress(rank, 'context parallel', started)
    dist.all_reduce(loss)
    for grad in grads.values():
        dist.all_reduce(grad)
        grad /= 2
    if rank == 0:
        result = {'expected_loss': expected_loss.item(), 'loss': loss.item() / 2,
                  'gradient_difference': relative_difference(grads, expected) if grads else None,
                  'backward_attention_forwards': counter and counter.count}
        with open(args.out, 'w') as file:
            json.dump(result, file)
    dist.destroy_process_group()


if __name__ == '__main__':
    main()
