"""Profiling: kernel names fall into the right categories; a CPU profile of the demo model prints its table."""
import json
import os
import subprocess
import sys

import pytest

from llmfoundry_ext.profiling import categorize, category_table
from tests.conftest import REPO


@pytest.mark.parametrize('name, category', [
    ('sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1', 'GEMM'),
    ('nvjet_tst_128x256_64x4_1x2_h_bz_coopA_TNT', 'GEMM'),
    ('cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_3', 'attention'),
    ('void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4>>', 'attention'),
    ('ncclDevKernel_ReduceScatter_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)', 'communication'),
    ('void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float, float, float, at::native::'
     '(anonymous namespace)::LogSoftMaxForwardEpilogue>', 'loss'),
    ('void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>>', 'elementwise'),
    ('void at::native::multi_tensor_apply_kernel<at::native::FusedAdamMathFunctor>', 'optimizer'),
    ('Memcpy DtoD (Device -> Device)', 'memory copies'),
    ('triton_per_fused__to_copy_mean_mul_pow_rsqrt_0', 'normalization'),
    ('triton_poi_fused__unsafe_view_mul_silu_silu_backward_view_0', 'elementwise'),  # compiled, not the optimizer
    ('aten::mm', 'GEMM'),
    ('some_unknown_kernel', 'other'),
])
def test_categorize(name, category):
    assert categorize(name) == category


def test_category_table_shares():
    rows = category_table({'aten::mm': 6.0, 'aten::addmm': 2.0, 'aten::mul': 1.5, 'nccl:all_gather': 0.5})
    assert [(r['category'], r['ms'], r['share']) for r in rows] == [
        ('GEMM', 8.0, 0.8), ('elementwise', 1.5, 0.15), ('communication', 0.5, 0.05)]
    assert rows[0]['top'] == ['aten::mm', 'aten::addmm']


def test_profile_script_on_cpu(tmp_path):
    result = subprocess.run(
        [sys.executable, 'scripts/profile_run.py', 'yamls/demo.yaml', 'global_batch_size=2', 'model.n_layers=2',
         '--warmup', '1', '--steps', '2', '--trace', str(tmp_path / 'trace.json'), '--json', str(tmp_path / 't.json')],
        cwd=REPO, capture_output=True, text=True, env={**os.environ, 'OMP_NUM_THREADS': '1'}, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert 'category          ms/step   share  top kernels' in result.stdout
    table = json.load(open(tmp_path / 't.json'))
    assert table['steps'] == 2 and sum(row['share'] for row in table['rows']) == pytest.approx(1.0)
    assert {'GEMM', 'loss', 'attention', 'elementwise'} <= {row['category'] for row in table['rows']}
    assert all(row['ms'] > 0 for row in table['rows'])
    assert 'traceEvents' in json.load(open(tmp_path / 'trace.json'))
