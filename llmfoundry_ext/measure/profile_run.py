"""A profiled training run on random tokens (``scripts/profile_run.py``): each rank's trace and rank 0's kernel
categories, optionally the host syncs of the last warm-up batch."""
import argparse
import json
import os
import shutil
import sys
import tempfile

from composer.utils import dist, get_device

from llmfoundry_ext.measure.benchmark import HF_EXPERTS, HFCausalLM
from llmfoundry_ext.measure.profiling import ProfileSteps, SyncReport, category_table, format_table, self_times
from llmfoundry_ext.measure.synthetic import synthetic_run_yaml
from llmfoundry_ext.errors import ConfigError
from llmfoundry_ext.preflight import prepare
from llmfoundry_ext.train import train


def profile_run(args: argparse.Namespace) -> int:
    """``scripts/profile_run.py``'s arguments -> its exit status (2 after a configuration error)."""
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
