"""The memory model: its arithmetic on a small config, and its predictions beside the peaks measured on GPUs."""
import dataclasses

import pytest

from llmfoundry_ext.model.llama import PRESETS, LlamaConfig
from llmfoundry_ext.model.mixtral import PRESETS as MIXTRAL
from llmfoundry_ext.machine import GIB
from llmfoundry_ext.plan.memory import Layout, Setting, estimate
from tests.plan import h200_rows

SMALL = LlamaConfig(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=128, vocab_size=256, tie_embeddings=False)
# 106,816 parameters: a block 64 x (2 x 64 + 2 x 32) attention + 3 x 64 x 128 feed-forward + 2 x 64 norms = 36,992;
# embeddings and output 256 x 64 = 16,384 each; the final norm 64. Two GPUs shard it; micro-batch 2 x 32 tokens.
SHARDED = Layout(seq_len=32, shard_ranks=2, sharded=True)


def mixtral(layers: int = 32):
    """Mixtral-8x7B's width with ``layers`` of its blocks."""
    return dataclasses.replace(MIXTRAL['mixtral-8x7b'], n_layers=layers)


def test_without_checkpointing_the_peak_is_the_forward_end():
    peak = estimate(SMALL, Setting(micro_batch=2), SHARDED)
    assert peak.parts == {
        'parameters and optimizer state': 12 * 106_816 // 2,          # 640,896
        'gradients': 0,                                                  # one micro-batch: none during the forward
        'weights for compute': 2 * 2 * 36_992 + 2 * 16_384,             # two blocks gathered, and the output layer
        # a token a block: residual 4 x 64 + 2 x (4 x 64 + 2 x 32 + 3 x 128) + log-sum-exp 4 x 4 = 1,680; 64 tokens,
        # 2 blocks, and the final hidden state 4 x 64
        'activations': 64 * (2 * 1_680 + 4 * 64),
        "loss, the block recomputed first, or the first experts' gradients": 4 * 256 * 64,  # liger's fp32 gradient
    }
    assert (peak.peak, peak.phase) == (1_118_592, 'forward')


def test_full_checkpointing_moves_the_peak_to_the_backward_end():
    peak = estimate(SMALL, Setting(micro_batch=2, checkpointing='full'), SHARDED)
    assert peak.parts == {
        'parameters and optimizer state': 640_896,
        'gradients': 4 * 106_816 // 2,                                   # 213,632
        'largest unit gathered, its gradient unsharded': 6 * 36_992,     # a block: bf16 gathered + fp32 gradient
        'the block recomputed last': 64 * 1_680,                         # its activations, as without checkpointing
    }
    assert (peak.peak, peak.phase) == (1_184_000, 'backward')
    eight_b, layout = PRESETS['8b'], Layout(seq_len=8192, shard_ranks=2, sharded=True)
    assert estimate(eight_b, Setting(1, 'full'), layout).peak < estimate(eight_b, Setting(1), layout).peak


def test_more_micro_batches_a_step_keep_the_gradients_through_the_forward():
    one, several = (estimate(SMALL, Setting(2), Layout(32, 2, True, accumulating=flag)) for flag in (False, True))
    assert several.peak - one.peak == 4 * 106_816 // 2


# Peaks measured on GPUs (torch.cuda.max_memory_allocated, GiB), from benchmarks/results: the model, its settings,
# the layout, the measured peak. The 1B trains on one H100 (autocast), the 8B over two H200s (FSDP2), seq 8192.
ONE_GPU, TWO_GPUS = Layout(8192), Layout(8192, shard_ranks=2, sharded=True)
MEASURED = [
    ('1b', Setting(2), Layout(8192, loss='compiled'), 44.41, 'speed-1b_h100_60e4d3f_lease1.json ours-b2-1'),
    ('1b', Setting(4), Layout(8192, loss='compiled'), 72.14, 'speed-1b_h100_60e4d3f_lease1.json ours-b4-1'),
    ('1b', Setting(2), ONE_GPU, 36.03, 'gpu_bench-1b_h100_1c53079.json ours-b2'),
    ('1b', Setting(4), ONE_GPU, 55.37, 'gpu_bench-1b_h100_1c53079.json ours-b4'),
    ('1b', Setting(4, float8=True), ONE_GPU, 43.70, 'llama1b_h100_options.json ours-best-b4-float8'),
    ('8b', Setting(1), TWO_GPUS, 83.66, 'gpu_bench-8b-none-float8_2xh200.json ours-none'),
    ('8b', Setting(1, reshard_after_forward=False), TWO_GPUS, 97.24,
     'gpu_bench-8b-none-float8_2xh200.json ours-none-keep'),
    ('8b', Setting(1, 'selective'), TWO_GPUS, 63.62, 'gpu_bench-8b_2xh200.json ours-selective'),
    ('8b', Setting(1, 'selective', False), TWO_GPUS, 76.79, 'gpu_bench-8b-all_2xh200_ab6ff06.json ours-selective'),
    ('8b', Setting(1, 'full'), TWO_GPUS, 62.83, 'gpu_bench-8b_2xh200.json ours-full'),
    ('8b', Setting(1, 'full', False), TWO_GPUS, 65.69, 'gpu_bench-8b-all_2xh200_ab6ff06.json ours-full'),
    ('1b', Setting(4, float8=True), Layout(8192, loss='compiled', float8_output=True), 65.4,
     'float8_output/float8-output-gpu0.json shipped-1 (one H200)'),
    ('1b', Setting(4, float8=True), Layout(8192, loss='compiled'), 58.3,
     'float8_output/float8-output-gpu0.json blocks-1 (one H200)'),
    ('8b', Setting(1, float8=True), TWO_GPUS, 77.84, 'gpu_bench-8b-none-float8_2xh200.json ours-float8'),
    ('8b', Setting(1, 'none', False, True), TWO_GPUS, 85.11, 'gpu_bench-8b-none-float8_2xh200.json ours-float8-keep'),
    ('8b', Setting(1, reshard_after_forward=False), Layout(8192, 2, True, loss='compiled'), 99.26,
     'gpu_bench-8b-compiled-ce_2xh200_6bdbe29.json ours-none-compiled-ce'),
]


