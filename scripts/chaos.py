"""Kill a 2-process FSDP2 run with kill -9 at random moments (odd trials inside a checkpoint write), re-run
it with the same command until it finishes, and check each rank's losses and sample ids against an uninterrupted run.

  python scripts/chaos.py --trials 20 [--seed 0] [--folder chaos_run] [--json chaos.json]
"""
import argparse
import sys

from llmfoundry_ext.measure.chaos import trials_command


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--trials', type=int, default=20)
    parser.add_argument('--seed', type=int, default=0, help='chooses the kill points')
    parser.add_argument('--write-delay', type=float, default=0.02,
                        help='seconds slept after each item a checkpoint writes, so that a kill can land inside')
    parser.add_argument('--folder', help='keep the runs here (default: a temporary folder)')
    parser.add_argument('--json', help='write the table here')
    return trials_command(parser.parse_args(argv))


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
