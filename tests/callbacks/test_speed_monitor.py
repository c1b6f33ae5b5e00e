"""Our SpeedMonitor counts a batch's FLOPs on the host: world size x the model's ``rank_flops``."""
import pytest

from llmfoundry_ext.preflight import prepare
from llmfoundry_ext.train import logged_history, train
from tests.conftest import write_yaml


def test_flops_per_second_over_tokens_per_second_is_the_models_flops_per_token(tiny_config, tmp_path):
    tiny_config.update(parallelism={'fsdp': None}, max_duration='6ba', loggers={'in_memory': {}},
                       callbacks={'speed_monitor': {'window_size': 2}})
    run = prepare(write_yaml(tiny_config, tmp_path / 'run.yaml'))
    trainer = train(run)
    history = logged_history(trainer)
    trainer.close()
    flops, tokens = history['throughput/flops_per_sec'], history['throughput/tokens_per_sec']
    assert len(flops) == len(tokens) == 4  # batches 3-6: a window of 2 needs 3 timestamps
    expected = run.architecture.flops_per_token(32)  # tiny_config's max_seq_len
    assert [f / t for (_, f), (_, t) in zip(flops, tokens)] == pytest.approx([expected] * 4, rel=1e-9)
