"""The throughput benchmark: row parsing, the table and ratios, torchtitan rows, the synthetic documents, and real
rows on two CPU processes."""
import json

import pytest

from llmfoundry_ext.measure import benchmark
from llmfoundry_ext.measure.benchmark import Row, comparisons, format_comparisons, format_table
from scripts.measure_speed import main as benchmark_main
from tests.conftest import FORKED


def test_rows_name_their_model_in_the_source_not_the_name():
    assert Row.parse("hf yamls/a.yaml global_batch_size=2 'model.fused_kernels=[rope]'") == Row(
        'hf', 'yamls/a.yaml', ['global_batch_size=2', 'model.fused_kernels=[rope]'], 'ours')
    assert Row.parse('b1 hf:yamls/a.yaml global_batch_size=1') == Row('b1', 'yamls/a.yaml', ['global_batch_size=1'],
                                                                      'hf')
    assert Row.parse('tt torchtitan:compile_sac FLAVOR=8B LBS=1') == Row('tt', 'compile_sac', ['FLAVOR=8B', 'LBS=1'],
                                                                         'torchtitan')
    for text in ("b1 hf:yamls/a.yaml 'model.fused_kernels=[rope]'", 'tt torchtitan:fp8 LBS=1', 'ours yamls/a.yaml'):
        assert Row.parse(text).text() == text


def test_table_gives_each_row_against_the_baseline_and_each_pair_its_ratio():
    common = {'step_seconds': 0.5, 'peak_allocated_gib': 40.0, 'peak_reserved_gib': 42.5}
    plan = {'predicted_peak_gib': 41.25, 'predicted_fits': True, 'predicted_tokens_per_second_per_gpu': 51234.0}
    results = [{'name': 'hf', 'model': 'hf', 'tokens_per_second_per_gpu': 20000.0, 'mfu': 0.25, **common},
               {'name': 'ours', 'model': 'ours', 'tokens_per_second_per_gpu': 50000.0, 'mfu': 0.625, **common, **plan},
               {'name': 'titan', 'model': 'torchtitan', 'tokens_per_second_per_gpu': 40000.0, 'mfu': 0.5,
                'step_seconds': None, 'peak_allocated_gib': None, 'peak_reserved_gib': 45.0},
               {'name': 'broken', 'model': 'ours', 'error': 'exit status 1'},
               {'name': 'oom', 'model': 'ours', 'error': 'out of memory', **plan, 'predicted_fits': False}]
    assert format_table(results, 'hf').splitlines() == [
        'run                       model       tok/s/GPU    MFU  step s alloc GiB resv GiB vs base '
        'predicted: GiB   tok/s',
        'hf                        hf             20,000  25.0%   0.500      40.0     42.5   1.00x',
        'ours                      ours           50,000  62.5%   0.500      40.0     42.5   2.50x'
        '           41.2  51,234',
        'titan                     torchtitan     40,000  50.0%       -         -     45.0   2.00x',
        'broken                    ours       failed: exit status 1',
        'oom                       ours       failed: out of memory           41.2  51,234 (no fit)']
    compared = comparisons(results, ['ours:titan', 'broken:titan'])
    assert compared == [{'ours': 'ours', 'theirs': 'titan', 'ratio': 1.25},
                        {'ours': 'broken', 'theirs': 'titan', 'ratio': None}]
    assert format_comparisons(compared).splitlines() == [
        'ours                       / titan                        1.250x',
        'broken                     / titan                             -']


def test_step_timer_gives_each_step_after_the_warm_up_and_their_mean(monkeypatch):
    """Warm-up 2 of 5 batches: the clock is read at the end of batches 2-5, the steps are 3-5."""
    clock = iter([10.0, 10.5, 11.25, 12.0])
    monkeypatch.setattr(benchmark.time, 'perf_counter', lambda: next(clock))
    timer = benchmark.StepTimer(warmup=2)
    for _ in range(5):
        timer.batch_end(None, None)
    assert timer.each_step_seconds() == [0.5, 0.75, 0.75]
    assert timer.step_seconds() == pytest.approx(2 / 3)



def test_step_timer_counts_the_allocators_frees_and_retries_over_the_timed_steps(monkeypatch):
    """Warm-up 2 of 4 batches: the counts at the end of batch 2 are subtracted from those at the training's end."""
    counts = iter([{'num_device_alloc': 5, 'num_device_free': 0, 'num_alloc_retries': 0},
                   {'num_device_alloc': 9, 'num_device_free': 3, 'num_alloc_retries': 2}])
    monkeypatch.setattr(benchmark, 'allocator_counts', lambda: next(counts))
    timer = benchmark.StepTimer(warmup=2)
    for _ in range(4):
        timer.batch_end(None, None)
    timer.fit_end(None, None)
    assert timer.allocator() == {'num_device_alloc': 4, 'num_device_free': 3, 'num_alloc_retries': 2}
    row = {'name': 'near', 'model': 'ours', 'tokens_per_second_per_gpu': 1000.0, 'mfu': 0.5, 'step_seconds': 1.0,
           'peak_allocated_gib': 130.0, 'peak_reserved_gib': 138.0, 'allocator': timer.allocator()}
    assert format_table([row], None).splitlines()[1] == (
        'near                      ours            1,000  50.0%   1.000     130.0    138.0       -'
        '  allocator: 3 cudaFree, 2 retries')
    assert benchmark.allocator_note({**row, 'allocator': {}}) == ''  # no GPU, or none made
    pools = [(0, 120 * 2 ** 30, 110 * 2 ** 30), (94, 17 * 2 ** 30, 0), (7, 2 ** 20, 0)]  # the last under 1 GiB: left out
    assert benchmark.allocator_note({**row, 'reserved_by_stream': pools}) == (
        '  allocator: 3 cudaFree, 2 retries  pools: default 120.0 (110.0), stream 94 17.0 (0.0)')
    assert benchmark.allocator_note({'reserved_by_stream': pools[:1]}) == ''  # the default stream's alone: no note


