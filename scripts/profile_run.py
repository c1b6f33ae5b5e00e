"""Profile a few training steps of a run and print where the time goes, by kernel category.

  python scripts/profile_run.py yamls/llama1b.yaml global_batch_size=1 device_microbatch_size=1 \
      [--warmup 3] [--steps 3] [--trace trace.json] [--json table.json] [--syncs] [--python] [--model hf]

The run's data is replaced by random tokens (the model, parallelism and precision are the YAML's; --model hf or
hf-loop trains transformers' model of that shape instead, as scripts/measure_speed.py's hf: rows do). Writes a
Chrome/Perfetto trace per rank (rank 0's at --trace, rank R's at its stem.rankR.json; open in ui.perfetto.dev)
and prints rank 0's category table (GPU kernels on a GPU, CPU operators otherwise); --syncs also lists where the
last warm-up batch made the host wait for the GPU.
(Not named profile.py: in scripts/ that would shadow Python's own ``profile``
module for every script there.) Launch with `composer -n N scripts/profile_run.py ...` for several GPUs.
"""
import argparse
import sys

from llmfoundry_ext.measure.benchmark import HF_EXPERTS
from llmfoundry_ext.measure.profile_run import profile_run


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('yaml')
    parser.add_argument('overrides', nargs='*', help='key=value')
    parser.add_argument('--warmup', type=int, default=3)
    parser.add_argument('--steps', type=int, default=3)
    parser.add_argument('--trace', default='trace.json')
    parser.add_argument('--json', help='also write the table here')
    parser.add_argument('--syncs', action='store_true', help="list the last warm-up batch's host syncs")
    parser.add_argument('--python', action='store_true',
                        help='record Python frames too (slower): what the host ran in an idle stretch')
    parser.add_argument('--model', choices=['ours', *HF_EXPERTS], default='ours',
                        help="ours, or transformers' model of the YAML's shape (hf-loop: its per-expert loop)")
    args = parser.parse_args(argv)
    return profile_run(args)


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
