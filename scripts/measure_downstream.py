"""Downstream evaluation's cost: ours in the training loop beside lm-evaluation-harness's HF backend on the same
weights (the checkpoint exported with to-hf), on a local HellaSwag-like task (pip install 'llmfoundry_ext[eval]').

  python scripts/measure_downstream.py --questions 1000 --batches 200 --interval 100 --json downstream.json \\
      [--gpus N] [--hf-batch-sizes auto 64] [--against OTHER.json] [--rescore] [override ...]

The text, tokenizer and shards are the learning benchmark's (its --corpus-mb of Python source, torchtitan's test
tokenizer: bash ../shared/anchors/prepare.sh). The task is made of pieces of that source the corpus left out: two
lines of a file, and four candidates for the next line (the real one, a line of each of three other files), as a
harness task YAML (dataset_path: json). Ours trains yamls/llama1b.yaml with the learning benchmark's settings (and
the overrides given) for --batches batches, scoring the task every --interval batches in the loop, and saves its
last checkpoint; that checkpoint is exported with to-hf and the harness's own HF backend (``HFLM``, bf16) scores the
task at each --hf-batch-sizes (none: no export). --gpus N trains on N GPUs with the same global batch, from the same
weights (seed 1's, drawn on the CPU); --against a report of another run (its --json) prints each evaluation's metrics
beside that run's; --rescore scores the last checkpoint again in one process: the in-loop evaluation (sharded over
--gpus) beside it on the same weights. Prints each evaluation's seconds, the metrics, how far each question's
log-likelihoods differ, and what an evaluation adds to 1,000 batches.
"""
import argparse
import site
import sys

from data_prep.demo_corpus import write_held_out_task
from llmfoundry_ext.measure.downstream import TASK, run
from llmfoundry_ext.measure.learning import prepare_data


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('overrides', nargs='*', help='key=value for the training YAML')
    parser.add_argument('--work', default='/tmp/bench_downstream')
    parser.add_argument('--questions', type=int, default=1000)
    parser.add_argument('--batches', type=int, default=200)
    parser.add_argument('--interval', type=int, default=100)
    parser.add_argument('--batch-tokens', type=int, default=16384, help="ours' tokens a forward")
    parser.add_argument('--gpus', type=int, default=1, choices=(1, 2))
    parser.add_argument('--hf-batch-sizes', nargs='*', default=['auto', '64'])
    parser.add_argument('--corpus-mb', type=float, default=8.0)
    parser.add_argument('--seq-len', type=int, default=8192)
    parser.add_argument('--roots', nargs='+', default=site.getsitepackages())
    parser.add_argument('--device', default='cuda')
    parser.add_argument('--profile', help='write where ours out of the loop spends an evaluation to this file')
    parser.add_argument('--json')
    parser.add_argument('--rescore', action='store_true',
                        help="score the last checkpoint again in this one process (scripts/evaluate.py's path) and "
                             "print its metrics and log-likelihoods beside the last in-loop evaluation's")
    parser.add_argument('--against', help="another run's --json: each evaluation's metrics beside this run's")
    args = parser.parse_args(argv)
    data = prepare_data(args.work, args.roots, args.corpus_mb, args.seq_len)
    return run(args, data, write_held_out_task(args.work, data, args.roots, args.questions, TASK))


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
