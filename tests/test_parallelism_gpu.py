"""On a GPU in bf16 as Composer's amp_bf16 runs it (FSDP2 with bf16 parameters and fp32 gradient reduction, under
autocast): each activation-checkpointing mode, eager and compiled, gives the loss and gradients of the model without
checkpointing (Llama-3.1-8B width, 2 layers, one 8,192-token sequence: the setting that stopped with a
CheckpointError when Composer's wrapper did the checkpointing). The shipped-YAML tests run these through Composer."""
import dataclasses
import gc

import pytest
import torch

from llmfoundry_ext.model.llama import PRESETS, Transformer
from tests.test_parallelism import run_config, run_context_parallel_worker, sharded_as_composer_does

pytestmark = pytest.mark.gpu

SEQUENCE = 8192
LOSS_TOLERANCE = 5e-3      # absolute, on a loss of about 12.3
GRADIENT_TOLERANCE = 2e-2  # |g - g_ref| / |g_ref| over all gradients together (bf16 operands: 1e-3 .. 1e-2)
TENSOR_TOLERANCE = 5e-2    # the same for each tensor alone
WIDTH_8B = dataclasses.replace(PRESETS['8b'], n_layers=2)


def loss_and_grads(tiny_config, tmp_path, mode: str, compile_blocks: bool):
    config = run_config(tiny_config, tmp_path, mode, compile_blocks=compile_blocks)
    torch.manual_seed(0)
    with torch.device('cuda'):
        transformer = sharded_as_composer_does(Transformer(WIDTH_8B), config)
    tokens = torch.randint(0, WIDTH_8B.vocab_size, (1, SEQUENCE + 1), device='cuda',
                           generator=torch.Generator('cuda').manual_seed(1))
    with torch.autocast('cuda', torch.bfloat16):
        logits = transformer(tokens[:, :-1])
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), tokens[0, 1:])
    loss.backward()
    grads = {name: p.grad.full_tensor().float() for name, p in transformer.named_parameters()}
    del transformer, logits
    gc.collect()
    torch._dynamo.reset()
    torch.cuda.empty_cache()
    return loss.item(), grads


@pytest.mark.timeout(900)
@pytest.mark.parametrize('mode, compile_blocks', [
    ('none', True), ('full', False), ('full', True), ('selective', False), ('selective', True),
    ('full_except_attention', False), ('full_except_attention', True)])
def test_checkpointing_modes_match_the_model_without_checkpointing(one_process_group, tiny_config, tmp_path, mode,
                                                                   compile_blocks):
    expected_loss, expected = loss_and_grads(tiny_config, tmp_path, 'none', False)
    loss, grads = loss_and_grads(tiny_config, tmp_path, mode, compile_blocks)
    difference = sum((grads[name] - grad).norm() ** 2 for name, grad in expected.items()) ** 0.5
    overall = (difference / sum(grad.norm() ** 2 for grad in expected.values()) ** 0.5).item()
    per_tensor = {name: ((grads[name] - grad).norm() / grad.norm()).item() for name, grad in expected.items()}
    worst = max(per_tensor, key=per_tensor.get)
    print(f'{mode} compile={compile_blocks}: loss {loss:.6f} vs {expected_loss:.6f}; gradients {overall:.2e} '
          f'overall, worst {worst} {per_tensor[worst]:.2e}')
    assert abs(loss - expected_loss) < LOSS_TOLERANCE
    assert overall < GRADIENT_TOLERANCE
    assert per_tensor[worst] < TENSOR_TOLERANCE, worst


CONTEXT_PARALLEL_SEQUENCE = 16384
# |loss - whole| absolute (loss about 7.1) and the gradients' overall relative difference. fp32 flex differs only in
# summation order (2x H200: 5e-7 and 7.6e-7); bf16 (cuDNN / flash SDPA in the ring, or flex, eager or compiled
# blocks, as training runs) by rounding (2x H200: 5e-6 and 2.5e-3 each). The fp32 flex case runs eager flex's
# unfused path, which holds each head's whole score matrix: at 16,384 tokens its whole-sequence half alone took 224 s
# (2x H200, 7579c4b; the other cases 3-25 s in all), so it runs a quarter of the sequence (its documents still cross
# the ranks' chunks): 90 s in all, 4.8e-7 and 4.6e-7 (2x H200, 02c6197).
CONTEXT_PARALLEL_TOLERANCES = {False: (1e-4, 1e-4), True: (5e-3, 1e-2)}