def test_step_timer_leaves_held_out_evaluations_out_of_the_steps(monkeypatch):
    """Warm-up 1: an evaluation of 3 s between batches 1 and 2 is not step 2's time."""
    clock = iter([10.0, 10.5, 13.5, 14.0, 14.25])
    monkeypatch.setattr(benchmark.time, 'perf_counter', lambda: next(clock))
    timer = benchmark.StepTimer(warmup=1)
    timer.batch_end(None, None)
    timer.eval_start(None, None)
    timer.eval_end(None, None)
    timer.batch_end(None, None)
    timer.batch_end(None, None)
    assert timer.each_step_seconds() == [1.0, 0.25]


FAKE_TORCHTITAN = """
import json, os, sys
steps = [{'step': s, 'tps': 1000 * s, 'mfu': 50.0, 'mem_gib': 60.0 + s, 'loss': 10.0 / s}
         for s in range(1, int(os.environ['STEPS']) + 1)]
summary = {sys.argv[1]: {'rows': steps, 'flavor': os.environ['FLAVOR']}}
json.dump(summary, open(os.environ['OUT'] + '/tt_summary.json', 'w'))
with open(os.environ['OUT'] + f'/tt_{sys.argv[1]}.log', 'w') as log:  # torchtitan's line, twice (two ranks)
    for s in range(1, int(os.environ['STEPS']) + 1):
        for rank in range(2):
            print(f'step: {s:2}  loss: {10.0 / s:8.5f}  grad_norm: {1.5 * s:7.4f}  memory: 60.00GiB(75.00%)', file=log)
"""


def test_torchtitan_rows_count_tokens_over_the_timed_steps_as_ours(tmp_path, monkeypatch):
    """Tokens over time of steps 3-5 of 5 (3,000, 4,000, 5,000 tokens/s each): their harmonic mean."""
    script = tmp_path / 'run.sh'
    script.write_text(f"python3 - \"$1\" <<'EOF'{FAKE_TORCHTITAN}EOF\n")
    monkeypatch.setattr(benchmark, 'TORCHTITAN_SCRIPT', str(script))
    result = benchmark.run_row('unused', Row.parse('tt torchtitan:compile FLAVOR=1B'), 2, 2, 3, str(tmp_path / 'row'),
                               prepare_yaml=None)
    assert result['tokens_per_second_per_gpu'] == pytest.approx(3 / (1 / 3000 + 1 / 4000 + 1 / 5000))
    assert result['losses'] == [10.0 / step for step in range(1, 6)]
    assert result['grad_norms'] == [1.5, 3.0, 4.5, 6.0, 7.5]
    assert (result['mfu'], result['peak_reserved_gib'], result['gpus']) == (0.5, 65.0, 2)


def run_benchmark(capsys, tmp_path, processes: int, *args: str) -> tuple[dict, str]:
    """scripts/measure_speed.py ARGS (its rows and pairs; documents of 16 tokens, 1 warm-up, 2 timed steps) on PROCESSES
    CPU processes: its JSON and console. Its main runs in this process, each row in processes of its own."""
    out = tmp_path / f'bench-{processes}.json'
    capsys.readouterr()
    assert benchmark_main(['--gpus', str(processes), '--warmup', '1', '--steps', '2', '--mean-document-tokens', '16',
                           '--json', str(out), *args]) == 0
    return json.loads(out.read_text()), capsys.readouterr().out


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_rows_run_on_two_processes_over_one_data_folder_record_the_whole_batchs_loss_and_write_json(tmp_path,
                                                                                                    capsys,
                                                                                                    monkeypatch):
    """Two ranks read the same synthetic tokens (a folder per rank was refused by streaming), for our model and
    transformers' alike; the losses recorded are the whole global batch's: fp32, one process's on the same batches
    (rank 0's own sample's, recorded until 2026-11-27, differed from the first batch on). The rows' ranks fork from
    one import (tests/forked_launch.py): the launch is not this test's subject."""
    monkeypatch.setattr(benchmark, 'LAUNCHER', FORKED)
    small = 'max_seq_len=64 global_batch_size=2 precision=fp32 model.n_layers=2'
    masked_row = f'masked yamls/demo.yaml {small} data.document_masking=true'
    results, printed = run_benchmark(capsys, tmp_path, 2, '--row', masked_row,
                                     '--row', f'hf hf:yamls/demo.yaml {small}', '--versus', 'masked:hf')
    masked, hf = results['rows']
    assert (masked['name'], masked['model'], masked['document_masking'], masked['gpus']) == ('masked', 'ours', True, 2)
    assert (hf['name'], hf['model'], hf['gpus']) == ('hf', 'hf', 2)
    assert masked['tokens_per_second_per_gpu'] > 0 and masked['mfu'] is None
    assert len(masked['each_step_seconds']) == 2
    assert sum(masked['each_step_seconds']) / 2 == pytest.approx(masked['step_seconds'])
    assert len(masked['losses']) == len(hf['losses']) == 3 and all(loss > 0 for loss in masked['losses'])
    assert results['versus'][0]['ratio'] == masked['tokens_per_second_per_gpu'] / hf['tokens_per_second_per_gpu']
    assert '\nmasked ' in printed
    alone = run_benchmark(capsys, tmp_path, 1, '--row', masked_row)[0]['rows'][0]
    assert masked['losses'] == pytest.approx(alone['losses'], abs=1e-5)


