"""The Llama model: published parameter counts (Llama 2 and 3, as transformers counts them), causality, GQA, and
Llama-3.1 RoPE scaling."""
import math

import pytest
import torch

from llmfoundry_ext.model.attention import attend, choose_backend, document_mask, has_module
from llmfoundry_ext.model.kernels import KernelConfig
from llmfoundry_ext.model.llama import PRESETS, LlamaConfig, Transformer, rope_inverse_frequencies

TINY = LlamaConfig(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=128, vocab_size=97, max_seq_len=64,
                   rope_theta=10000.0, rope_scaling_factor=1.0)


@pytest.mark.parametrize('preset, count', [('1b', 1_235_814_400), ('8b', 8_030_261_248),
                                           ('70b', 70_553_706_496), ('llama2-7b', 6_738_415_616),
                                           ('llama2-13b', 13_015_864_320), ('llama2-70b', 68_976_648_192)])
def test_preset_parameter_counts(preset, count):
    with torch.device('meta'):
        model = Transformer(PRESETS[preset])
    assert PRESETS[preset].num_params() == count
    assert sum(p.numel() for p in model.parameters()) == count


def test_flops_per_token_of_1b_at_8192():
    """Tied output: the embedding lookup is free but the output matmul is not, so all parameters count."""
    assert PRESETS['1b'].flops_per_token(8192) == 6 * 1_235_814_400 + 12 * 16 * 2048 * 8192


def model(config=TINY, seed=0, kernels=KernelConfig()) -> Transformer:
    torch.manual_seed(seed)
    transformer = Transformer(config, kernels)
    transformer.init_weights()
    return transformer


def test_causal_logits_ignore_future_tokens():
    transformer = model()
    tokens = torch.randint(0, 97, (2, 24))
    changed = tokens.clone()
    changed[:, 12] = (changed[:, 12] + 1) % 97
    before, after = transformer(tokens), transformer(changed)
    assert torch.equal(before[:, :12], after[:, :12])
    assert not torch.allclose(before[:, 12:], after[:, 12:])


def test_logits_at_places_equal_the_full_logits_there():
    transformer = model()
    tokens = torch.randint(0, 97, (3, 20))
    rows, positions = torch.tensor([0, 0, 2, 1]), torch.tensor([5, 19, 0, 7])
    picked = transformer(tokens, logits_at=(rows, positions))
    assert picked.shape == (4, 97)
    torch.testing.assert_close(picked, transformer(tokens)[rows, positions], rtol=1e-6, atol=1e-6)


def test_bidirectional_logits_see_future_tokens():
    transformer = model(LlamaConfig(**{**TINY.__dict__, 'causal': False}))
    tokens = torch.randint(0, 97, (1, 16))
    changed = tokens.clone()
    changed[0, 15] = (changed[0, 15] + 1) % 97
    assert not torch.allclose(transformer(tokens)[0, 0], transformer(changed)[0, 0])


def test_sdpa_with_gqa_equals_eager_reference():
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 8, 33, 16), torch.randn(2, 2, 33, 16), torch.randn(2, 2, 33, 16)
    for causal in (True, False):
        torch.testing.assert_close(attend(q, k, v, causal, 'sdpa'), attend(q, k, v, causal, 'eager'),
                                   rtol=1e-5, atol=1e-5)


def test_init_is_seeded_and_depth_scaled():
    first, second = model(seed=3), model(seed=3)
    assert all(torch.equal(a, b) for a, b in zip(first.state_dict().values(), second.state_dict().values()))
    assert torch.equal(first.layers[1].input_layernorm.weight, torch.ones(64))


@pytest.mark.parametrize('scheme, embedding, residual_depths, up_depths', [
    ('torchtitan', 1.0, (1, 2), (1, 2)),   # o, down, up at 0.02 / sqrt(2 (layer + 1))
    ('gpt2', 0.02, (2, 2), None),           # o, down at 0.02 / sqrt(2 layers); up 0.02
])
def test_init_schemes_draw_each_weight_at_its_std(scheme, embedding, residual_depths, up_depths):
    wide = LlamaConfig(**{**TINY.__dict__, 'dim': 256, 'ffn_dim': 1024, 'init_scheme': scheme})
    built = model(wide, seed=0)
    assert built.embed_tokens.weight.std().item() == pytest.approx(embedding, rel=0.03)
    assert built.lm_head.weight.std().item() == pytest.approx(256 ** -0.5, rel=0.03)
    assert built.lm_head.weight.abs().max().item() <= 3 * 256 ** -0.5
    for layer, depth in zip(built.layers, residual_depths):
        residual = 0.02 / math.sqrt(2 * depth)
        assert layer.self_attn.o_proj.weight.std().item() == pytest.approx(residual, rel=0.03)
        assert layer.mlp.down_proj.weight.std().item() == pytest.approx(residual, rel=0.03)
        assert layer.self_attn.q_proj.weight.std().item() == pytest.approx(0.02, rel=0.03)
        assert layer.mlp.gate_proj.weight.std().item() == pytest.approx(0.02, rel=0.03)
    ups = [0.02 / math.sqrt(2 * depth) for depth in up_depths] if up_depths else [0.02] * 2
    assert [layer.mlp.up_proj.weight.std().item() for layer in built.layers] == pytest.approx(ups, rel=0.03)


