"""Activation checkpointing inside the blocks: which blocks, what each mode recomputes, the same loss and gradients
as without it (eager and compiled), and the FSDP2 bf16 input cast that broke Composer's wrapper (CPU)."""
import contextlib
import json
import os
import shlex
import shutil
import subprocess
import sys

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from llmfoundry_ext.build import build_trainer
from llmfoundry_ext.config import load
from llmfoundry_ext.measure.chaos import keep_checkpoints_up_to
from llmfoundry_ext.model.llama import LlamaConfig, Transformer
from llmfoundry_ext.parallelism import checkpointed_blocks, describe_checkpointing, parallelize
from llmfoundry_ext.preflight import prepare
from tests.conftest import FORKED, REPO, global_batches, train_runs, write_yaml

TINY = LlamaConfig(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=128, vocab_size=97, max_seq_len=64,
                   rope_theta=10000.0, rope_scaling_factor=1.0, tie_embeddings=True)


def run_config(tiny_config, tmp_path, mode: str, every: int = 1, compile_blocks: bool = False):
    tiny_config['parallelism']['fsdp'].update(activation_checkpointing=mode, checkpoint_every=every)
    tiny_config['model']['compile'] = compile_blocks
    return load(write_yaml(tiny_config, tmp_path / f'{mode}-{every}-{compile_blocks}.yaml'))


@pytest.mark.parametrize('mode, every, blocks, text', [
    ('none', 1, [], 'no activation checkpointing'),
    ('full', 1, [0, 1, 2, 3, 4], 'full activation checkpointing of every block'),
    ('full', 2, [0, 2, 4], 'full activation checkpointing of every 2nd block'),
    ('selective', 3, [0, 3], 'selective activation checkpointing of every 3rd block'),
    ('selective', 4, [0, 4], 'selective activation checkpointing of every 4th block'),
    ('full_except_attention', 1, [0, 1, 2, 3, 4], 'full_except_attention activation checkpointing of every block')])
def test_checkpointed_blocks_and_their_description(tiny_config, tmp_path, mode, every, blocks, text):
    tiny_config['model']['n_layers'] = 5
    config = run_config(tiny_config, tmp_path, mode, every)
    assert [block.layer_id for block in checkpointed_blocks(Transformer(config.model.architecture()), config)] == blocks
    assert describe_checkpointing(config) == text


class CountOps(TorchDispatchMode):
    """How many matmuls and attention forwards (SDPA's CPU kernel) ran."""
    def __init__(self):
        super().__init__()
        self.count = {'matmuls': 0, 'attentions': 0}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count['matmuls'] += func is torch.ops.aten.mm.default
        self.count['attentions'] += func is torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default
        return func(*args, **(kwargs or {}))


def loss_grads_and_backward_matmuls(config, count: bool = True):
    """fp32 on the CPU: the loss, every gradient, and how many matmuls and attention forwards ran in the backward
    pass (None uncounted: torch 2.11's compiled backward runs a higher-order op that a dispatch mode cannot pass
    through)."""
    torch.manual_seed(0)
    transformer = Transformer(TINY)
    parallelize(transformer, config)
    tokens = torch.randint(0, 97, (2, 32))
    logits = transformer(tokens)
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), torch.roll(tokens, -1, 1).flatten())
    counter = CountOps() if count else None
    with counter or contextlib.nullcontext():
        loss.backward()
    return loss.detach(), {name: p.grad for name, p in transformer.named_parameters()}, counter and counter.count


# Backward matmuls: 2 per linear (input and weight gradients), 7 linears a block, 2 blocks, plus the output layer's
# 2 = 30; full recomputation adds 6 forward matmuls per checkpointed block (it stops once the backward has what it
# needs: down_proj's output is not needed) and the block's attention forward; selective recomputes only every second
# matmul (k, o, up: 3) and keeps attention; full_except_attention recomputes the 6 matmuls but keeps attention.
@pytest.mark.parametrize('mode, every, backward_matmuls, backward_attentions', [
    ('none', 1, 30, 0), ('full', 1, 30 + 2 * 6, 2), ('full', 2, 30 + 6, 1), ('selective', 1, 30 + 2 * 3, 0),
    ('full_except_attention', 1, 30 + 2 * 6, 0), ('full_except_attention', 2, 30 + 6, 0)])
