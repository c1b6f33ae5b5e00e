"""On a GPU: every attention backend, compiled blocks and liger kernels against the eager fp32 reference."""
import pytest
import torch

from llmfoundry_ext.model.attention import BackendUnavailableError, attend, attention_mask, check_backend, has_module
from llmfoundry_ext.model.kernels import KernelConfig
from llmfoundry_ext.model.llama import LlamaConfig, Transformer

pytestmark = pytest.mark.gpu

FP32_BACKENDS = ('sdpa', 'flex')  # varlen and flash (FA-2) take bf16/fp16 only
DOCUMENTS = [[300, 100, 60, 52], [512]]  # lengths per row: short packed documents, and one that fills its row


def positions(lengths_per_row: list[list[int]]) -> torch.Tensor:
    """position_ids [B, S] restarting at each document, as the collator makes them."""
    return torch.stack([torch.cat([torch.arange(n) for n in lengths]) for lengths in lengths_per_row]).cuda()


def run(backend: str, q, k, v, causal: bool, position_ids, sdpa_kernel: str = 'auto'):
    """Output and q/k/v gradients of sum(out * weights) for one backend."""
    q, k, v = (t.detach().clone().requires_grad_() for t in (q, k, v))
    mask = attention_mask(backend, position_ids, causal, q.shape[0], q.shape[2], q.device)
    out = attend(q, k, v, causal, backend, mask, sdpa_kernel)
    weights = torch.linspace(-1, 1, out.numel(), device='cuda').view_as(out)
    (out.float() * weights).sum().backward()
    return out, q.grad, k.grad, v.grad


def backends():
    names = ['sdpa', 'varlen', 'flex', 'flash']
    return [pytest.param(name, marks=pytest.mark.skipif(
        not has_module('flash_attn') if name == 'flash' else False, reason='flash-attn not installed'))
        for name in names]


@pytest.mark.parametrize('dtype', [torch.float32, torch.bfloat16], ids=['fp32', 'bf16'])
@pytest.mark.parametrize('masked', [False, True], ids=['plain', 'documents'])
@pytest.mark.parametrize('causal', [True, False], ids=['causal', 'bidirectional'])
@pytest.mark.parametrize('backend', backends())
def test_backend_matches_eager(backend, causal, masked, dtype):
    if dtype == torch.float32 and backend not in FP32_BACKENDS:
        pytest.skip(f'{backend} takes bf16/fp16 only')
    torch.manual_seed(0)
    q = torch.randn(2, 8, 512, 64, device='cuda', dtype=dtype)
    k, v = (torch.randn(2, 2, 512, 64, device='cuda', dtype=dtype) for _ in range(2))
    ids = positions(DOCUMENTS) if masked else None
    reference = run('eager', q.float(), k.float(), v.float(), causal, ids)
    tolerance = dict(atol=2e-2, rtol=2e-2) if dtype == torch.bfloat16 else dict(atol=2e-4, rtol=2e-4)
    for got, expected in zip(run(backend, q, k, v, causal, ids), reference):
        torch.testing.assert_close(got.float(), expected, **tolerance)


@pytest.mark.parametrize('kernel', ['cudnn', 'flash', 'efficient', 'math'])
def test_pinned_sdpa_kernels_match_eager(kernel):
    torch.manual_seed(0)
    q = torch.randn(1, 8, 1024, 128, device='cuda', dtype=torch.bfloat16)
    k, v = (torch.randn(1, 2, 1024, 128, device='cuda', dtype=torch.bfloat16) for _ in range(2))
    reference = run('eager', q.float(), k.float(), v.float(), True, None)
    for got, expected in zip(run('sdpa', q, k, v, True, None, kernel), reference):
        torch.testing.assert_close(got.float(), expected, atol=2e-2, rtol=2e-2)


def test_missing_flash_attn_is_one_clear_error():
    if has_module('flash_attn'):
        pytest.skip('flash-attn is installed here')
    with pytest.raises(BackendUnavailableError, match=r"^attn_impl 'flash' needs the flash-attn package"):
        check_backend('flash')


