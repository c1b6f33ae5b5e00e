"""Milliseconds of one optimizer step over a YAML's parameters on one GPU: torch's fused AdamW beside
compiled_adamw, and a plain copy of as many bytes as the reference of the GPU's memory bandwidth.

  python scripts/measure_optimizer.py yamls/mixtral8x7b.yaml model.n_layers=2 --json optimizer.json
"""
import argparse
import sys

from llmfoundry_ext.measure.optimizer_step import optimizer_rows, parameter_shapes, report


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('yaml')
    parser.add_argument('overrides', nargs='*', help='key=value, as train.py takes them')
    parser.add_argument('--steps', type=int, default=10)
    parser.add_argument('--warmup', type=int, default=3, help='untimed steps (compilation)')
    parser.add_argument('--json', help='also write the rows here')
    args = parser.parse_intermixed_args(argv)
    shapes = parameter_shapes(args.yaml, args.overrides)
    rows = optimizer_rows(shapes, args.steps, args.warmup)
    print(report(rows, sum(shape.numel() for shape in shapes), args.json))
    return 0


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
