"""Expert parallelism on CPU processes (gloo): each block's experts split over the ranks, tokens sent to them by
all-to-all; the same losses as FSDP2 alone from the same weights, and checkpoints that move between the degrees."""
import dataclasses
import json
import shlex
import shutil

import pytest

from llmfoundry_ext.callbacks.sample_ledger import read_ledger
from llmfoundry_ext.measure.chaos import keep_checkpoints_up_to
from tests.conftest import changes, config_error, global_batches, train_runs, write_yaml
from tests.test_parallelism import mean_losses


def mixtral(config: dict, folder, degree: int) -> str:
    """``config`` as a small Mixtral (4 experts, top 2) with its experts split over ``degree`` ranks, checkpoints
    and ledger in ``folder``."""
    config = {**config, 'checkpoint': {'save_folder': str(folder / 'checkpoints'), 'save_interval': '10ba'},
              'callbacks': {'sample_ledger': {'folder': str(folder / 'ledger')}}, 'loggers': {}}
    config['model'] = {**config['model'], 'family': 'mixtral', 'n_experts': 4, 'experts_per_token': 2, 'ffn_dim': 64}
    config['parallelism'] = {'fsdp': {'state_dict_type': 'sharded'}, 'expert_parallel_degree': degree}
    config['algorithms'] = {'gradient_clipping': {'clipping_type': 'norm', 'clipping_threshold': 1.0}}
    folder.mkdir(parents=True, exist_ok=True)
    return write_yaml(config, folder / 'run.yaml')


def train_mixtral(config: dict, processes: int, runs: list[tuple], norms=None) -> list[dict[int, dict]]:
    """One launch of ``processes`` ranks training each (folder, degree, override...) in turn; their ledgers.
    ``norms``: a JSON file for each run's gradient norms (tests/gradient_norms_worker.py)."""
    outputs = train_runs(processes, [shlex.join([mixtral(config, folder, degree), *overrides])
                                     for folder, degree, *overrides in runs],
                         worker=['tests/gradient_norms_worker.py', str(norms)] if norms else None)
    for output, (_, degree, *_) in zip(outputs, runs):
        split = f', experts over {degree} ranks (expert parallel)' if degree > 1 else ''
        assert f'FSDP2 over {processes} ranks{split}' in output
    return [{rank: read_ledger(str(folder / 'ledger' / f'ledger-rank{rank}.jsonl')) for rank in range(processes)}
            for folder, *_ in runs]


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize('optimizer', [{'name': 'decoupled_sgdw', 'lr': 0.5},  # no state; each update its gradient
                                       {'name': 'adamw', 'lr': 1e-3}])  # its moments (DTensors) move with the weights
def test_experts_split_over_two_ranks_train_as_fsdp_alone_and_checkpoints_move_between_degrees(tiny_config, tmp_path,
                                                                                               optimizer):
    """Two runs on 2 ranks from the same weights (the same seed's initialisation, split after it): FSDP2 alone
    (expert parallel 1) and the experts split over both ranks (2), 20 batches, a checkpoint at 10; then each one's
    checkpoint resumed at the other degree. fp32: the experts' gradients sum the two ranks' tokens in another order
    (one grouped GEMM over both ranks' copies, against each rank's partial sums reduce-scattered), so losses and
    norms agree to rounding, not to the bit: within 1e-5 and 1e-6 relative (seen: ~1e-7); the samples exactly."""
    tiny_config.update(max_duration='20ba', optimizer=optimizer)
    norms = tmp_path / 'norms.json'
    whole, split = train_mixtral(tiny_config, 2, [(tmp_path / 'ep1', 1), (tmp_path / 'ep2', 2)], norms)
    whole_norms, split_norms = json.loads(norms.read_text())  # every mesh's gradients, the experts' among them
    assert len(whole_norms) == 20 and split_norms == pytest.approx(whole_norms, rel=1e-6, abs=0)
    batches, later = range(1, 21), range(11, 21)
    assert global_batches(split, batches) == global_batches(whole, batches)
    assert mean_losses(split, batches) == pytest.approx(mean_losses(whole, batches), rel=1e-5, abs=0)
    for source, target in (('ep2', 'ep2-at-1'), ('ep1', 'ep1-at-2')):  # as if stopped after batch 10
        shutil.copytree(tmp_path / source, tmp_path / target, symlinks=True)
        keep_checkpoints_up_to(tmp_path / target / 'checkpoints', 10)
        shutil.rmtree(tmp_path / target / 'ledger')
    at_1, at_2 = train_mixtral(tiny_config, 2, [(tmp_path / 'ep2-at-1', 1), (tmp_path / 'ep1-at-2', 2)])
    for resumed, continued in ((at_1, split), (at_2, whole)):
        assert [sorted(ledger) for ledger in resumed.values()] == [list(later)] * 2  # resumed, not restarted
        assert global_batches(resumed, later) == global_batches(whole, later)
        assert mean_losses(resumed, later) == pytest.approx(mean_losses(continued, later), rel=1e-5, abs=0)


def drawn_gate(folder):
    """The first block's experts' gate weights [E, F, dim], whole, from ``folder``'s checkpoint at batch 10."""
    import torch
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    dcp_to_torch_save(str(folder / 'checkpoints' / 'ep0-ba10'), str(folder / 'drawn.pt'))
    return torch.load(folder / 'drawn.pt', weights_only=False)['state']['model']['model.layers.0.mlp.experts.w1']


