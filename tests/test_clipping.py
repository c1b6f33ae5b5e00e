from types import SimpleNamespace

import pytest
import torch
from composer import algorithms
from composer.core import Event, Precision

from llmfoundry_ext.clipping import GradientClipping


def stepped(algorithm, fused: bool, grad_scale: float, precision=Precision.AMP_BF16, device='cpu'):
    """A linear layer's weights and gradients after one AdamW step clipped to norm 1 (gradients ``grad_scale``
    x the loss's), and whether the optimizer was handed a ``grad_scale``."""
    torch.manual_seed(0)
    model = torch.nn.Linear(16, 8, device=device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1, weight_decay=0.1, fused=fused)
    (model(torch.randn(4, 16, device=device)).square().sum() * grad_scale).backward()
    state = SimpleNamespace(model=model, optimizers=optimizer, precision=precision, fsdp_config_version=2)
    algorithm(clipping_type='norm', clipping_threshold=1.0).apply(Event.AFTER_TRAIN_BATCH, state, None)
    folded = hasattr(optimizer, 'grad_scale')
    optimizer.step()
    return [p.detach().clone() for p in model.parameters()], [p.grad.clone() for p in model.parameters()], folded


@pytest.mark.parametrize('device', ['cpu', pytest.param('cuda', marks=pytest.mark.gpu)])
@pytest.mark.parametrize('grad_scale', [100.0, 1e-4])  # clipped (norm ~ 400), and left alone (norm < 1)
def test_clipping_folded_into_fused_adamw_equals_composers(grad_scale, device):
    weights, grads, folded = stepped(GradientClipping, fused=True, grad_scale=grad_scale, device=device)
    ref_weights, ref_grads, _ = stepped(algorithms.GradientClipping, fused=True, grad_scale=grad_scale,
                                        device=device)
    assert folded
    for ours, ref in zip(weights + grads, ref_weights + ref_grads):
        torch.testing.assert_close(ours, ref, rtol=1e-6, atol=1e-7)
    norm = torch.linalg.vector_norm(torch.stack([g.norm() for g in grads])).item()
    if grad_scale > 1:
        assert norm == pytest.approx(1.0, rel=1e-5)
    else:
        assert norm < 1e-2


@pytest.mark.parametrize('fused, precision', [(False, Precision.AMP_BF16), (True, Precision.AMP_FP16)])
def test_clipping_without_a_fused_optimizer_or_under_fp16_is_composers_to_the_bit(fused, precision):
    weights, _, folded = stepped(GradientClipping, fused=fused, grad_scale=100.0, precision=precision)
    ref_weights, _, _ = stepped(algorithms.GradientClipping, fused=fused, grad_scale=100.0, precision=precision)
    assert not folded
    for ours, ref in zip(weights, ref_weights):
        assert torch.equal(ours, ref)


@pytest.mark.parametrize('fused', [True, False])
def test_the_norm_before_clipping_is_kept_folded_or_not(fused):
    torch.manual_seed(0)
    model = torch.nn.Linear(16, 8)
    (model(torch.randn(4, 16)).square().sum() * 100).backward()
    expected = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in model.parameters()])).item()
    optimizer = torch.optim.AdamW(model.parameters(), fused=fused)
    clipping = GradientClipping(clipping_type='norm', clipping_threshold=1.0)
    clipping.apply(Event.AFTER_TRAIN_BATCH, SimpleNamespace(model=model, optimizers=optimizer,
                                                            precision=Precision.AMP_BF16, fsdp_config_version=2), None)
    assert expected > 100 and clipping.last_norm.item() == pytest.approx(expected, rel=1e-6)
    assert hasattr(optimizer, 'grad_scale') == fused
