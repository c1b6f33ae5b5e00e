"""Composer's Trainer with each batch at its learning rate's scheduled value, and without host syncs per batch: the
optimizer stepped after the backward instead of from inside a closure, each batch fetched without asking the ranks
whether a loader ran out, the batch size that scales each micro-batch's loss counted on the host, the training loss
logged as a device tensor, and the sample and token counts of one process kept on the host."""
import datetime
import itertools
import warnings
from typing import Sequence

import composer
import torch
from composer.core import Batch, Event, TrainerMode
from composer.utils import dist


class Trainer(composer.Trainer):
    """Each host sync at a batch's end idles the GPU while the host logs, loads the next batch and dispatches its
    forward; with none, the host runs a step ahead and those costs overlap the GPU's work
    (``scripts/profile_run.py --syncs`` lists what is left)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs, step_schedulers_every_batch=False)  # stepped by _train_batch instead

    def _train_batch(self, use_grad_scaling: bool) -> dict:
        """Set this batch's learning rates, train it, then log its losses (the mean over the ranks) as device
        tensors and hand Composer none: its loop reads each back with ``.item()`` every batch. A logger reads them
        when it writes them (the console line at its interval, TensorBoard at its flush); ``StopOnNonFiniteLoss``
        checks them before each checkpoint."""
        self._schedule_learning_rates()
        losses = super()._train_batch(use_grad_scaling)
        if losses is None:  # amp_fp16: the grad scaler skipped the step
            return losses
        for loss in losses.values():
            dist.all_reduce(loss)  # on the device; a no-op on one process
        world = dist.get_world_size()
        self.logger.log_metrics({key: (loss / world).squeeze().detach() for key, loss in losses.items()})
        return {}

    def _schedule_learning_rates(self) -> None:
        """Each batch trains at its schedules' value for the time at the batch's end: batch k of a W-batch linear
        warm-up at k/W of the peak (as torchtitan), the last batch at the schedule's final value. Composer 0.32 steps
        schedulers after a batch but before its count advances, so batch k trained at the value for k - 2 (batches 1
        and 2 at 0 under a linear warm-up: a warm-up two batches late); its own per-batch stepping is off."""
        now, world = self.state.timestamp, dist.get_world_size()
        batch_end = now.to_next_batch(  # every rank's batch has this rank's shape; a share of a sample under context
            # parallelism (a float, ContextParallel.samples): Composer's counts take whole samples
            samples=round(world * self._train_data_spec.get_num_samples_in_batch(self.state.batch)),
            tokens=world * self._train_data_spec.get_num_tokens_in_batch(self.state.batch))
        self.state.timestamp = batch_end
        try:
            with warnings.catch_warnings():  # torch's "scheduler before optimizer" warning: the value is for this batch
                warnings.filterwarnings('ignore', message=r'Detected call of `lr_scheduler\.step\(\)` before')
                for scheduler in self.state.schedulers:
                    scheduler.step()
        finally:
            self.state.timestamp = now

    def _train_microbatches(self, microbatches: Sequence[Batch], total_loss_dict: dict[str, torch.Tensor],
                            ddp_sync: bool = True) -> torch.Tensor:
        """Composer's, less its host sync before the forward: it averages the batch's sample count over the ranks
        on the GPU and reads it back (``.item()``) to scale each micro-batch's loss. Here every rank's batch holds
        the same number of samples (streaming deals each rank an equal share, ``device_microbatch_size`` divides the
        device batch), so that mean is this rank's own count. What else Composer's covers is not used here: token-based
        accumulation and automatic micro-batch sizes (asserted), and ``ddp_sync=False``, which only its closures
        pass (DDP's sync on the last micro-batch is ``_train_microbatch``'s, kept)."""
        assert not self.accumulate_train_batch_on_tokens and not self.state.auto_microbatching
        self.engine.run_event(Event.BEFORE_TRAIN_BATCH)
        use_grad_scaling = self._use_grad_scaling(self.state.precision, self.state.scaler)
        for optimizer in self.state.optimizers:
            optimizer.zero_grad(set_to_none=True)
        batch_size = sum(self._train_data_spec.get_num_samples_in_batch(batch) for batch in microbatches)
        whole_batch = self.state.batch
        for index, microbatch in enumerate(microbatches):
            self.state.batch = self._train_data_spec.microbatch_transforms(self.state.device.batch_to_device(microbatch))
            losses = self._train_microbatch(use_grad_scaling, batch_size, index + 1 == len(microbatches))
            for name, loss in losses.items():
                key = f'loss/train/{name}'
                total_loss_dict[key] = total_loss_dict[key] + loss if key in total_loss_dict else loss
        self.state.batch = whole_batch
        if use_grad_scaling:
            for optimizer in self.state.optimizers:
                self.state.scaler.unscale_(optimizer)
        self.engine.run_event(Event.AFTER_TRAIN_BATCH)
        return total_loss_dict['loss/train/total']

    def _iter_dataloader(self, trainer_mode: TrainerMode):
        """Training batches without Composer's check, before each, that no rank's loader has run out: an
        all-reduce read back with ``.item()``, so the host waited for the GPU to finish a batch before it fetched and
        dispatched the next, and the GPU idled meanwhile. Streaming deals every rank the same number of samples, so
        all ranks' loaders end at the same batch. Evaluation and prediction keep Composer's."""
        if trainer_mode != TrainerMode.TRAIN:
            yield from super()._iter_dataloader(trainer_mode)
            return
        loader, length = self.state.dataloader, self.state.dataloader_len
        batches = iter(loader) if length is None else itertools.islice(loader, int(length))
        while True:
            self.engine.run_event(Event.BEFORE_DATALOADER)
            try:
                batch = next(batches)
            except StopIteration:  # Composer's AFTER_DATALOADER marker, ended as its own does
                self.engine.run_marker_only_event(Event.AFTER_DATALOADER)
                return
            yield batch

    def _use_closures(self) -> bool:
        """Composer 0.32 runs each batch's forward and backward inside ``optimizer.step(closure)`` unless the
        precision is amp_fp16, and the closure returns ``loss.item()``: the GPU idled 5-7 ms a step of the 8B on 2
        H200s while the host then dispatched fused AdamW over FSDP2's DTensors. A closure is for optimizers that
        re-evaluate the loss (LBFGS, SAM); none is offered."""
        return False

    def _accumulate_time_across_ranks(self, num_samples, num_tokens: int,
                                      batch_time: datetime.timedelta) -> tuple[int, int, datetime.timedelta]:
        """One process: its own counts, without Composer's round trip through the GPU (three reads back)."""
        if dist.get_world_size() > 1:
            return super()._accumulate_time_across_ranks(num_samples, num_tokens, batch_time)
        return int(num_samples), int(num_tokens), batch_time

