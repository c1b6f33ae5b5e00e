"""Where two runs' GPU time goes, side by side: kernel time per step by category, GPU busy and idle time.

  python scripts/compare_profiles.py ours=trace.json torchtitan=rank0_trace.json [--json table.json]

Each trace is a torch.profiler Chrome trace whose profiled steps are ProfilerStep#N ranges: those of
scripts/profile_run.py, or torchtitan's (its [profiling] traces, profile_traces/iteration_N/rank0_trace.json).
"""
import argparse
import json
import sys

from llmfoundry_ext.profiling import compare_traces, format_comparison, read_trace


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('traces', nargs='+', metavar='NAME=TRACE')
    parser.add_argument('--json', help='also write the table here')
    args = parser.parse_args(argv)
    summaries = {}
    for named in args.traces:
        name, _, path = named.rpartition('=')
        summary = read_trace(path)
        if not summary.steps:
            print(f'error: {path} has no ProfilerStep#N ranges: profile it with scripts/profile_run.py or '
                  "torchtitan's profiler", file=sys.stderr)
            return 2
        summaries[name or path] = summary
    rows = compare_traces(summaries)
    print(format_comparison(rows))
    print('steps: ' + ', '.join(f'{name} {s.steps}' for name, s in summaries.items()))
    if args.json:
        with open(args.json, 'w') as file:
            json.dump({'steps': {name: s.steps for name, s in summaries.items()}, 'rows': rows}, file, indent=2)
    return 0


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
