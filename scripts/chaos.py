"""Kill a 2-process FSDP2 run with kill -9 at random moments (odd trials inside a checkpoint write), re-run
it with the same command until it finishes, and check each rank's losses and sample ids against an uninterrupted run.

  python scripts/chaos.py --trials 20 [--seed 0] [--folder chaos_run] [--json chaos.json]
"""
import argparse
import sys
import tempfile

from llmfoundry_ext.bench.chaos import HEADER, run, write_json


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--trials', type=int, default=20)
    parser.add_argument('--seed', type=int, default=0, help='chooses the kill points')
    parser.add_argument('--write-delay', type=float, default=0.02,
                        help='seconds slept after each item a checkpoint writes, so that a kill can land inside')
    parser.add_argument('--folder', help='keep the runs here (default: a temporary folder)')
    parser.add_argument('--json', help='write the table here')
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as temporary:
        print(HEADER, flush=True)
        results = run(args.folder or temporary, args.trials, args.seed, args.write_delay,
                      report=lambda row: print(row, flush=True))
    same = sum(result.identical for result in results)
    inside = sum(bool(result.killed_inside_write) for result in results)
    print(f'{same} of {len(results)} resumed runs identical to the uninterrupted one; {inside} kills inside a '
          f'checkpoint write')
    if args.json:
        write_json(results, args.json)
    return 0 if same == len(results) else 1


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
