"""The elastic job's edges (scripts/chaos.py --elastic-edges runs them all): a third node joining a running job of
two, and the loss of node 0, which hosts the rendezvous, followed by a re-submission."""
import re

import pytest

from llmfoundry_ext.measure.elastic_edges import Edges


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_node_that_joins_trains_and_a_job_that_loses_its_rendezvous_host_ends_in_one_line(nodes_of_their_own,
                                                                                          tmp_path):
    """The third node joins at the next restart (a membership change: torchrun's restart count stays 0) and its
    ranks train every batch after the checkpoint resumed from, the uninterrupted run's samples; losing node 0 ends
    node 1 with one line and status 1, and the re-submission on two nodes resumes with the uninterrupted run's
    samples."""
    edges = Edges(str(tmp_path), node_timeout=30)
    grown = edges.grow()
    assert (grown.exit_statuses, grown.lines, grown.same_samples, grown.ranks_after) == ([0, 0, 0], [], True, 6)
    log = (tmp_path / 'grow-node0.log').read_text()
    assert log.index('elastic (torchrun): restart 0 of 3; 4 ranks on 2 nodes') < log.index(
        'elastic (torchrun): restart 0 of 3; 6 ranks on 3 nodes')
    origin = f'the checkpoint of batch {grown.resumed_from_batch}' if grown.resumed_from_batch else 'scratch'
    assert re.search(rf'^recovery: restart 0 of 3 at 6 ranks on 3 nodes \(before: 4 ranks on 2 nodes, to batch \d+\); '
                     rf'resumed from {origin}, ', log, flags=re.MULTILINE)
    lost = edges.end('rendezvous-host-lost', lose=(0,))
    assert (lost.exit_statuses[1], lost.same_samples, lost.ranks_after) == (1, True, 4)
    # the agent's line; node 1's node watch may name the store first (it looks every 5 s)
    assert lost.lines[-1].startswith('error: the rendezvous at 127.0.0.1:') and lost.lines[-1].endswith(
        "(on the job's first node) cannot be reached (RendezvousConnectionError): the job ends. Re-submit the job to "
        'resume from its last checkpoint.')
    assert len(lost.lines) <= 2 and all(re.fullmatch(
        r"error: node 0 of 2 \(the job's rendezvous store\) cannot be reached \(\w+\): stopping node 1\. Re-submit the "
        r'job to resume from its last checkpoint\.', line) for line in lost.lines[:-1])
    assert lost.resumed_from_batch % 3 == 0 and lost.resumed_from_batch > 0
    # the re-submission's line: where the lost job had got to
    assert re.fullmatch(rf'recovery: restart 0 of 3 at 4 ranks on 2 nodes \(before: 4 ranks on 2 nodes, to batch '
                        rf'\d+\); resumed from the checkpoint of batch {lost.resumed_from_batch}, \d+ batch(es)? '
                        rf'trained again; batch {lost.resumed_from_batch + 1} trained [\d.]+ s after batch \d+ was',
                        lost.recovery)
