"""YAML -> config -> preflight -> Composer Trainer -> fit. ``main(argv)`` is what ``composer train.py <yaml>
key=value ...`` runs."""
import dataclasses
import os
import sys

from composer.loggers import InMemoryLogger
from composer.utils import dist, get_device, reproducibility
from omegaconf import OmegaConf

from llmfoundry_ext.atomic import write_atomically
from llmfoundry_ext.build import build_trainer
from llmfoundry_ext.callbacks.console_line import EVAL_LOSS, total_batches
from llmfoundry_ext.config import TrainConfig
from llmfoundry_ext.data.stale_shm import remove_stale_streaming_state
from llmfoundry_ext.downstream_callback import DownstreamEvaluation
from llmfoundry_ext.errors import ConfigError, TrainingStopped
from llmfoundry_ext.machine import GIB, Machine, global_rank, name_the_node_rank
from llmfoundry_ext.node_watch import start_node_watch
from llmfoundry_ext.parallelism import describe_checkpointing
from llmfoundry_ext.plan.run_plan import PRECISION_REPORT
from llmfoundry_ext.preflight import Run, prepare
from llmfoundry_ext.refusal import default_sigterm, exit_2_on_sigterm, refuse
from llmfoundry_ext.resumption import prepare_autoresume
from llmfoundry_ext.run_lock import end_with_the_launcher, holding

DIST_TIMEOUT_SECONDS = 300.0
USAGE = 'usage: composer train.py <run.yaml> [key=value ...]   (or: python train.py ... for one process)'


def main(argv: list[str]) -> int:
    """Train as configured; a config error is one line on stderr and exit status 2."""
    if not argv or argv[0] in ('-h', '--help'):
        print(USAGE, file=sys.stderr)
        return 2
    end_with_the_launcher()
    exit_2_on_sigterm()
    name_the_node_rank()
    try:
        run = prepare(argv[0], argv[1:])
    except ConfigError as error:
        return refuse(f'config error: {error}')
    try:
        with holding(run.config.checkpoint_folder if global_rank() == 0 else None):
            train(run)
    except ConfigError as error:
        return refuse(f'config error: {error}')
    except TrainingStopped as stop:
        return refuse(f'error: {stopped_line(stop)}', status=1)
    return 0


def stopped_line(stop: TrainingStopped) -> str:
    """The stop's own line, also where a data-loader worker raised it: PyTorch raises it again in this process with
    the worker's traceback as its message, whose last line is the original's."""
    text = str(stop).strip()
    return text.splitlines()[-1].split('TrainingStopped: ', 1)[-1] if 'Original Traceback' in text else text


def train(run: Run, extra_callbacks: list = (), model=None):
    """Build everything from the preflighted run, print the start summary, fit, and return the Trainer.

    ``model``: a ComposerModel to train instead of the config's (the benchmark's HF baseline). A job over several
    nodes is watched (``node_watch``): when a node dies, the others stop with one line naming it."""
    device = get_device(None)
    dist.initialize_dist(device, DIST_TIMEOUT_SECONDS)  # before the datasets, so streaming uses this group
    default_sigterm()
    watch = start_node_watch(run.config.node_timeout_s, run.plan.machine)
    try:
        trainer = build_and_fit(run, device, extra_callbacks, model)
    except (ConfigError, TrainingStopped):
        if watch:
            watch.close()
        raise
    except Exception:
        if watch:  # a collective that failed because a node died: the watch names it and ends this process
            watch.wait_for_verdict()
            watch.close()
        raise
    if watch:
        watch.finish()
    return trainer


