"""Benchmark training throughput of YAML runs, with transformers' Llama under the same Composer FSDP2 as baseline.

  python scripts/benchmark.py --gpus 1 --steps 10 --json bench.json \\
      --row 'hf yamls/llama1b.yaml global_batch_size=1 device_microbatch_size=1' \\
      --row 'ours yamls/llama1b.yaml global_batch_size=1 device_microbatch_size=1' \\
      --row 'ours-compiled yamls/llama1b.yaml global_batch_size=1 device_microbatch_size=1 model.compile=true'

Each --row is 'NAME YAML key=value ...'; a NAME of 'hf' (or 'hf:...') trains transformers' LlamaForCausalLM
(sdpa) of the YAML's shape instead of ours. Data are random tokens with EOS closing documents of
--mean-document-tokens on average (the same tokens in every row), so masked and unmasked rows compare on the
same data. Prints tokens/s per GPU, MFU, mean step time and peak memory per row, each against the --baseline
row (default: the first), and writes them as JSON.
"""
import argparse
import json
import os
import sys
import tempfile

from llmfoundry_ext.benchmark import Row, format_table, measure, run_row


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--row', action='append', default=[], help="'NAME YAML key=value ...' (repeatable)")
    parser.add_argument('--gpus', type=int, default=1)
    parser.add_argument('--warmup', type=int, default=5, help='untimed batches (compilation, allocator warm-up)')
    parser.add_argument('--steps', type=int, default=10, help='timed batches; their mean step time is reported')
    parser.add_argument('--mean-document-tokens', type=int, default=1024)
    parser.add_argument('--baseline', help='row name the ratios refer to (default: the first row)')
    parser.add_argument('--json', help='write the results here')
    parser.add_argument('--worker', help=argparse.SUPPRESS)  # one row, inside composer -n GPUS
    args = parser.parse_args(argv)
    if args.worker:
        return work(args)
    if not args.row:
        parser.error('give at least one --row')
    rows = [Row.parse(text) for text in args.row]
    results = []
    with tempfile.TemporaryDirectory() as folder:
        for i, row in enumerate(rows):
            results.append(run_row(os.path.abspath(__file__), row, args.gpus, args.warmup, args.steps,
                                   args.mean_document_tokens, os.path.join(folder, f'{i}.json')))
            print('=== ' + format_table(results[-1:], None).splitlines()[1], flush=True)
    table = format_table(results, args.baseline or rows[0].name)
    first = next((r for r in results if 'error' not in r), None)
    if first:
        print(f"\n{first['gpus']} x {first['device']}, torch {first['torch']}; mean of {args.steps} steps after "
              f"{args.warmup} warm-up; documents of {args.mean_document_tokens} tokens on average")
    print(table)
    if args.json:
        with open(args.json, 'w') as file:
            json.dump({'rows': results, 'warmup': args.warmup, 'steps': args.steps,
                       'mean_document_tokens': args.mean_document_tokens}, file, indent=2)
    return 0 if all('error' not in r for r in results) else 1


def work(args) -> int:
    from composer.utils import dist

    row = Row.parse(args.worker)
    with tempfile.TemporaryDirectory() as folder:
        result = measure(row, args.warmup, args.steps, args.mean_document_tokens, folder)
    if dist.get_global_rank() == 0:
        with open(args.json, 'w') as file:
            json.dump(result, file)
    return 0


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
