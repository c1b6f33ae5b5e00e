"""The YAML's named components: the default's arguments a named optimizer or scheduler keeps."""
import dataclasses

import pytest

from llmfoundry_ext.config import load
from llmfoundry_ext.registry import with_default_arguments
from tests.conftest import write_yaml


@pytest.mark.parametrize('optimizer, scheduler, expected, defaulted', [
    ({'name': 'adamw'}, {'name': 'linear_with_warmup'},
     ({'name': 'adamw', 'lr': 3e-4}, {'name': 'linear_with_warmup', 't_warmup': '100ba'}),
     {'optimizer': ['lr'], 'scheduler': ['t_warmup']}),
    ({'name': 'decoupled_sgdw', 'lr': 0.1}, {'name': 'constant'},  # set, or not an argument of ConstantScheduler
     ({'name': 'decoupled_sgdw', 'lr': 0.1}, {'name': 'constant'}), {}),
    ({'name': 'adamw'}, None, ({'name': 'adamw', 'lr': 3e-4}, None), {'optimizer': ['lr']}),
    ({'name': 'no_such_optimizer'}, {'name': 'cosine'},  # an unknown name is check_all's to report
     ({'name': 'no_such_optimizer'}, {'name': 'cosine'}), {}),
    ({'lr': 0.01}, {'t_warmup': '5ba'},  # no name: the default's (scheduler.t_warmup=5ba on a YAML without one)
     ({'lr': 0.01, 'name': 'decoupled_adamw'}, {'t_warmup': '5ba', 'name': 'cosine_with_warmup'}),
     {'optimizer': ['name'], 'scheduler': ['name']}),
])
def test_a_named_component_keeps_the_defaults_arguments_it_takes_and_leaves_out(
        tiny_config, tmp_path, optimizer, scheduler, expected, defaulted):
    tiny_config.update(optimizer=optimizer, scheduler=scheduler)
    config = load(write_yaml(tiny_config, tmp_path / 'run.yaml'))
    filled, gained = with_default_arguments(config)
    assert (filled.optimizer, filled.scheduler) == expected
    assert gained == defaulted
    assert filled == dataclasses.replace(config, optimizer=expected[0], scheduler=expected[1])
