"""Chaos trials for a job that loses a node: two "nodes" on this machine, each torchrun's elastic agent with 2
processes (``--nnodes=1:2``, c10d rendezvous hosted by node 0), FSDP2 over the 4 ranks with sharded checkpoints
(``chaos.run_yaml``). Node 1's agent and workers are killed with ``kill -9`` at a random batch (odd trials inside a
checkpoint write); the node watch on node 0 names the lost node and ends its workers, the agent restarts them at the
new membership (2 ranks), autoresume loads the last sealed checkpoint and the plan settles again for 2 ranks, the
global batch kept. Each trial is checked against an uninterrupted run (every batch's global sample ids) and against
a run resumed by hand from the same checkpoint on one node (each rank's losses after it, to fp32's rounding), and
times the recovery from node 0's console: the node watch's line, the restarted group's start, the checkpoint loaded,
its first batch.

Node 1, not node 0: node 0's agent hosts the rendezvous, and its loss ends the job (torchrun's c10d rendezvous has
one host; docs/reliability.md).
"""
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass

import yaml

from llmfoundry_ext.elastic_launch import JOIN_TIMEOUT_S
from llmfoundry_ext.elastic_launch import LAUNCHER as ELASTIC_LAUNCHER
from llmfoundry_ext.measure.chaos import (BATCHES, KEEP, Runner, each_trial, keep_checkpoints_up_to, last_recorded,
                                          resumption, run_yaml, wait_for_a_kill_point, write_streams)

PER_NODE = 2             # processes a node
NODE_TIMEOUT_S = 30      # node_timeout_s by default (the YAMLs' too): how long a silent node is waited for. Beside
                         # the test suite on a 2-core machine, 5 and 10 s ended healthy jobs in slowed checkpoint writes
LAST_CALL_S = 2          # the rendezvous waits this long for more nodes once it has its minimum
MAX_RESTARTS = 3
# fp32 on the CPU: bit for bit on torch 2.11; on torch 2.15 one batch of 18 on one rank 2 ulp apart (1.4e-7 relative)
LOSS_TOLERANCE = 1e-6


@dataclass
class Recovery:
    number: int
    aimed_inside_write: bool
    killed_after_batch: int      # the last batch rank 0 had recorded at the kill
    killed_inside_write: str     # the checkpoint being written at the kill, or ''
    resumed_from_batch: int
    skipped: str                 # the broken checkpoint autoresume moved aside, or ''
    detected_s: float            # seconds from the kill to the node watch's line on node 0
    restarted_s: float           # to the restarted group's start summary
    loaded_s: float              # to its checkpoint loaded (autoresume's line; -1: none, it started from scratch)
    first_batch_s: float         # to its first batch trained
    redone: int                  # batches trained again: killed_after_batch - resumed_from_batch
    exit_status: int             # node 0's agent
    same_samples: bool           # every batch's global sample ids equal the uninterrupted run's
    same_losses: bool            # each rank's losses after the checkpoint those of the run resumed by hand, within
    #                              LOSS_TOLERANCE
    loss_difference: float       # the largest relative difference between the two (0: bit for bit)


# A node of its own on this machine: a user and mount namespace with an empty /dev/shm (streaming keeps a node's
# shared memory there, and two nodes' collide; tests/launch_server.py does the same for Composer's launcher).
NODE_OF_ITS_OWN = ['unshare', '--user', '--map-root-user', '--mount', 'sh', '-c',
                   'mount --make-rprivate / && mount -t tmpfs tmpfs /dev/shm && exec "$@"', 'node']


# torchrun's agents share one store with their workers over every restart (torch 2.11): a restarted group read the
# dead group's addresses from it, and gloo connected to ports no longer open (3 restarts of 4 here). Off, each
# restart's workers get a store of their own (scripts/slurm/launch.sh sets it too).
ELASTIC_ENVIRONMENT = {'TORCH_DISABLE_SHARE_RDZV_TCP_STORE': '1'}


def elastic_command(port: int, job: str, nnodes: str = '1:2', max_restarts: int = MAX_RESTARTS,
                    join_timeout: float = JOIN_TIMEOUT_S) -> list[str]:
    """torchrun's elastic agent (``elastic_launch``) for one node of ``nnodes`` (MIN:MAX), its rendezvous at
    127.0.0.1:``port``: the local form of ``scripts/slurm/launch.sh`` with ``MIN_NODES`` (docs/reliability.md)."""
    return [*ELASTIC_LAUNCHER, f'--nnodes={nnodes}', f'--nproc-per-node={PER_NODE}', '--rdzv-backend=c10d',
            f'--rdzv-endpoint=127.0.0.1:{port}', f'--rdzv-id={job}',
            f'--rdzv-conf=last_call_timeout={LAST_CALL_S},join_timeout={join_timeout:g}',
            f'--max-restarts={max_restarts}', '--monitor-interval=1']