def test_each_mode_recomputes_what_it_should_and_changes_no_number(tiny_config, tmp_path, mode, every,
                                                                   backward_matmuls, backward_attentions):
    expected_loss, expected_grads, _ = loss_grads_and_backward_matmuls(run_config(tiny_config, tmp_path, 'none'))
    loss, grads, recomputed = loss_grads_and_backward_matmuls(run_config(tiny_config, tmp_path, mode, every))
    assert recomputed == {'matmuls': backward_matmuls, 'attentions': backward_attentions}
    assert torch.equal(loss, expected_loss)
    for name, grad in expected_grads.items():
        assert torch.equal(grads[name], grad), name


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize('mode', ['full', 'selective', 'full_except_attention'])
def test_compiled_blocks_with_checkpointing_match_eager(tiny_config, tmp_path, mode):
    """Checkpointing inside the compiled block (inductor, here on the CPU): the loss and gradients of the eager
    model without checkpointing, within fp32 rounding."""
    expected_loss, expected_grads, _ = loss_grads_and_backward_matmuls(run_config(tiny_config, tmp_path, 'none'))
    loss, grads, _ = loss_grads_and_backward_matmuls(run_config(tiny_config, tmp_path, mode, compile_blocks=True),
                                                     count=False)
    torch.testing.assert_close(loss, expected_loss, rtol=1e-5, atol=1e-5)
    for name, grad in expected_grads.items():
        torch.testing.assert_close(grads[name], grad, rtol=1e-4, atol=1e-5, msg=name)


