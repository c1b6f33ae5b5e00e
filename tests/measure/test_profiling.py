"""Profiling: kernel names fall into the right categories; a CPU profile of the demo model prints its table; two
Chrome traces compare by category, busy and idle time."""
import gzip
import json
import os
import subprocess
import warnings

import pytest
import torch

from llmfoundry_ext.measure.profiling import (SyncReport, categorize, category_table, compare_traces, read_trace,
                                            reserved_by_stream, top_kernels, write_timeline)
from tests.conftest import FORKED, REPO


@pytest.mark.parametrize('name, category', [
    ('sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1', 'GEMM'),
    ('nvjet_tst_128x256_64x4_1x2_h_bz_coopA_TNT', 'GEMM'),
    ('cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_3', 'attention'),
    ('void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4>>', 'attention'),
    ('ncclDevKernel_ReduceScatter_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)', 'communication'),
    ('triton_poi_fused__unsafe_view_all_gather_into_tensor_cat_clone_transpose_view_3', 'memory copies'),
    ('void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float, float, float, at::native::'
     '(anonymous namespace)::LogSoftMaxForwardEpilogue>', 'loss'),
    ('void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>>', 'elementwise'),
    ('void at::native::multi_tensor_apply_kernel<at::native::FusedAdamMathFunctor>', 'optimizer'),
    ('Memcpy DtoD (Device -> Device)', 'memory copies'),
    ('triton_per_fused__to_copy_mean_mul_pow_rsqrt_0', 'normalization'),
    ('triton_poi_fused__unsafe_view_mul_silu_silu_backward_view_0', 'elementwise'),  # compiled, not the optimizer
    ('aten::mm', 'GEMM'),
    ('void cutlass::device_kernel<at::cuda::detail::enable_3x_kernel_for_sm9x<cutlass::gemm::kernel::GemmUniversal<'
     'cutlass::gemm::GroupProblemShape<cute::tuple<int, int, int>>', 'grouped GEMM'),
    ('void at_cuda_detail::cub::DeviceRadixSortOnesweepKernel<at_cuda_detail::cub::DeviceRadixSortPolicy<long>',
     'sort, index'),
    ('void at::native::sbtopk::gatherTopK<float, unsigned int, 2, false>', 'sort, index'),
    ('void at::native::index_elementwise_kernel<128, 4, at::native::gpu_index_kernel<at::native::index_kernel_impl',
     'sort, index'),
    ('void at::native::indexFuncLargeIndex<c10::BFloat16, long, unsigned int, 2, 2, -2, true>', 'sort, index'),
    ('void at::cuda::kernelHistogram1D<float, float, long, 1, 2, -1, (at::cuda::CUDAHistogramMemoryType)0>',
     'sort, index'),
    ('ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)', 'communication'),  # expert parallelism's all-to-all
    ('some_unknown_kernel', 'other'),
])
def test_categorize(name, category):
    assert categorize(name) == category


def test_category_table_shares():
    rows = category_table({'aten::mm': 6.0, 'aten::addmm': 2.0, 'aten::mul': 1.5, 'nccl:all_gather': 0.5})
    assert [(r['category'], r['ms'], r['share']) for r in rows] == [
        ('GEMM', 8.0, 0.8), ('elementwise', 1.5, 0.15), ('communication', 0.5, 0.05)]
    assert rows[0]['top'] == ['aten::mm', 'aten::addmm']


