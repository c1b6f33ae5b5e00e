"""The Mixtral model: published parameter count, active-parameter FLOPs, the grouped-GEMM experts and the whole MoE
layer (8 experts top-2, and 64 top-8, the shape most MoE pretraining uses now) against a per-expert loop, and the
load-balancing loss's range."""
import pytest
import torch
import torch.nn.functional as F

from llmfoundry_ext.model.kernels import KernelConfig
from llmfoundry_ext.model.mixtral import (PRESETS, MoE, GroupedExperts, Mixtral, MixtralConfig, aligned_groups,
                                          load_balancing_loss, times_chosen)

TINY = MixtralConfig(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=96, vocab_size=101, n_experts=4,
                     experts_per_token=2, rope_theta=10000.0, rope_scaling_factor=1.0, max_seq_len=128)


def test_mixtral_8x7b_parameter_count_on_meta():
    with torch.device('meta'):
        model = Mixtral(PRESETS['mixtral-8x7b'])
    assert sum(p.numel() for p in model.parameters()) == PRESETS['mixtral-8x7b'].num_params() == 46_702_792_704


def test_flops_count_the_active_parameters():
    """Two of eight experts per token: 12,879,925,248 active parameters (Mistral's "12.9B"), of which all but the
    embedding lookup are in matmuls."""
    config = PRESETS['mixtral-8x7b']
    assert config.num_params(active=True) == 12_879_925_248
    active = config.num_params(include_embedding=False, active=True)
    assert active == 12_879_925_248 - 32000 * 4096
    assert config.flops_per_token(4096) == 6 * active + 12 * 32 * 4096 * 4096


def loop_reference(experts: GroupedExperts, tokens, chosen, weights):
    """Each expert in turn on the tokens routed to it (transformers 4's Mixtral loop)."""
    out = torch.zeros_like(tokens)
    for expert in range(experts.w1.shape[0]):
        token_index, slot = torch.where(chosen == expert)
        x = tokens[token_index]
        hidden = F.silu(x @ experts.w1[expert].T) * (x @ experts.w3[expert].T)
        out = out.index_add(0, token_index, (hidden @ experts.w2[expert].T) * weights[token_index, slot, None])
    return out


def unbalanced_routing(tokens: int, generator) -> torch.Tensor:
    """[tokens, 2] distinct expert ids of 8, drawn from experts 0, 1, 3, 4, 6 with expert 0 the most likely: experts
    2, 5 and 7 get no token."""
    choice = torch.multinomial(torch.tensor([0.5, 0.2, 0.1, 0.1, 0.1]).expand(tokens, 5), 2, generator=generator)
    return torch.tensor([0, 1, 3, 4, 6])[choice]


def grouped_and_loop(device: str, dtype: torch.dtype, group_alignment: int = 1):
    """Output and gradients (tokens, routing weights, w1, w2, w3) of the grouped experts and of the loop."""
    generator = torch.Generator().manual_seed(0)
    config = MixtralConfig(dim=64, ffn_dim=128, n_experts=8, experts_per_token=2, n_layers=2)
    experts = GroupedExperts(config, KernelConfig(), layer_id=0)
    experts.group_alignment = group_alignment
    experts.init_weights()
    experts.to(device=device, dtype=dtype)
    tokens = torch.randn(300, 64, generator=generator).to(device, dtype)
    chosen = unbalanced_routing(300, generator).to(device)
    weights = torch.rand(300, 2, generator=generator).softmax(-1).to(device, dtype)
    results = []
    for run in (experts, lambda tokens, chosen, weights, counts: loop_reference(experts, tokens, chosen, weights)):
        inputs = [tokens.clone().requires_grad_(), weights.clone().requires_grad_()]
        out = run(inputs[0], chosen, inputs[1], times_chosen(chosen, 8))
        parameters = [experts.w1, experts.w2, experts.w3]
        grads = torch.autograd.grad((out.float() ** 2).sum(), inputs + parameters)
        results.append((out, grads))
    counts = chosen.flatten().bincount(minlength=8).tolist()
    assert counts[2] == counts[5] == counts[7] == 0 and counts[0] == max(counts) and min(c for c in counts if c) > 0
    return results


@pytest.mark.parametrize('group_alignment', [1, 16])
def test_grouped_experts_equal_the_loop_in_fp32(group_alignment):
    """Groups as routed, and padded to 16 rows as float8's grouped GEMM takes them (groups of 0 to 244 rows, no
    non-empty one a multiple of 16)."""
    (out, grads), (expected, expected_grads) = grouped_and_loop('cpu', torch.float32, group_alignment)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-6)
    for grad, expected_grad in zip(grads, expected_grads):
        torch.testing.assert_close(grad, expected_grad, rtol=1e-4, atol=1e-5)


