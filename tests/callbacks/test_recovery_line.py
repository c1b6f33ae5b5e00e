"""The recovery line: the world before and after a restart, the batches trained again and the time between."""
from llmfoundry_ext.callbacks.recovery_line import recovery_line
from llmfoundry_ext.machine import Machine


def test_the_line_names_both_worlds_the_batches_again_and_the_time_between():
    restarted = Machine(world_size=2, local_world_size=2, restart=1, max_restarts=3)
    before = {'batch': 17, 'time': 100.0, 'world': '4 ranks on 2 nodes'}
    now = {'batch': 16, 'time': 121.44, 'world': '2 ranks on 1 node'}
    assert recovery_line(before, 15, now, restarted) == (
        'recovery: restart 1 of 3 at 2 ranks on 1 node (before: 4 ranks on 2 nodes, to batch 17); resumed from the '
        'checkpoint of batch 15, 2 batches trained again; batch 16 trained 21.4 s after batch 17 was')
    grown = Machine(world_size=6, local_world_size=2, restart=0, max_restarts=3)  # a node joined: no restart counted
    assert recovery_line({**before, 'batch': 2}, 0, {'batch': 1, 'time': 103.0, 'world': '6 ranks on 3 nodes'},
                         grown) == ('recovery: restart 0 of 3 at 6 ranks on 3 nodes (before: 4 ranks on 2 nodes, to '
                                    'batch 2); resumed from scratch, 2 batches trained again; batch 1 trained 3.0 s '
                                    'after batch 2 was')
