"""The node watch: a node whose heartbeat stops for the timeout is named; a store that cannot be reached names node 0."""
import subprocess

import pytest
import torch.distributed as dist

from llmfoundry_ext.node_watch import NodeWatch
from tests.conftest import FORKED, REPO


def test_a_node_silent_for_the_timeout_is_named_and_beating_nodes_are_not():
    store = dist.HashStore()
    node0 = NodeWatch(store, nodes=2, node=0, beats=True, timeout=10)
    node1 = NodeWatch(store, nodes=2, node=1, beats=True, timeout=10)
    assert [(node1.check(t), node0.check(t)) for t in (0, 5, 10, 15, 20)] == [(None, None)] * 5
    # node 1 dies after t = 20: node 0 keeps beating; node 1's count stops moving
    assert [node0.check(t) for t in (25, 30)] == [None, None]
    assert node0.check(30.5) == ('node 1 of 2 stopped answering (no heartbeat for 10 s): stopping node 0. '
                                 'Re-submit the job to resume from its last checkpoint.')


def test_a_process_that_does_not_beat_still_watches():
    store = dist.HashStore()
    beating, listening = NodeWatch(store, 2, 0, True, timeout=5), NodeWatch(store, 2, 0, False, timeout=5)
    for t in (0, 4, 5):  # node 1 never beats
        beating.check(t)
        assert listening.check(t) is None
    assert listening.check(5.1) == ('node 1 of 2 stopped answering (no heartbeat for 5 s): stopping node 0. '
                                    'Re-submit the job to resume from its last checkpoint.')


def test_a_store_that_cannot_be_reached_names_node_0():
    class Gone:
        def add(self, key, amount):
            raise dist.DistNetworkError('Connection reset by peer')
    expected = ("node 0 of 4 (the job's rendezvous store) cannot be reached (DistNetworkError): stopping node 2. "
                'Re-submit the job to resume from its last checkpoint.')
    assert NodeWatch(Gone(), 4, 2, True, timeout=30).check(0) == expected
    # under torchrun's elastic agent too: its rendezvous is on node 0 as well, and the job ends with it
    assert NodeWatch(Gone(), 4, 2, True, timeout=30, next_step="torchrun's elastic agent restarts").check(0) == expected


def test_the_thread_hands_the_first_lost_node_to_on_lost():
    store, found = dist.HashStore(), []
    NodeWatch(store, 2, 0, True, timeout=0.05, interval=0.01, on_lost=found.append).start().wait_for_verdict()
    assert found == ['node 1 of 2 stopped answering (no heartbeat for 0.05 s): stopping node 0. '
                     'Re-submit the job to resume from its last checkpoint.']


def test_node_timeout_must_be_positive(tiny_config, tmp_path):
    from llmfoundry_ext.config import load
    from llmfoundry_ext.errors import ConfigError
    from tests.conftest import write_yaml
    with pytest.raises(ConfigError, match=r'^node_timeout_s: must be positive, got 0.0$'):
        load(write_yaml(tiny_config, tmp_path / 'run.yaml'), ['node_timeout_s=0'])


FINISH_AS_A_NODE = """
import os, sys, time
import torch.distributed as dist
from llmfoundry_ext.node_watch import NodeWatch
node, port, lost_file = int(os.environ['RANK']), int(sys.argv[1]), sys.argv[2]
store = dist.TCPStore('127.0.0.1', port, 2, is_master=node == 0)
dist.init_process_group('gloo', store=store, rank=node, world_size=2)
watch = NodeWatch(store, 2, node, True, timeout=10, interval=0.01,
                  on_lost=lambda message: open(lost_file, 'a').write(message + '\\n')).start()
time.sleep(3 * node)
watch.finish()
"""


def test_a_job_that_ends_well_ends_without_an_error_on_any_node(tmp_path):
    """Node ``node`` of a 2-node job (one process each, forked from the suite's import; node 0 hosting the store),
    watched every 10 ms: node 1 ends its work 3 s after node 0 (which takes up to a second to exit). Anything a watch
    reports goes to ``lost.txt``."""
    from composer.utils import get_free_tcp_port
    lost = tmp_path / 'lost.txt'
    (tmp_path / 'node.py').write_text(FINISH_AS_A_NODE)
    run = subprocess.run([*FORKED, '-n', '2', str(tmp_path / 'node.py'), str(get_free_tcp_port()), str(lost)],
                         cwd=REPO, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    assert not lost.exists(), lost.read_text()


def test_under_torchruns_elastic_agent_the_line_says_the_workers_restart_while_they_may(monkeypatch):
    from llmfoundry_ext.machine import Machine
    from llmfoundry_ext.errors import RESUBMIT
    from llmfoundry_ext.node_watch import what_follows
    monkeypatch.setenv('WORLD_SIZE', '4')
    monkeypatch.setenv('LOCAL_WORLD_SIZE', '2')
    monkeypatch.setenv('TORCHELASTIC_RESTART_COUNT', '1')
    monkeypatch.setenv('TORCHELASTIC_MAX_RESTARTS', '3')
    second_start = Machine.from_environment()
    assert (second_start.nodes, second_start.restart, second_start.restarts_left) == (2, 1, 2)
    assert (second_start.elastic, second_start.world) == (True, '4 ranks on 2 nodes')
    assert (Machine(world_size=2, local_world_size=2).elastic, Machine(2, 2).world) == (False, '2 ranks on 1 node')
    assert what_follows(second_start) == ("torchrun's elastic agent restarts the workers on the nodes left (restart 2 "
                                          "of 3), from the last checkpoint.")
    monkeypatch.setenv('LLMFOUNDRY_EXT_MIN_NODES', '2')  # elastic_launch's --nnodes 2:2: the node left is too few
    assert what_follows(Machine.from_environment()) == (
        "1 node left, fewer than the job's minimum of 2: torchrun's elastic agent restarts the workers if a node joins "
        "within its join timeout (restart 2 of 3), from the last checkpoint, else ends the job.")
    monkeypatch.setenv('TORCHELASTIC_RESTART_COUNT', '3')
    assert what_follows(Machine.from_environment()) == RESUBMIT  # none left: the agent ends the job
    assert what_follows(Machine(world_size=4, local_world_size=2)) == RESUBMIT  # Composer's launcher
