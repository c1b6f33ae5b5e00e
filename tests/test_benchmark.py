"""The throughput benchmark: row parsing, the table, the synthetic documents, and one real row on the CPU."""
import json
import subprocess
import sys

import numpy as np

from llmfoundry_ext.benchmark import Row, format_table
from llmfoundry_ext.profiling import random_windows
from tests.conftest import REPO


def test_rows_parse_with_shell_quoting_and_hf_names():
    assert Row.parse("hf yamls/a.yaml global_batch_size=2 'model.fused_kernels=[rope]'") == Row(
        'hf', 'yamls/a.yaml', ['global_batch_size=2', 'model.fused_kernels=[rope]'], 'hf')
    assert Row.parse('hf:b1 yamls/a.yaml').model == 'hf'
    assert Row.parse('ours-hf yamls/a.yaml').model == 'ours'


def test_table_gives_each_row_against_the_baseline():
    common = {'step_seconds': 0.5, 'peak_memory_gib': 40.0}
    results = [{'name': 'hf', 'tokens_per_second_per_gpu': 20000.0, 'mfu': 0.25, **common},
               {'name': 'ours', 'tokens_per_second_per_gpu': 50000.0, 'mfu': 0.625, **common},
               {'name': 'broken', 'error': 'exit status 1'}]
    assert format_table(results, 'hf').splitlines() == [
        'run                           tok/s/GPU    MFU  step s  peak GiB  vs base',
        'hf                               20,000  25.0%   0.500      40.0    1.00x',
        'ours                             50,000  62.5%   0.500      40.0    2.50x',
        'broken                        failed: exit status 1']


def test_synthetic_documents_have_the_asked_mean_length_and_no_stray_eos():
    plain = list(random_windows(4, 4096, 1000, 999, 0))
    assert all(not (w == 999).any() and w.max() < 1000 for w in plain)
    windows = np.concatenate(list(random_windows(4, 4096, 1000, 999, 128)))
    assert abs(len(windows) / (windows == 999).sum() - 128) < 128 * 0.15
    again = np.concatenate(list(random_windows(4, 4096, 1000, 999, 128)))
    assert np.array_equal(windows, again)


def test_one_row_runs_on_the_cpu_and_writes_json(tmp_path):
    out = tmp_path / 'bench.json'
    run = subprocess.run(
        [sys.executable, 'scripts/benchmark.py', '--warmup', '2', '--steps', '2', '--mean-document-tokens', '16',
         '--json', str(out), '--row',
         'masked yamls/demo.yaml max_seq_len=64 global_batch_size=2 precision=fp32 data.document_masking=true'],
        cwd=REPO, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    (row,) = json.loads(out.read_text())['rows']
    assert row['name'] == 'masked' and row['document_masking'] is True and row['tokens_per_second_per_gpu'] > 0
    assert row['step_seconds'] > 0 and row['gpus'] == 1 and row['mfu'] is None
    assert '\nmasked ' in run.stdout
