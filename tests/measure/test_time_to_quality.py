"""Time to quality: held-out losses over seeds, tokens and seconds to a target, gaps at equal tokens; the default
precision decided over the grid's cells."""
import pytest

from llmfoundry_ext.measure.time_to_quality import (Curve, Evaluation, HeldOut, cell_name, compare, decide,
                                                    format_decision, format_table, gaps_at_equal_tokens, over_seeds,
                                                    tokens_to_target)

BF16 = over_seeds([[Evaluation(100, 2.4), Evaluation(200, 2.0), Evaluation(300, 1.9)],
                   [Evaluation(100, 2.6), Evaluation(200, 2.2), Evaluation(300, 1.9)]])


def means(*steps_and_losses) -> list[HeldOut]:
    return [HeldOut(step, loss, loss, loss) for step, loss in steps_and_losses]


def test_seeds_are_averaged_at_the_steps_every_seed_evaluated():
    assert [point.step for point in BF16] == [100, 200, 300]
    assert [value for point in BF16 for value in point[1:]] == pytest.approx(
        [2.5, 2.4, 2.6, 2.1, 2.0, 2.2, 1.9, 1.9, 1.9], rel=1e-12)
    assert over_seeds([[Evaluation(100, 3.0), Evaluation(200, 2.0)], [Evaluation(200, 4.0)]]) == [
        HeldOut(200, 3.0, 2.0, 4.0)]


def test_the_target_is_reached_between_evaluations_linearly_in_tokens():
    assert tokens_to_target(BF16, 1000, 2.0) == pytest.approx(250_000, rel=1e-12)  # halfway from 2.1 to 1.9
    assert tokens_to_target(BF16, 1000, 1.95) == pytest.approx(275_000, rel=1e-12)
    assert tokens_to_target(BF16, 1000, 2.6) == 100_000  # the first evaluation is already there
    assert tokens_to_target(BF16, 1000, 1.9) == 300_000
    assert tokens_to_target(BF16, 1000, 1.8) is None


def test_gaps_are_relative_to_the_reference_at_the_steps_both_evaluated():
    gaps = gaps_at_equal_tokens(means((100, 2.52), (200, 2.1)), BF16)
    assert list(gaps) == [100, 200]
    assert gaps[100] == pytest.approx(0.008, rel=1e-9) and gaps[200] == 0.0


def test_a_faster_recipe_that_loses_held_out_loss_is_sooner_but_does_not_hold():
    rows = [Curve('bf16', BF16, 1000, 1000.0, 300),
            Curve('float8', means((100, 2.52), (200, 2.12), (300, 1.92)), 1000, 1250.0, 300),
            Curve('torchtitan', means((100, 2.55), (200, 2.15), (300, 1.95)), 1000, 1100.0, 300)]
    table = compare(rows, quality_reference='bf16', time_reference='torchtitan', tolerance=0.005, speedup=1.15)
    by_name = {entry['name']: entry for entry in table}
    assert [entry['target'] for entry in table] == [1.95] * 3  # torchtitan's final held-out loss
    assert by_name['torchtitan']['seconds_to_target'] == pytest.approx(300_000 / 1100, rel=1e-12)
    assert by_name['bf16']['tokens_to_target'] == pytest.approx(275_000, rel=1e-12)
    assert by_name['bf16']['sooner'] == pytest.approx((300_000 / 1100) / 275, rel=1e-12)  # 0.9917x
    assert by_name['float8']['tokens_to_target'] == pytest.approx(285_000, rel=1e-12)
    assert by_name['float8']['seconds_to_target'] == pytest.approx(228.0, rel=1e-12)
    assert by_name['float8']['sooner'] == pytest.approx((300_000 / 1100) / 228, rel=1e-12)  # 1.196x
    assert by_name['float8']['final_gap'] == pytest.approx(0.02 / 1.9, rel=1e-12)  # +1.05 %: over 0.5 %
    assert [entry['holds'] for entry in table] == [True, False, False]
    # in torchtitan's 272.7 s over 1.15 (237.2 s), 1,000 tokens a step: 237 steps at 1,000 tokens/s, 296 at 1,250
    assert [entry['steps_in_time'] for entry in table] == [237, 296, 260]
    assert format_table(table, 'bf16', 'torchtitan').splitlines() == [
        "target: torchtitan's final held-out loss 1.9500; gaps against bf16 at equal tokens",
        'row                      steps  held-out      gap   tokens/s  tokens to target  s to target  sooner'
        '  steps at 1.15x',
        'bf16                       300    1.9000   +0.00%      1,000           275,000        275.0   0.99x'
        '             237',
        'float8                     300    1.9200   +1.05%      1,250           285,000        228.0   1.20x'
        '             296',
        'torchtitan                 300    1.9500   +2.63%      1,100           300,000        272.7   1.00x'
        '             260']


