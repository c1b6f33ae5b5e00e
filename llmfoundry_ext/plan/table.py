"""``scripts/plan.py``: a run's plan on a machine described on the command line, as a table of every setting the
``auto`` keys range over (the YAML's own settings marked) and as JSON."""
import dataclasses

from llmfoundry_ext.config import load
from llmfoundry_ext.errors import ConfigError
from llmfoundry_ext.machine import GIB, Machine
from llmfoundry_ext.plan.run_plan import RunPlan, every_key_auto, format_duration, settle, text

TRILLION = 10 ** 12


def plan_for(yaml_path: str, overrides: list[str], machine: Machine) -> tuple[RunPlan, RunPlan | ConfigError]:
    """(the plan with every key auto: the table's rows; the YAML's own plan, or why it is refused). Call it, and
    read its plans, ``launched_as(machine)``."""
    config = load(yaml_path, overrides)
    every = settle(dataclasses.replace(every_key_auto(config), fit_check=False), machine, machine.gpu.has_float8)
    try:
        own = settle(config, machine, machine.gpu.has_float8)
    except ConfigError as error:
        own = error
    return every, own


def rows(every: RunPlan, own: RunPlan | None) -> list[dict]:
    """One row a setting, fastest first: predictions, time and GPU-hours to max_duration, the YAML's choice."""
    tokens = every.total_tokens()
    chosen = own.chosen.setting if own is not None else None
    table = []
    for candidate in sorted(every.candidates, key=lambda c: (-c.tokens_per_second, c.memory.peak)):
        seconds = every.seconds_for(tokens, candidate) if tokens else None
        table.append({**dataclasses.asdict(candidate.setting), 'peak_gib': round(candidate.memory.peak / GIB, 2),
                      'fits': candidate.fits, 'tokens_per_second_per_gpu': round(candidate.tokens_per_second),
                      'mfu': round(every.mfu(candidate.tokens_per_second), 3), 'hours': seconds and seconds / 3600,
                      'gpu_hours': seconds and seconds * every.machine.world_size / 3600,
                      'chosen': candidate.setting == chosen})
    return table


def plural(count: int, noun: str) -> str:
    return f'{count:,} {noun}' + ('s' if count != 1 else '')


def render(every: RunPlan, own: RunPlan | ConfigError, yaml_path: str) -> str:
    config, machine = every.config, every.machine
    architecture = config.model.architecture()
    refused = own if isinstance(own, ConfigError) else None
    table = rows(every, None if refused else own)
    samples = config.device_batch_size
    lines = [f'{yaml_path}: {config.model.family} {config.model.preset}, {architecture.num_params():,} parameters, '
             f'sequence {config.max_seq_len:,}, global batch {config.global_batch_size}, {config.max_duration}',
             f'on {machine.world_size} x {machine.gpu.name} ({machine.gpu.memory_bytes / GIB:.1f} GiB; '
             f'{plural(machine.nodes, "node")}), {plural(samples, "sample")} a GPU a step'
             + ('' if machine.gpu.calibrated else '; speed uncalibrated on this GPU (FLOPs at H100 efficiencies)'),
             '',
             '  micro  checkpointing  reshard  float8  peak GiB  fits  tokens/s/GPU   MFU   time to end   GPU-hours']
    for row in table:
        hours = format_duration(row['hours'] * 3600) if row['hours'] else '-'
        gpu_hours = f"{row['gpu_hours']:,.0f}" if row['gpu_hours'] else '-'
        lines.append(f"{'*' if row['chosen'] else ' '} {row['micro_batch']:5d}  {row['checkpointing']:13s}  "
                     f"{text(row['reshard_after_forward']):7s}  {text(row['float8']):6s}  "
                     f"{row['peak_gib']:8.1f}  {'yes' if row['fits'] else 'no':4s}  "
                     f"{row['tokens_per_second_per_gpu']:12,d}  {row['mfu']:4.0%}  {hours:>12s}  {gpu_hours:>10s}")
    lines.append('')
    if refused:
        lines.append(f'the YAML as set is refused: {refused}')
    else:
        lines += [f"* the YAML's plan{' (auto: ' + ', '.join(own.auto_keys) + ')' if own.auto_keys else ''}",
                  f'1T tokens: {format_duration(own.seconds_for(TRILLION))} on {plural(machine.world_size, "GPU")} '
                  f'({own.seconds_for(TRILLION) * machine.world_size / 3600:,.0f} GPU-hours)']
    return '\n'.join(lines)