@pytest.mark.timeout(900)
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason='needs 2 GPUs')
@pytest.mark.parametrize('backend, documents, bf16, compile_blocks, sequence', [
    ('flex', True, False, False, CONTEXT_PARALLEL_SEQUENCE // 4),
    ('sdpa', False, True, False, CONTEXT_PARALLEL_SEQUENCE),
    ('sdpa', False, True, True, CONTEXT_PARALLEL_SEQUENCE),
    ('flex', True, True, True, CONTEXT_PARALLEL_SEQUENCE)],
    ids=['documents-flex-fp32', 'causal-sdpa-bf16', 'causal-sdpa-bf16-compiled', 'documents-flex-bf16-compiled'])
def test_context_parallel_2_gives_the_losses_and_gradients_of_the_whole_sequence(tmp_path, backend, documents,
                                                                                  bf16, compile_blocks, sequence):
    args = ['--backend', backend, '--seq', str(sequence)]
    args += ['--documents'] * documents + ['--bf16'] * bf16 + ['--compile'] * compile_blocks
    result = run_context_parallel_worker(tmp_path, *args)
    print(f'context parallel 2, {sequence} tokens, {backend}, documents {documents}, bf16 {bf16}, '
          f'compiled {compile_blocks}: {result}')
    loss_tolerance, gradient_tolerance = CONTEXT_PARALLEL_TOLERANCES[bf16]
    assert abs(result['loss'] - result['expected_loss']) < loss_tolerance
    assert result['gradient_difference'] < gradient_tolerance


@pytest.mark.timeout(900)
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason='needs 2 GPUs')
@pytest.mark.parametrize('mode, compile_blocks, recomputed_attentions', [
    ('full', False, 2), ('full_except_attention', False, 0), ('full_except_attention', True, None)])
def test_full_except_attention_under_context_parallel_2_keeps_the_ring_out_of_the_recomputation(
        tmp_path, mode, compile_blocks, recomputed_attentions):
    """Causal ring SDPA in bf16 over 2 GPUs with the split model's 2 blocks checkpointed: the whole sequence's loss
    and gradients as without checkpointing; full runs each block's ring attention again in the backward,
    full_except_attention none (counted eager; a compiled backward is one op a dispatch mode cannot see into)."""
    args = ['--backend', 'sdpa', '--seq', str(CONTEXT_PARALLEL_SEQUENCE), '--bf16', '--checkpointing', mode]
    result = run_context_parallel_worker(tmp_path, *args, *['--compile'] * compile_blocks)
    print(f'context parallel 2, sdpa, bf16, {mode}, compiled {compile_blocks}: {result}')
    loss_tolerance, gradient_tolerance = CONTEXT_PARALLEL_TOLERANCES[True]
    assert abs(result['loss'] - result['expected_loss']) < loss_tolerance
    assert result['gradient_difference'] < gradient_tolerance
    assert result['backward_attention_forwards'] == recomputed_attentions


# The float8 output layer against the bf16 one at the 1B's width (2,048 x 128,256), 8,192 tokens, under autocast as
# training runs it. float8's 3-bit mantissa: on the CPU (torchao's emulation, 1,024 tokens of a 8,192 vocabulary)
# the gradients differed by 2.7 % and the loss by 5e-4.
FLOAT8_GRADIENT_TOLERANCE = 5e-2   # |g - g_bf16| / |g_bf16|, of the hidden states' and the weight's gradients
FLOAT8_LOSS_TOLERANCE = 1e-2       # absolute, on a loss of about 11.8


@pytest.mark.timeout(300)
def test_the_float8_output_layer_gives_the_bf16_loss_and_gradients_without_more_memory():
    pytest.importorskip('torchao')
    from llmfoundry_ext.model.composer_model import compiled_cross_entropy
    from llmfoundry_ext.model.llama import OutputLayer
    from llmfoundry_ext.parallelism import compiled_float8_matmul

    torch.manual_seed(0)
    dim, vocab, tokens = PRESETS['1b'].dim, PRESETS['1b'].vocab_size, 8192
    layer = OutputLayer(dim, vocab, bias=False, device='cuda')
    torch.nn.init.normal_(layer.weight, std=dim ** -0.5)
    hidden = torch.randn(1, tokens, dim, device='cuda')
    labels = torch.randint(0, vocab, (1, tokens), device='cuda')

    def loss_grads_peak(float8_matmul):
        layer.float8_matmul, layer.weight.grad = float8_matmul, None
        inputs = hidden.clone().requires_grad_()
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        with torch.autocast('cuda', torch.bfloat16):
            loss = compiled_cross_entropy()(layer(inputs), labels)
        loss.backward()
        return loss.item(), inputs.grad, layer.weight.grad.clone(), torch.cuda.max_memory_allocated() - before

    for _ in range(2):  # the second of each: compiled and warm
        bf16 = loss_grads_peak(None)
        float8 = loss_grads_peak(compiled_float8_matmul(layer, 'tensorwise'))
    relative = [((got - want).norm() / want.norm()).item() for got, want in zip(float8[1:3], bf16[1:3])]
    logits_bytes = tokens * vocab * 2
    print(f'loss {float8[0]:.5f} vs {bf16[0]:.5f}; gradients {relative[0]:.2e} (hidden), {relative[1]:.2e} '
          f'(weight); peak {float8[3] / 2**30:.2f} vs {bf16[3] / 2**30:.2f} GiB')
    assert abs(float8[0] - bf16[0]) < FLOAT8_LOSS_TOLERANCE
    assert max(relative) < FLOAT8_GRADIENT_TOLERANCE
    assert float8[3] < bf16[3] + logits_bytes  # eager torchao casts took several fp32 copies of the logits' size
