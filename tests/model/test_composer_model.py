"""LanguageModel's loss: the compiled cross-entropy (model.compile) gives the eager one's loss and gradients."""
import pytest
import torch

from llmfoundry_ext.model.composer_model import LanguageModel
from llmfoundry_ext.model.llama import LlamaConfig, Transformer

TINY = LlamaConfig(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=128, vocab_size=97, max_seq_len=64,
                   rope_theta=10000.0, rope_scaling_factor=1.0)


def loss_and_grads(compile_loss: bool):
    torch.manual_seed(0)
    model = LanguageModel(Transformer(TINY), compile_loss=compile_loss)
    tokens = torch.randint(0, 97, (2, 32))
    labels = torch.roll(tokens, -1, 1)
    labels[:, -1] = -100
    batch = {'input_ids': tokens, 'labels': labels}
    loss = model.loss(model(batch), batch)
    loss.backward()
    return loss.detach(), {name: p.grad for name, p in model.named_parameters()}


@pytest.mark.slow
def test_compiled_loss_matches_eager():
    expected_loss, expected_grads = loss_and_grads(compile_loss=False)
    loss, grads = loss_and_grads(compile_loss=True)
    torch.testing.assert_close(loss, expected_loss, rtol=1e-6, atol=1e-6)
    for name, grad in expected_grads.items():
        torch.testing.assert_close(grads[name], grad, rtol=1e-5, atol=1e-6, msg=name)
