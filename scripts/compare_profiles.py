"""Where two runs' GPU time goes, side by side: kernel time per step by category, GPU busy and idle time.

  python scripts/compare_profiles.py ours=trace.json torchtitan=rank0_trace.json [--kernels N] [--json table.json]

Each trace is a torch.profiler Chrome trace whose profiled steps are ProfilerStep#N ranges: those of
scripts/profile_run.py, or torchtitan's (its [profiling] traces, profile_traces/iteration_N/rank0_trace.json).
--kernels N also lists each trace's N kernels with the most time per step, --gaps N its N longest idle stretches
(the GPU waiting on the host: a sync, a slow launch) with the kernels either side. --timelines DIR writes each
trace's GPU work alone to DIR/NAME.timeline.json.gz (kernel, stream, start, duration: llmfoundry_ext.bench.profiling.
write_timeline), small enough to bring back from a GPU machine and line up ranks' kernels.
"""
import argparse
import json
import os
import sys

from llmfoundry_ext.bench.profiling import compare_traces, format_comparison, read_trace, top_kernels, write_timeline


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('traces', nargs='+', metavar='NAME=TRACE')
    parser.add_argument('--kernels', type=int, default=0, metavar='N', help="list each trace's top N kernels")
    parser.add_argument('--gaps', type=int, default=0, metavar='N', help="list each trace's N longest idle stretches")
    parser.add_argument('--json', help='also write the table here')
    parser.add_argument('--timelines', metavar='DIR', help="write each trace's GPU work to DIR/NAME.timeline.json.gz")
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
        if args.timelines:
            os.makedirs(args.timelines, exist_ok=True)
            label = name or os.path.basename(path).removesuffix('.json')  # unnamed traces each get their own file
            write_timeline(summary, os.path.join(args.timelines, f'{label}.timeline.json.gz'))
    rows = compare_traces(summaries)
    print(format_comparison(rows))
    print('steps: ' + ', '.join(f'{name} {s.steps}' for name, s in summaries.items()))
    kernels = {name: top_kernels(s, args.kernels) for name, s in summaries.items()} if args.kernels else {}
    for name, ranked in kernels.items():
        print(f'{name}: top {args.kernels} kernels, ms and calls per step')
        print('\n'.join(f"{k['ms']:>9.2f} {k['calls']:>7g}  {k['category']:<14} {k['kernel'][:140]}" for k in ranked))
    gaps = {name: s.gaps[:args.gaps] for name, s in summaries.items()} if args.gaps else {}
    for name, longest in gaps.items():
        print(f'{name}: {args.gaps} longest idle stretches of {summaries[name].steps} steps, ms')
        for gap in longest:
            print(f"{gap['ms']:>9.2f}  after {gap['after'][:70]}  before {gap['before'][:70]}")
            if gap.get('launched_in'):
                print(f"           launched in {gap['launched_in'][-200:]}")
            if gap.get('host_work'):
                print(f"           host did {gap['host_work']}")
    if args.json:
        with open(args.json, 'w') as file:
            json.dump({'steps': {name: s.steps for name, s in summaries.items()}, 'rows': rows, 'kernels': kernels,
                       'gaps': gaps}, file, indent=2)
    return 0


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
