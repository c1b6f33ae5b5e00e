"""Profile a few training steps of a run and print where the time goes, by kernel category.

  python scripts/profile_run.py yamls/llama1b.yaml global_batch_size=1 device_microbatch_size=1 \
      [--warmup 3] [--steps 3] [--trace trace.json] [--json table.json] [--syncs] [--python] [--model hf]

The run's data is replaced by random tokens (the model, parallelism and precision are the YAML's; --model hf or
hf-loop trains transformers' model of that shape instead, as scripts/benchmark.py's hf: rows do). Writes a
Chrome/Perfetto trace per rank (rank 0's at --trace, rank R's at its stem.rankR.json; open in ui.perfetto.dev)
and prints rank 0's category table (GPU kernels on a GPU, CPU operators otherwise); --syncs also lists where the
last warm-up batch made the host wait for the GPU.
(Not named profile.py: in scripts/ that would shadow Python's own ``profile``
module for every script there.) Launch with `composer -n N scripts/profile_run.py ...` for several GPUs.
"""
import argparse
import json
import os
import shutil
import sys
import tempfile

from composer.utils import dist, get_device

from llmfoundry_ext.benchmark import HF_EXPERTS, HFCausalLM
from llmfoundry_ext.errors import ConfigError
from llmfoundry_ext.preflight import prepare
from llmfoundry_ext.profiling import ProfileSteps, SyncReport, category_table, format_table, self_times
from llmfoundry_ext.synthetic import synthetic_run_yaml
from llmfoundry_ext.train import train


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('yaml')
    parser.add_argument('overrides', nargs='*', help='key=value')
    parser.add_argument('--warmup', type=int, default=3)
    parser.add_argument('--steps', type=int, default=3)
    parser.add_argument('--trace', default='trace.json')
    parser.add_argument('--json', help='also write the table here')
    parser.add_argument('--syncs', action='store_true', help="list the last warm-up batch's host syncs")
    parser.add_argument('--python', action='store_true',
                        help='record Python frames too (slower): what the host ran in an idle stretch')
    parser.add_argument('--model', choices=['ours', *HF_EXPERTS], default='ours',
                        help="ours, or transformers' model of the YAML's shape (hf-loop: its per-expert loop)")
    args = parser.parse_args(argv)
    dist.initialize_dist(get_device(None))
    folder = shared_folder()
    try:
        profiler, syncs = profile_synthetic_run(args, folder)
    finally:
        dist.barrier()
        if dist.get_local_rank() == 0:
            shutil.rmtree(folder, ignore_errors=True)
    if profiler is None:
        return 2
    profiler.profile.export_chrome_trace(rank_trace(args.trace, dist.get_global_rank()))
    if dist.get_global_rank() == 0:
        if syncs is not None:
            print(syncs.report())
        rows = category_table(self_times(profiler.profile))
        print(f'\n{args.yaml} ({args.model}): {args.steps} profiled steps after {args.warmup} warm-up; trace in '
              f'{args.trace}')
        if profiler.allocator:
            print('allocator in those steps: ' + ', '.join(f'{key} {n}' for key, n in profiler.allocator.items()))
        print(format_table(rows, args.steps))
        if args.json:
            with open(args.json, 'w') as file:
                json.dump({'yaml': args.yaml, 'overrides': args.overrides, 'steps': args.steps, 'rows': rows}, file,
                          indent=2)
    return 0


def profile_synthetic_run(args: argparse.Namespace, folder: str) -> tuple[ProfileSteps | None, SyncReport | None]:
    """Train the YAML on random tokens written into ``folder`` (by each node's local rank 0), profiling the
    chosen steps (and with ``--syncs`` listing the last warm-up step's host syncs); None after a configuration
    error (printed once per node)."""
    error = None
    if dist.get_local_rank() == 0:
        try:
            synthetic_run_yaml(args.yaml, args.overrides, folder, args.warmup + args.steps + 2)
        except ConfigError as raised:
            error = raised
    dist.barrier()
    try:
        run = prepare(os.path.join(folder, 'run.yaml'))
    except ConfigError as raised:
        error = error or raised
    if error is not None:
        if dist.get_local_rank() == 0:
            print(f'config error: {error}', file=sys.stderr)
        return None, None
    profiler = ProfileSteps(args.warmup, args.steps, args.python)
    syncs = SyncReport(args.warmup - 1) if args.syncs else None
    model = HFCausalLM(run.architecture, HF_EXPERTS[args.model]) if args.model in HF_EXPERTS else None
    train(run, extra_callbacks=[profiler] + ([syncs] if syncs else []), model=model).close()
    return profiler, syncs


def rank_trace(path: str, rank: int) -> str:
    """Where ``rank`` writes its trace: ``path`` for rank 0, ``stem.rankR.json`` beside it for the others (ranks of a
    context-parallel group wait on each other: each one's view tells which is late)."""
    stem, extension = os.path.splitext(path)
    return path if rank == 0 else f'{stem}.rank{rank}{extension}'


def shared_folder() -> str:
    """A new temporary folder, at one path on every rank (streaming wants every rank's data at one path); each
    node's local rank 0 writes the synthetic data into it."""
    folder = [tempfile.mkdtemp(prefix='profile_run-') if dist.get_global_rank() == 0 else None]
    dist.broadcast_object_list(folder)
    os.makedirs(folder[0], exist_ok=True)
    return folder[0]


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