def sharded_as_composer_does(transformer: Transformer, config) -> Transformer:
    """``parallelize``, then FSDP2 per block and at the root with bf16 parameters and fp32 gradient reduction (the
    mixed precision of Composer's amp_bf16)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    parallelize(transformer, config)
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for block in transformer.layers:
        fully_shard(block, mp_policy=policy)
    return fully_shard(transformer, mp_policy=policy)


@pytest.mark.parametrize('mode', ['full', 'selective', 'full_except_attention'])
def test_checkpointing_inside_fsdp2_units_recomputes_with_the_bf16_cast_inputs(tiny_config, tmp_path, mode,
                                                                            one_process_group):
    """FSDP2 with bf16 parameters casts each block's float inputs (the fp32 RoPE tables) to bf16 in its pre-forward
    hook, which does not run again for the recomputation: a checkpoint around the FSDP2 unit (Composer's wrapper)
    recomputed with fp32 tables and stopped with a CheckpointError. Inside the unit, bf16 gradients equal the
    uncheckpointed model's exactly."""
    def bf16_grads(config):
        torch.manual_seed(0)
        transformer = sharded_as_composer_does(Transformer(TINY), config)
        tokens = torch.randint(0, 97, (2, 32))
        transformer(tokens).float().logsumexp(-1).mean().backward()
        return {name: p.grad.full_tensor() for name, p in transformer.named_parameters()}

    expected = bf16_grads(run_config(tiny_config, tmp_path, 'none'))
    grads = bf16_grads(run_config(tiny_config, tmp_path, mode))
    assert all(torch.equal(grads[name], grad) for name, grad in expected.items())


def test_fsdp2_units_are_torchtitans(tiny_config, tmp_path, one_process_group, launched_alone, fsdp_on_one_process):
    """Each block is a unit; untied embeddings and output layer are units of their own (the output layer kept
    gathered after its forward); tied, they stay with the root. The output layer's fused loss goes through its
    call, so its unit is gathered for it."""
    from torch.distributed.fsdp import FSDPModule

    tiny_config['model']['tie_embeddings'] = False
    trainer = build_trainer(prepare(write_yaml(tiny_config, tmp_path / 'untied.yaml')))
    transformer = trainer.state.model.model
    assert [name for name, m in transformer.named_modules() if isinstance(m, FSDPModule)] == [
        '', 'embed_tokens', 'layers.0', 'layers.1', 'lm_head']
    assert transformer.fsdp_wrap_fn(transformer.lm_head) == {'reshard_after_forward': False}
    tied = Transformer(TINY)
    assert [name for name, m in tied.named_modules() if tied.fsdp_wrap_fn(m)] == ['layers.0', 'layers.1']


def test_composer_gets_no_checkpointing_of_its_own(tiny_config, tmp_path):
    from llmfoundry_ext.parallelism import composer_parallelism
    config = run_config(tiny_config, tmp_path, 'full')
    assert composer_parallelism(config, sharded=True)['fsdp'].activation_checkpointing is False
    assert composer_parallelism(config, sharded=False) is None


@pytest.mark.parametrize('split', [False, True])
def test_blocks_compile_without_peak_memory_reordering_under_context_parallelism(tiny_config, tmp_path, monkeypatch,
                                                                                 split):
    """Under context parallelism Inductor's peak-memory reordering is off for the blocks (it ordered the two ranks'
    backward differently, and they waited for each other); otherwise Inductor's defaults."""
    compiled = []
    monkeypatch.setattr(torch.nn.Module, 'compile', lambda module, **options: compiled.append(options))

    class ShardsNothing:  # stands in for ContextParallel, which needs GPUs
        def apply(self, transformer):
            pass

    transformer = Transformer(TINY)
    parallelize(transformer, run_config(tiny_config, tmp_path, 'full', compile_blocks=True),
                ShardsNothing() if split else None)
    options = {'reorder_for_peak_memory': False} if split else None
    assert compiled == [{'options': options}] * TINY.n_layers


@pytest.mark.slow
def test_context_parallel_forward_equals_the_whole_sequence_on_the_cpu(tmp_path):
    """Two gloo processes, flex with packed documents (the CPU runs flex's forward, not its backward): the loss of the
    sequence split over both, each rank's token mean scaled by its share of the labels, equals the whole sequence's
    (the first 128 labels of row 0 are -100, so the ranks' label counts differ). torch.compile is off: flex runs
    unfused, as its loss needs (compiling it on the CPU took ~15 s a rank; compiled flex on the CPU:
    tests/model/test_llama.py; under context parallelism on GPUs: tests/test_parallelism_gpu.py)."""
    result = run_context_parallel_worker(tmp_path, '--device', 'cpu', '--backend', 'flex', '--seq', '1024',
                                         '--documents', '--forward-only', env={'TORCHDYNAMO_DISABLE': '1'})
    assert abs(result['loss'] - result['expected_loss']) < 1e-5, result


def run_context_parallel_worker(tmp_path, *args, env: dict | None = None) -> dict:
    """tests/context_parallel_worker.py on 2 ranks forked from one import (FORKED: the launch is not the subject);
    ``env``: more of the launch's environment."""
    out = tmp_path / 'context_parallel.json'
    command = [*FORKED, '-n', '2', 'tests/context_parallel_worker.py', str(out), *args]
    run = subprocess.run(command, cwd=REPO, timeout=900, env={**os.environ, 'OMP_NUM_THREADS': '1', **(env or {})})
    assert run.returncode == 0, f'the worker ended with exit status {run.returncode}: its output is above'
    return json.loads(out.read_text())


def run_yaml(config: dict, folder, replicate: int) -> str:
    """``config`` with checkpoints in ``folder`` (FSDP2, or HSDP with ``replicate`` replicas) and its sample ledger."""
    config = {**config, 'checkpoint': {'save_folder': str(folder / 'checkpoints'), 'save_interval': '3ba'},
              'callbacks': {'sample_ledger': {'folder': str(folder / 'ledger')}}, 'loggers': {}}
    config['parallelism'] = {'fsdp': {'state_dict_type': 'sharded', 'replicate_degree': replicate}}
    os.makedirs(folder, exist_ok=True)
    return write_yaml(config, folder / 'run.yaml')


def train_in_one_launch(config: dict, processes: int, runs: list[tuple]) -> list[dict[int, dict]]:
    """One launch of ``processes`` ranks training each run of ``runs`` (folder, replicate, override...) in turn
    (``train_runs``); each run's sample ledgers, rank -> ``read_ledger``'s."""
    from llmfoundry_ext.callbacks.sample_ledger import read_ledger

    outputs = train_runs(processes, [shlex.join([run_yaml(config, folder, replicate), *overrides])
                                     for folder, replicate, *overrides in runs])
    for output, (_, replicate, *_) in zip(outputs, runs):
        layout = f'HSDP {replicate} replicas x {processes // replicate} shards' if replicate > 1 else \
            f'FSDP2 over {processes} ranks'
        assert layout in output
    return [{rank: read_ledger(str(folder / 'ledger' / f'ledger-rank{rank}.jsonl')) for rank in range(processes)}
            for folder, *_ in runs]


def mean_losses(ledgers: dict[int, dict], batches) -> list[float]:
    return [sum(ledger[b]['loss'] for ledger in ledgers.values()) / len(ledgers) for b in batches]


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_hsdp_on_four_processes_trains_as_fsdp_and_checkpoints_move_between_them(tiny_config, tmp_path):
    """gloo has no ReduceOp.AVG for the replicas' gradients: FSDP2 sums them and divides (parallelism.py). Three
    launches: FSDP 4 and HSDP 2 x 2 to batch 3; HSDP's checkpoint at batch 3 resumed by FSDP 4, and FSDP 4's by HSDP
    2 x 2; HSDP's by FSDP 2."""
    tiny_config.update(max_duration='6ba', global_batch_size=8)
    fsdp4, hsdp = train_in_one_launch(tiny_config, 4, [(tmp_path / 'fsdp4', 1),
                                                       (tmp_path / 'hsdp', 2, 'callbacks.stop_after.batches=3')])
    for rank in range(4):  # the same samples on each rank; losses to the order of the sums (fp32)
        assert [hsdp[rank][b]['sample_ids'] for b in (1, 2, 3)] == [fsdp4[rank][b]['sample_ids'] for b in (1, 2, 3)]
        assert [hsdp[rank][b]['loss'] for b in (1, 2, 3)] == pytest.approx(
            [fsdp4[rank][b]['loss'] for b in (1, 2, 3)], rel=1e-5, abs=0)
    for name in ('as-fsdp4', 'as-fsdp2'):  # HSDP's checkpoint at batch 3
        shutil.copytree(tmp_path / 'hsdp', tmp_path / name, symlinks=True)
        shutil.rmtree(tmp_path / name / 'ledger')
    shutil.copytree(tmp_path / 'fsdp4', tmp_path / 'to-hsdp', symlinks=True)  # FSDP 4 as if stopped at batch 3
    keep_checkpoints_up_to(tmp_path / 'to-hsdp' / 'checkpoints', 3)
    shutil.rmtree(tmp_path / 'to-hsdp' / 'ledger')
    as_fsdp4, to_hsdp = train_in_one_launch(tiny_config, 4, [(tmp_path / 'as-fsdp4', 1), (tmp_path / 'to-hsdp', 2)])
    as_fsdp2, = train_in_one_launch(tiny_config, 2, [(tmp_path / 'as-fsdp2', 1)])
    for resumed, processes in ((as_fsdp4, 4), (as_fsdp2, 2), (to_hsdp, 4)):
        assert [sorted(ledger) for ledger in resumed.values()] == [[4, 5, 6]] * processes  # resumed, not restarted
        assert global_batches(resumed, (4, 5, 6)) == global_batches(fsdp4, (4, 5, 6))
        assert mean_losses(resumed, (4, 5, 6)) == pytest.approx(mean_losses(fsdp4, (4, 5, 6)), rel=1e-5, abs=0)