@pytest.mark.parametrize('preset, setting, layout, measured, source', MEASURED, ids=[m[-1] for m in MEASURED])
def test_the_prediction_is_within_6_percent_of_the_measured_peak(preset, setting, layout, measured, source):
    predicted = estimate(PRESETS[preset], setting, layout).peak / GIB
    assert abs(predicted / measured - 1) < 0.06, f'{predicted:.2f} GiB predicted, {measured} measured ({source})'


@pytest.mark.parametrize('row', h200_rows(), ids=lambda row: row['name'])
def test_the_prediction_is_within_6_percent_of_the_1b_on_one_h200(row):
    """bash benchmarks/gpu.sh plan-1b: 8 samples a step (below 8 a micro-batch: gradients kept through the forward),
    the loss compiled, as llama1b.yaml, its float8 rows with the output layer in bf16 (as before 2998bf0). Measured with the model before the loss and the first recomputed block were
    taken as successive (selective and full then predicted 90.2 and 61.1 GiB: +11.6 %, +9.7 %)."""
    setting = Setting(**row['setting'])
    layout = Layout(8192, accumulating=setting.micro_batch < 8, loss='compiled')
    predicted = estimate(PRESETS['1b'], setting, layout).peak / GIB
    measured = row['peak_allocated_gib']
    assert abs(predicted / measured - 1) < 0.06, f'{predicted:.2f} GiB predicted, {measured:.2f} measured'


def test_experts_split_over_a_group_are_gathered_a_share_at_a_time():
    """Mixtral-8x7B's block: 8 experts of 3 x 4,096 x 14,336 (1,409,286,144 weights) beside 41,984,000 for
    attention, norms and router. Split over 4 ranks, a rank gathers 2 experts (352,321,536), its own unit."""
    arch = mixtral()
    setting = Setting(micro_batch=1)
    whole, split = (estimate(arch, setting, Layout(seq_len=4096, shard_ranks=8, sharded=True, expert_parallel=degree))
                    for degree in (1, 4))
    experts, block = 8 * 3 * 4096 * 14336, arch.block_params()
    assert (experts, block - experts) == (1_409_286_144, 41_984_000)
    gathered = 2 * 2 * (41_984_000 + 352_321_536)  # bf16, the block running and the one prefetched
    assert split.parts['weights for compute'] == gathered + 2 * 32000 * 4096
    assert whole.parts['weights for compute'] - split.parts['weights for compute'] == 2 * 2 * experts * 3 // 4
    unit = 'largest unit gathered, its gradient unsharded'  # the backward's end: the peak under full checkpointing
    ends = [estimate(arch, Setting(micro_batch=1, checkpointing='full'),
                     Layout(seq_len=4096, shard_ranks=8, sharded=True, expert_parallel=degree)) for degree in (1, 4)]
    assert [end.phase for end in ends] == ['backward'] * 2
    assert [end.parts[unit] for end in ends] == [6 * block, 6 * 352_321_536]
    assert whole.parts['parameters and optimizer state'] == split.parts['parameters and optimizer state']


