"""Loader throughput: tokens/s that the StreamingDataLoader + collator deliver, per worker count.

  python scripts/measure_loader.py [--seq-len 8192] [--batches 300] [--json out.json]

Writes uint32 MDS shards (zstd) of random tokens to a temporary folder, then times full passes of the
training loader (shuffle on, the causal-LM collator) with 0, 1 and 2 workers. The bar: 20x what one H100
consumes training the 1B model (~50,000 tokens/s), so >= 1,000,000 tokens/s per worker.
"""
import argparse
import sys

from llmfoundry_ext.measure.loader import loader_rows


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--seq-len', type=int, default=8192)
    parser.add_argument('--batch-size', type=int, default=8)
    parser.add_argument('--batches', type=int, default=300)
    parser.add_argument('--json', help='also write the rows here')
    args = parser.parse_args(argv)
    return loader_rows(args)


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
