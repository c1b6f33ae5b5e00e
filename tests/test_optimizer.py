import copy
from types import SimpleNamespace

import pytest
import torch
from composer.core import Event, Precision

from llmfoundry_ext.clipping import GradientClipping
from llmfoundry_ext.optimizer import CompiledAdamW

SETTINGS = dict(betas=(0.9, 0.95), eps=1e-8)


def trained(make_optimizer, device: str, steps=range(8), start: tuple | None = None):
    """Two parameter groups (weight decay 0.1 and none) after ``steps`` on gradients drawn from each step's number,
    the lr changed each step and the gradients clipped (folded into ``grad_scale``) on every other one: the
    weights, the state's tensors and the state dict (copies). ``start``: the weights and state dict to resume."""
    torch.manual_seed(0)
    weights = [torch.nn.Parameter(torch.randn(shape, device=device)) for shape in ((64, 32), (8, 4, 16), (32,))]
    optimizer = make_optimizer([{'params': weights[:2], 'weight_decay': 0.1},
                                {'params': weights[2:], 'weight_decay': 0.0}])
    if start is not None:
        with torch.no_grad():
            for weight, saved in zip(weights, start[0]):
                weight.copy_(saved)
        optimizer.load_state_dict(copy.deepcopy(start[1]))
    for step in steps:
        generator = torch.Generator().manual_seed(step)
        for weight in weights:
            weight.grad = (torch.randn(weight.shape, generator=generator) * 10 ** (step % 3)).to(device)
        for group in optimizer.param_groups:
            group['lr'] = 1e-3 * (step + 1)
        optimizer.__dict__.pop('grad_scale', None)
        if step % 2:
            clipping = GradientClipping(clipping_type='norm', clipping_threshold=1.0)
            clipping.apply(Event.AFTER_TRAIN_BATCH, SimpleNamespace(
                model=torch.nn.ParameterList(weights), optimizers=optimizer, precision=Precision.AMP_BF16), None)
            assert optimizer.grad_scale.item() > 1  # folded, and clipping
        optimizer.step()
    state = [optimizer.state[weight][key].clone() for weight in weights for key in ('step', 'exp_avg', 'exp_avg_sq')]
    return [weight.detach().clone() for weight in weights], state, copy.deepcopy(optimizer.state_dict())


def fused(groups):
    return torch.optim.AdamW(groups, fused=True, **SETTINGS)


def compiled(groups):
    return CompiledAdamW(groups, **SETTINGS)


@pytest.mark.parametrize('device', ['cpu', pytest.param('cuda', marks=pytest.mark.gpu)])
def test_compiled_adamw_steps_as_torchs_fused_adamw(device):
    """The same weights and state as torch's fused AdamW after 8 steps of changing lr, weight decay in one group and
    the clip folded in (CPU: the same arithmetic eagerly; GPU: the generated kernels), to fp32 rounding."""
    ours, our_state, _ = trained(compiled, device)
    torchs, torch_state, _ = trained(fused, device)
    for mine, theirs in zip(ours + our_state, torchs + torch_state):
        torch.testing.assert_close(mine, theirs, rtol=2e-6, atol=1e-7)
    assert our_state[0].item() == 8 and our_state[0].device.type == device  # the step count, on the device


@pytest.mark.parametrize('device', ['cpu', pytest.param('cuda', marks=pytest.mark.gpu)])
def test_a_checkpoint_of_torchs_adamw_resumes_in_compiled_adamw_and_back(device):
    """Four steps of one, then its weights and state dict taken up by the other for four more: as eight of torch's."""
    straight = trained(fused, device)[0]
    torchs_four, our_four = trained(fused, device, range(4)), trained(compiled, device, range(4))
    ours_after_torchs = trained(compiled, device, range(4, 8), start=(torchs_four[0], torchs_four[2]))[0]
    torchs_after_ours = trained(fused, device, range(4, 8), start=(our_four[0], our_four[2]))[0]
    for a, b, c in zip(ours_after_torchs, torchs_after_ours, straight):
        torch.testing.assert_close(a, c, rtol=2e-6, atol=1e-7)
        torch.testing.assert_close(b, c, rtol=2e-6, atol=1e-7)
    assert set(our_four[2]['state'][0]) == {'step', 'exp_avg', 'exp_avg_sq'}
