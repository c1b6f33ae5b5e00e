"""On a GPU: the grouped-GEMM experts in bf16 against a per-expert loop, with experts that get no token."""
import pytest
import torch

from tests.model.test_mixtral import grouped_and_loop

pytestmark = pytest.mark.gpu


def relative_error(value: torch.Tensor, reference: torch.Tensor) -> float:
    return ((value.float() - reference.float()).norm() / reference.float().norm()).item()


def test_grouped_experts_equal_the_loop_in_bf16():
    """bf16 tolerance: relative (Frobenius) error under 1% for the output and every gradient; both computed in bf16
    with fp32 accumulation, they differ only in the order of rounding."""
    (out, grads), (expected, expected_grads) = grouped_and_loop('cuda', torch.bfloat16)
    assert out.dtype == torch.bfloat16
    errors = [relative_error(out, expected)] + [relative_error(g, e) for g, e in zip(grads, expected_grads)]
    print('relative errors (out, d tokens, d weights, d w1, d w2, d w3):', [f'{e:.2e}' for e in errors])
    assert max(errors) < 1e-2


# Relative (Frobenius) error of the float8 experts against bf16's: e4m3 keeps 3 mantissa bits, so one operand rounds
# by ~2.6 % RMS and a GEMM of two such operands errs by ~3.7 %; the output passes three GEMMs (w1 and w3, then w2 on
# their product: ~6.5 %) and an expert weight's gradient is one more GEMM of two quantized operands on top of the
# forward's error (~8 %). torchao's own MoE test asks 23 dB (7.1 %) of the weight gradients with a bf16 shared
# expert added to the output. On an H200 at 679a148: 6.6 / 2.4 / 8.2 / 9.1 / 8.3 % (out, d x, d w1, d w2, d w3).
# The floor tells float8 ran at all (bf16 against itself is 0).
FLOAT8_BAND = (1e-2, 1e-1)


@pytest.mark.timeout(300)
def test_float8_experts_run_torchaos_scaled_grouped_gemm_within_float8s_rounding_of_bf16():
    """Mixtral's width, one MoE layer, 8,192 tokens under bf16 autocast: the experts converted to float8
    (model.float8_experts) beside the same layer in bf16; the float8 forward and backward run torch's scaled grouped
    GEMM (rowwise scales), and part from bf16's by float8's rounding (FLOAT8_BAND)."""
    pytest.importorskip('torchao')
    import copy
    import dataclasses

    from llmfoundry_ext.model.kernels import KernelConfig
    from llmfoundry_ext.model.mixtral import PRESETS, MoE
    from llmfoundry_ext.parallelism import FLOAT8_GROUP_ALIGNMENT, convert_experts_to_float8

    torch.manual_seed(0)
    config = dataclasses.replace(PRESETS['mixtral-8x7b'], n_layers=1)
    bf16 = MoE(config, KernelConfig(), layer_id=0).cuda()
    bf16.experts.init_weights()
    torch.nn.init.normal_(bf16.gate.weight, std=config.dim ** -0.5)
    float8 = copy.deepcopy(bf16)
    convert_experts_to_float8(float8)
    assert float8.experts.group_alignment == FLOAT8_GROUP_ALIGNMENT
    assert type(float8.experts.w1.data).__name__ == 'Float8TrainingWeightWrapperTensor'
    x = torch.randn(1, 8192, config.dim, device='cuda')

    def run(moe):
        inputs = x.clone().requires_grad_()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
            with torch.autocast('cuda', torch.bfloat16):
                out, _ = moe(inputs)
            (out.float() ** 2).mean().backward()
        ops = {event.key for event in profile.key_averages()}
        return [out, inputs.grad, *(getattr(moe.experts, name).grad for name in ('w1', 'w2', 'w3'))], ops

    expected, bf16_ops = run(bf16)
    got, float8_ops = run(float8)
    errors = [relative_error(value, reference) for value, reference in zip(got, expected)]
    print('relative errors (out, d x, d w1, d w2, d w3):', [f'{e:.2e}' for e in errors])
    assert 'aten::_scaled_grouped_mm' in float8_ops and 'aten::_scaled_grouped_mm' not in bf16_ops
    assert FLOAT8_BAND[0] < min(errors) and max(errors) < FLOAT8_BAND[1]