@pytest.mark.slow
def test_profile_script_on_two_cpu_processes(tmp_path):
    """Both ranks train on the one synthetic data folder (streaming refuses a folder per rank); rank 0 reports,
    each rank writes its trace."""
    result = subprocess.run(
        [*FORKED, '-n', '2', 'scripts/profile_run.py', 'yamls/demo.yaml', 'global_batch_size=4', 'model.n_layers=2',
         '--warmup', '1', '--steps', '2', '--trace', str(tmp_path / 'trace.json'), '--json', str(tmp_path / 't.json')],
        cwd=REPO, capture_output=True, text=True, env={**os.environ, 'OMP_NUM_THREADS': '1'}, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.count('category          ms/step   share  top kernels') == 1
    table = json.load(open(tmp_path / 't.json'))
    assert table['steps'] == 2 and sum(row['share'] for row in table['rows']) == pytest.approx(1.0)
    assert {'GEMM', 'loss', 'attention', 'elementwise'} <= {row['category'] for row in table['rows']}
    assert all(row['ms'] > 0 for row in table['rows'])
    steps = sorted(e['name'] for e in json.load(open(tmp_path / 'trace.json'))['traceEvents']
                   if e['name'].startswith('ProfilerStep#'))
    assert steps == ['ProfilerStep#1', 'ProfilerStep#2']
    rank1 = json.load(open(tmp_path / 'trace.rank1.json'))['traceEvents']
    assert sorted(e['name'] for e in rank1 if e['name'].startswith('ProfilerStep#')) == steps


@pytest.mark.slow
def test_profile_script_profiles_transformers_model_with_python_frames(tmp_path):
    """--model hf trains transformers' LlamaForCausalLM of the YAML's shape (unsharded: one process); --python
    records the modules' frames, which name it."""
    trace = tmp_path / 'trace.json'
    result = subprocess.run(
        [*FORKED, '-n', '1', 'scripts/profile_run.py', 'yamls/demo.yaml', 'global_batch_size=2', 'model.n_layers=2',
         '--warmup', '1', '--steps', '1', '--trace', str(trace), '--python', '--model', 'hf'],
        cwd=REPO, capture_output=True, text=True, env={**os.environ, 'OMP_NUM_THREADS': '1'}, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert f'yamls/demo.yaml (hf): 1 profiled steps after 1 warm-up; trace in {trace}' in result.stdout
    modules = {e['name'] for e in json.load(open(trace))['traceEvents'] if e['name'].startswith('nn.Module: ')}
    assert {'nn.Module: LlamaForCausalLM_0', 'nn.Module: LlamaDecoderLayer_0',
            'nn.Module: LlamaDecoderLayer_1'} <= modules
    assert not any('Transformer' in name or 'LanguageModel' in name for name in modules)


def write_trace(path, steps: int, kernels: list[tuple[str, str, float, float]]) -> str:
    """A Chrome trace of ``steps`` ProfilerStep ranges and GPU events (category, name, start us, duration us)."""
    events = [{'ph': 'X', 'cat': 'user_annotation', 'name': f'ProfilerStep#{n}', 'ts': 0, 'dur': 1} for n in range(steps)]
    events += [{'ph': 'X', 'cat': cat, 'name': name, 'ts': ts, 'dur': dur} for cat, name, ts, dur in kernels]
    events.append({'ph': 'X', 'cat': 'cpu_op', 'name': 'aten::mm', 'ts': 0, 'dur': 99000})  # CPU: not counted
    path.write_text(json.dumps({'traceEvents': events}))
    return str(path)


def test_read_trace_counts_overlapping_streams_once(tmp_path):
    trace = write_trace(tmp_path / 't.json', 2, [
        ('kernel', 'nvjet_gemm', 1000, 3000), ('kernel', 'ncclDevKernel_AllGather', 2000, 4000),  # overlap 2000
        ('gpu_memcpy', 'Memcpy HtoD', 8000, 1000), ('kernel', 'nvjet_gemm', 10000, 2000)])
    summary = read_trace(trace)
    assert summary.kernels == {'nvjet_gemm': 5.0, 'ncclDevKernel_AllGather': 4.0, 'Memcpy HtoD': 1.0}
    assert summary.device_events == [('nvjet_gemm', None, 1000, 3000), ('ncclDevKernel_AllGather', None, 2000, 4000),
                                     ('Memcpy HtoD', None, 8000, 1000), ('nvjet_gemm', None, 10000, 2000)]
    assert (summary.busy_ms, summary.span_ms, summary.steps) == (8.0, 11.0, 2)
    assert summary.gaps == [
        {'ms': 2.0, 'after': 'ncclDevKernel_AllGather', 'before': 'Memcpy HtoD', 'launched_in': '', 'host_work': ''},
        {'ms': 1.0, 'after': 'Memcpy HtoD', 'before': 'nvjet_gemm', 'launched_in': '', 'host_work': ''}]


def test_read_trace_names_the_cpu_code_that_ended_each_idle_stretch_and_what_the_host_did_in_it(tmp_path):
    """The idle stretch is [1000, 3500] us. On the launching thread (1), the innermost range around all of it is
    named (fsdp::chunk_cat, not the step range around that); then the ranges that began or ended in it and overlap
    it by over 0.1 ms, longest overlap first; not thread 2's, not a 50 us call."""
    cpu = [('user_annotation', 'Optimizer.step#AdamW.step', 3000, 1000, 1),
           ('cpu_op', 'fsdp::chunk_cat', 900, 2700, 1),
           ('cpu_op', 'aten::_fused_adamw_', 3300, 200, 1), ('cpu_op', 'aten::mm', 3000, 1000, 2),
           ('cuda_runtime', 'cudaLaunchKernel', 3400, 10, 1), ('cuda_runtime', 'cudaStreamSynchronize', 500, 900, 1),
           ('cpu_op', 'aten::empty', 2100, 600, 1), ('cuda_runtime', 'cudaFree', 2800, 50, 1),
           ('cuda_runtime', 'cudaMalloc', 1000, 2000, 2)]
    events = [{'ph': 'X', 'cat': 'user_annotation', 'name': 'ProfilerStep#0', 'ts': 0, 'dur': 9000, 'tid': 1}]
    events += [{'ph': 'X', 'cat': cat, 'name': name, 'ts': ts, 'dur': dur, 'tid': tid,
                'args': {'correlation': 7 if name == 'cudaLaunchKernel' else 100 + i}}
               for i, (cat, name, ts, dur, tid) in enumerate(cpu)]
    events += [{'ph': 'X', 'cat': 'kernel', 'name': 'norm', 'ts': 0, 'dur': 1000, 'args': {'correlation': 6}},
               {'ph': 'X', 'cat': 'kernel', 'name': 'adam', 'ts': 3500, 'dur': 100, 'args': {'correlation': 7}}]
    (tmp_path / 't.json').write_text(json.dumps({'traceEvents': events}))
    assert read_trace(str(tmp_path / 't.json')).gaps == [{
        'ms': 2.5, 'after': 'norm', 'before': 'adam',
        'launched_in': 'fsdp::chunk_cat > Optimizer.step#AdamW.step > aten::_fused_adamw_',
        'host_work': 'all of it in fsdp::chunk_cat, aten::empty 0.60 ms, Optimizer.step#AdamW.step 0.50 ms, '
                     'cudaStreamSynchronize 0.40 ms, aten::_fused_adamw_ 0.20 ms'}]


def test_compare_traces_per_step(tmp_path):
    ours = read_trace(write_trace(tmp_path / 'a.json', 2, [('kernel', 'nvjet_gemm', 0, 6000),
                                                           ('kernel', 'flash_fwd', 7000, 2000)]))
    theirs = read_trace(write_trace(tmp_path / 'b.json', 1, [('kernel', 'nvjet_gemm', 0, 2000),
                                                             ('kernel', 'triton_red_fused_rsqrt', 2000, 1000)]))
    assert compare_traces({'ours': ours, 'titan': theirs}) == [
        {'category': 'GEMM', 'ours': 3.0, 'titan': 2.0}, {'category': 'attention', 'ours': 1.0, 'titan': 0.0},
        {'category': 'normalization', 'ours': 0.0, 'titan': 1.0}, {'category': 'GPU busy', 'ours': 4.0, 'titan': 3.0},
        {'category': 'GPU idle', 'ours': 0.5, 'titan': 0.0}, {'category': 'span', 'ours': 4.5, 'titan': 3.0}]
    assert top_kernels(ours, 1) == [{'kernel': 'nvjet_gemm', 'category': 'GEMM', 'ms': 3.0, 'calls': 0.5}]


def test_write_timeline_keeps_each_gpu_event_with_its_stream_in_start_order(tmp_path):
    events = [{'ph': 'X', 'cat': 'user_annotation', 'name': 'ProfilerStep#0', 'ts': 0, 'dur': 9000},
              {'ph': 'X', 'cat': 'kernel', 'name': 'ncclDevKernel_SendRecv', 'ts': 500, 'dur': 80, 'tid': 'stream 9',
               'args': {'stream': 9}},
              {'ph': 'X', 'cat': 'kernel', 'name': 'nvjet_gemm', 'ts': 100, 'dur': 300, 'args': {'stream': 7}},
              {'ph': 'X', 'cat': 'cpu_op', 'name': 'aten::mm', 'ts': 90, 'dur': 20},
              {'ph': 'X', 'cat': 'kernel', 'name': 'nvjet_gemm', 'ts': 600, 'dur': 50.5, 'args': {'stream': 7}}]
    (tmp_path / 't.json').write_text(json.dumps({'traceEvents': events}))
    write_timeline(read_trace(str(tmp_path / 't.json')), str(tmp_path / 't.timeline.json.gz'))
    with gzip.open(tmp_path / 't.timeline.json.gz', 'rt') as file:
        assert json.load(file) == {'names': ['ncclDevKernel_SendRecv', 'nvjet_gemm'],
                                   'events': [[1, 7, 100, 300], [0, 9, 500, 80], [1, 7, 600, 50.5]]}


def test_compare_profiles_script(tmp_path, capsys):
    from scripts.compare_profiles import main
    ours = write_trace(tmp_path / 'a.json', 1, [('kernel', 'nvjet_gemm', 0, 3000)])
    assert main([f'ours={ours}', f'titan={ours}', '--json', str(tmp_path / 'c.json')]) == 0
    assert capsys.readouterr().out.splitlines()[:2] == ['ms per step              ours         titan  difference',
                                                        'GEMM                     3.00          3.00       +0.00']
    assert json.load(open(tmp_path / 'c.json'))['steps'] == {'ours': 1, 'titan': 1}
    assert main([f'ours={ours}', '--kernels', '1']) == 0
    assert capsys.readouterr().out.splitlines()[-2:] == ['ours: top 1 kernels, ms and calls per step',
                                                         '     3.00       1  GEMM           nvjet_gemm']
    assert main([f'ours={ours}', '--timelines', str(tmp_path / 'lines')]) == 0
    assert os.listdir(tmp_path / 'lines') == ['ours.timeline.json.gz']
    other = write_trace(tmp_path / 'b.json', 1, [('kernel', 'flash_fwd', 0, 1000)])
    assert main([str(ours), str(other), '--timelines', str(tmp_path / 'unnamed')]) == 0
    assert sorted(os.listdir(tmp_path / 'unnamed')) == ['a.timeline.json.gz', 'b.timeline.json.gz']
    gapped = write_trace(tmp_path / 'g.json', 1, [('kernel', 'nvjet_gemm', 0, 1000),
                                                  ('kernel', 'flash_fwd', 3500, 10)])
    assert main([f'ours={gapped}', '--gaps', '1']) == 0
    assert capsys.readouterr().out.splitlines()[-2:] == ['ours: 1 longest idle stretches of 1 steps, ms',
                                                         '     2.50  after nvjet_gemm  before flash_fwd']
    bare = tmp_path / 'bare.json'
    bare.write_text(json.dumps({'traceEvents': [{'ph': 'X', 'cat': 'kernel', 'name': 'k', 'ts': 0, 'dur': 1}]}))
    assert main([f'x={bare}']) == 2
    assert capsys.readouterr().err.strip() == (f'error: {bare} has no ProfilerStep#N ranges: profile it with '
                                               "scripts/profile_run.py or torchtitan's profiler")
    assert main([f'ours={tmp_path / "absent.json"}']) == 2
    assert capsys.readouterr().err.strip() == (f'error: {tmp_path / "absent.json"}: no such trace; did its profiling '
                                               'run fail? (its log says why)')


def item_on_the_host():
    warnings.warn('called a synchronizing CUDA operation')  # what torch's sync debug mode says


def fetch_the_next_batch():
    warnings.warn('called a synchronizing CUDA operation')  # Composer's loader check: after a batch's end


@pytest.mark.filterwarnings('ignore:called a synchronizing')
def test_sync_report_counts_each_call_site_from_its_batchs_start_to_the_next(monkeypatch):
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: True)

    def set_sync_debug_mode(mode):  # turning the mode on warns too: not a sync of the batch
        warnings.warn('called a synchronizing CUDA operation')

    monkeypatch.setattr(torch.cuda, 'set_sync_debug_mode', set_sync_debug_mode)
    report = SyncReport(batch=1)
    for _ in range(3):
        fetch_the_next_batch()
        report.batch_start(None, None)
        for _ in range(2):
            item_on_the_host()
        report.batch_end(None, None)
    report.fit_end(None, None)
    lines = report.report().splitlines()
    assert lines[0] == 'host syncs in batch 1: 3'
    assert len(lines) == 3 and lines[1].startswith('   2x  item_on_the_host (test_profiling.py:')
    assert lines[2].startswith('   1x  fetch_the_next_batch (test_profiling.py:')
    assert ' < test_sync_report_counts_each_call_site_from_its_batchs_start_to_the_next (test_profiling.py:' in lines[1]


def test_line_up_ranks_shows_which_rank_waited_at_which_collective(tmp_path, capsys):
    """Rank 0's SendRecv lasts 50 ms (waiting for rank 1, whose GEMM ran before its SendRecv), rank 1's 1 ms; the
    window around rank 0's first SendRecv interleaves both ranks' kernels on their common clock."""
    from scripts.line_up_ranks import main

    def timeline(name, kernels):
        events = [{'ph': 'X', 'cat': 'user_annotation', 'name': 'ProfilerStep#0', 'ts': 0, 'dur': 1}]
        events += [{'ph': 'X', 'cat': 'kernel', 'name': kernel, 'ts': ts, 'dur': dur, 'args': {'stream': stream}}
                   for kernel, stream, ts, dur in kernels]
        (tmp_path / f'{name}.json').write_text(json.dumps({'traceEvents': events}))
        write_timeline(read_trace(str(tmp_path / f'{name}.json')), str(tmp_path / f'{name}.gz'))
        return f'{name}={tmp_path / name}.gz'

    rank0 = timeline('rank0', [('flash_bwd', 7, 1000, 100_000), ('ncclDevKernel_SendRecv', 17, 101_000, 50_000),
                               ('ncclDevKernel_SendRecv', 17, 160_000, 1000)])
    rank1 = timeline('rank1', [('flash_bwd', 7, 2000, 100_000), ('nvjet_gemm', 7, 102_000, 48_000),
                               ('ncclDevKernel_SendRecv', 17, 150_000, 1000),
                               ('ncclDevKernel_SendRecv', 17, 160_000, 1000)])
    assert main([rank0, rank1, '--around', 'SendRecv', '--before', '1', '--after', '50']) == 0
    assert capsys.readouterr().out.splitlines() == [
        'rank0: communication kernels per stream      calls   total ms  median ms     max ms',
        '  stream 17   ncclDevKernel_SendRecv              2       51.0      25.50      50.00',
        'rank1: communication kernels per stream      calls   total ms  median ms     max ms',
        '  stream 17   ncclDevKernel_SendRecv              2        2.0       1.00       1.00',
        '            stream    start ms       ms  kernel',
        'rank0           17       100.0    50.00  ncclDevKernel_SendRecv',
        'rank1            7       101.0    48.00  nvjet_gemm',
        'rank1           17       149.0     1.00  ncclDevKernel_SendRecv']


def test_the_reserve_is_summed_by_the_stream_each_segment_serves(monkeypatch):
    """Three segments on two streams: the default stream's two summed, the side stream's cache apart, largest first."""
    gib = 2 ** 30
    segments = [{'stream': 0, 'total_size': 100 * gib, 'allocated_size': 90 * gib},
                {'stream': 94, 'total_size': 17 * gib, 'allocated_size': 0},
                {'stream': 0, 'total_size': 10 * gib, 'allocated_size': 2 * gib}]
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: True)
    monkeypatch.setattr(torch.cuda.memory, '_snapshot', lambda: {'segments': segments})
    assert reserved_by_stream() == [(0, 110 * gib, 92 * gib), (94, 17 * gib, 0)]
