"""What ``scripts/compare_profiles.py`` and ``scripts/line_up_ranks.py`` print from traces and timelines (read and
summed by ``profiling``)."""
import json
import os
import sys

from llmfoundry_ext.measure.profiling import (collective_stats, compare_traces, format_comparison, interleave,
                                            read_timeline, read_trace, top_kernels, write_timeline)


def compare_report(args) -> int:
    """``scripts/compare_profiles.py``'s arguments -> the traces' categories side by side (and their top kernels, longest
    idle stretches, timelines, JSON); 2 when a trace is missing or has no profiler steps."""
    summaries = {}
    for named in args.traces:
        name, _, path = named.rpartition('=')
        if not os.path.isfile(path):
            print(f'error: {path}: no such trace; did its profiling run fail? (its log says why)', file=sys.stderr)
            return 2
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


def line_up_report(args) -> int:
    """``scripts/line_up_ranks.py``'s arguments -> each timeline's communication kernels, and the ranks' kernels
    interleaved around one."""
    timelines = {name: read_timeline(path) for name, _, path in (t.rpartition('=') for t in args.timelines)}
    for name, events in timelines.items():
        print(f'{name}: communication kernels per stream      calls   total ms  median ms     max ms')
        for row in collective_stats(events):
            print(f"  stream {row['stream']:<4} {row['kernel'][:30]:<30} {row['calls']:>6} {row['total_ms']:>10.1f} "
                  f"{row['median_ms']:>10.2f} {row['max_ms']:>10.2f}")
    if args.around:
        print(f'{"":<12}{"stream":>6}{"start ms":>12}{"ms":>9}  kernel')
        for name, stream, start, duration, kernel in interleave(timelines, args.around, args.index, args.before,
                                                                args.after):
            print(f'{name:<12}{stream:>6}{start:>12.1f}{duration:>9.2f}  {kernel[:90]}')
    return 0
