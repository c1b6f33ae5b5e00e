from composer.optim import DecoupledAdamW

from llmfoundry_ext.build import build_trainer
from llmfoundry_ext.preflight import prepare
from tests.conftest import write_yaml


def test_the_optimizer_steps_after_the_backward_not_from_a_closure(tiny_config, tmp_path, monkeypatch,
                                                                  launched_alone):
    """Composer's closure would end each backward with loss.item(), a host sync before the optimizer step."""
    closures = []
    step = DecoupledAdamW.step
    monkeypatch.setattr(DecoupledAdamW, 'step', lambda self, closure=None: closures.append(closure) or step(self))
    tiny_config.update(max_duration='2ba', checkpoint={'save_folder': None, 'autoresume': False}, loggers={})
    trainer = build_trainer(prepare(write_yaml(tiny_config, tmp_path / 'run.yaml')))
    trainer.fit()
    trainer.close()
    assert closures == [None, None]
    assert int(trainer.state.timestamp.batch) == 2