class Console:
    """A node's output, each line stamped on arrival (``time.monotonic``) and appended to its log file."""

    def __init__(self, process: subprocess.Popen, path: str):
        self.lines: list[tuple[float, str]] = []
        self._thread = threading.Thread(target=self._read, args=(process, path), daemon=True)
        self._thread.start()

    def text(self, since: float = 0) -> str:
        """The lines that arrived at or after ``since`` (``time.monotonic``), once the node's output has ended."""
        self._thread.join(timeout=5)
        return ''.join(line for stamp, line in self.lines if stamp >= since)

    def _read(self, process: subprocess.Popen, path: str) -> None:
        with open(path, 'a') as log:
            for line in process.stdout:
                self.lines.append((time.monotonic(), line))
                log.write(line)
                log.flush()

    def first_after(self, start: float, pattern: str, after: float = 0) -> float:
        """Seconds from ``start`` to the first line matching ``pattern`` at least ``after`` seconds past it (-1: none;
        the survivors may print a batch of their own between the kill and the restart)."""
        self._thread.join(timeout=5)
        if after < 0:
            return -1
        return next((stamp - start for stamp, line in self.lines
                     if stamp >= start + after and re.search(pattern, line)), -1)


class ElasticRunner(Runner):
    """``chaos.Runner`` (its uninterrupted and by-hand runs on one node, its ledgers) and the two-node elastic job."""

    def start_node(self, name: str, node: int, port: int, slow_writes: bool = False,
                   **launch) -> tuple[subprocess.Popen, Console]:
        """Node ``node`` of job ``name``: its agent (``elastic_command(port, name, **launch)``) and workers."""
        process = subprocess.Popen([*NODE_OF_ITS_OWN, *elastic_command(port, name, **launch), 'train.py',
                                    self.yaml_path, f'run_name={name}'],
                                   cwd=self.repo, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                   env={**self.env, **ELASTIC_ENVIRONMENT,
                                        'CHAOS_WRITE_DELAY': str(self.write_delay if slow_writes else 0)},
                                   start_new_session=True)
        return process, Console(process, os.path.join(self.folder, f'{name}-node{node}.log'))


def elastic_yaml(folder: str, node_timeout: float, canonical_nodes: int = 2, global_batch_size: int = 8) -> str:
    """``chaos.run_yaml`` with a line a batch (the recovery's first batch is timed), a node watch of
    ``node_timeout`` seconds and the data's canonical nodes fixed (the sample order of 2 nodes by default, on 1 or 2,
    as the YAMLs fix it; a job of up to 3 nodes: 6, and a global batch that 2, 4 and 6 ranks divide)."""
    path = run_yaml(folder, write_streams(folder), KEEP)
    with open(path) as file:
        config = yaml.safe_load(file)
    config.update(log_interval='1ba', node_timeout_s=node_timeout, global_batch_size=global_batch_size)
    config['data']['train']['num_canonical_nodes'] = canonical_nodes
    with open(path, 'w') as file:
        yaml.safe_dump(config, file)
    return path


def global_samples(ledgers: list[dict[int, dict]], resumed: int, survivors: int) -> list[list[int]]:
    """Each batch's sample ids over the job's ranks: up to the checkpoint resumed from, every rank's (the first
    start); after it, the survivors' (ranks 0 to ``survivors - 1``; the lost node's records of batches redone are
    stale; a batch never trained: none)."""
    return [sorted(i for ledger in (ledgers if batch <= resumed else ledgers[:survivors]) for i in
                   ledger.get(batch, {}).get('sample_ids', [])) for batch in range(1, BATCHES + 1)]


def lose_node_1(runner: ElasticRunner, name: str, inside_write: bool, rng: random.Random, port: int):
    """Start the two nodes, kill node 1's process group inside the write of a random checkpoint or at a random
    batch; (node 0's agent, its console, the last batch rank 0 recorded, the checkpoint being written, the kill's
    time)."""
    node0, console = runner.start_node(name, 0, port, inside_write)
    wait_for_the_rendezvous(port)  # node 0 hosts it: started together, either agent may bind the port first
    node1, _ = runner.start_node(name, 1, port, inside_write)
    in_progress = wait_for_a_kill_point(runner, name, node0, inside_write, rng, f'{runner.folder}/{name}-node0.log')
    os.killpg(node1.pid, signal.SIGKILL)
    killed = time.monotonic()
    node1.wait()
    return node0, console, last_recorded(runner, name), in_progress, killed


def wait_for_the_rendezvous(port: int, seconds: float = 60) -> None:
    """Until the rendezvous's store listens on 127.0.0.1:``port``."""
    import socket

    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        with socket.socket() as probe:
            if probe.connect_ex(('127.0.0.1', port)) == 0:
                return
        time.sleep(0.05)
    raise RuntimeError(f'no rendezvous on 127.0.0.1:{port} after {seconds:g} s')


def resume_by_hand(runner: ElasticRunner, name: str, batch: int) -> list[dict[int, dict]]:
    """The trial's folder as it was at its checkpoint of ``batch``, resumed by Composer's launcher on one node."""
    by_hand = f'{name}-by-hand'
    shutil.copytree(os.path.join(runner.folder, name), os.path.join(runner.folder, by_hand), symlinks=True)
    keep_checkpoints_up_to(runner.checkpoints(by_hand), batch)
    shutil.rmtree(os.path.join(runner.folder, by_hand, 'ledger'))
    runner.finish(by_hand, attempts=1)
    return runner.ledgers(by_hand, PER_NODE)


