"""Chaos trials for autoresume: a 2-process FSDP2 run with sharded checkpoints is killed with ``kill -9`` at a random
moment (odd trials inside a checkpoint write), re-run with the same command until it finishes, and every
rank's ledger (per batch: loss and sample ids) compared with an uninterrupted run's.

To land inside a write, the processes of the run to be killed get a ``sitecustomize`` (on their PYTHONPATH only) that
sleeps after each item torch.distributed.checkpoint writes: a checkpoint then takes about a second to write, and a
kill while its folder has no ``.metadata`` yet is a kill inside the write. The other runs write at full speed.
"""
import json
import os
import random
import re
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import asdict, dataclass

import numpy as np

from llmfoundry_ext.measure import REPO
from llmfoundry_ext.callbacks.sample_ledger import read_ledger
from llmfoundry_ext.data.mds import write_mds
from llmfoundry_ext.launch import LAUNCHER
from llmfoundry_ext.resumption import CHECKPOINT_NAME, seal_path

BATCHES, SAVE_EVERY, RANKS, KEEP = 24, 3, 2, 2  # KEEP: save_num_checkpoints_to_keep
STALL_TIMEOUT_S = 600  # how long a trial waits for a run to reach a batch or a write before calling it stalled
SLOW_WRITES = '''
import os, sys, time
_delay = float(os.environ.get('CHAOS_WRITE_DELAY', '0'))
if _delay and sys.argv[0].endswith('train.py'):  # the run's ranks, not its launcher or resource trackers
    import torch.distributed.checkpoint.filesystem as filesystem
    _write_item = filesystem._write_item
    def _slow_write_item(*args, **kwargs):
        result = _write_item(*args, **kwargs)
        time.sleep(_delay)
        return result
    filesystem._write_item = _slow_write_item
'''


@dataclass
class Trial:
    number: int
    aimed_inside_write: bool
    killed_after_batch: int  # the last batch rank 0 had recorded
    killed_inside_write: str  # the checkpoint being written at the kill, or ''
    resumed_from_batch: int
    skipped: str  # the broken checkpoint the re-run moved aside, or ''
    identical: bool  # every rank's losses and sample ids of every batch equal the uninterrupted run's
    checkpoints_left: int  # checkpoints in the folder at the end, set-aside ones included (at most KEEP + 1)


def run_yaml(folder: str, streams: dict[str, str], keep: int = -1) -> str:
    """A tiny Llama (untied, so the embeddings and output layer are FSDP2 units of their own), FSDP2 over 2 ranks with
    selective activation checkpointing, sharded checkpoints every SAVE_EVERY batches (the ``keep`` newest; -1: all),
    the sample ledger on."""
    import yaml
    config = {
        'run_name': 'chaos', 'max_seq_len': 32, 'global_batch_size': 8, 'max_duration': f'{BATCHES}ba',
        'precision': 'fp32', 'progress_bar': False, 'log_interval': '100ba', 'loggers': {},
        'model': {'preset': 'debug', 'dim': 64, 'n_layers': 2, 'n_heads': 4, 'n_kv_heads': 2, 'ffn_dim': 128,
                  'vocab_size': 512, 'max_seq_len': 64, 'tie_embeddings': False},
        'data': {'train': {'streams': {name: {'local': path, 'proportion': 0.5} for name, path in streams.items()},
                           'shuffle_seed': 3}},
        'parallelism': {'fsdp': {'state_dict_type': 'sharded', 'activation_checkpointing': 'selective'}},
        'checkpoint': {'save_folder': os.path.join(folder, '{run_name}', 'checkpoints'),
                       'save_interval': f'{SAVE_EVERY}ba', 'save_num_checkpoints_to_keep': keep},
        'callbacks': {'sample_ledger': {'folder': os.path.join(folder, '{run_name}', 'ledger')}},
    }
    path = os.path.join(folder, 'chaos.yaml')
    with open(path, 'w') as file:
        yaml.safe_dump(config, file)
    return path


def write_streams(folder: str) -> dict[str, str]:
    streams = {}
    for seed, name in enumerate(('a', 'b')):
        rng = np.random.default_rng(seed)
        streams[name] = os.path.join(folder, 'data', name)
        write_mds(streams[name], [rng.integers(2, 512, 32, dtype=np.uint32) for _ in range(400)],
                  {'source': f'chaos:{name}', 'window': 32})
    return streams


