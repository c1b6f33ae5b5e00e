"""Training throughput of YAML runs on synthetic tokens: tokens/s per GPU, MFU, step time and peak memory.

Each row runs in its own ``composer -n GPUS`` process (fresh GPU memory and compile caches); rank 0 writes the
row's figures to a JSON file the parent reads. The baseline row trains transformers' LlamaForCausalLM (sdpa)
of the same shape under the same Composer FSDP2 settings, as llm-foundry's ``hf_causal_lm`` does.
"""
import json
import os
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass, field

import torch
from composer.core import Callback, State
from composer.loggers import Logger
from composer.models import ComposerModel

from llmfoundry_ext.model.composer_model import batch_flops, token_mean_cross_entropy
from llmfoundry_ext.model.llama import LlamaConfig

HF_BASELINE = 'hf'


@dataclass
class Row:
    """One benchmarked configuration: a name, a YAML and its overrides; ``model`` 'ours' or 'hf'."""
    name: str
    yaml: str
    overrides: list[str] = field(default_factory=list)
    model: str = 'ours'

    @classmethod
    def parse(cls, text: str) -> 'Row':
        """'NAME YAML key=value ...' (shell quoting); NAME 'hf' or starting 'hf:' runs the HF baseline."""
        name, yaml, *overrides = shlex.split(text)
        return cls(name, yaml, overrides, HF_BASELINE if name.split(':')[0] == HF_BASELINE else 'ours')


class StepTimer(Callback):
    """Mean step time over the batches after ``warmup``, synchronising only at the window's two ends (a sync
    every step would idle the GPU while the CPU queues the next step), and the peak GPU memory in that window."""

    def __init__(self, warmup: int):
        self.warmup = warmup
        self.batches = 0
        self.start = self.end = 0.0

    def batch_end(self, state: State, logger: Logger) -> None:
        self.batches += 1
        if self.batches < self.warmup:
            return
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        self.end = time.perf_counter()
        if self.batches == self.warmup:
            self.start = self.end
            if torch.cuda.is_available():
                torch.cuda.reset_peak_memory_stats()

    def step_seconds(self) -> float:
        return (self.end - self.start) / (self.batches - self.warmup)


class HFLlamaLM(ComposerModel):
    """transformers' LlamaForCausalLM with sdpa attention, our shape, each decoder layer its own FSDP2 unit."""

    def __init__(self, config: LlamaConfig):
        super().__init__()
        from transformers import LlamaConfig as HFConfig
        from transformers import LlamaForCausalLM
        from transformers.models.llama.modeling_llama import LlamaDecoderLayer

        from llmfoundry_ext.checkpoint import hf_config
        hf = HFConfig(**hf_config(config, torch.float32))
        hf._attn_implementation = 'sdpa'
        self.model = LlamaForCausalLM(hf)
        self.model.fsdp_wrap_fn = lambda module: isinstance(module, LlamaDecoderLayer)
        self.config = config

    def forward(self, batch: dict) -> torch.Tensor:
        return self.model(input_ids=batch['input_ids']).logits

    def loss(self, outputs: torch.Tensor, batch: dict) -> torch.Tensor:
        return token_mean_cross_entropy(outputs, batch['labels'])

    def flops_per_batch(self, batch: dict) -> int:
        return batch_flops(self.config, batch)


def measure(row: Row, warmup: int, steps: int, mean_document_tokens: int, folder: str) -> dict:
    """Train ``warmup + steps`` batches of ``row`` (in this process group) and return its figures."""
    from composer.callbacks.speed_monitor import get_gpu_flops_available
    from composer.utils import dist

    from llmfoundry_ext.config import load
    from llmfoundry_ext.profiling import synthetic_run_yaml
    from llmfoundry_ext.train import train

    overrides = [*row.overrides, f'max_duration={warmup + steps}ba']
    yaml = synthetic_run_yaml(row.yaml, overrides, folder, warmup + steps + 2, mean_document_tokens)
    config = load(yaml)
    timer = StepTimer(warmup)
    model = HFLlamaLM(config.model.llama()) if row.model == HF_BASELINE else None
    trainer = train(config, extra_callbacks=[timer], model=model)
    peak_flops = get_gpu_flops_available(trainer.state) if torch.cuda.is_available() else 0
    trainer.close()
    seconds = timer.step_seconds()
    tokens_per_gpu = config.tokens_per_step / dist.get_world_size() / seconds
    flops_per_token = config.model.llama().flops_per_token(config.max_seq_len)
    return {
        'name': row.name, 'yaml': row.yaml, 'overrides': row.overrides, 'model': row.model,
        'gpus': dist.get_world_size(), 'device': torch.cuda.get_device_name() if torch.cuda.is_available() else 'cpu',
        'torch': torch.__version__, 'step_seconds': seconds, 'tokens_per_second_per_gpu': tokens_per_gpu,
        'mfu': tokens_per_gpu * flops_per_token / peak_flops if peak_flops else None,
        'peak_memory_gib': torch.cuda.max_memory_allocated() / 2 ** 30 if torch.cuda.is_available() else None,
        'document_masking': config.data.document_masking, 'timed_steps': steps,
    }


def run_row(script: str, row: Row, gpus: int, warmup: int, steps: int, mean_document_tokens: int,
            out: str) -> dict:
    """``composer -n gpus script --worker ...`` for one row; its figures, or the error it ended with."""
    command = [sys.executable, '-m', 'composer.cli.launcher', '-n', str(gpus), script, '--worker',
               shlex.join([row.name, row.yaml, *row.overrides]), '--warmup', str(warmup), '--steps', str(steps),
               '--mean-document-tokens', str(mean_document_tokens), '--json', out]
    print(f'--- {row.name}: {shlex.join(command[3:])}', flush=True)
    result = subprocess.run(command, env={**os.environ, 'PYTHONUNBUFFERED': '1'})
    if result.returncode != 0 or not os.path.isfile(out):
        return {'name': row.name, 'model': row.model, 'error': f'exit status {result.returncode}'}
    with open(out) as file:
        return json.load(file)


def format_table(results: list[dict], baseline: str | None) -> str:
    """One line per row; ``vs base`` is tokens/s relative to the baseline row."""
    base = next((r for r in results if r['name'] == baseline and 'error' not in r), None)
    lines = [f"{'run':<28}{'tok/s/GPU':>11}{'MFU':>7}{'step s':>8}{'peak GiB':>10}{'vs base':>9}"]
    for r in results:
        if 'error' in r:
            lines.append(f"{r['name']:<28}  failed: {r['error']}")
            continue
        ratio = f"{r['tokens_per_second_per_gpu'] / base['tokens_per_second_per_gpu']:.2f}x" if base else '-'
        mfu = f"{r['mfu']:.1%}" if r['mfu'] else '-'
        memory = f"{r['peak_memory_gib']:.1f}" if r['peak_memory_gib'] is not None else '-'
        lines.append(f"{r['name']:<28}{r['tokens_per_second_per_gpu']:>11,.0f}{mfu:>7}{r['step_seconds']:>8.3f}"
                     f"{memory:>10}{ratio:>9}")
    return '\n'.join(lines)
