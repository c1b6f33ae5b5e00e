"""Where two runs' GPU time goes, side by side: kernel time per step by category, GPU busy and idle time.

  python scripts/compare_profiles.py ours=trace.json torchtitan=rank0_trace.json [--kernels N] [--json table.json]

Each trace is a torch.profiler Chrome trace whose profiled steps are ProfilerStep#N ranges: those of
scripts/profile_run.py, or torchtitan's (its [profiling] traces, profile_traces/iteration_N/rank0_trace.json).
--kernels N also lists each trace's N kernels with the most time per step, --gaps N its N longest idle stretches
(the GPU waiting on the host: a sync, a slow launch) with the kernels either side. --timelines DIR writes each
trace's GPU work alone to DIR/NAME.timeline.json.gz (kernel, stream, start, duration: llmfoundry_ext.measure.profiling.
write_timeline), small enough to bring back from a GPU machine and line up ranks' kernels.
"""
import argparse
import sys

from llmfoundry_ext.measure.trace_report import compare_report


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('traces', nargs='+', metavar='NAME=TRACE')
    parser.add_argument('--kernels', type=int, default=0, metavar='N', help="list each trace's top N kernels")
    parser.add_argument('--gaps', type=int, default=0, metavar='N', help="list each trace's N longest idle stretches")
    parser.add_argument('--json', help='also write the table here')
    parser.add_argument('--timelines', metavar='DIR', help="write each trace's GPU work to DIR/NAME.timeline.json.gz")
    args = parser.parse_args(argv)
    return compare_report(args)


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
