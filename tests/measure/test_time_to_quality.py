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


def entry(name: str, gap: float | None, sooner: float | None = None) -> dict:
    """A time-to-quality table's row as the decision reads it (the gap against its table's bf16 reference)."""
    return {'name': name, 'final_gap': gap, 'holds': None if gap is None else gap <= 0.005, 'sooner': sooner}


def cell(blocks_gap, blocks_tied_gap, blocks_sooner, output_gap, output_tied_gap, output_sooner) -> list[dict]:
    """One cell's untied and tied tables together: each recipe's equal-token rows, its time-to-target run."""
    rows = [entry('ours-bf16', 0.0), entry('torchtitan', -0.003, 1.0), entry('ours-shipped-bf16', 0.0)]
    for untied, tied, gap, tied_gap, sooner in (('ours-float8-blocks', 'ours-shipped-float8-blocks', blocks_gap,
                                                 blocks_tied_gap, blocks_sooner),
                                                ('ours-float8', 'ours-shipped', output_gap, output_tied_gap,
                                                 output_sooner)):
        rows += [entry(untied, gap), entry(tied, tied_gap)]
        if sooner is not None:
            rows.append(entry(f'{untied}@412', None, sooner))  # the timed run: another schedule, no gap
    return rows


def test_the_default_is_the_fastest_recipe_that_holds_in_every_cell_tied_and_untied():
    cells = {'prose lr 0.001': cell(-0.0014, 0.002, 1.17, -0.0008, 0.0326, 1.19),
             'python lr 0.0003': cell(0.004, -0.001, 1.21, 0.001, 0.0, 1.30)}
    decision = decide(cells)
    assert (decision['decision'], decision['failed']) == ('float8 blocks', ['float8 blocks and output layer'])
    assert decision['why'] == 'holds in every cell; its slowest cell 1.17x sooner than the target row (at least 1.15x)'
    assert format_decision(decision).splitlines() == [
        'recipe                                          prose lr 0.001              python lr 0.0003',
        'float8 blocks                          -0.14% / +0.20% / 1.17x       +0.40% / -0.10% / 1.21x',
        'float8 blocks and output layer         -0.08% / +3.26% / 1.19x       +0.10% / +0.00% / 1.30x',
        'decision: float8 blocks (holds in every cell; its slowest cell 1.17x sooner than the target row (at least '
        '1.15x))']
    both_hold = decide({'prose lr 0.001': cell(0.0, 0.0, 1.12, 0.0, 0.0, 1.14)})
    assert both_hold['decision'] == 'float8 blocks and output layer'  # the larger of the two slowest speed-ups
    assert both_hold['why'].endswith('1.14x sooner than the target row (under 1.15x)')


def test_bf16_is_the_default_when_no_recipe_holds_and_a_missing_row_leaves_it_undecided():
    failing = decide({'prose lr 0.001': cell(0.006, 0.0, 1.2, 0.0, 0.0326, 1.19)})
    assert (failing['decision'], failing['why']) == (
        'bf16', 'every recipe ends above bf16 by more than the tolerance in some cell')
    missing = decide({'prose lr 0.001': cell(-0.0014, None, None, -0.0008, 0.0326, 1.19)})
    assert (missing['decision'], missing['why']) == (
        None, 'incomplete: float8 blocks lacks a row or a time to the target in some cell')
    untimed = decide({'prose lr 0.001': cell(-0.0014, 0.001, None, -0.0008, 0.0326, 1.19)})
    assert untimed['decision'] is None and untimed['recipes']['float8 blocks']['prose lr 0.001']['holds'] is True


def test_a_cell_is_named_by_its_corpus_and_learning_rate():
    assert cell_name({'data': {'suffix': '.rst.txt'}, 'hyper': {'lr': 0.001}}) == 'prose lr 0.001'
    assert cell_name({'data': {'suffix': '.py'}, 'hyper': {'lr': 3e-4}}) == 'python lr 0.0003'
    assert cell_name({'data': {}, 'hyper': {'lr': 3e-4}}) == 'python lr 0.0003'  # reports before the suffix was kept
