from llmfoundry_ext.model import fused


def test_liger_older_than_chunk_mem_const_is_one_line(monkeypatch):
    monkeypatch.setattr(fused, 'has_module', lambda name: True)
    monkeypatch.setattr(fused, 'liger_version', lambda: (0, 8, 2))
    assert fused.fused_kernels_problem(['cross_entropy'], on_gpu=True) == (
        'fused kernels need liger-kernel >= 0.8.3 (installed: 0.8.2): pip install -U liger-kernel, '
        'or set model.fused_kernels=[]')
    monkeypatch.setattr(fused, 'liger_version', lambda: (0, 8, 3))
    assert fused.fused_kernels_problem(['cross_entropy'], on_gpu=True) is None
