"""One optimizer step over a YAML's parameters, timed: torch's fused AdamW beside ``compiled_adamw`` and a plain copy
of the same bytes (``scripts/measure_optimizer.py``). The parameters are the YAML's model's shapes, fp32 on one GPU,
with random gradients; the clip folded in as the training's (a ``grad_scale``)."""
import json
import time

import torch

from llmfoundry_ext.config import TrainConfig, apply_preset, build, read_yaml
from llmfoundry_ext.optimizer import CompiledAdamW

ADAMW_BYTES = 28  # fp32 parameter, gradient and two moments read; parameter and moments written


def parameter_shapes(yaml: str, overrides: list[str]) -> list[torch.Size]:
    """The shapes of the YAML's model's parameters (built on the meta device)."""
    raw = read_yaml(yaml, overrides)
    apply_preset(raw)
    config = build(TrainConfig, raw, '')
    with torch.device('meta'):
        model = config.model.family_entry().module(config.model.architecture())
    return [parameter.shape for parameter in model.parameters()]


def timed(step, steps: int, warmup: int) -> float:
    """Mean milliseconds of ``step`` over ``steps`` after ``warmup`` (compilation) on the GPU."""
    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / steps * 1e3


def optimizer_rows(shapes: list[torch.Size], steps: int, warmup: int) -> list[dict]:
    """Milliseconds a step and GB/s of ADAMW_BYTES a parameter, each optimizer; the copy of 8 bytes a parameter."""
    count = sum(shape.numel() for shape in shapes)
    rows = []
    for name, make in (('torch fused AdamW', lambda p: torch.optim.AdamW(p, fused=True, betas=(0.9, 0.95))),
                       ('compiled_adamw', lambda p: CompiledAdamW(p, betas=(0.9, 0.95)))):
        parameters = [torch.nn.Parameter(torch.randn(shape, device='cuda') * 0.02) for shape in shapes]
        for parameter in parameters:
            parameter.grad = torch.randn_like(parameter) * 1e-3
        optimizer = make(parameters)
        optimizer.grad_scale = torch.tensor(1.2, device='cuda')
        ms = timed(optimizer.step, steps, warmup)
        rows.append({'row': name, 'ms': ms, 'GB/s': ADAMW_BYTES * count / ms / 1e6})
        del parameters, optimizer
        torch.cuda.empty_cache()
    source = torch.empty(count // 2, device='cuda')
    target = torch.empty_like(source)
    ms = timed(lambda: target.copy_(source), steps, warmup)
    rows.append({'row': 'copy (reference)', 'ms': ms, 'GB/s': 8 * (count // 2) / ms / 1e6})
    return rows


def report(rows: list[dict], count: int, json_path: str | None) -> str:
    lines = [f'{count:,} fp32 parameters, {torch.cuda.get_device_name()}, torch {torch.__version__}',
             f'{"row":24s} {"ms/step":>8s} {"GB/s":>8s}']
    lines += [f'{row["row"]:24s} {row["ms"]:8.2f} {row["GB/s"]:8.0f}' for row in rows]
    if json_path:
        with open(json_path, 'w') as file:
            json.dump({'parameters': count, 'device': torch.cuda.get_device_name(), 'torch': torch.__version__,
                       'rows': rows}, file, indent=1)
    return '\n'.join(lines)