def build_and_fit(run: Run, device, extra_callbacks: list, model):
    config = run.config
    reproducibility.seed_all(config.seed)
    if dist.get_local_rank() == 0:
        removed = remove_stale_streaming_state()
        if removed:
            print(f"removed streaming shared memory left by earlier runs: prefixes {', '.join(removed)}", flush=True)
    if config.checkpoint.autoresume and config.checkpoint_folder:
        prepare_autoresume_on_rank_zero(config.checkpoint_folder, run.plan.sharded_checkpoints,
                                        config.checkpoint.save_num_checkpoints_to_keep)
    dist.barrier()
    trainer = build_trainer(run, device, extra_callbacks, model)
    complete = trainer.state.get_elapsed_duration() >= 1
    if dist.get_global_rank() == 0:
        print(start_summary(run, trainer), flush=True)
        if int(trainer.state.timestamp.batch):
            for warning in data_order_changes(config):
                print(warning, flush=True)
        write_resolved_config(config)
    if complete:
        if dist.get_global_rank() == 0:
            print(f'run {config.run_name} is already complete ({config.max_duration}); nothing to train. '
                  f'Raise max_duration to train further.', flush=True)
        return trainer
    trainer.fit()
    if dist.get_global_rank() == 0:
        print(end_summary(run, trainer), flush=True)
    return trainer


def prepare_autoresume_on_rank_zero(folder: str, sharded: bool, keep: int) -> None:
    """``prepare_autoresume`` on global rank 0, which prints its lines; every rank raises its error, if any."""
    outcome = [None]
    if dist.get_global_rank() == 0:
        try:
            for line in prepare_autoresume(folder, sharded, keep):
                print(line, flush=True)
        except TrainingStopped as stop:
            outcome = [str(stop)]
    dist.broadcast_object_list(outcome, src=0)
    if outcome[0]:
        raise TrainingStopped(outcome[0])


def write_resolved_config(config: TrainConfig) -> None:
    """The config as resolved (presets, overrides) next to the checkpoints, written atomically; its tokenizer's
    path absolute, so that scripts/evaluate.py and the exports find it from any folder."""
    folder = config.checkpoint_folder
    if folder is None:
        return
    os.makedirs(folder, exist_ok=True)
    resolved = dataclasses.asdict(config)
    if config.data.tokenizer is not None and '://' not in config.data.tokenizer:
        resolved['data']['tokenizer'] = os.path.abspath(config.data.tokenizer)
    write_atomically(os.path.join(folder, 'config.yaml'), OmegaConf.to_yaml(resolved))


ORDER_KEYS = ('seed', 'global_batch_size', 'max_seq_len', 'objective', 'data.document_masking', 'data.train.streams',
              'data.train.shuffle', 'data.train.shuffle_seed', 'data.train.shuffle_algo',
              'data.train.num_canonical_nodes')


def data_order_changes(config: TrainConfig) -> list[str]:
    """Warnings for each setting that decides the sample order and differs from the checkpointed run's."""
    path = os.path.join(config.checkpoint_folder or '', 'config.yaml')
    if not os.path.isfile(path):
        return []
    before, now = OmegaConf.load(path), OmegaConf.create(dataclasses.asdict(config))
    warnings = []
    for key in ORDER_KEYS:
        old, new = OmegaConf.select(before, key), OmegaConf.select(now, key)
        if old != new:
            warnings.append(f'warning: {key} changed since the checkpointed run ({to_text(old)} -> {to_text(new)}): '
                            f'the sample order will not continue exactly where it stopped')
    return warnings


def to_text(value) -> str:
    if OmegaConf.is_config(value):
        value = OmegaConf.to_container(value)
    return str(value)


