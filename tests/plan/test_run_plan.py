"""The run plan: auto settings chosen for a stated GPU, explicit settings that do not fit refused before training."""
import os
import re

import pytest

from llmfoundry_ext.config import load
from llmfoundry_ext.errors import ConfigError
from llmfoundry_ext.machine import Machine, gpu_named
from llmfoundry_ext.plan.memory import Setting
from llmfoundry_ext.plan.run_plan import settle
from tests.conftest import REPO, write_yaml

EVERY_KEY_AUTO = ['device_microbatch_size=auto', 'parallelism.fsdp.activation_checkpointing=auto',
                  'parallelism.fsdp.reshard_after_forward=auto', 'model.float8=auto']


def test_auto_is_the_fastest_setting_predicted_to_fit_a_60_gib_gpu():
    """1B, 8 samples a step on one GPU without float8: micro-batch 8 and 4 without checkpointing (130.1 and 77.7 GiB
    predicted) do not fit 55.2 GiB; 2 without (49.2 GiB, 53,495 tokens/s) is the fastest that does (then 1 without,
    51,897; 4 with selective, 55.2 GiB, 50,854)."""
    config = load(os.path.join(REPO, 'yamls/llama1b.yaml'), ['global_batch_size=8', *EVERY_KEY_AUTO])
    plan = settle(config, Machine.described(1, gpu_named('60')), float8_available=False)
    assert plan.chosen.setting == Setting(micro_batch=2, checkpointing='none', reshard_after_forward=False,
                                          float8=False)
    resolved = plan.config
    assert (resolved.device_microbatch_size, resolved.parallelism.fsdp.activation_checkpointing,
            resolved.parallelism.fsdp.reshard_after_forward, resolved.model.float8) == (2, 'none', False, False)
    assert len(plan.candidates) == 4 * 3 * 1 * 1  # micro-batch 1, 2, 4, 8; three modes; one GPU: no resharding


def test_auto_takes_float8_only_for_the_families_the_held_out_loss_grid_let_through(monkeypatch):
    """Issue 66's grid let no family through (float8 blocks +2.3 % held-out on Python, lr 3e-4): the 1B on an H100
    takes bf16; were llama listed, the same plan would take float8 (faster, less memory)."""
    from llmfoundry_ext.plan import run_plan
    config = load(os.path.join(REPO, 'yamls/llama1b.yaml'), ['global_batch_size=8', *EVERY_KEY_AUTO])
    h100 = Machine.described(1, gpu_named('h100'))
    assert run_plan.FLOAT8_FAMILIES == ()
    assert settle(config, h100, float8_available=True).chosen.setting == Setting(
        micro_batch=2, checkpointing='none', reshard_after_forward=False, float8=False)
    monkeypatch.setattr(run_plan, 'FLOAT8_FAMILIES', ('llama',))
    assert settle(config, h100, float8_available=True).chosen.setting == Setting(
        micro_batch=4, checkpointing='none', reshard_after_forward=False, float8=True)


def refusal_on_a_60_gib_gpu(overrides: list[str]) -> str:
    """The line settling llama1b.yaml with ``overrides`` on one 60 GiB GPU without float8 is refused with."""
    config = load(os.path.join(REPO, 'yamls/llama1b.yaml'), overrides)
    with pytest.raises(ConfigError) as refused:
        settle(config, Machine.described(1, gpu_named('60')), float8_available=False)
    return str(refused.value)


def test_an_explicit_setting_predicted_not_to_fit_is_refused_naming_one_that_fits():
    assert refusal_on_a_60_gib_gpu([
        'global_batch_size=8', 'device_microbatch_size=4', 'parallelism.fsdp.activation_checkpointing=none',
        'parallelism.fsdp.reshard_after_forward=false', 'model.float8=false']) == (
        'device_microbatch_size: micro-batch 4, checkpointing none, reshard false, float8 false is predicted to need '
        '77.7 GiB a GPU, more than the 55.2 GiB that fits a GPU of 60 GiB (H100 speed assumed) (60.0 GiB, less 5% '
        'and 2.0 GiB outside the allocator); set device_microbatch_size=2 (predicted 49.2 GiB, 53,495 tokens/s a '
        'GPU), or auto')


def test_when_no_auto_choice_fits_the_explicit_key_to_change_is_named():
    assert refusal_on_a_60_gib_gpu(['global_batch_size=8', 'device_microbatch_size=8']) == (
        'device_microbatch_size: the smallest setting auto may take here (micro-batch 8, checkpointing full, reshard '
        'false, float8 false) is predicted to need 55.9 GiB a GPU, more than the 55.2 GiB that fits a GPU of 60 GiB '
        '(H100 speed assumed) (60.0 GiB, less 5% and 2.0 GiB outside the allocator); set device_microbatch_size=2 '
        '(predicted 49.2 GiB, 53,495 tokens/s a GPU), or auto')


def test_train_refuses_it_in_one_line_with_exit_status_2_before_any_process_group(tiny_config, tmp_path,
                                                                                  monkeypatch, capsys):
    """On a (described) GPU of 0.01 GiB even the tiny model does not fit: one line, status 2, no process group."""
    from llmfoundry_ext import preflight, train

    def no_process_group(*args):
        raise AssertionError('a process group was started')

    monkeypatch.setattr(preflight, 'gpu_of_this_machine', lambda: gpu_named('0.01'))
    monkeypatch.setattr(train.dist, 'initialize_dist', no_process_group)
    tiny_config['device_microbatch_size'] = 4
    yaml = write_yaml(tiny_config, tmp_path / 'run.yaml')
    capsys.readouterr()
    assert train.main([yaml]) == 2
    stderr = capsys.readouterr().err
    assert re.fullmatch(r'config error: device_microbatch_size: micro-batch 4, checkpointing none, reshard false, '
                        r'float8 false is predicted to need [\d.]+ GiB a GPU, more than the -[\d.]+ GiB that fits '
                        r'a GPU of 0.01 GiB .*, and no setting fits; use more GPUs, '
                        r'parallelism.context_parallel_degree, or a shorter max_seq_len\n', stderr), stderr


def test_the_summary_names_the_report_behind_an_auto_float8():
    config = load(os.path.join(REPO, 'yamls/llama1b.yaml'), ['global_batch_size=8', *EVERY_KEY_AUTO])
    plan = settle(config, Machine.described(1, gpu_named('h100')), float8_available=True)
    assert plan.summary()[0] == (
        '  plan: micro-batch 2 (auto), activation checkpointing none (auto), reshard after forward false (auto), '
        'float8 false (auto; held-out loss: benchmarks/time-to-quality_h200_2026-11-29.md)')
