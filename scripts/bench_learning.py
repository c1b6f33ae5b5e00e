"""The learning benchmark: ours beside torchtitan and transformers' Llama on the same tokens of a real text.

  python scripts/bench_learning.py --steps 500 --seeds 1 2 --json learning.json --versus ours:torchtitan \\
      --row 'ours yamls/llama1b.yaml global_batch_size=2 model.tie_embeddings=false' \\
      --row 'torchtitan torchtitan:compile FLAVOR=1B LBS=2' \\
      --row 'hf hf:yamls/llama1b.yaml global_batch_size=2 model.tie_embeddings=false' --single-seed hf

Rows as scripts/benchmark.py's. Every row trains --steps steps with AdamW (lr --lr, betas 0.9/0.95, weight decay
0.1), --warmup steps of linear warm-up then a linear decay to 0, clipping at 1.0, on the same documents in the same
order: Python source of this machine's installed packages (--corpus-mb), torchtitan's test tokenizer (bash
../shared/anchors/prepare.sh). Prints each row's mean loss per --window steps (mean over seeds, their range) and,
for each --versus OURS:THEIRS, whether ours stays within 1 % of theirs from step 100 on and ends at or below.
"""
import argparse
import json
import sys
import site
import tempfile

from llmfoundry_ext.bench.benchmark import Row
from llmfoundry_ext.bench.learning import Hyper, Plan, merge_reports, prepare_data, print_report, run


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--row', action='append', default=[], help="'NAME SOURCE key=value ...' (repeatable)")
    parser.add_argument('--report', nargs='+', help='print the table of saved JSON files instead of training')
    parser.add_argument('--rename', action='append', default=[], metavar='[FILE:]OLD=NEW',
                        help="with --report: row OLD (of FILE's rows only) counted as row NEW (the same settings)")
    parser.add_argument('--seeds', type=int, nargs='+', default=[1, 2])
    parser.add_argument('--single-seed', action='append', default=[], help='a row name trained on the first seed only')
    parser.add_argument('--steps', type=int, default=500)
    parser.add_argument('--lr', type=float, default=3e-4)
    parser.add_argument('--warmup', type=int, default=20)
    parser.add_argument('--window', type=int, default=50)
    parser.add_argument('--gpus', type=int, default=1)
    parser.add_argument('--corpus-mb', type=float, default=40.0)
    parser.add_argument('--roots', nargs='+', default=site.getsitepackages(), help='folders of *.py (default: '
                        "this Python's installed packages)")
    parser.add_argument('--seq-len', type=int, default=8192, help="tokens a sample (torchtitan's seq_len)")
    parser.add_argument('--work', help='folder for the corpus, shards and rows (default: a temporary one)')
    parser.add_argument('--versus', action='append', default=[], help="'OURS:THEIRS' row names")
    parser.add_argument('--shared-init', metavar='ROW', help="every row of a seed starts from the fresh weights "
                        "ROW's model draws for that seed ('NAME SOURCE key=value ...'; else each row draws its own)")
    parser.add_argument('--json', help='write the results here')
    args = parser.parse_args(argv)
    if args.report:
        report = merge_reports(args.report, args.versus, args.rename)
        print_report(report)
        if args.json:
            with open(args.json, 'w') as file:
                json.dump(report, file, indent=1)
        return 0 if all(verdict['holds'] for verdict in report['verdicts']) else 1
    if not args.row:
        parser.error('give at least one --row, or --report FILES')
    plan = Plan([Row.parse(text) for text in args.row], args.seeds, tuple(args.single_seed),
                Hyper(steps=args.steps, lr=args.lr, warmup=args.warmup), args.window, args.gpus,
                args.shared_init and Row.parse(args.shared_init))
    with tempfile.TemporaryDirectory() as scratch:
        work = args.work or scratch
        data = prepare_data(work, args.roots, args.corpus_mb, args.seq_len)
        print(f"corpus: {data['documents']:,} documents, {data['megabytes']:.1f} MB, {data['tokens']:,} tokens",
              flush=True)
        report = run(plan, data, work, args.versus, args.json)
    return 0 if all(verdict['holds'] for verdict in report['verdicts']) else 1


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