TINY = dict(dim=256, n_layers=2, n_heads=8, n_kv_heads=4, ffn_dim=512, vocab_size=1000, max_seq_len=512,
            rope_theta=10000.0, rope_scaling_factor=1.0)


def loss_and_grads(config: LlamaConfig, state: dict, tokens, labels, compile_blocks: bool = False,
                   loss_scale: float = 1.0, kernels: KernelConfig = KernelConfig()):
    """The loss and the parameters' gradients of ``loss * loss_scale`` (Composer scales each micro-batch's loss)."""
    torch.manual_seed(0)
    transformer = Transformer(config, kernels).cuda()
    transformer.load_state_dict(state)
    if compile_blocks:
        for block in transformer.layers:
            block.compile()
    if kernels.fused_loss:
        loss = transformer(tokens, labels=labels)
    else:
        logits = transformer(tokens)
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), labels.flatten())
    (loss * loss_scale).backward()
    return loss.detach(), {name: p.grad for name, p in transformer.named_parameters()}


@pytest.mark.parametrize('fused, compile_blocks, loss_scale', [
    (['cross_entropy'], False, 1.0), (['cross_entropy'], False, 0.25), (['rms_norm'], False, 1.0),
    (['swiglu'], False, 1.0), (['rope'], False, 1.0), (['cross_entropy', 'rms_norm', 'swiglu', 'rope'], False, 1.0),
    ([], True, 1.0)],
    ids=['cross_entropy', 'cross_entropy_scaled', 'rms_norm', 'swiglu', 'rope', 'all_fused', 'compiled'])
def test_fused_kernels_and_compile_match_the_plain_model(fused, compile_blocks, loss_scale):
    """fp32: the loss and every gradient equal the plain model's within float rounding."""
    if fused and not has_module('liger_kernel'):
        pytest.skip('liger-kernel not installed')
    plain = LlamaConfig(**TINY)
    torch.manual_seed(0)
    state = Transformer(plain).state_dict()
    tokens = torch.randint(0, 1000, (2, 512), device='cuda')
    labels = torch.roll(tokens, -1, dims=1)
    expected_loss, expected_grads = loss_and_grads(plain, state, tokens, labels, loss_scale=loss_scale)
    loss, grads = loss_and_grads(plain, state, tokens, labels, compile_blocks, loss_scale,
                                 KernelConfig(fused_kernels=fused))
    torch.testing.assert_close(loss, expected_loss, atol=1e-5, rtol=1e-5)
    for name, grad in expected_grads.items():
        torch.testing.assert_close(grads[name], grad, atol=1e-4, rtol=1e-3, msg=name)


def test_fused_cross_entropy_backward_does_not_wait_for_the_gpu():
    """liger's own backward read its incoming gradient on the host; ours scales it on the GPU (no sync)."""
    if not has_module('liger_kernel'):
        pytest.skip('liger-kernel not installed')
    from llmfoundry_ext.model import fused
    hidden = (torch.randn(2, 512, 256, device='cuda') * 0.1).requires_grad_()
    weight = (torch.randn(1000, 256, device='cuda') * 0.1).requires_grad_()
    labels = torch.randint(0, 1000, (2, 512), device='cuda')
    loss = fused.linear_cross_entropy(hidden, weight, labels) * 0.5
    torch.cuda.set_sync_debug_mode('error')
    try:
        loss.backward()
    finally:
        torch.cuda.set_sync_debug_mode(0)
    plain_hidden, plain_weight = (t.detach().clone().requires_grad_() for t in (hidden, weight))
    expected = torch.nn.functional.cross_entropy((plain_hidden @ plain_weight.T).flatten(0, 1), labels.flatten()) * 0.5
    expected.backward()
    torch.testing.assert_close(loss.detach(), expected.detach(), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(hidden.grad, plain_hidden.grad, atol=1e-5, rtol=1e-3)
    torch.testing.assert_close(weight.grad, plain_weight.grad, atol=1e-5, rtol=1e-3)
