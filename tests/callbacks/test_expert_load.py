"""ExpertLoad's figures: each expert's share of the routed tokens over all layers, and the busiest expert of any
layer against a balanced share."""
import pytest
import torch

from llmfoundry_ext.callbacks.expert_load import load_metrics


def test_load_metrics_exact():
    chosen = torch.tensor([[3.0, 1.0, 0.0, 0.0],    # layer 0: expert 0 took 3 of 4 routed tokens
                           [2.0, 2.0, 0.0, 0.0]])   # layer 1: experts 0 and 1 half each
    assert load_metrics(chosen) == {'router/load/expert_0': 0.625, 'router/load/expert_1': 0.375,
                                    'router/load/expert_2': 0.0, 'router/load/expert_3': 0.0,
                                    'router/max_load': 3.0}  # 3/4 of layer 0 against a balanced 1/4


def test_load_metrics_balanced():
    metrics = load_metrics(torch.full((3, 8), 5.0))
    assert [metrics[f'router/load/expert_{e}'] for e in range(8)] == [0.125] * 8
    assert metrics['router/max_load'] == pytest.approx(1.0)
