import pytest
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


def test_batch_k_trains_at_the_schedules_value_for_the_end_of_batch_k(tiny_config, tmp_path, monkeypatch):
    """A 4-batch linear warm-up to 1e-3, then a linear decay to 0 at batch 6: the rates the optimizer stepped with."""
    rates = []
    step = DecoupledAdamW.step
    monkeypatch.setattr(DecoupledAdamW, 'step', lambda self, closure=None: rates.append(
        self.param_groups[0]['lr']) or step(self))
    tiny_config.update(max_duration='6ba', checkpoint={'save_folder': None, 'autoresume': False}, loggers={},
                       scheduler={'name': 'linear_with_warmup', 't_warmup': '4ba', 'alpha_f': 0.0})
    trainer = build_trainer(prepare(write_yaml(tiny_config, tmp_path / 'run.yaml')))
    trainer.fit()
    trainer.close()
    assert rates == pytest.approx([2.5e-4, 5e-4, 7.5e-4, 1e-3, 5e-4, 0.0], abs=1e-12)
