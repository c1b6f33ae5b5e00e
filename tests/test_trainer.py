import inspect

import pytest
import torch
from composer.optim import DecoupledAdamW
from composer.utils import dist
from torch.distributed.tensor import DTensor

from llmfoundry_ext.build import build_trainer
from llmfoundry_ext.model.composer_model import LanguageModel, token_mean_cross_entropy
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


def test_a_share_of_a_sample_a_rank_schedules_and_counts_whole_samples(tiny_config, tmp_path):
    """Under context parallelism each rank counts its share of the batch's samples, a float
    (ContextParallel.samples): the schedule's step takes the batch's whole samples (Composer's Timestamp refused 1.0,
    and llama8b-131k.yaml stopped at its first batch on 2 GPUs)."""
    tiny_config.update(max_duration='3ba', checkpoint={'save_folder': None, 'autoresume': False}, loggers={})
    trainer = build_trainer(prepare(write_yaml(tiny_config, tmp_path / 'run.yaml')))
    samples = trainer._train_data_spec.get_num_samples_in_batch
    trainer._train_data_spec.get_num_samples_in_batch = lambda batch: samples(batch) / 2
    trainer.fit()
    trainer.close()
    assert trainer.state.timestamp.sample.value == 3 * tiny_config['global_batch_size'] // 2


def test_micro_batches_of_a_batch_step_as_the_whole_batch(tiny_config, tmp_path, monkeypatch):
    """The batch size that scales each micro-batch's loss is counted on the host: 3 batches of 8 in micro-batches
    of 4 leave the weights of torch's SGD on the whole batches' mean loss (fp32; SGD's step is proportional to the
    gradient, so a loss scaled wrong moves the weights by another amount)."""
    microbatches = []
    loss_of = LanguageModel.loss
    monkeypatch.setattr(LanguageModel, 'loss', lambda self, outputs, batch: microbatches.append(
        {key: value.clone() for key, value in batch.items()}) or loss_of(self, outputs, batch))
    tiny_config.update(max_duration='3ba', device_microbatch_size=4, scheduler=None, callbacks={}, loggers={},
                       checkpoint={'save_folder': None, 'autoresume': False},
                       optimizer={'name': 'decoupled_sgdw', 'lr': 1.0})
    run = prepare(write_yaml(tiny_config, tmp_path / 'run.yaml'))
    trainer = build_trainer(run)
    initial = {name: p.detach().clone() for name, p in trainer.state.model.model.named_parameters()}
    trainer.fit()
    trainer.close()

    model = run.config.model.family_entry().module(run.architecture, run.kernels)
    model.load_state_dict(initial, strict=False)  # the RoPE table is a buffer of its own
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    for first, second in zip(microbatches[::2], microbatches[1::2]):
        batch = {key: torch.cat([first[key], second[key]]) for key in ('input_ids', 'labels')}
        token_mean_cross_entropy(model(batch['input_ids']), batch['labels']).backward()
        optimizer.step()
        optimizer.zero_grad()
    trained = dict(trainer.state.model.model.named_parameters())
    assert len(microbatches) == 6
    assert [name for name, p in model.named_parameters()
            if not torch.allclose(p, trained[name], rtol=0, atol=1e-6)] == []


def test_a_run_steps_as_a_plain_torch_loop_that_clips_then_steps_fused_adamw(tiny_config, tmp_path, monkeypatch,
                                                                             launched_alone):
    """fp32, one process under FSDP2, the clip active every batch (norms ~0.8 over a threshold of 0.5, folded into
    fused AdamW): each batch's loss equals torch's own loop on the same weights and batches (clip_grad_norm_, fused
    AdamW, torchtitan's warm-up and linear decay as a LambdaLR stepped after each batch)."""
    batches, losses = [], []
    loss_of = LanguageModel.loss

    def recording(self, outputs, batch):
        loss = loss_of(self, outputs, batch)
        batches.append({key: value.clone() for key, value in batch.items()})
        losses.append(loss.item())
        return loss

    monkeypatch.setattr(LanguageModel, 'loss', recording)
    hyper = {'lr': 3e-3, 'betas': (0.9, 0.95), 'eps': 1e-8, 'weight_decay': 0.1}
    warmup, total, threshold = 4, 16, 0.5
    tiny_config.update(max_duration=f'{total}ba', checkpoint={'save_folder': None, 'autoresume': False}, loggers={},
                       callbacks={}, device_microbatch_size=8,
                       optimizer={'name': 'adamw', 'fused': True, **hyper, 'betas': list(hyper['betas'])},
                       scheduler={'name': 'linear_with_warmup', 't_warmup': f'{warmup}ba', 'alpha_f': 0.0},
                       algorithms={'gradient_clipping': {'clipping_type': 'norm', 'clipping_threshold': threshold}})
    run = prepare(write_yaml(tiny_config, tmp_path / 'run.yaml'))
    trainer = build_trainer(run)
    initial = {name: (p.full_tensor() if isinstance(p, DTensor) else p).detach().clone()
               for name, p in trainer.state.model.model.named_parameters()}
    trainer.fit()
    trainer.close()

    model = run.config.model.family_entry().module(run.architecture, run.kernels)
    model.load_state_dict(initial, strict=False)  # the RoPE table is a buffer of its own
    optimizer = torch.optim.AdamW(model.parameters(), fused=True, **hyper)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: (step + 1) / warmup if step < warmup
                                                 else 1 - (step + 1 - warmup) / (total - warmup))
    reference, norms = [], []
    for batch in batches:
        loss = token_mean_cross_entropy(model(batch['input_ids']), batch['labels'])
        loss.backward()
        norms.append(torch.nn.utils.clip_grad_norm_(model.parameters(), threshold).item())
        optimizer.step()
        schedule.step()
        optimizer.zero_grad()
        reference.append(loss.item())
    assert len(losses) == total and min(norms) > threshold
    assert losses == pytest.approx(reference, rel=1e-6)


def test_training_fetches_each_batch_without_asking_the_ranks_and_ends_each_epoch(tiny_config, tmp_path, monkeypatch):
    """Composer all-reduces "has a loader run out?" before each batch and reads it back (a host sync a batch);
    training asks none, and its epochs end where the loader does: 2 epochs of 40 samples in batches of 8 are 10
    batches."""
    asked = []
    all_reduce = dist.all_reduce
    monkeypatch.setattr(dist, 'all_reduce', lambda tensor, *args, **kwargs: asked.append(
        [frame.function for frame in inspect.stack()[1:3]]) or all_reduce(tensor, *args, **kwargs))
    tiny_config['data']['train']['epoch_size'] = 40
    tiny_config.update(max_duration='2ep', checkpoint={'save_folder': None, 'autoresume': False}, loggers={},
                       callbacks={})
    trainer = build_trainer(prepare(write_yaml(tiny_config, tmp_path / 'run.yaml')))
    trainer.fit()
    trainer.close()
    assert (int(trainer.state.timestamp.epoch), int(trainer.state.timestamp.batch)) == (2, 10)
    assert [callers for callers in asked if callers[0] == '_iter_dataloader'] == []
    assert [callers for callers in asked if callers[0] == '_train_batch'] == [['_train_batch', '_train_loop']] * 10
