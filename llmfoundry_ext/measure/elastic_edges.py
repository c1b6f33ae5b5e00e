"""The elastic job's edges: a node that joins a running job, and the ways a job ends without finishing. Nodes as in
``elastic_chaos`` (torchrun's elastic agent through ``elastic_launch``, 2 processes each, a namespace of its own), on
a run of global batch 12 over 6 canonical nodes, so that 1, 2 or 3 nodes (2, 4 or 6 ranks) train the same samples
in the same order.

- **grow**: nodes 0 and 1 (``--nnodes 1:3``) train; node 2 starts at a random batch; the agents restart the workers
  at 3 nodes (torchrun counts a membership change as no restart), autoresume resumes, node 2's ranks train the rest.
- **the ends**, each followed by a re-submission of 2 nodes that must resume exactly: *fewer than the minimum*
  (``--nnodes 2:2`` loses node 1: node 0's agent waits the join timeout for a node, then ends); *restarts used*
  (``--max-restarts 1``: node 1 lost, then a worker of node 0 killed); *rendezvous host lost* (node 0 killed: node
  1's agent ends); *all nodes lost* (both killed: no process is left to say a word, Slurm marks the job NODE_FAIL, and
  the re-submission's recovery line says where the lost job got to).
"""
import os
import random
import re
import signal
import time
from dataclasses import dataclass

from llmfoundry_ext.measure.chaos import BATCHES, last_recorded, resumption, wait_until
from llmfoundry_ext.measure.elastic_chaos import (PER_NODE, ElasticRunner, elastic_yaml, global_samples,
                                                  uninterrupted, wait_for_the_rendezvous)

ENDS_JOIN_TIMEOUT_S = 15  # the ends' rendezvous: how long a restarted agent waits for the job's minimum of nodes


@dataclass
class Edge:
    name: str
    exit_statuses: list[int]   # each node's agent, in node order
    lines: list[str]           # the 'error: ' lines of the nodes' consoles after the event, node by node
    resumed_from_batch: int    # where the run went on: the restart's (grow) or the re-submission's
    same_samples: bool         # every batch after it, over the ranks that trained it: the uninterrupted run's
    ranks_after: int           # the ranks that recorded batches after it
    seconds: float             # from the event to the last agent's end (grow: to the first batch on 3 nodes)
    recovery: str              # the recovery line of the restart (grow) or of the re-submission


class Edges:
    """The uninterrupted run (one node), then each edge's job in a folder of its own."""

    def __init__(self, folder: str, node_timeout: float, write_delay: float = 0.02, seed: int = 0):
        self.runner = ElasticRunner(folder, elastic_yaml(folder, node_timeout, canonical_nodes=6,
                                                         global_batch_size=12), write_delay)
        self.expected = uninterrupted(self.runner)
        self.rng = random.Random(seed)

    def port(self) -> int:
        from composer.utils import get_free_tcp_port
        return get_free_tcp_port()

    def start(self, name: str, nodes: range, port: int, **launch) -> list:
        """Nodes ``nodes`` of job ``name``: (process, console) each, node 0's rendezvous listening before the next."""
        started = []
        for node in nodes:
            started.append(self.runner.start_node(name, node, port, **launch))
            if node == 0:
                wait_for_the_rendezvous(port)
        return started

    def until_batch(self, name: str, process, low: int = 2, high: int = BATCHES - 8) -> int:
        """Until rank 0 has recorded a random batch in [low, high]; that batch."""
        target = self.rng.randint(low, high)
        return wait_until(lambda: (last_recorded(self.runner, name) >= target, target), process,
                          f'{name} ended or stalled before batch {target}; see {self.runner.folder}/{name}-node0.log')

    def after(self, name: str, batch: int, ranks: int) -> tuple[bool, int]:
        """From ``ranks`` ranks' ledgers: whether every batch after ``batch`` over them is the uninterrupted run's,
        and how many of them recorded a batch after it."""
        ledgers = self.runner.ledgers(name, ranks)
        return (global_samples(ledgers, batch, ranks)[batch:] == self.expected[batch:],
                sum(any(b > batch for b in ledger) for ledger in ledgers))

    def grow(self) -> Edge:
        name = 'grow'  # slow checkpoint writes, and node 2 started early: it starts in seconds, the run is 24 batches
        (node0, console), (node1, _) = self.start(name, range(2), port := self.port(), slow_writes=True, nnodes='1:3')
        self.until_batch(name, node0, 4, 8)
        (node2, _), = self.start(name, range(2, 3), port, slow_writes=True, nnodes='1:3')
        joined = time.monotonic()
        statuses = [process.wait(timeout=300) for process in (node0, node1, node2)]
        text = console.text(since=joined)
        resumed, _ = resumption(text)
        first = console.first_after(joined, r'^batch \d+/', after=console.first_after(joined, r'6 ranks on 3 nodes'))
        return Edge(name, statuses, error_lines(text), resumed, *self.after(name, resumed, 3 * PER_NODE), first,
                    recovery_line(text))

    def end(self, name: str, nnodes: str = '1:2', max_restarts: int = 1, lose=(1,), then_a_worker: bool = False
            ) -> Edge:
        """Nodes 0 and 1 lose the nodes ``lose`` (kill -9) at a random batch, and with ``then_a_worker`` a worker of
        node 0 once it trains again; the nodes left end; then the re-submission."""
        launch = dict(nnodes=nnodes, max_restarts=max_restarts, join_timeout=ENDS_JOIN_TIMEOUT_S)
        nodes = self.start(name, range(2), port := self.port(), **launch)
        batch = self.until_batch(name, nodes[0][0], 5)  # past the first checkpoint (batch 3)
        for node in lose:
            os.killpg(nodes[node][0].pid, signal.SIGKILL)
        event = time.monotonic()
        if then_a_worker:
            self.until_batch(name, nodes[0][0], batch + 1, BATCHES - 2)
            os.kill(workers(nodes[0][0].pid)[-1], signal.SIGKILL)
        statuses = [process.wait(timeout=300) for process, _ in nodes]
        ended = time.monotonic() - event
        lines = [line for _, console in nodes for line in error_lines(console.text(since=event))]
        resumed, same, ranks, recovery = self.resubmit(name, port)
        return Edge(name, statuses, lines, resumed, same, ranks, ended, recovery)

    def resubmit(self, name: str, port: int) -> tuple[int, bool, int, str]:
        """The same job again on 2 nodes, the last job's ledgers set aside: (the batch it resumed from, whether its
        batches are the uninterrupted run's, how many ranks trained them, its recovery line)."""
        folder = os.path.join(self.runner.folder, name)
        os.rename(os.path.join(folder, 'ledger'), os.path.join(folder, 'ledger-before'))
        nodes = self.start(name, range(2), port)
        if any(process.wait(timeout=300) for process, _ in nodes):
            raise RuntimeError(f'{name}: the re-submission failed; see {self.runner.folder}/{name}-node0.log')
        text = nodes[0][1].text()
        resumed, _ = resumption(text)
        return (resumed, *self.after(name, resumed, 2 * PER_NODE), recovery_line(text))

    def each(self):
        """Each edge's result, as it ends: grow, then the ends."""
        yield self.grow()
        for name, how in ENDS.items():
            yield self.end(name, **how)


