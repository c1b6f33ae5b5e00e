"""TensorBoard holds the logged loss tensors until its flush and writes each at its own step."""
from llmfoundry_ext.measure.plotting import read_scalars
from llmfoundry_ext.preflight import prepare
from llmfoundry_ext.train import logged_history, train
from tests.conftest import write_yaml


def test_the_loss_reaches_tensorboard_at_each_step_with_the_logged_value(tiny_config, tmp_path):
    tiny_config.update(parallelism={'fsdp': None}, max_duration='7ba',
                       loggers={'in_memory': {}, 'tensorboard': {'log_dir': str(tmp_path / 'tb'), 'flush_interval': 3}})
    trainer = train(prepare(write_yaml(tiny_config, tmp_path / 'run.yaml')))
    board = next(d for d in trainer.logger.destinations if type(d).__name__ == 'TensorboardLogger')
    assert board.pending == []  # flushed at batches 3 and 6 and at the end
    logged = [(int(time.batch), float(loss)) for time, loss in logged_history(trainer)['loss/train/total']]
    trainer.close()
    assert read_scalars(str(tmp_path / 'tb'))['loss/train/total'] == logged
    assert [step for step, _ in logged] == [0, 1, 2, 3, 4, 5, 6]