@pytest.mark.parametrize('micro_batch', [2, 4])
def test_the_recorded_loss_is_the_whole_batchs_over_its_micro_batches(micro_batch, tiny_config, tmp_path,
                                                                      launched_alone):
    """fp32: in micro-batches of 2 or 4 the recorded losses are those of the same batches in one micro-batch of 8
    (Composer's ``state.loss`` at a batch's end is the last micro-batch's alone)."""
    from llmfoundry_ext.preflight import prepare
    from llmfoundry_ext.train import train
    from tests.conftest import write_yaml

    def recorded(device_microbatch_size: int) -> list[float]:
        recorder = benchmark.LossRecorder()
        tiny_config.update(max_duration='3ba', device_microbatch_size=device_microbatch_size, loggers={},
                           checkpoint={'save_folder': None, 'autoresume': False}, callbacks={})
        train(prepare(write_yaml(tiny_config, tmp_path / f'run{device_microbatch_size}.yaml')),
              extra_callbacks=[recorder]).close()
        return recorder.values()

    whole = recorded(8)
    assert recorded(micro_batch) == pytest.approx(whole, rel=1e-6) and len(whole) == 3


FAKE_VALIDATING_TORCHTITAN = FAKE_TORCHTITAN + """
open(os.environ['OUT'] + '/validation', 'w').write('''[validation]
enable = false
''' + 'torchrun -m torchtitan.train')
with open(os.environ['OUT'] + f'/tt_{sys.argv[1]}.log', 'a') as log:
    for s in (1, 2, 4):
        print(f'validate step: {s:2}  loss: {5.0 - s / 4:7.4f}  memory: 60.00GiB(75.00%)  tps: 9,000', file=log)
"""


def test_torchtitan_rows_validate_on_the_held_out_documents_named(tmp_path, monkeypatch):
    script = tmp_path / 'run.sh'
    script.write_text(f"python3 - \"$1\" <<'EOF'{FAKE_VALIDATING_TORCHTITAN}EOF\n")
    monkeypatch.setattr(benchmark, 'TORCHTITAN_SCRIPT', str(script))
    row = Row.parse('tt torchtitan:compile FLAVOR=1B LBS=4 HELD_OUT=/work/held-out EVAL_EVERY=2 EVAL_BATCHES=3')
    result = benchmark.run_row('unused', row, 1, 1, 3, str(tmp_path / 'row'), prepare_yaml=None)
    assert result['held_out'] == [[1, 4.75], [2, 4.5], [4, 4.0]]
    assert result['tokens_per_step'] == 4 * 8192
    assert (tmp_path / 'row' / 'validation').read_text() == (  # the script's section, as torchtitan's toml has it
        '[validation]\nenable = true\ndataset = "c4_test"\ndataset_path = "/work/held-out"\nfreq = 2\nsteps = 3\n'
        f'local_batch_size = $LBS\nseq_len = $SEQ\ntorchrun {benchmark.SAME_HELD_OUT}')


def test_torchtitans_validation_restarts_its_dataset_before_each_round():
    """torchtitan v0.2.2's validation dataset keeps its position between rounds (checked against its own dataset
    class on the held-out folder: round 2 read other batches; restarted, round 3 read round 1's, which equal our
    held-out MDS windows token for token); the wrapped validate starts each round at the first document."""
    from types import SimpleNamespace

    from llmfoundry_ext.measure.torchtitan_validation import validating_from_the_start
    dataset = SimpleNamespace(_sample_idx=37, _token_buffer=[5, 6, 7])
    validator = SimpleNamespace(validation_dataloader=SimpleNamespace(dataset=dataset))
    seen = []
    validate = validating_from_the_start(lambda self, parts, step: seen.append(
        (self.validation_dataloader.dataset._sample_idx, list(self.validation_dataloader.dataset._token_buffer), step)))
    validate(validator, [], 100)
    dataset._sample_idx, dataset._token_buffer = 12, [1]
    validate(validator, [], 200)
    assert seen == [(0, [], 100), (0, [], 200)]
