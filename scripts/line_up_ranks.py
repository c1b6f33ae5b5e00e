"""Line up the ranks' GPU work from compare_profiles.py --timelines files: who waited for whom.

  python scripts/line_up_ranks.py rank0=ours.timeline.json.gz rank1=ours-rank1.timeline.json.gz \\
      [--around SendRecv --index 30 --before 400 --after 700]

Lists each timeline's communication kernels per stream (calls, total, median and longest ms: a collective that
waits for another rank lasts as long as the wait), then, with --around, every kernel of all timelines in the window
around the --index-th kernel whose name contains --around in the first one, on the ranks' common clock (one host).
"""
import argparse
import sys

from llmfoundry_ext.measure.trace_report import line_up_report


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('timelines', nargs='+', metavar='NAME=TIMELINE')
    parser.add_argument('--around', metavar='KERNEL', help='a part of a kernel name of the first timeline')
    parser.add_argument('--index', type=int, default=0, help='which of those kernels (0: the first)')
    parser.add_argument('--before', type=float, default=400.0, help='ms of the window before it')
    parser.add_argument('--after', type=float, default=700.0, help='ms of the window after it')
    args = parser.parse_args(argv)
    return line_up_report(args)


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
