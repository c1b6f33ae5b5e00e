"""Generation's cost on one GPU: ours (greedy, a KV cache, contexts batched by length) beside lm-evaluation-harness's
HF backend on the same weights and the same few-shot requests of a local GSM8K-like task (pip install
'llmfoundry_ext[eval]'; torchtitan's test tokenizer: bash ../shared/anchors/prepare.sh).

  python scripts/measure_generation.py --questions 500 --shots 4 --max-gen-toks 64 --dtypes float32 bfloat16 \\
      --generation-rows 128 --hf-batch-sizes 64 128 --json generation.json

Prints each row's seconds and exact_match, then each HF row beside ours of the same dtype: how much faster ours is,
and how many questions' generated texts differ (llmfoundry_ext/measure/generation.py says what the weights are).
"""
import argparse
import json
import sys

from llmfoundry_ext.measure.generation import run
from llmfoundry_ext.config import DownstreamConfig


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--work', default='/tmp/bench_generation')
    parser.add_argument('--questions', type=int, default=500)
    parser.add_argument('--shots', type=int, default=4)
    parser.add_argument('--max-gen-toks', type=int, default=64)
    parser.add_argument('--dtypes', nargs='+', default=['float32', 'bfloat16'], choices=('float32', 'bfloat16'))
    parser.add_argument('--generation-rows', type=int, nargs='+', default=[DownstreamConfig.generation_rows],
                        help="ours' contexts generated together (a row each)")
    parser.add_argument('--batch-tokens', type=int, default=DownstreamConfig.batch_tokens,
                        help="ours' tokens a forward reading the contexts")
    parser.add_argument('--hf-batch-sizes', type=int, nargs='+', default=[64, 128])
    parser.add_argument('--limit', type=int, help='time the first N questions only (few-shot drawn from all)')
    parser.add_argument('--warm-up', type=int, default=8, help='questions each row runs before it is timed')
    parser.add_argument('--preset', default='1b', help="the architecture (llama.py's PRESETS)")
    parser.add_argument('--device', default='cuda')
    parser.add_argument('--json')
    args = parser.parse_args(argv)
    report = run(args)
    if args.json:
        with open(args.json, 'w') as file:
            json.dump(report, file, indent=1)
    return 0


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