class Runner:
    """Launches ``composer -n <processes> train.py <yaml> run_name=<name>`` (``launch.LAUNCHER``) in its own process
    group, logs appended."""

    def __init__(self, folder: str, yaml_path: str, write_delay: float):
        self.folder, self.yaml_path = folder, yaml_path
        hooks = os.path.join(folder, 'hooks')
        os.makedirs(hooks, exist_ok=True)
        with open(os.path.join(hooks, 'sitecustomize.py'), 'w') as file:
            file.write(SLOW_WRITES)
        self.repo = REPO
        self.write_delay = write_delay
        self.env = {**os.environ, 'OMP_NUM_THREADS': '1',
                    'PYTHONPATH': os.pathsep.join([hooks, REPO, os.environ.get('PYTHONPATH', '')])}

    def start(self, name: str, slow_writes: bool = False, processes: int = RANKS) -> subprocess.Popen:
        log = open(os.path.join(self.folder, f'{name}.log'), 'a')
        return subprocess.Popen([*LAUNCHER, '-n', str(processes), 'train.py', self.yaml_path, f'run_name={name}'],
                                cwd=self.repo, stdout=log, stderr=subprocess.STDOUT,
                                env={**self.env, 'CHAOS_WRITE_DELAY': str(self.write_delay if slow_writes else 0)},
                                start_new_session=True)

    def finish(self, name: str, attempts: int = 3, processes: int = RANKS) -> None:
        for _ in range(attempts):
            if self.start(name, processes=processes).wait(timeout=900) == 0:
                return
        raise RuntimeError(f'{name} did not finish in {attempts} runs; see {self.folder}/{name}.log')

    def log(self, name: str) -> str:
        with open(os.path.join(self.folder, f'{name}.log')) as file:
            return file.read()

    def ledgers(self, name: str, ranks: int = RANKS) -> list[dict[int, dict]]:
        return [read_ledger(os.path.join(self.folder, name, 'ledger', f'ledger-rank{rank}.jsonl'))
                for rank in range(ranks)]

    def checkpoints(self, name: str) -> str:
        return os.path.join(self.folder, name, 'checkpoints')


def writing(checkpoints: str) -> str:
    """The checkpoint folder being written now (it has no .metadata yet), or ''."""
    if not os.path.isdir(checkpoints):
        return ''
    return next((name for name in os.listdir(checkpoints) if re.fullmatch(r'ep\d+-ba\d+', name)
                 and not os.path.exists(os.path.join(checkpoints, name, '.metadata'))), '')


def kill(runner: Runner, name: str, inside_write: bool, rng: random.Random) -> tuple[int, str]:
    """Start the run and kill -9 its process group: inside the write of a random checkpoint, or at a random batch.
    Returns the last batch rank 0 recorded and the checkpoint being written at the kill ('' if none)."""
    process = runner.start(name, slow_writes=True)
    in_progress = wait_for_a_kill_point(runner, name, process, inside_write, rng, f'{runner.folder}/{name}.log')
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    return last_recorded(runner, name), in_progress


def wait_for_a_kill_point(runner: Runner, name: str, running: subprocess.Popen, inside_write: bool,
                          rng: random.Random, log: str) -> str:
    """Until the run ``running`` reaches a random kill point: inside the write of a checkpoint, or a batch recorded;
    the checkpoint being written then ('' if none). ``log``: where to look when it ends or stalls before."""
    target = rng.randrange(SAVE_EVERY, BATCHES, SAVE_EVERY) if inside_write else rng.randrange(2, BATCHES)

    def reached() -> tuple[bool, str]:
        in_progress = writing(runner.checkpoints(name))
        return (in_progress == f'ep0-ba{target}' if inside_write else last_recorded(runner, name) >= target,
                in_progress)

    return wait_until(reached, running, f'{name}: the run ended or stalled before its kill point; see {log}')


def wait_until(check, running: subprocess.Popen, failure: str, timeout_s: float = STALL_TIMEOUT_S):
    """Poll ``check()`` (whether it is done, and a value) until done; that value. A RuntimeError saying ``failure``
    if ``running`` ends or ``timeout_s`` passes first (a stalled run fails its trial, not pytest's timeout)."""
    deadline = time.monotonic() + timeout_s
    while True:
        done, value = check()
        if done:
            return value
        if running.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(failure)
        time.sleep(0.01)


def last_recorded(runner: Runner, name: str) -> int:
    """The last batch rank 0's ledger holds (0: none yet)."""
    ledger = os.path.join(runner.folder, name, 'ledger', 'ledger-rank0.jsonl')
    return max(read_ledger(ledger), default=0) if os.path.exists(ledger) else 0