def relative_difference(loss, reference: float) -> float:
    """|loss - reference| / |reference|; infinite where the job never trained that batch (None)."""
    return float('inf') if loss is None else abs(loss - reference) / abs(reference)


def trial(runner: ElasticRunner, number: int, expected: list[list[int]], rng: random.Random) -> Recovery:
    from composer.utils import get_free_tcp_port

    name = f'elastic{number:02d}'
    aimed_inside = number % 2 == 1
    node0, console, killed_after, inside, killed = lose_node_1(runner, name, aimed_inside, rng, get_free_tcp_port())
    status = node0.wait(timeout=300)
    resumed, skipped = resumption(console.text(since=killed))
    ledgers = runner.ledgers(name, 2 * PER_NODE)
    by_hand = resume_by_hand(runner, name, resumed)
    after = range(resumed + 1, BATCHES + 1)
    difference = max((relative_difference(ledgers[rank].get(b, {}).get('loss'), by_hand[rank][b]['loss'])
                      for rank in range(PER_NODE) for b in after), default=0.0)
    restarted = console.first_after(killed, r'^run \S+: ')  # the restarted group's start summary
    return Recovery(number, aimed_inside, killed_after, inside, resumed, skipped,
                    console.first_after(killed, 'stopped answering'), restarted,
                    console.first_after(killed, 'autoresume: resuming', after=restarted),
                    console.first_after(killed, r'^batch \d+/', after=restarted),
                    killed_after - resumed, status, global_samples(ledgers, resumed, PER_NODE) == expected,
                    difference <= LOSS_TOLERANCE, difference)


def run(folder: str, trials: int, seed: int, write_delay: float, report=print,
        node_timeout: float = NODE_TIMEOUT_S) -> list[Recovery]:
    """The uninterrupted run (one node), then ``trials`` two-node jobs that lose node 1, each reported as it ends."""
    runner = ElasticRunner(folder, elastic_yaml(folder, node_timeout), write_delay)
    return each_trial(trial, runner, uninterrupted(runner), trials, seed, lambda r: report(format_row(r)))


def uninterrupted(runner: ElasticRunner) -> list[list[int]]:
    """The reference: each batch's global sample ids in a run on one node, uninterrupted."""
    runner.finish('uninterrupted', attempts=1)
    return global_samples(runner.ledgers('uninterrupted', PER_NODE), BATCHES, PER_NODE)


HEADER = (f"{'trial':>5} {'aimed at':>8} {'killed after':>12} {'inside write of':>15} {'resumed from':>12} "
          f"{'redone':>6} {'detected s':>10} {'restarted s':>11} {'loaded s':>8} {'first batch s':>13} "
          f"{'exit':>4} {'samples':>7} {'losses':>6}")


def seconds(value: float) -> str:
    """'18.2', or '-' where the line never came (a job killed before its first checkpoint loads none)."""
    return '-' if value < 0 else f'{value:.1f}'


def format_row(r: Recovery) -> str:
    aimed = 'a write' if r.aimed_inside_write else 'a batch'
    return (f"{r.number:>5} {aimed:>8} {f'batch {r.killed_after_batch}':>12} {r.killed_inside_write or '-':>15} "
            f"{f'batch {r.resumed_from_batch}':>12} {r.redone:>6} {r.detected_s:>10.1f} {r.restarted_s:>11.1f} "
            f"{seconds(r.loaded_s):>8} {r.first_batch_s:>13.1f} {r.exit_status:>4} "
            f"{'same' if r.same_samples else 'NO':>7} {'same' if r.same_losses else 'NO':>6}")


def trials_command(args) -> int:
    """``scripts/chaos.py --elastic``'s arguments -> the trials' table and summary (and JSON); 1 unless every job
    finished without a re-submission with the uninterrupted run's samples and the by-hand resumption's losses."""
    import json
    import tempfile
    from dataclasses import asdict

    with tempfile.TemporaryDirectory() as temporary:
        print(HEADER, flush=True)
        results = run(args.folder or temporary, args.trials, args.seed, args.write_delay,
                      report=lambda row: print(row, flush=True), node_timeout=args.node_timeout)
    good = sum(r.exit_status == 0 and r.same_samples and r.same_losses for r in results)
    inside = sum(bool(r.killed_inside_write) for r in results)
    recovered = sorted(r.first_batch_s for r in results)
    print(f'{good} of {len(results)} jobs finished without a re-submission, every batch the uninterrupted run\'s '
          f'samples and each loss after the checkpoint the by-hand resumption\'s; {inside} kills inside a checkpoint '
          f'write; first batch after the kill in {recovered[0]:.1f}-{recovered[-1]:.1f} s '
          f'(node_timeout_s {args.node_timeout:g})')
    if args.json:
        with open(args.json, 'w') as file:
            json.dump([asdict(r) for r in results], file, indent=2)
    return 0 if good == len(results) else 1
