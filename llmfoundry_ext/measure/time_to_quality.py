"""Time to quality: from each row's held-out losses (documents never trained on, evaluated every N steps), the tokens
and the wall-clock a row needs to reach a target loss, and its held-out loss beside a reference row's at equal
tokens. The arithmetic behind a precision default (docs/learning.md): a recipe is worth its speed only if it reaches
the same model sooner.

Our own code: the learning benchmark's rows come from three trainers (ours, torchtitan, transformers), and no
library reads a time-to-target off their evaluations. Between two evaluations the loss is taken as linear in tokens
(an evaluation every 100 steps of a 400-step run: the curve is nearly straight there); the wall-clock is the tokens
over the row's steady throughput (compilation and start-up left out, as the speed table leaves them out).

A row whose own schedule ends above the target cannot be timed to it; the table then says how many steps the row
trains in the time reference's seconds over the speed-up asked for: a run of that many steps (its own schedule, the
same learning rate) reaching the target is that speed-up, measured (docs/learning.md)."""
import statistics
from typing import NamedTuple, Optional


class Evaluation(NamedTuple):
    """One held-out evaluation: after ``step`` optimizer steps, the mean token loss over the held-out documents."""
    step: int
    loss: float


class HeldOut(NamedTuple):
    """A row's held-out loss at one step over its seeds: their mean, smallest and largest."""
    step: int
    mean: float
    low: float
    high: float


def over_seeds(seeds: list[list[Evaluation]]) -> list[HeldOut]:
    """Each step's mean, smallest and largest loss over the seeds, at the steps every seed evaluated."""
    steps = sorted(set.intersection(*(set(step for step, _ in evaluations) for evaluations in seeds)))
    losses = [{step: loss for step, loss in evaluations} for evaluations in seeds]
    return [HeldOut(step, statistics.fmean(at[step] for at in losses), min(at[step] for at in losses),
                    max(at[step] for at in losses)) for step in steps]


def tokens_to_target(held_out: list[HeldOut], tokens_per_step: int, target: float) -> Optional[float]:
    """The tokens at which the mean held-out loss first reaches ``target``, linear in tokens between the evaluation
    above it and the one at or below it (the first evaluation's tokens if that one is already there); None if no
    evaluation reaches it."""
    previous = None
    for point in held_out:
        if point.mean <= target:
            if previous is None:
                return float(point.step * tokens_per_step)
            fraction = (previous.mean - target) / (previous.mean - point.mean)
            return (previous.step + fraction * (point.step - previous.step)) * tokens_per_step
        previous = point
    return None


def gaps_at_equal_tokens(held_out: list[HeldOut], reference: list[HeldOut]) -> dict[int, float]:
    """At each step both evaluated (the same tokens: rows of one benchmark train the same batches), the row's mean
    held-out loss relative to the reference's: (row - reference) / reference."""
    theirs = {point.step: point.mean for point in reference}
    return {point.step: (point.mean - theirs[point.step]) / theirs[point.step] for point in held_out
            if point.step in theirs}


class Curve(NamedTuple):
    """A benchmark row's held-out losses over its seeds, its steady speed and the length of its schedule."""
    name: str
    held_out: list[HeldOut]
    tokens_per_step: int
    tokens_per_second: float  # the whole run's: every GPU's
    steps: int  # its learning-rate schedule's: rows of another length are compared on time alone


def compare(rows: list[Curve], quality_reference: str, time_reference: str, tolerance: float,
            speedup: float) -> list[dict]:
    """Per row: its final held-out loss and its gaps to ``quality_reference``'s at equal tokens where both train the
    same schedule (``holds``: the final one at most ``tolerance`` over: a lower loss holds); the tokens, seconds and
    speed-up to ``time_reference``'s final mean held-out loss (the target) against the seconds ``time_reference``
    takes to reach it; and the steps the row trains in those seconds over ``speedup``."""
    by_name = {row.name: row for row in rows}
    reference = by_name[quality_reference]
    target = by_name[time_reference].held_out[-1].mean
    reference_seconds = seconds_to_target(by_name[time_reference], target)
    table = []
    for row in rows:
        gaps = gaps_at_equal_tokens(row.held_out, reference.held_out) if row.steps == reference.steps else {}
        final_gap = gaps[max(gaps)] if gaps else None
        seconds = seconds_to_target(row, target)
        table.append({'name': row.name, 'steps': row.steps, 'final_step': row.held_out[-1].step,
                      'final_loss': row.held_out[-1].mean, 'gaps': gaps, 'final_gap': final_gap,
                      'holds': None if final_gap is None else final_gap <= tolerance, 'target': target,
                      'tokens_to_target': tokens_to_target(row.held_out, row.tokens_per_step, target),
                      'seconds_to_target': seconds, 'tokens_per_second': row.tokens_per_second,
                      'sooner': reference_seconds / seconds if seconds else None, 'speedup_asked': speedup,
                      'steps_in_time': int(reference_seconds / speedup * row.tokens_per_second / row.tokens_per_step)})
    return table


def seconds_to_target(row: Curve, target: float) -> Optional[float]:
    """The row's tokens to ``target`` at its steady speed; None where it does not reach it."""
    tokens = tokens_to_target(row.held_out, row.tokens_per_step, target)
    return None if tokens is None else tokens / row.tokens_per_second


