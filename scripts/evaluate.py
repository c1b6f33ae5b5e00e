"""Downstream tasks of lm-evaluation-harness on a trained model, scored by our model (pip install
'llmfoundry_ext[eval]'):

  python scripts/evaluate.py <run-folder | checkpoint | HF folder> --tasks hellaswag arc_easy \\
      [--include tasks/] [--limit 1000] [--num-fewshot 0] [--device cuda] [--json results.json]

  composer -n 8 scripts/evaluate.py <run-folder> --tasks hellaswag ...   # each process its share of the documents

A run folder is read at its latest checkpoint (sharded or monolithic, written at any world size), with the run's
tokenizer; task names are the harness's, or those of task YAMLs given with --include (files or folders; the data on
disk, e.g. dataset_path: json with data_files). Under a launcher (WORLD_SIZE > 1) every process reads the weights,
the model is sharded over them with FSDP2 (a unit a block) and each scores its share of every task's documents.
Prints the harness's table; --json writes its results and each sample's log-likelihoods.
"""
import sys

import torch

from llmfoundry_ext.cli import ArgumentParser, positive_int
from llmfoundry_ext.config import DownstreamConfig
from llmfoundry_ext.downstream import evaluate_weights, exit_process


def main(argv: list[str]) -> int:
    parser = ArgumentParser(prog='evaluate.py', description=__doc__)
    parser.add_argument('source', help='a run folder, one checkpoint, or an HF / native weights folder')
    parser.add_argument('--tasks', nargs='+', required=True)
    parser.add_argument('--include', nargs='+', default=[], help='task YAML files or folders')
    parser.add_argument('--limit', type=float, help='examples per task (a fraction if below 1)')
    parser.add_argument('--num-fewshot', type=int)
    parser.add_argument('--tokenizer', help="tokenizer folder (default: the source's)")
    parser.add_argument('--batch-tokens', type=positive_int, default=8192, help='tokens a forward (default 8192)')
    parser.add_argument('--generation-rows', type=positive_int, default=DownstreamConfig.generation_rows,
                        help='contexts generated together (default %(default)s)')
    parser.add_argument('--device', default='cuda' if torch.cuda.is_available() else 'cpu')
    parser.add_argument('--dtype', default='bfloat16', choices=('bfloat16', 'float32'),
                        help="the weights' dtype on a GPU, as the HF backend's dtype (the CPU scores in float32)")
    parser.add_argument('--json')
    args = parser.parse_args(argv)
    return evaluate_weights(args.source, args.tasks, args.include, args.limit, args.num_fewshot, args.tokenizer,
                            args.batch_tokens, args.generation_rows, args.device, args.dtype, args.json)

if __name__ == '__main__':
    exit_process(main(sys.argv[1:]))
