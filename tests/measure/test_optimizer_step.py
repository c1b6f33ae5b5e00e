"""The optimizer benchmark's parameters and table (its timings need a GPU)."""
import json

from llmfoundry_ext.measure.optimizer_step import parameter_shapes, report


def test_the_benchmark_steps_the_yamls_model_parameters():
    shapes = parameter_shapes('yamls/mixtral8x7b.yaml', ['model.n_layers=2'])
    assert sum(shape.numel() for shape in shapes) == 3_164_688_384  # as scripts/plan.py counts Mixtral's 2 layers
    assert (8, 14336, 4096) in shapes and len(shapes) == 23


def test_the_table_and_json_name_each_row(tmp_path, monkeypatch):
    monkeypatch.setattr('torch.cuda.get_device_name', lambda: 'NVIDIA H200')
    rows = [{'row': 'torch fused AdamW', 'ms': 29.73, 'GB/s': 2980.4}, {'row': 'compiled_adamw', 'ms': 20.86,
                                                                         'GB/s': 4247.9}]
    text = report(rows, 3_164_688_384, str(tmp_path / 'o.json'))
    assert text.splitlines()[2:] == ['torch fused AdamW           29.73     2980', 'compiled_adamw              20.86     4248']
    assert json.loads((tmp_path / 'o.json').read_text())['rows'] == rows