def format_table(table: list[dict], quality_reference: str, time_reference: str) -> str:
    """One line a row: its schedule, final held-out loss, its gap to the quality reference, tokens/s, tokens,
    seconds and speed-up to the target, and the steps it trains in the time reference's seconds over the speed-up
    asked."""
    speedup = table[0]['speedup_asked']
    lines = [f"target: {time_reference}'s final held-out loss {table[0]['target']:.4f}; gaps against "
             f"{quality_reference} at equal tokens",
             f"{'row':<24}{'steps':>6}{'held-out':>10}{'gap':>9}{'tokens/s':>11}{'tokens to target':>18}"
             f"{'s to target':>13}{'sooner':>8}{f'steps at {speedup:g}x':>16}"]
    for entry in table:
        reached = entry['tokens_to_target'] is not None
        gap = '-' if entry['final_gap'] is None else f"{entry['final_gap']:+.2%}"
        lines.append(f"{entry['name']:<24}{entry['steps']:>6}{entry['final_loss']:>10.4f}{gap:>9}"
                     f"{entry['tokens_per_second']:>11,.0f}"
                     + (f"{entry['tokens_to_target']:>18,.0f}{entry['seconds_to_target']:>13.1f}"
                        f"{entry['sooner']:>7.2f}x" if reached else f"{'not reached':>18}{'-':>13}{'-':>8}")
                     + f"{entry['steps_in_time']:>16}")
    return '\n'.join(lines)


class Recipe(NamedTuple):
    """A precision recipe the grid weighs for the default, by its rows' names: on torchtitan's 1B flavor (untied,
    beside ``ours-bf16``; its time-to-target runs named ``UNTIED@STEPS``) and on the shipped tied 1B (beside
    ``ours-shipped-bf16``)."""
    name: str
    untied: str
    tied: str


RECIPES = (Recipe('float8 blocks', 'ours-float8-blocks', 'ours-shipped-float8-blocks'),
           Recipe('float8 blocks and output layer', 'ours-float8', 'ours-shipped'))


def cell_name(report: dict) -> str:
    """'prose lr 0.001': a merged report's corpus (the learning benchmark's file suffix) and learning rate."""
    corpus = 'python' if report['data'].get('suffix', '.py') == '.py' else 'prose'
    return f"{corpus} lr {report['hyper']['lr']:g}"


def recipe_in_cell(recipe: Recipe, table: list[dict]) -> dict:
    """The recipe's rows in one cell's time-to-quality tables (untied and tied together): its final gaps at equal
    tokens, whether both hold (None where a row is missing), and its best speed-up to the target over its runs."""
    by_name = {entry['name']: entry for entry in table}
    untied, tied = by_name.get(recipe.untied), by_name.get(recipe.tied)
    timed = [entry['sooner'] for entry in table if entry['sooner'] is not None
             and (entry['name'] == recipe.untied or entry['name'].startswith(recipe.untied + '@'))]
    holds = [row['holds'] for row in (untied, tied) if row is not None]
    return {'untied_gap': untied and untied['final_gap'], 'tied_gap': tied and tied['final_gap'],
            'holds': False if False in holds else (True if len(holds) == 2 else None),
            'sooner': max(timed) if timed else None}


def decide(cells: dict[str, list[dict]], recipes: tuple = RECIPES, speedup: float = 1.15) -> dict:
    """Issue 66's rule over the grid's cells (name -> its time-to-quality tables' rows): the recipe with the shortest
    wall-clock to the target (its smallest speed-up over the cells, largest) among those that hold bf16's held-out
    loss in every cell, tied and untied; bf16 when none holds; None (incomplete) while a recipe that has not failed
    lacks a row or a time somewhere."""
    weighed = {recipe.name: {cell: recipe_in_cell(recipe, table) for cell, table in cells.items()}
               for recipe in recipes}
    failed = {name for name, by_cell in weighed.items() if any(c['holds'] is False for c in by_cell.values())}
    open_ = [name for name in weighed if name not in failed and any(
        c['holds'] is None or c['sooner'] is None for c in weighed[name].values())]
    if open_:
        decision, why = None, f"incomplete: {', '.join(open_)} lacks a row or a time to the target in some cell"
    elif len(failed) == len(weighed):
        decision, why = 'bf16', 'every recipe ends above bf16 by more than the tolerance in some cell'
    else:
        decision = max((name for name in weighed if name not in failed),
                       key=lambda name: min(c['sooner'] for c in weighed[name].values()))
        slowest = min(c['sooner'] for c in weighed[decision].values())
        why = (f'holds in every cell; its slowest cell {slowest:.2f}x sooner than the target row '
               f"({'at least' if slowest >= speedup else 'under'} {speedup:g}x)")
    return {'recipes': weighed, 'failed': sorted(failed), 'decision': decision, 'why': why}


def format_decision(decision: dict) -> str:
    """A line a recipe: each cell's gaps at equal tokens (untied / the tied shipped 1B) and speed-up to the target,
    then the decision."""
    cells = sorted(next(iter(decision['recipes'].values())))
    lines = [f"{'recipe':<32}" + ''.join(f'{cell:>30}' for cell in cells)]
    for name, by_cell in decision['recipes'].items():
        lines.append(f'{name:<32}' + ''.join(f'{cell_text(by_cell[cell]):>30}' for cell in cells))
    lines.append(f"decision: {decision['decision'] or 'none yet'} ({decision['why']})")
    return '\n'.join(lines)


def cell_text(weighed: dict) -> str:
    """'-0.14% / +0.20% / 1.17x' (a missing row or time: '-')."""
    gap = lambda value: '-' if value is None else f'{value:+.2%}'
    sooner = '-' if weighed['sooner'] is None else f"{weighed['sooner']:.2f}x"
    return f"{gap(weighed['untied_gap'])} / {gap(weighed['tied_gap'])} / {sooner}"
