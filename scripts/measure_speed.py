"""Benchmark training throughput of YAML runs beside transformers' Llama and torchtitan, on the same machine.

  python scripts/measure_speed.py --gpus 2 --warmup 5 --steps 10 --json bench.json \\
      --row 'ours-8b yamls/llama8b.yaml global_batch_size=2' \\
      --row 'titan-8b torchtitan:compile FLAVOR=8B LBS=1' \\
      --row 'hf hf:yamls/llama1b.yaml global_batch_size=1 device_microbatch_size=1' \\
      --versus ours-8b:titan-8b

Each --row is 'NAME SOURCE key=value ...': SOURCE a YAML (our model, as that YAML and its overrides set it up;
with no override but the batch it is the YAML as shipped), 'hf:YAML' (transformers' LlamaForCausalLM, sdpa, of
that YAML's shape under the same Composer FSDP2 settings) or 'torchtitan:SETTING' (torchtitan v0.2.2 through
.anchors/run.sh SETTING with KEY=VALUE as its environment: FLAVOR, LBS, SEQ; see bash ../shared/anchors/prepare.sh).
Our data are random tokens with EOS closing documents of --mean-document-tokens on average, the same in every row.
Prints tokens/s per GPU, MFU, mean step time and peak memory per row against the --baseline row (default: the
first), each --versus pair's ratio, and writes them all as JSON.
"""
import argparse
import sys

from llmfoundry_ext.measure.benchmark import run_rows, work


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--row', action='append', default=[], help="'NAME SOURCE key=value ...' (repeatable)")
    parser.add_argument('--gpus', type=int, default=1)
    parser.add_argument('--warmup', type=int, default=5, help='untimed steps (compilation, allocator warm-up)')
    parser.add_argument('--steps', type=int, default=10, help='timed steps; tokens/s is over all of them')
    parser.add_argument('--mean-document-tokens', type=int, default=1024)
    parser.add_argument('--baseline', help='row name the ratios refer to (default: the first row)')
    parser.add_argument('--versus', action='append', default=[], help="'OURS:THEIRS' row names to compare")
    parser.add_argument('--json', help='write the results here')
    parser.add_argument('--worker', help=argparse.SUPPRESS)  # one row, inside composer -n GPUS
    parser.add_argument('--worker-yaml', help=argparse.SUPPRESS)
    parser.add_argument('--export', help=argparse.SUPPRESS)  # the worker's trained weights for transformers' check
    args = parser.parse_args(argv)
    if args.worker:
        return work(args)
    if not args.row:
        parser.error('give at least one --row')
    return run_rows(args)


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