def test_a_lower_loss_holds_and_a_row_of_another_schedule_is_timed_but_not_compared_at_equal_tokens():
    rows = [Curve('bf16', BF16, 1000, 1000.0, 300),
            Curve('better', means((100, 2.4), (200, 2.0), (300, 1.8)), 1000, 1000.0, 300),
            Curve('longer', means((100, 2.4), (200, 2.1), (300, 1.95), (330, 1.85)), 1000, 1250.0, 330)]
    table = compare(rows, 'bf16', 'bf16', 0.005, 1.15)
    assert table[1]['final_gap'] == pytest.approx(-0.1 / 1.9, rel=1e-12) and table[1]['holds'] is True  # -5.3 %
    assert (table[2]['gaps'], table[2]['final_gap'], table[2]['holds']) == ({}, None, None)
    assert table[2]['tokens_to_target'] == pytest.approx(315_000, rel=1e-12)  # 1.9: halfway from 1.95 to 1.85
    assert table[2]['sooner'] == pytest.approx(300 / 252, rel=1e-12)
    assert format_table(table, 'bf16', 'bf16').splitlines()[-1] == (
        'longer                     330    1.8500        -      1,250           315,000        252.0   1.19x'
        '             326')


def test_a_row_that_never_reaches_the_target_says_so():
    rows = [Curve('bf16', BF16, 1000, 1000.0, 300),
            Curve('slow', means((100, 2.6), (200, 2.3), (300, 2.0)), 1000, 900.0, 300)]
    table = compare(rows, 'bf16', 'bf16', 0.005, 1.15)
    assert table[1]['tokens_to_target'] is None and table[1]['sooner'] is None
    assert format_table(table, 'bf16', 'bf16').splitlines()[-1] == (
        'slow                       300    2.0000   +5.26%        900       not reached            -       -'
        '             234')


def cell(blocks: float | None, output: float | None, blocks_untied: float | None = None,
         timed: tuple[int, float] | None = None, titan: float = 2.1, seeds: int = 2) -> dict[str, Curve]:
    """One cell's curves, 1,000 tokens a step: bf16 (tied and untied) and torchtitan at 2.2 at step 200, then bf16
    2.0 and torchtitan ``titan`` at step 400 (the target: 400 s at 1,000 tokens/s); each recipe's tied row ends at the
    final loss given (None: not run), at 1,600 tokens/s (blocks) and 2,000 (blocks and output layer); ``timed``: the
    tied blocks row's run of another schedule (its steps and final loss); every row the mean of ``seeds`` runs."""
    def row(name, final, tokens_per_second, steps=400):
        return Curve(name, means((200, 2.2), (steps, final)), 1000, tokens_per_second, steps, seeds)

    rows = [row('ours-bf16', 2.0, 1100.0), row('ours-shipped-bf16', 2.0, 1100.0), row('torchtitan', titan, 1000.0)]
    for name, final, speed in (('ours-shipped-float8-blocks', blocks, 1600.0), ('ours-shipped', output, 2000.0),
                               ('ours-float8-blocks', blocks_untied, 1600.0)):
        if final is not None:
            rows.append(row(name, final, speed))
    if timed:
        rows.append(row(f'ours-shipped-float8-blocks@{timed[0]}', timed[1], 1600.0, timed[0]))
    return {curve.name: curve for curve in rows}


def seconds_to_two_point_one(final: float, tokens_per_second: float) -> float:
    """A cell row's seconds to the target: 2.2 at step 200 down to ``final`` at step 400, linear in tokens."""
    return (200 + 200 * 0.1 / (2.2 - final)) * 1000 / tokens_per_second


def grid(**cells) -> dict[str, dict[str, Curve]]:
    """Every grid cell like prose lr 0.001 but where ``cells`` (python_1e_3=...) says otherwise."""
    names = {'prose_3e_4': 'prose lr 0.0003', 'prose_1e_3': 'prose lr 0.001', 'python_3e_4': 'python lr 0.0003',
             'python_1e_3': 'python lr 0.001'}
    return {name: cells.get(key, cell(2.004, 2.1)) for key, name in names.items()}


