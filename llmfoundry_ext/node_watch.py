"""Stop a multi-node job within seconds when one of its nodes dies, naming that node.

When a node dies (killed, out of memory, hardware), the ranks of the other nodes wait inside their next collective:
NCCL until its timeout (Composer's ``dist_timeout``, minutes), gloo with a traceback about a closed connection
that names no node. Neither torch nor Composer watches the nodes (torchelastic's agent restarts workers, it does
not name a lost node to a Slurm job), so each rank runs a daemon thread here: every node's local rank 0 adds to its
node's counter in the job's rendezvous store (the TCPStore at ``MASTER_ADDR:MASTER_PORT`` that the process group
already uses) every ``HEARTBEAT_SECONDS`` (or a sixth of the timeout, where that is shorter); every rank reads all
the counters, and when one has not moved for ``timeout`` seconds of this rank's clock (or the store itself, on node
0, cannot be reached) it prints one line naming the node and ends its process, so the launcher and ``srun
--kill-on-bad-exit`` end the job. Re-submitting the job resumes from the last checkpoint. Under torchrun's elastic
agent (``--nnodes=MIN:MAX``, ``elastic_launch``, docs/reliability.md) the agent restarts the workers on the nodes left
instead, while it has restarts left and they are at least MIN, and the line says so (or that they are too few).
"""
import os
import sys
import threading
import time
from datetime import timedelta
from typing import Optional

from composer.utils import dist

from llmfoundry_ext.errors import RESUBMIT
from llmfoundry_ext.machine import Machine

HEARTBEAT_SECONDS = 5.0
EXIT_STATUS = 3
KEY = 'llmfoundry_ext/node_heartbeat/{}'


class NodeWatch:
    """Heartbeats of every node of the job, kept and checked on a daemon thread.

    ``store``: a client of the job's store; ``nodes``: how many nodes the job has; ``node``: this one's rank;
    ``beats``: whether this process beats for its node (its local rank 0); ``next_step``: what the line says follows
    (``what_follows``); ``on_lost(message)``: what to do when a node is lost (default: ``stop_this_process``)."""

    def __init__(self, store, nodes: int, node: int, beats: bool, timeout: float, interval: float = HEARTBEAT_SECONDS,
                 on_lost=None, next_step: str = RESUBMIT):
        self.store, self.nodes, self.node, self.beats = store, nodes, node, beats
        self.next_step = next_step
        self.timeout, self.interval = timeout, interval
        self.on_lost = on_lost or (lambda message: stop_this_process(message, beats, interval))
        self.counts: dict[int, int] = {}
        self.last_change: dict[int, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name='node-watch', daemon=True)

    def start(self) -> 'NodeWatch':
        self._thread.start()
        return self

    def wait_for_verdict(self) -> None:
        """Give the watch the time it needs to find a lost node (and, by default, end this process)."""
        self._thread.join(self.timeout + 2 * self.interval)

    def close(self) -> None:
        self._stop.set()
        self._thread.join()

    def finish(self) -> None:
        """The end of a job that went well: stop watching, then wait until every rank has. Node 0 hosts the store;
        were it to end first, a slower node's watch would find the store gone and end that node with an error."""
        self.close()
        dist.barrier()

    def _run(self) -> None:
        while not self._stop.is_set():
            lost = self.check(time.monotonic())
            if lost:
                self.on_lost(lost)
                return
            self._stop.wait(self.interval)

    def check(self, now: float) -> Optional[str]:
        """Beat (if this process beats) and read every node's count; the message naming a lost node, or None."""
        try:
            if self.beats:
                self.store.add(KEY.format(self.node), 1)
            counts = {node: self.store.add(KEY.format(node), 0) for node in range(self.nodes)}
        except Exception as error:  # noqa: BLE001 - any failure to reach the store means its host is gone
            return (f'node 0 of {self.nodes} (the job\'s rendezvous store) cannot be reached '
                    f'({type(error).__name__}): stopping node {self.node}. {RESUBMIT}')  # elastic too: its host
        for node, count in counts.items():
            if count != self.counts.get(node):
                self.counts[node], self.last_change[node] = count, now
            elif now - self.last_change[node] > self.timeout:
                return (f'node {node} of {self.nodes} stopped answering (no heartbeat for {self.timeout:g} s): '
                        f'stopping node {self.node}. {self.next_step}')
        return None


def stop_this_process(message: str, first_of_node: bool, interval: float) -> None:
    """The node's first process prints the one line and ends at once; the others end an interval later, so that the
    line is out before the launcher stops the node. Each ends with ``os._exit``, status ``EXIT_STATUS``: its main
    thread may be blocked in a collective that will not return."""
    if first_of_node:
        print(f'error: {message}', file=sys.stderr, flush=True)
    else:
        time.sleep(interval + 1)
    os._exit(EXIT_STATUS)


def what_follows(machine: Machine) -> str:
    """The end of a lost node's line: torchrun's elastic agent restarts the workers while it may, on the nodes left
    if they are the job's minimum at least, else once a node joins within its join timeout; else re-submit."""
    if machine.restarts_left <= 0:
        return RESUBMIT
    restart = f'(restart {machine.restart + 1} of {machine.max_restarts}), from the last checkpoint'
    left = machine.nodes - 1
    if left < machine.min_nodes:
        return (f"{left} node{'s' if left != 1 else ''} left, fewer than the job's minimum of {machine.min_nodes}: "
                f"torchrun's elastic agent restarts the workers if a node joins within its join timeout {restart}, "
                f"else ends the job.")
    return f"torchrun's elastic agent restarts the workers on the nodes left {restart}."


def start_node_watch(timeout: float, machine: Machine) -> Optional[NodeWatch]:
    """A started NodeWatch when the job's ranks are on more than one node (None otherwise), on its own client of the
    launcher's store."""
    if machine.nodes == 1:
        return None
    from torch.distributed import TCPStore
    store = TCPStore(os.environ['MASTER_ADDR'], int(os.environ['MASTER_PORT']), is_master=False,
                     timeout=timedelta(seconds=min(timeout, 30)))
    return NodeWatch(store, machine.nodes, machine.node_rank, machine.rank % machine.local_world_size == 0, timeout,
                     interval=min(HEARTBEAT_SECONDS, timeout / 6), next_step=what_follows(machine)).start()
