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
    seeds: int = 1  # the runs its held-out losses are the mean of
    by_seed: Optional[dict[int, list[Evaluation]]] = None  # each run's evaluations by its seed, where known


def on_shared_seeds(row: Curve, reference: Curve) -> tuple[list[HeldOut], list[HeldOut]]:
    """Both rows' held-out losses over the seeds both ran: a row of seed 1 beside a reference of seeds 1 and 2 is
    weighed against the reference's seed 1, since two seeds of one row part by as much as the gaps weighed
    (docs/learning.md). Their own means where either does not name its seeds or they share none."""
    shared = sorted(set(row.by_seed or ()) & set(reference.by_seed or ()))
    if not shared or len(shared) == row.seeds == reference.seeds:
        return row.held_out, reference.held_out
    return (over_seeds([row.by_seed[seed] for seed in shared]),
            over_seeds([reference.by_seed[seed] for seed in shared]))


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
        gaps = gaps_at_equal_tokens(*on_shared_seeds(row, reference)) if row.steps == reference.steps else {}
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


def row_of(run: str) -> str:
    """The row a run is of: its name, less the ``@STEPS`` of a run on another schedule."""
    return run.split('@')[0]


class Recipe(NamedTuple):
    """A precision recipe the grid weighs for the default, by its rows' names: on the shipped tied 1B (beside
    ``ours-shipped-bf16``; its runs of another schedule ``TIED@STEPS``, timed to the target) and, where the cell ran
    it, on torchtitan's untied 1B flavor from torchtitan's own weights (beside ``ours-bf16``)."""
    name: str
    untied: str
    tied: str

    def ran(self, run: str) -> bool:
        """Whether ``run`` (a row name, or ``TIED@STEPS``) is one of this recipe's."""
        return run == self.untied or row_of(run) == self.tied


RECIPES = (Recipe('float8 blocks', 'ours-float8-blocks', 'ours-shipped-float8-blocks'),
           Recipe('float8 blocks and output layer', 'ours-float8', 'ours-shipped'),
           Recipe('float8 rowwise blocks', 'ours-float8-rowwise', 'ours-shipped-float8-rowwise'))
UNTIED_BF16, TIED_BF16, TARGET = 'ours-bf16', 'ours-shipped-bf16', 'torchtitan'  # the rule's reference rows
SECOND_SEED_WITHIN = 0.01  # issue 66: one seed a cell, a second where two rows end within 1 % of each other
GRID = ('prose lr 0.0003', 'prose lr 0.001', 'python lr 0.0003', 'python lr 0.001')  # issue 66: 2 corpora x 2 lrs


def cell_name(report: dict) -> str:
    """'prose lr 0.001': a report's corpus (the learning benchmark's file suffix) and learning rate."""
    corpus = 'python' if report['data'].get('suffix', '.py') == '.py' else 'prose'
    return f"{corpus} lr {report['hyper']['lr']:g}"


def final_gap(curves: dict[str, Curve], name: str, reference: str) -> Optional[float]:
    """``name``'s held-out loss relative to ``reference``'s at the last step both evaluated, over the seeds both ran,
    where both trained the same schedule; None where either is missing."""
    row, against = curves.get(name), curves.get(reference)
    if row is None or against is None or row.steps != against.steps:
        return None
    gaps = gaps_at_equal_tokens(*on_shared_seeds(row, against))
    return gaps[max(gaps)] if gaps else None


def gap_verdict(curves: dict[str, Curve], name: str, reference: str, tolerance: float
                ) -> tuple[Optional[float], bool, bool]:
    """``name``'s final gap to ``reference``, whether it fails (over ``tolerance``, and settled), and whether it waits
    for a second seed (the rows end within SECOND_SEED_WITHIN of each other and one of them ran one seed only)."""
    gap = final_gap(curves, name, reference)
    if gap is None:
        return None, False, False
    second_seed = abs(gap) < SECOND_SEED_WITHIN and min(curves[name].seeds, curves[reference].seeds) < 2
    return gap, gap > tolerance and not second_seed, second_seed