def test_tied_output_shares_the_embedding():
    tied = model(LlamaConfig(**{**TINY.__dict__, 'tie_embeddings': True}))
    assert tied.lm_head.weight is tied.embed_tokens.weight
    assert sum(p.numel() for p in tied.parameters()) == 97 * 64 + 2 * (64 * (64 + 2 * 32 + 64) + 3 * 64 * 128
                                                                       + 2 * 64) + 64


def test_llama31_rope_scaling_bands():
    """High frequencies unchanged, low ones divided by the factor, the band between interpolated."""
    config = PRESETS['8b']
    scaled, plain = rope_inverse_frequencies(config), rope_inverse_frequencies(
        LlamaConfig(**{**config.__dict__, 'rope_scaling_factor': 1.0}))
    wavelength = 2 * math.pi / plain
    high, low = wavelength < 8192 / 4, wavelength > 8192 / 1
    assert torch.equal(scaled[high], plain[high])
    torch.testing.assert_close(scaled[low], plain[low] / 8)
    middle = ~high & ~low
    assert middle.any() and torch.all(scaled[middle] < plain[middle]) and torch.all(scaled[middle] > plain[middle] / 8)


def test_document_masking_isolates_documents():
    """With position_ids restarting at a boundary, the second document's logits ignore the first document."""
    transformer = model()
    first, second = torch.randint(2, 97, (1, 10)), torch.randint(2, 97, (1, 6))
    packed = torch.cat([first, second], dim=1)
    positions = torch.cat([torch.arange(10), torch.arange(6)]).unsqueeze(0)
    alone = transformer(second)
    torch.testing.assert_close(transformer(packed, positions)[:, 10:], alone, rtol=1e-5, atol=1e-5)
    other_first = torch.randint(2, 97, (1, 10))
    torch.testing.assert_close(transformer(torch.cat([other_first, second], 1), positions)[:, 10:], alone,
                               rtol=1e-5, atol=1e-5)


def test_masked_attention_backends_agree():
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 4, 12, 8), torch.randn(2, 2, 12, 8), torch.randn(2, 2, 12, 8)
    position_ids = torch.tensor([list(range(5)) + list(range(7)), list(range(12))])
    for causal in (True, False):
        torch.testing.assert_close(attend(q, k, v, causal, 'sdpa', document_mask('sdpa', position_ids, causal)),
                                   attend(q, k, v, causal, 'eager', document_mask('eager', position_ids, causal)),
                                   rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize('masking, on_gpu, expected', [
    (False, True, 'sdpa'), (False, False, 'sdpa'), (True, False, 'sdpa'),
    (True, True, 'varlen' if has_module('torch.nn.attention.varlen') else 'flex')])
def test_auto_picks_the_fastest_backend_that_masks_as_asked(masking, on_gpu, expected):
    assert choose_backend('auto', masking, on_gpu) == expected


def test_compiled_blocks_match_eager():
    """torch.compile per block (inductor, here on the CPU) changes no number beyond float rounding."""
    eager = model()
    compiled = model()
    compiled.load_state_dict(eager.state_dict())
    for block in compiled.layers:
        block.compile()
    tokens = torch.randint(0, 97, (2, 16))
    torch.testing.assert_close(compiled(tokens), eager(tokens), rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_flex_block_mask_matches_eager_on_the_cpu():
    """flex_attention (compiled, on the CPU here) with the document block mask: the same numbers as eager."""
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 4, 128, 16), torch.randn(2, 2, 128, 16), torch.randn(2, 2, 128, 16)
    position_ids = torch.stack([torch.cat([torch.arange(50), torch.arange(78)]), torch.arange(128)])
    for causal in (True, False):
        torch.testing.assert_close(attend(q, k, v, causal, 'flex', document_mask('flex', position_ids, causal)),
                                   attend(q, k, v, causal, 'eager', document_mask('eager', position_ids, causal)),
                                   rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_flex_model_matches_eager_model_with_and_without_documents():
    """The model builds flex's block mask once per forward, for packed documents and for plain causal rows.
    Forward only: torch 2.7's inductor cannot compile flex's backward on the CPU (the GPU tests cover it)."""
    eager = model(kernels=KernelConfig(attn_impl='eager'))
    flex = model(kernels=KernelConfig(attn_impl='flex'))
    tokens = torch.randint(0, 97, (2, 64))
    positions = torch.stack([torch.cat([torch.arange(20), torch.arange(44)]), torch.arange(64)])
    with torch.no_grad():
        torch.testing.assert_close(flex(tokens), eager(tokens), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(flex(tokens, positions), eager(tokens, positions), rtol=1e-5, atol=1e-5)