def start_summary(run: Run, trainer) -> str:
    """What this run is, in the numbers a user checks first; says whether it resumed."""
    config, architecture = run.config, run.architecture
    state = trainer.state
    model = config.model
    batches = total_batches(state)
    resumed = int(state.timestamp.batch)
    parameters, active = architecture.num_params(), architecture.num_params(active=True)
    parameters_text = f'{parameters:,} parameters' + (f', {active:,} active' if active != parameters else '')
    lines = [
        f'run {config.run_name}: {model.family.capitalize()} preset {model.preset} ({parameters_text}, '
        f'{model.dim} dim, {model.n_layers} layers, vocab {model.vocab_size:,})',
        f'  world size {run.plan.machine.world_size}, precision {config.precision}, attention {run.kernels.attn_impl}'
        f"{' (document masking)' if config.data.document_masking else ''}, "
        f'{parallel_layout(trainer)}{context_parallel_layout(config)}{expert_parallel_layout(config)}, '
        f'{describe_checkpointing(config)}, '
        f'compiled blocks {model.compile}, '
        f"fused kernels {', '.join(model.fused_kernels) or 'none'}{float8_text(model)}",
        *run.plan.summary(),
        *elastic_line(run.plan.machine),
        f'  tokens per step {config.tokens_per_step:,} = global batch {config.global_batch_size} x sequence '
        f'{config.max_seq_len}; FLOPs per token {architecture.flops_per_token(config.max_seq_len):,}',
        f'  duration {config.max_duration}' + (f' = {batches * config.tokens_per_step:,} tokens' if batches else ''),
        optimizer_line(run),
        checkpoint_line(config),
        *downstream_line(run),
        (f'  autoresume: resuming from the latest checkpoint at batch {resumed}' if resumed else
         '  starting from scratch (no checkpoint found)'),
    ]
    return '\n'.join(lines)


def elastic_line(machine: Machine) -> list[str]:
    """Under torchrun's elastic agent: the restarts it has made of those allowed (a node joining is none), and the
    world it restarted at."""
    if not machine.elastic:
        return []
    return [f'  elastic (torchrun): restart {machine.restart} of {machine.max_restarts}; {machine.world}']


def optimizer_line(run: Run) -> str:
    """'  optimizer adamw (lr 0.0003 default, betas [0.9, 0.95]); scheduler cosine_with_warmup (t_warmup 2000ba)': the
    arguments in force, those the YAML left to the default marked so."""
    parts = []
    for kind in ('optimizer', 'scheduler'):
        section = getattr(run.config, kind)
        if section is None:
            parts.append(f'{kind} none (a constant rate)')
            continue
        defaulted = run.default_arguments.get(kind, [])
        arguments = ', '.join(f"{key} {value}{' default' if key in defaulted else ''}"
                              for key, value in section.items() if key != 'name')
        parts.append(f"{kind} {section['name']}" + (f' ({arguments})' if arguments else ''))
    return '  ' + '; '.join(parts)


def float8_text(model) -> str:
    """', float8 tensorwise (blocks; held-out loss: REPORT)' in the start summary: the recipe, what it covers
    (blocks, experts, output layer) and the measurement of what it costs; '' without float8."""
    if not model.float8:
        return ''
    covered = ['blocks', *(['experts'] if model.experts_in_float8 else []),
               *(['output layer'] if model.float8_output_layer else [])]
    layers = ' and '.join(filter(None, (', '.join(covered[:-1]), covered[-1])))
    unmeasured = "; the experts' not measured yet" if model.experts_in_float8 else ''
    return f', float8 {model.float8_recipe} ({layers}; held-out loss: {PRECISION_REPORT}{unmeasured})'


def downstream_line(run: Run) -> list[str]:
    """'  downstream every 50 batches: task (240 examples), ...', with downstream."""
    config = run.config
    downstream = config.downstream
    if downstream is None:
        return []
    tasks = ', '.join(f'{name} ({count:,} examples)' for name, count in run.downstream_tasks.examples.items())
    limit = f'; limit {downstream.limit:g} a task' if downstream.limit is not None else ''
    return [f'  downstream every {downstream.interval_batches(config.eval_interval)} batches: {tasks}{limit}']


def parallel_layout(trainer) -> str:
    """'FSDP2 over N ranks', 'HSDP R replicas x S shards', 'DDP' or 'one process, unsharded', from the mesh Composer
    built."""
    mesh = trainer.state.fsdp_config.device_mesh if trainer.state.fsdp_config else None
    if mesh is None:
        return 'DDP' if dist.get_world_size() > 1 else 'one process, unsharded'
    if mesh.ndim == 2:
        return f'HSDP {mesh.size(0)} replicas x {mesh.size(1)} shards'
    return f'FSDP2 over {mesh.size()} ranks'


