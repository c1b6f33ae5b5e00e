#!/usr/bin/env bash
# The 1B best settings of llama1b_h100.sh (batch 4) with float8 linears or selective activation checkpointing.
set -euo pipefail
cd "$(dirname "$0")/.."
Y=yamls/llama1b.yaml
BEST='global_batch_size=4 device_microbatch_size=4 model.compile=true model.fused_kernels=[cross_entropy]
      parallelism.fsdp.reshard_after_forward=false optimizer.name=adamw optimizer.fused=true optimizer.weight_decay=0.1'
python3 scripts/benchmark.py --gpus 1 --warmup 5 --steps 10 --json "${1:-benchmark-1b-options.json}" \
  --row "$(echo ours-best-b4-float8 $Y $BEST model.float8=true)" \
  --row "$(echo ours-best-b4-ac-every2 $Y $BEST parallelism.fsdp.activation_checkpointing=selective)"