def speedup_to_target(curves: dict[str, Curve], name: str) -> Optional[float]:
    """The best over ``name``'s runs (``name`` and ``name@STEPS``) of TARGET's seconds to its own final held-out
    loss over the run's seconds to it; None where TARGET or every run of ``name`` is missing or short of it."""
    if TARGET not in curves:
        return None
    target = curves[TARGET].held_out[-1].mean
    theirs = seconds_to_target(curves[TARGET], target)
    ours = [seconds_to_target(curve, target) for run, curve in curves.items() if row_of(run) == name]
    return max((theirs / seconds for seconds in ours if seconds), default=None)


def recipe_in_cell(recipe: Recipe, curves: dict[str, Curve], tolerance: float) -> dict:
    """The recipe in one cell (row name -> its curve over the cell's runs): its final gaps at equal tokens to bf16
    (untied: where the cell ran it), whether they hold (False: a settled gap over the tolerance; None: no tied row,
    or a second seed to run) and the shipped tied model's speed-up to the target."""
    (untied, untied_fails, untied_seed), (tied, tied_fails, tied_seed) = (
        gap_verdict(curves, name, reference, tolerance)
        for name, reference in ((recipe.untied, UNTIED_BF16), (recipe.tied, TIED_BF16)))
    second_seed = untied_seed or tied_seed
    return {'untied_gap': untied, 'tied_gap': tied, 'second_seed': second_seed,
            'holds': False if untied_fails or tied_fails else (None if tied is None or second_seed else True),
            'sooner': speedup_to_target(curves, recipe.tied)}


def decide(cells: dict[str, dict[str, Curve]], recipes: tuple = RECIPES, tolerance: float = 0.005,
           speedup: float = 1.15, grid: tuple = GRID) -> dict:
    """Issue 66's rule over the grid's cells (name -> row name -> curve; a grid cell not given counts as run with no
    rows): the recipe with the shortest wall-clock to the target (its smallest speed-up over the cells, largest) among
    those that hold bf16's held-out loss in every cell; bf16 when none holds; None (incomplete) while a recipe that
    has not failed lacks its tied row or a time somewhere. A recipe no cell ran is left out (the grid runs its
    optional recipes, rowwise, where device time allows); None while none ran."""
    names = sorted(set(grid) | set(cells))
    weighed = {recipe.name: {cell: recipe_in_cell(recipe, cells.get(cell, {}), tolerance) for cell in names}
               for recipe in recipes if any(recipe.ran(run) for curves in cells.values() for run in curves)}
    if not weighed:
        return {'recipes': {}, 'cells': names, 'failed': [], 'decision': None, 'why': 'no recipe has run'}
    failed = {name for name, by_cell in weighed.items() if any(c['holds'] is False for c in by_cell.values())}
    holding = [name for name in weighed if name not in failed]
    missing = [text for text in (what_is_missing(name, weighed[name]) for name in holding) if text]
    if missing:
        decision, why = None, 'incomplete: ' + '; '.join(missing)
    elif len(failed) == len(weighed):
        decision, why = 'bf16', 'every recipe ends above bf16 by more than the tolerance in some cell'
    else:
        decision = max(holding, key=lambda name: min(c['sooner'] for c in weighed[name].values()))
        slowest = min(c['sooner'] for c in weighed[decision].values())
        why = (f'holds in every cell; its slowest cell {slowest:.2f}x sooner than the target row '
               f"({'at least' if slowest >= speedup else 'under'} {speedup:g}x)")
    return {'recipes': weighed, 'cells': names, 'failed': sorted(failed), 'decision': decision, 'why': why}


def what_is_missing(name: str, by_cell: dict) -> str:
    """'NAME lacks its tied row or a time to the target in CELLS, and a second seed in CELLS' (the parts that
    apply), or '' where nothing is."""
    unrun = [cell for cell, c in by_cell.items() if c['tied_gap'] is None or c['sooner'] is None]
    unseeded = [cell for cell, c in by_cell.items() if c['second_seed']]
    parts = ([f"its tied row or a time to the target in {', '.join(unrun)}"] if unrun else []) + (
        [f"a second seed in {', '.join(unseeded)}"] if unseeded else [])
    return f"{name} lacks {', and '.join(parts)}" if parts else ''


def format_decision(decision: dict) -> str:
    """A line a recipe: each cell's gaps at equal tokens (untied / the tied shipped 1B) and the shipped model's
    speed-up to the target, then the decision."""
    cells = decision['cells']
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