def test_the_default_is_the_fastest_recipe_that_holds_in_every_cell_of_the_grid():
    decision = decide(grid(python_1e_3=cell(1.99, 2.0, blocks_untied=2.009)))
    assert (decision['decision'], decision['failed']) == ('float8 blocks', ['float8 blocks and output layer'])
    by_cell = decision['recipes']['float8 blocks']
    assert by_cell['prose lr 0.001']['tied_gap'] == pytest.approx(0.002, rel=1e-9)  # 2.004 beside 2.0
    assert by_cell['prose lr 0.001']['sooner'] == pytest.approx(400 / seconds_to_two_point_one(2.004, 1600), rel=1e-12)
    assert by_cell['python lr 0.001']['sooner'] == pytest.approx(400 / seconds_to_two_point_one(1.99, 1600), rel=1e-12)
    assert decision['why'] == 'holds in every cell; its slowest cell 2.12x sooner than the target row (at least 1.15x)'
    assert format_decision(decision).splitlines() == [
        'recipe                                         prose lr 0.0003                prose lr 0.001'
        '              python lr 0.0003               python lr 0.001',
        'float8 blocks                               - / +0.20% / 2.12x            - / +0.20% / 2.12x'
        '            - / +0.20% / 2.12x       +0.45% / -0.50% / 2.17x',
        'float8 blocks and output layer              - / +5.00% / 2.00x            - / +5.00% / 2.00x'
        '            - / +5.00% / 2.00x            - / +0.00% / 2.67x',
        'decision: float8 blocks (holds in every cell; its slowest cell 2.12x sooner than the target row (at least '
        '1.15x))']
    both_hold = decide({'prose lr 0.001': cell(2.004, 2.0)}, grid=('prose lr 0.001',))
    assert both_hold['decision'] == 'float8 blocks and output layer'  # the larger of the two slowest speed-ups
    assert both_hold['why'] == 'holds in every cell; its slowest cell 2.67x sooner than the target row (at least 1.15x)'


def test_an_untied_gap_over_the_tolerance_fails_the_recipe_and_none_holding_leaves_bf16():
    untied_over = decide(grid(prose_3e_4=cell(2.004, 2.0, blocks_untied=2.0102)))
    assert untied_over['recipes']['float8 blocks']['prose lr 0.0003']['holds'] is False  # +0.51 % untied
    assert (untied_over['decision'], untied_over['why']) == (
        'bf16', 'every recipe ends above bf16 by more than the tolerance in some cell')


def test_a_missing_cell_row_or_time_leaves_the_default_undecided():
    missing_cells = decide({'prose lr 0.001': cell(2.004, 2.1)})
    assert (missing_cells['decision'], missing_cells['why']) == (
        None, 'incomplete: float8 blocks lacks its tied row or a time to the target in prose lr 0.0003, '
              'python lr 0.0003, python lr 0.001')
    no_tied_row = decide(grid(python_3e_4=cell(None, 2.1, blocks_untied=2.0)))
    assert no_tied_row['why'] == ('incomplete: float8 blocks lacks its tied row or a time to the target in '
                                  'python lr 0.0003')
    below_everyone = cell(2.004, 2.1, titan=1.99)  # holds, but ends above torchtitan's 1.99: not timed
    untimed = decide(grid(prose_1e_3=below_everyone))
    assert untimed['decision'] is None and untimed['recipes']['float8 blocks']['prose lr 0.001'] == {
        'untied_gap': None, 'tied_gap': pytest.approx(0.002, rel=1e-9), 'second_seed': False, 'holds': True,
        'sooner': None}
    timed = decide(grid(prose_1e_3=cell(2.004, 2.1, titan=1.99, timed=(440, 1.98))))
    # the 440-step run reaches 1.99 at step 200 + 240 x 0.21 / 0.22, at 1,600 tokens/s; torchtitan takes 400 s
    assert timed['recipes']['float8 blocks']['prose lr 0.001']['sooner'] == pytest.approx(
        400 / ((200 + 240 * 0.21 / 0.22) * 1000 / 1600), rel=1e-12)
    assert timed['decision'] == 'float8 blocks'


def test_a_cell_is_named_by_its_corpus_and_learning_rate():
    assert cell_name({'data': {'suffix': '.rst.txt'}, 'hyper': {'lr': 0.001}}) == 'prose lr 0.001'
    assert cell_name({'data': {'suffix': '.py'}, 'hyper': {'lr': 3e-4}}) == 'python lr 0.0003'
    assert cell_name({'data': {}, 'hyper': {'lr': 3e-4}}) == 'python lr 0.0003'  # reports before the suffix was kept