def as_mixtral(config: dict) -> None:
    config['model'].update(family='mixtral', n_experts=4, experts_per_token=2)


EP = 'parallelism.expert_parallel_degree'
BAD_DEGREES = [  # (world size, change), the line
    ((2, changes((EP, 2))), f'{EP}: 2 splits experts, and model.family llama has none; set {EP}=1'),
    ((2, changes((EP, 3)), as_mixtral), f'{EP}: 3 does not divide model.n_experts 4; use a divisor of it'),
    ((1, changes((EP, 2)), as_mixtral), f'{EP}: 2 does not divide the world size 1; use a divisor of it'),
    ((2, changes((EP, 2), ('parallelism.fsdp', None)), as_mixtral),
     f'{EP}: expert parallelism runs under FSDP2 over all ranks (parallelism.fsdp set, replicate_degree 1, '
     f'context_parallel_degree 1); set those, or {EP}=1'),
    ((4, changes((EP, 2), ('parallelism.fsdp.replicate_degree', 2)), as_mixtral),
     f'{EP}: expert parallelism runs under FSDP2 over all ranks (parallelism.fsdp set, replicate_degree 1, '
     f'context_parallel_degree 1); set those, or {EP}=1'),
]


@pytest.mark.parametrize('world_and_changes, message', BAD_DEGREES, ids=[m[:60] for _, m in BAD_DEGREES])
def test_a_degree_that_cannot_split_the_experts_is_one_line(tiny_config, tmp_path, monkeypatch, world_and_changes,
                                                            message):
    from llmfoundry_ext.config import load

    world, *mutations = world_and_changes
    monkeypatch.setenv('WORLD_SIZE', str(world))
    assert config_error(load, tiny_config, tmp_path, lambda config: [mutate(config) for mutate in mutations]) == \
        message


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_experts_split_on_a_meta_build_are_drawn_and_resume_at_degree_1(tiny_config, tmp_path):
    """The meta build (auto's on GPUs without init_from): the experts split while on meta, each rank's share drawn by
    Composer after (on the CPU here: tests/meta_on_cpu_worker.py), at the init std (a learning rate of 0 keeps the
    draw to the checkpoint); its checkpoint at batch 10 resumed at degree 1 gives the losses of the run going on at
    2 (within 1e-5 relative, as above) and its samples. That the two ranks draw their shares apart is DTensor's CUDA
    RNG (tests/test_expert_parallel_gpu.py): on the CPU DTensor has none, and both draw the same share."""
    tiny_config.update(max_duration='20ba')
    meta = 'model.init_device=meta'
    runs = [shlex.join([mixtral(tiny_config, tmp_path / folder, 2), meta, *overrides])
            for folder, overrides in (('ep2', []), ('drawn', ['optimizer.lr=0', 'max_duration=10ba']))]
    train_runs(2, runs, worker=['tests/meta_on_cpu_worker.py'])
    gate = drawn_gate(tmp_path / 'drawn')
    assert gate.shape == (4, 64, 64)
    assert gate.std().item() == pytest.approx(0.02, rel=0.05)
    shutil.copytree(tmp_path / 'ep2', tmp_path / 'at-1', symlinks=True)
    keep_checkpoints_up_to(tmp_path / 'at-1' / 'checkpoints', 10)
    shutil.rmtree(tmp_path / 'at-1' / 'ledger')
    at_1, = train_mixtral(tiny_config, 2, [(tmp_path / 'at-1', 1)])
    split = {rank: read_ledger(str(tmp_path / 'ep2' / 'ledger' / f'ledger-rank{rank}.jsonl')) for rank in range(2)}
    later = range(11, 21)
    assert [sorted(ledger) for ledger in at_1.values()] == [list(later)] * 2
    assert global_batches(at_1, later) == global_batches(split, later)
    assert mean_losses(at_1, later) == pytest.approx(mean_losses(split, later), rel=1e-5, abs=0)


@pytest.mark.parametrize('degree, init_from, device', [(1, False, 'meta'), (2, False, 'meta'), (2, True, 'cpu')])
def test_auto_builds_on_meta_where_the_experts_are_split_but_on_the_cpu_to_load_weights(tiny_config, tmp_path,
                                                                                       monkeypatch, degree,
                                                                                       init_from, device):
    """Under FSDP2 on GPUs auto builds on meta, under expert parallelism too (its draw on two GPUs:
    tests/test_expert_parallel_gpu.py), but on every rank's CPU where ``init_from``'s whole experts are split."""
    from llmfoundry_ext.config import load
    from llmfoundry_ext.machine import Machine, gpu_named
    from llmfoundry_ext.plan.run_plan import init_device

    as_mixtral(tiny_config)
    changes((EP, degree))(tiny_config)
    monkeypatch.setenv('WORLD_SIZE', '2')
    config = load(write_yaml(tiny_config, tmp_path / 'run.yaml'))
    if init_from:  # set after load(), which reads the weights' config: there are none here
        config = dataclasses.replace(config, model=dataclasses.replace(config.model, init_from='weights/'))
    assert init_device(config, Machine.described(2, gpu_named('h100')), shards=True) == device