def checkpoint_line(config: TrainConfig) -> str:
    folder = config.checkpoint_folder
    return f'  checkpoints in {folder}' if folder else '  no checkpoints (checkpoint.save_folder is null)'


def context_parallel_layout(config: TrainConfig) -> str:
    """', each sequence split over 2 GPUs (context parallel)', or nothing."""
    degree = config.parallelism.context_parallel_degree
    return f', each sequence split over {degree} GPUs (context parallel)' if degree > 1 else ''


def expert_parallel_layout(config: TrainConfig) -> str:
    """', experts over 2 ranks (expert parallel)', or nothing."""
    degree = config.parallelism.expert_parallel_degree
    return f', experts over {degree} ranks (expert parallel)' if degree > 1 else ''


def end_summary(run: Run, trainer) -> str:
    """Where the run stopped, its loss over this invocation and throughput (from an in_memory logger), and the peak
    memory and speed beside the plan's predictions."""
    config = run.config
    where = f'; checkpoints in {config.checkpoint_folder}' if config.checkpoint_folder else ''
    lines = [f'run {config.run_name} stopped at batch {int(trainer.state.timestamp.batch)} of {config.max_duration}'
             + where]
    history = logged_history(trainer)
    losses = history.get('loss/train/total')
    if losses:
        window = losses[:10], losses[-10:]
        first, last = (sum(float(loss) for _, loss in part) / len(part) for part in window)
        batches = [f'{int(part[0][0].batch) + 1}-{int(part[-1][0].batch) + 1}' for part in window]
        lines.append(f'  loss {first:.3f} (mean of batches {batches[0]}) -> {last:.3f} (batches {batches[1]})')
    speeds = history.get('throughput/tokens_per_sec')
    if speeds:
        lines.append(f'  {float(speeds[-1][1]):,.0f} tokens/s over the last batches')
    lines += measured_beside_predicted(run, float(speeds[-1][1]) if speeds else None)
    evaluations = next((callback.history for callback in trainer.state.callbacks
                        if isinstance(callback, DownstreamEvaluation)), [])
    return '\n'.join(lines + downstream_summary(evaluations, history.get(EVAL_LOSS, []),
                                                trainer.state.timestamp.total_wct.total_seconds()))


def measured_beside_predicted(run: Run, tokens_per_second: float | None) -> list[str]:
    """'  peak memory 61.2 GiB allocated (predicted 60.4); 55,000 tokens/s a GPU (predicted 54,600)', on a GPU."""
    if run.plan.machine.gpu is None:
        return []
    import torch
    predicted = run.plan.chosen
    line = (f'  peak memory {torch.cuda.max_memory_allocated() / GIB:.1f} GiB allocated (predicted '
            f'{predicted.memory.peak / GIB:.1f})')
    if tokens_per_second:
        line += (f'; {tokens_per_second / run.plan.machine.world_size:,.0f} tokens/s a GPU (predicted '
                 f'{predicted.tokens_per_second:,.0f})')
    return [line]


def downstream_summary(evaluations: list, held_out: list, run_seconds: float) -> list[str]:
    """Each downstream metric by batch (and the held-out loss, where an in_memory logger kept it), and what the
    evaluations cost."""
    if not evaluations:
        return []
    lines = ['  held-out loss by batch: ' + ', '.join(f'{int(time.batch)} {float(value):.4f}'
                                                     for time, value in held_out)] if held_out else []
    for name in evaluations[0][1]:
        lines.append(f"  {name.removeprefix('metrics/downstream/')} by batch: " + ', '.join(
            f'{batch} {metrics[name]:.4f}' for batch, metrics, _ in evaluations))
    spent = sum(seconds for _, _, seconds in evaluations)
    lines.append(f'  downstream: {len(evaluations)} evaluations, {spent / len(evaluations):.1f} s each '
                 f'({spent:.0f} s; the run\'s clock {run_seconds:.0f} s)')
    return lines


def logged_history(trainer) -> dict:
    for destination in trainer.logger.destinations:
        if isinstance(destination, InMemoryLogger):
            return destination.data
    return {}