def test_aligned_groups_pad_each_experts_rows_with_zeros_to_the_alignment():
    """Groups of 3, 0 and 3 rows, aligned to 4: each group's padding after its rows, 6 + 3 x 3 rows rounded up to 16
    (torchao's float8 weight gradient needs the whole padded token count aligned, not only each group)."""
    padded, slots, ends = aligned_groups(torch.arange(1.0, 7.0).unsqueeze(1), torch.tensor([3.0, 0.0, 3.0]), 4)
    assert slots.tolist() == [0, 1, 2, 4, 5, 6] and ends.tolist() == [4, 4, 8] and ends.dtype == torch.int32
    assert padded.squeeze(1).tolist() == [1, 2, 3, 0, 4, 5, 6, 0] + [0] * 8


def moe_loop_reference(moe: MoE, x: torch.Tensor) -> torch.Tensor:
    """transformers' Mixtral block as a loop: the router's softmax, the top k renormalised, each expert in turn."""
    tokens = x.flatten(0, 1)
    probabilities = F.softmax(tokens @ moe.gate.weight.T, dim=-1, dtype=torch.float)
    weights, chosen = probabilities.topk(moe.top_k, dim=-1)
    return loop_reference(moe.experts, tokens, chosen, weights / weights.sum(-1, keepdim=True)).view_as(x)


@pytest.mark.parametrize('n_experts,top_k', [(8, 2), (64, 8)])
def test_the_moe_layer_equals_a_loop_over_its_experts_with_gradients(n_experts, top_k):
    """Router, permutation, grouped GEMMs and the weighted combine; 384 tokens: at 64 experts top-8, 3,072 routed
    copies, every expert's group non-empty."""
    torch.manual_seed(0)
    moe = MoE(MixtralConfig(dim=64, ffn_dim=32, n_layers=2, n_experts=n_experts, experts_per_token=top_k),
              KernelConfig(), layer_id=0)
    moe.experts.init_weights()
    torch.nn.init.normal_(moe.gate.weight, std=0.5)
    x = torch.randn(4, 96, 64, requires_grad=True)
    out, statistics = moe(x)
    expected = moe_loop_reference(moe, x)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-6)
    parameters = [x, moe.gate.weight, moe.experts.w1, moe.experts.w2, moe.experts.w3]
    grads = torch.autograd.grad((out ** 2).sum(), parameters)
    expected_grads = torch.autograd.grad((expected ** 2).sum(), parameters)
    for grad, expected_grad in zip(grads, expected_grads):
        torch.testing.assert_close(grad, expected_grad, rtol=1e-4, atol=1e-5)
    assert statistics[0].sum().item() == 384 * top_k and statistics[0].min().item() > 0
    torch.testing.assert_close(statistics[1].sum(), torch.tensor(384.0))


@pytest.mark.slow
@pytest.mark.parametrize('n_experts,top_k', [(8, 2), (64, 8)])
def test_experts_split_over_two_ranks_give_the_whole_layers_outputs_and_gradients(tmp_path, n_experts, top_k):
    """2 forked ranks (gloo), half the experts on each; 40 and 57 tokens (uneven all-to-all splits; at 64 experts
    top-8 about 5 copies an expert). Each rank's outputs and input and router gradients are the whole layer's on its
    tokens, and each rank's experts' gradients the whole layer's summed over both ranks' tokens: fp32, to
    rounding."""
    import json
    import os
    import subprocess

    from tests.conftest import FORKED, REPO

    out = tmp_path / 'differences.json'
    subprocess.run([*FORKED, '-n', '2', os.path.join('tests', 'model', 'expert_parallel_worker.py'), str(out),
                    str(n_experts), str(top_k)], cwd=REPO, check=True, timeout=300)
    for rank in json.loads(out.read_text()):
        differences = [rank['output'], rank['input_grad'], rank['router_grad'], rank['expert_grads']]
        assert rank['local_experts'] == n_experts // 2
        assert all(difference <= 1e-5 * scale for difference, scale in zip(differences, rank['scales']))
        assert min(rank['scales']) > 0