ENDS = {'fewer-than-minimum': dict(nnodes='2:2', max_restarts=3), 'restarts-used': dict(then_a_worker=True),
        'rendezvous-host-lost': dict(lose=(0,)), 'all-nodes-lost': dict(lose=(0, 1))}


def workers(agent: int) -> list[int]:
    """The process ids of an agent's workers: its children running train.py."""
    children = []
    for thread in os.listdir(f'/proc/{agent}/task'):
        with open(f'/proc/{agent}/task/{thread}/children') as file:
            children += [int(pid) for pid in file.read().split()]
    return sorted(pid for pid in children if b'train.py' in open(f'/proc/{pid}/cmdline', 'rb').read())


def error_lines(text: str) -> list[str]:
    return re.findall(r'^error: .*$', text, flags=re.MULTILINE)


def recovery_line(text: str) -> str:
    """A node's console's first recovery line (``callbacks.recovery_line``), or ''."""
    found = re.search(r'^recovery: .*$', text, flags=re.MULTILINE)
    return found[0] if found else ''


def format_edge(edge: Edge) -> str:
    """The edge's exits, where the run went on and whether its samples are exact, then its nodes' error lines."""
    went_on = 'the restart' if edge.name == 'grow' else 'the re-submission'
    samples = 'the uninterrupted run\'s' if edge.same_samples else 'NOT the uninterrupted run\'s'
    return '\n'.join([f"{edge.name}: exits {' '.join(map(str, edge.exit_statuses))}, {edge.seconds:.1f} s; {went_on} "
                      f'resumed from batch {edge.resumed_from_batch} on {edge.ranks_after} ranks, samples {samples}',
                      *(f'  {line}' for line in [*edge.lines, edge.recovery] if line)])


def edges_command(args) -> int:
    """``scripts/chaos.py --elastic-edges``: each edge as it ends (and JSON); 1 unless the grown job trained on its
    third node and finished, and every edge's samples are exact."""
    import json
    import tempfile
    from dataclasses import asdict

    with tempfile.TemporaryDirectory() as temporary:
        results = []
        for edge in Edges(args.folder or temporary, args.node_timeout, args.write_delay, args.seed).each():
            results.append(edge)
            print(format_edge(edge), flush=True)
    if args.json:
        with open(args.json, 'w') as file:
            json.dump([asdict(edge) for edge in results], file, indent=2)
    grew = results[0].exit_statuses == [0, 0, 0] and results[0].ranks_after == 3 * PER_NODE
    return 0 if grew and all(edge.same_samples for edge in results) else 1