def test_a_recipe_no_cell_ran_is_left_out_and_one_run_somewhere_is_weighed_everywhere():
    """Rowwise float8 (optional in the grid) ran only in prose lr 0.001, holding there (2.002 beside 2.0): it is
    weighed in every cell and holds the decision up; with no recipe run at all there is none."""
    assert list(decide(grid())['recipes']) == ['float8 blocks', 'float8 blocks and output layer']
    cells = grid()
    rowwise = Curve('ours-shipped-float8-rowwise', means((200, 2.2), (400, 2.002)), 1000, 1300.0, 400, 2)
    cells['prose lr 0.001'] = {**cells['prose lr 0.001'], rowwise.name: rowwise}
    decision = decide(cells)
    assert list(decision['recipes']) == ['float8 blocks', 'float8 blocks and output layer', 'float8 rowwise blocks']
    assert decision['recipes']['float8 rowwise blocks']['prose lr 0.001']['tied_gap'] == pytest.approx(0.001)
    assert (decision['decision'], decision['why']) == (
        None, 'incomplete: float8 rowwise blocks lacks its tied row or a time to the target in prose lr 0.0003, '
              'python lr 0.0003, python lr 0.001')
    nothing = decide({})
    assert (nothing['decision'], nothing['why']) == (None, 'no recipe has run')
    assert format_decision(nothing).splitlines()[-1] == 'decision: none yet (no recipe has run)'


def test_rows_ending_within_1_percent_on_one_seed_wait_for_a_second_and_a_larger_gap_fails_on_one():
    """Issue 66: one seed a cell, a second where two rows end within 1 % of each other. On one seed, blocks at +0.8 %
    (over the 0.5 % tolerance) and at +0.2 % both wait for a second seed, and at +1.5 % fail; on two seeds +0.8 %
    fails (and +0.2 % holds: the grid's other cells)."""
    one_seed = decide(grid(prose_3e_4=cell(2.016, 2.1, seeds=1), python_3e_4=cell(2.004, 2.1, seeds=1)))
    blocks = one_seed['recipes']['float8 blocks']
    assert [(blocks[name]['second_seed'], blocks[name]['holds'])
            for name in ('prose lr 0.0003', 'python lr 0.0003', 'prose lr 0.001')] == [(True, None), (True, None),
                                                                                        (False, True)]
    assert one_seed['why'] == 'incomplete: float8 blocks lacks a second seed in prose lr 0.0003, python lr 0.0003'
    over_on_one = decide(grid(prose_3e_4=cell(2.03, 2.1, seeds=1)))['recipes']['float8 blocks']['prose lr 0.0003']
    assert (over_on_one['second_seed'], over_on_one['holds']) == (False, False)
    two_seeds = decide(grid(prose_3e_4=cell(2.016, 2.1)))
    assert two_seeds['recipes']['float8 blocks']['prose lr 0.0003']['holds'] is False
    assert two_seeds['decision'] == 'bf16'


def test_a_row_of_one_seed_is_weighed_against_the_same_seed_of_a_reference_of_two():
    """Python lr 3e-4 at 7b10d1f: rowwise ran seed 1 (1.5184), bf16 seeds 1 and 2 (1.4864, 1.5105): the gap is to
    bf16's seed 1 (+2.15 %), not to the mean of both (+1.33 %); rows of the same seeds keep their means."""
    def curve(name, *finals):
        runs = {seed: [Evaluation(200, 2.2), Evaluation(400, final)] for seed, final in enumerate(finals, 1)}
        return Curve(name, over_seeds(list(runs.values())), 1000, 1000.0, 400, len(runs), runs)

    bf16 = curve('ours-shipped-bf16', 1.4864, 1.5105)
    rowwise, blocks = curve('ours-shipped-float8-rowwise', 1.5184), curve('ours-shipped-float8-blocks', 1.5204, 1.5346)
    cells = {'python lr 0.0003': {row.name: row for row in (bf16, rowwise, blocks)}}
    weighed = decide(cells, grid=('python lr 0.0003',))['recipes']
    assert weighed['float8 rowwise blocks']['python lr 0.0003']['tied_gap'] == pytest.approx(0.032 / 1.4864, rel=1e-9)
    assert weighed['float8 blocks']['python lr 0.0003']['tied_gap'] == pytest.approx(
        (1.5275 - 1.49845) / 1.49845, rel=1e-9)
    by_name = {entry['name']: entry for entry in compare([bf16, rowwise], 'ours-shipped-bf16', 'ours-shipped-bf16',
                                                         0.005, 1.15)}
    assert by_name['ours-shipped-float8-rowwise']['gaps'] == pytest.approx({200: 0.0, 400: 0.032 / 1.4864}, rel=1e-9)