def keep_checkpoints_up_to(checkpoints, batch: int) -> None:
    """Remove a run's checkpoints (folders, files and their seals) of batches after ``batch``, as if it had stopped
    there."""
    for entry in os.listdir(checkpoints):
        found = CHECKPOINT_NAME.match(entry)
        if found and int(found[1]) > batch:
            path = os.path.join(checkpoints, entry)
            if os.path.isdir(path):
                shutil.rmtree(path)  # its seal inside
            else:
                os.remove(path)
                if os.path.exists(seal_path(path)):
                    os.remove(seal_path(path))


def identical(actual: list[dict[int, dict]], expected: list[dict[int, dict]]) -> bool:
    """Every rank recorded every batch once resumed, with the uninterrupted run's loss and sample ids, bit for bit."""
    batches = list(range(1, BATCHES + 1))
    for rank, reference in zip(actual, expected):
        if sorted(rank) != batches:
            return False
        for key in ('loss', 'sample_ids'):
            if [rank[b][key] for b in batches] != [reference[b][key] for b in batches]:
                return False
    return True


def resumption(log: str) -> tuple[int, str]:
    """From a run's log: the batch autoresume resumed from (0: from scratch) and the broken checkpoint it moved aside
    ('' if none)."""
    resumed = re.findall(r'autoresume: resuming from the latest checkpoint at batch (\d+)', log)
    skipped = re.findall(r'autoresume: skipped checkpoint (\S+) ', log)
    return int(resumed[0]) if resumed else 0, skipped[0] if skipped else ''


def trial(runner: Runner, number: int, expected, rng: random.Random) -> Trial:
    name = f'trial{number:02d}'
    aimed_inside = number % 2 == 1
    killed_after, inside = kill(runner, name, aimed_inside, rng)
    runner.finish(name)
    checkpoints = runner.checkpoints(name)
    left = sum(bool(re.match(r'ep\d+-ba\d+', entry)) for entry in os.listdir(checkpoints))
    return Trial(number, aimed_inside, killed_after, inside, *resumption(runner.log(name)),
                 identical(runner.ledgers(name), expected), left)


def run(folder: str, trials: int, seed: int, write_delay: float, report=print) -> list[Trial]:
    """The uninterrupted run, then ``trials`` killed and resumed ones, each reported as it ends."""
    runner = Runner(folder, run_yaml(folder, write_streams(folder), KEEP), write_delay)
    runner.finish('uninterrupted', attempts=1)
    return each_trial(trial, runner, runner.ledgers('uninterrupted'), trials, seed, lambda r: report(format_row(r)))


def each_trial(trial, runner: Runner, expected, trials: int, seed: int, report) -> list:
    """``trial(runner, number, expected, rng)`` for numbers 1 to ``trials``, the kill points drawn from ``seed``;
    each result handed to ``report`` as it ends."""
    rng = random.Random(seed)
    results = []
    for number in range(1, trials + 1):
        results.append(trial(runner, number, expected, rng))
        report(results[-1])
    return results


HEADER = f"{'trial':>5} {'aimed at':>14} {'killed after':>12} {'inside write of':>15} {'resumed from':>12} " \
         f"{'moved aside':>12} {'identical':>9} {'checkpoints left':>16}"


def format_row(t: Trial) -> str:
    aimed = 'a write' if t.aimed_inside_write else 'a batch'
    return (f"{t.number:>5} {aimed:>14} {f'batch {t.killed_after_batch}':>12} {t.killed_inside_write or '-':>15} "
            f"{f'batch {t.resumed_from_batch}':>12} {t.skipped or '-':>12} {'yes' if t.identical else 'NO':>9} "
            f"{t.checkpoints_left:>16}")


def write_json(results: list[Trial], path: str) -> None:
    with open(path, 'w') as file:
        json.dump([asdict(t) for t in results], file, indent=2)


def trials_command(args) -> int:
    """``scripts/chaos.py``'s arguments -> the trials' table and summary (and JSON); 1 unless every resumed run is
    identical to the uninterrupted one."""
    with tempfile.TemporaryDirectory() as temporary:
        print(HEADER, flush=True)
        results = run(args.folder or temporary, args.trials, args.seed, args.write_delay,
                      report=lambda row: print(row, flush=True))
    same = sum(result.identical for result in results)
    inside = sum(bool(result.killed_inside_write) for result in results)
    most = max((result.checkpoints_left for result in results), default=0)
    print(f'{same} of {len(results)} resumed runs identical to the uninterrupted one; {inside} kills inside a '
          f'checkpoint write; at most {most} checkpoints left in a folder (save_num_checkpoints_to_keep {KEEP}, and '
          f'one set aside)')
    if args.json:
        write_json(results, args.json)
    return 0 if same == len(results) and most <= KEEP + 1 else 1
