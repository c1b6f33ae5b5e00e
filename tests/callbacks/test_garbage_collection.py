"""garbage_collection: Python's automatic collection off while training, a generation-1 collection every interval
batches, and the collector as it was after the fit."""
import gc
import types

import pytest
from composer.core import Callback

from llmfoundry_ext.callbacks import garbage_collection
from llmfoundry_ext.callbacks.garbage_collection import GarbageCollection
from llmfoundry_ext.errors import ConfigError
from llmfoundry_ext.preflight import prepare
from llmfoundry_ext.train import train
from tests.conftest import write_yaml


class RecordBatches(Callback):
    def __init__(self, events: list):
        self.events = events

    def batch_end(self, state, logger) -> None:
        self.events.append(('batch', int(state.timestamp.batch), gc.isenabled()))


def test_collections_run_at_every_interval_and_never_on_their_own_while_training(tiny_config, tmp_path, monkeypatch,
                                                                                  launched_alone):
    events = []
    monkeypatch.setattr(garbage_collection, 'gc', types.SimpleNamespace(
        collect=lambda generation: events.append(('collect', generation)), disable=gc.disable, enable=gc.enable,
        isenabled=gc.isenabled))
    tiny_config.update(max_duration='7ba', checkpoint={'save_folder': None, 'autoresume': False}, loggers={})
    tiny_config['callbacks'] = {'garbage_collection': {'interval': 3}}
    assert gc.isenabled()
    trainer = train(prepare(write_yaml(tiny_config, tmp_path / 'run.yaml')), extra_callbacks=[RecordBatches(events)])
    assert events == [('collect', 1), ('batch', 1, False), ('batch', 2, False), ('collect', 1), ('batch', 3, False),
                      ('batch', 4, False), ('batch', 5, False), ('collect', 1), ('batch', 6, False),
                      ('batch', 7, False)]
    assert gc.isenabled()  # given back at the fit's end
    trainer.close()
    assert gc.isenabled()


def test_a_collector_that_was_off_stays_off_and_a_bad_interval_is_one_line():
    callback = GarbageCollection()
    gc.disable()
    try:
        callback.fit_start(None, None)
        callback.close(None, None)
        assert not gc.isenabled()
    finally:
        gc.enable()
    with pytest.raises(ConfigError, match=r'^callbacks.garbage_collection.interval: 0; it is a number of batches, '
                                          r'at least 1 \(torchtitan collects every 50\)$'):
        GarbageCollection(interval=0)