def test_grouped_experts_run_fp32_weights_in_autocasts_dtype(monkeypatch):
    """One process keeps fp32 weights under autocast, which has no rule for grouped GEMMs (CUDA's takes bf16
    only): each grouped GEMM gets bf16 operands under a bf16 autocast, fp32 ones without."""
    seen = []
    grouped_mm = F.grouped_mm
    monkeypatch.setattr(F, 'grouped_mm', lambda a, b, offs: seen.append((a.dtype, b.dtype)) or grouped_mm(a, b, offs=offs))
    experts = GroupedExperts(PRESETS['debug'], KernelConfig(), layer_id=0)
    experts.init_weights()
    tokens, chosen = torch.randn(16, 256), torch.randint(0, 8, (16, 2))
    weights = torch.rand(16, 2)
    with torch.autocast('cpu', torch.bfloat16):
        experts(tokens, chosen, weights, times_chosen(chosen, 8))
    experts(tokens, chosen, weights, times_chosen(chosen, 8))
    assert seen == [(torch.bfloat16, torch.bfloat16)] * 3 + [(torch.float32, torch.float32)] * 3


def test_load_balancing_loss_is_top_k_when_balanced_and_grows_with_imbalance():
    """2 layers, 4 experts, 10 tokens, top 2: every expert chosen 5 times at probability 1/4 gives 2 (= k);
    all tokens on two experts whose probability is 1/2 each gives 4."""
    balanced = torch.tensor([[5.0, 5, 5, 5], [2.5, 2.5, 2.5, 2.5]]).expand(2, 2, 4)
    assert load_balancing_loss(balanced, tokens=10).item() == pytest.approx(2.0)
    collapsed = torch.tensor([[10.0, 10, 0, 0], [5, 5, 0, 0]]).expand(2, 2, 4)
    assert load_balancing_loss(collapsed, tokens=10).item() == pytest.approx(4.0)


def test_router_statistics_count_every_routed_token():
    torch.manual_seed(0)
    model = Mixtral(TINY)
    model.init_weights()
    logits, statistics = model(torch.randint(0, 101, (2, 24)))
    assert logits.shape == (2, 24, 101) and statistics.shape == (2, 2, 4)
    assert statistics[:, 0].sum(dim=1).tolist() == [96.0, 96.0]      # 48 tokens x 2 experts, each layer
    torch.testing.assert_close(statistics[:, 1].sum(dim=1), torch.tensor([48.0, 48.0]))  # probabilities sum to 1


def test_experts_sharded_on_their_own_under_bf16_mixed_precision_get_exact_counts(one_process_group, monkeypatch):
    """Expert parallelism shards the experts as an FSDP2 unit of their own, whose mixed precision casts float inputs
    to bf16: counts handed over as floats arrived rounded (2 H200s: split sizes of 32,800 for 32,768 routed rows)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    torch.manual_seed(0)
    config = MixtralConfig(dim=64, n_layers=1, n_heads=4, n_kv_heads=2, ffn_dim=96, vocab_size=101, n_experts=2,
                           experts_per_token=1, rope_theta=10000.0, rope_scaling_factor=1.0, max_seq_len=2048)
    moe = MoE(config, KernelConfig(), layer_id=0)
    moe.experts.init_weights()
    fully_shard(moe.experts, mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16))
    arrived = []
    monkeypatch.setattr(GroupedExperts, 'run_local', lambda self, routed, counts: arrived.append(counts) or routed)
    moe.gate.weight.data = torch.tensor([[1.0] + [0.0] * 63, [0.0] * 64])  # expert 0 where the first feature > 0
    tokens = torch.randn(1, 1025, 64)
    moe(tokens)
    assert arrived[0].tolist() == [int((tokens[0, :, 0] > 0).sum()), int((tokens[0, :, 0] <= 0).sum())]


def test_experts_initialised_with_depth_scaled_down_projection():
    torch.manual_seed(0)
    model = Mixtral(MixtralConfig(dim=256, ffn_dim=512, n_layers=8, n_experts=4, vocab_size=64))
    model.init_weights()
    experts = model.layers[0].mlp.experts
    assert experts.w1.std().item() == pytest.approx(0.02, rel=0.02)
    assert experts.w2.std().item() == pytest.approx(0.02 / 2 ** 0.5, rel=0.02)  # torchtitan: 0.02 / sqrt(2 (0 + 1))
    assert experts.w3.std().item() == pytest.approx(0.02 / 2 ** 0.5, rel=0.02)
    deepest = model.layers[7].mlp.experts
    assert deepest.w2.std().item() == pytest.approx(0.02 / 4, rel=0.02)   # 0.02 / sqrt(2 (7 + 1))


def test_logits_at_places_equal_the_full_logits_there():
    torch.manual_seed(0)
    model = Mixtral(TINY)
    model.init_weights()
    tokens = torch.randint(0, 101, (2, 16))
    rows, positions = torch.tensor([1, 0, 1]), torch.tensor([3, 15, 0])
    picked, statistics = model(tokens, logits_at=(rows, positions))
    logits, full_statistics = model(tokens)
    torch.testing.assert_close(picked, logits[rows, positions], rtol=1e-6, atol=1e-6)
    assert torch.equal(statistics, full_statistics)
