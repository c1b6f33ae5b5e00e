"""GPU time of parts of the training step, for a preset's shapes on one GPU (attention: on a ring of GPUs).

  python scripts/measure_step_parts.py --preset 8b --tokens 8192 [--shards 2] [--json out.json]
  torchrun --nproc_per_node 2 scripts/measure_step_parts.py --preset 8b --tokens 131072 --parts attention

loss: the output layer and cross-entropy, forward and backward, from bf16 hidden states and weight: liger's
fused kernel at several ``chunk_mem_const`` (its transient logits are at most that many times the hidden
states; 1, liger's default, cuts 8,192 tokens of the 8B into 32 chunks) beside the logits GEMM with a compiled
cross-entropy (torchtitan's loss path). optimizer: AdamW (fused / foreach) and norm clipping on one rank's fp32
shard of the preset's parameters (``--shards``: the FSDP degree), as in the 8B on 2 GPUs. attention: one layer's
causal attention, forward and backward, over ``--tokens`` per sequence, for each ``model.sdpa_kernel`` as the model
calls it (auto passes ``enable_gqa``; a pinned kernel gets key/value heads repeated to the query heads) and for
cuDNN and flash pinned with ``enable_gqa`` (torchtitan's call: cuDNN first); launched on N processes, each sequence
is split over them by context parallelism (ring attention, head-tail balanced). TFLOP/s per GPU count causal
attention (forward 2·S²·H·D, backward 2.5x that); the kernel named is the one with most GPU time.
"""
import argparse
import sys

from llmfoundry_ext.measure.step_parts import run
from llmfoundry_ext.model.llama import PRESETS


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--preset', default='8b', choices=sorted(PRESETS))
    parser.add_argument('--tokens', type=int, default=8192, help='tokens per micro-batch (batch x sequence)')
    parser.add_argument('--shards', type=int, default=2, help='FSDP degree: the optimizer sees 1/shards of the model')
    parser.add_argument('--chunk-mem-const', type=int, nargs='+', default=[1, 2, 4, 8, 16, 32])
    parser.add_argument('--parts', nargs='+', default=['loss', 'optimizer'],
                        choices=['loss', 'optimizer', 'attention'])
    parser.add_argument('--json', help='also write the rows here')
    args = parser.parse_args(argv)
    return run(args)


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