# Mixtral's width with 2 layers, one H200, one process, micro-batch 4 of 4,096 tokens, no checkpointing, liger's loss
# (benchmarks/results/mixtral-float8_h200/float8-mixtral.json): the float8 setting, the measured peak, the row. The
# experts stay bf16 under model.float8 (weights and saved inputs); float8 experts keep bf16 inputs too (torchao).
MIXTRAL_MEASURED = [(False, 52.31, 'bf16'), (True, 51.90, 'float8'), (True, 49.80, 'float8-experts')]


@pytest.mark.parametrize('float8, measured, row', MIXTRAL_MEASURED, ids=[m[-1] for m in MIXTRAL_MEASURED])
def test_mixtral_on_one_h200_is_predicted_within_6_percent(float8, measured, row):
    two_layers = mixtral(2)
    predicted = estimate(two_layers, Setting(4, 'none', False, float8), Layout(4096)).peak / GIB
    assert abs(predicted / measured - 1) < 0.06, f'{predicted:.2f} GiB predicted, {measured} measured ({row})'


# The same at the settings the plan weighs, 4 samples a step (benchmarks/results/mixtral-auto_h200/
# plan-mixtral_9fc54d9.json, bf16), and auto's at 8 and 16 (mixtral-mfu_h200x2/mfu-mixtral_656046c.json): samples a
# step, micro-batch, checkpointing, the measured peak. With checkpointing the backward's end holds the block recomputed
# last beside every gradient (full: 50.97 measured, 47.16 predicted without it); the experts' routed copies are most of
# what grows with the micro-batch (16: 84.51 measured, 77.66 predicted without them).
MIXTRAL_SETTINGS = [(4, 1, 'none', 57.41), (4, 2, 'none', 58.73), (4, 4, 'none', 52.31), (4, 1, 'selective', 54.26),
                    (4, 4, 'selective', 49.03), (4, 4, 'full', 50.97), (8, 8, 'none', 63.04), (16, 16, 'none', 84.51)]


@pytest.mark.parametrize('samples, micro, checkpointing, measured', MIXTRAL_SETTINGS,
                         ids=[f'b{s}-mb{m}-{c}' for s, m, c, _ in MIXTRAL_SETTINGS])
def test_mixtral_on_one_h200_at_the_plans_settings_is_predicted_within_6_percent(samples, micro, checkpointing,
                                                                                  measured):
    two_layers = mixtral(2)
    layout = Layout(4096, accumulating=micro < samples)
    predicted = estimate(two_layers, Setting(micro, checkpointing, False), layout).peak / GIB
    assert abs(predicted / measured - 1) < 0.06, f'{predicted:.2f} GiB predicted, {measured} measured'


# Mixtral's width with 8 layers on two H200s, micro-batch 4 of 4,096 tokens, no checkpointing, the weights kept
# gathered (auto's choice), liger's loss (benchmarks/results/ep-mixtral_h200x2/ep-mixtral.json), and FSDP2 resharded
# after the forward (fsdp-reshard-8layers_9fc54d9.json): the expert-parallel degree, resharding, the measured peak.
# Under expert parallelism the experts' SwiGLU runs eager (without its SiLU output: 106.8 GiB predicted for 120.5,
# -11.4 %).
MIXTRAL_TWO_GPUS = [(1, False, 124.64), (2, False, 120.47), (1, True, 110.26)]


@pytest.mark.parametrize('degree, reshard, measured', MIXTRAL_TWO_GPUS,
                         ids=['fsdp', 'expert-parallel-2', 'fsdp-resharded'])
def test_mixtral_on_two_h200s_is_predicted_within_6_percent(degree, reshard, measured):
    eight_layers = mixtral(8)
    layout = Layout(4096, shard_ranks=2, sharded=True, expert_parallel=degree)
    predicted = estimate(eight_layers, Setting(4, 'none', reshard), layout).peak / GIB
    assert abs(predicted / measured - 1) < 0.06, f'{predicted:.2f} GiB predicted, {measured} measured'


def test_the_first_expert_gemms_gradients_count_at_the_backwards_start():
    """Mixtral-8x7B's block at micro-batch 1 of 4,096 tokens, one process: the experts' down projections' gradient in
    bf16 and fp32 (6 x 8 x 4,096 x 14,336) and its input's (2 x 4,096 tokens x 2 experts x 14,336); under FSDP2
    the bf16 gradient alone; a dense model's none."""
    from llmfoundry_ext.plan.memory import first_expert_gradient_bytes

    arch = mixtral()
    inputs = 2 * 4096 * 2 * 14336
    assert first_expert_gradient_bytes(arch, 4096, Layout(4096)) == 6 * 469_762_048 + inputs
    assert first_expert_gradient_bytes(arch, 4096, Layout(4096, 8, True, expert_parallel=4)) == (
        2 * 469_762_048 // 4 + inputs)
    assert first_expert_gradient_bytes(PRESETS['8b'], 8192, Layout(8192)) == 0
