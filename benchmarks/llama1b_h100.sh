#!/usr/bin/env bash
# Issue #6, Must show 1 and 3: the Llama-3.2-1B preset at sequence 8192 on one H100, bf16, FSDP2 (Composer),
# against transformers' LlamaForCausalLM (sdpa) under the same settings.
#   benchmarks/llama1b_h100.sh core|extra [out.json]
# core: the baseline, our eager model, our best settings, and the same with document masking (auto: varlen).
# extra: flex document masking, a larger batch, float8 and full activation checkpointing.
set -euo pipefail
cd "$(dirname "$0")/.."
Y=yamls/llama1b.yaml
B2='global_batch_size=2 device_microbatch_size=2'
FAST='model.compile=true model.fused_kernels=[cross_entropy] parallelism.fsdp.reshard_after_forward=false'
BEST="$B2 $FAST"
case "${1:-core}" in
  core) rows=("hf-b2 $Y $B2" "ours-eager-b2 $Y $B2" "ours-best-b2 $Y $BEST"
              "ours-best-b2-docmask $Y $BEST data.document_masking=true") ;;
  extra) rows=("ours-best-b2 $Y $BEST" "ours-best-b2-docmask-flex $Y $BEST data.document_masking=true model.attn_impl=flex"
               "ours-best-b3 $Y global_batch_size=3 device_microbatch_size=3 $FAST" "ours-best-b2-float8 $Y $BEST model.float8=true"
               "ours-best-b2-ac-full $Y $BEST parallelism.fsdp.activation_checkpointing=full") ;;
  *) echo "usage: $0 core|extra [out.json]" >&2; exit 2 ;;
esac
args=()
for row in "${rows[@]}"; do args+=(--row "$row"); done
python3 scripts/benchmark.py --gpus 1 --warmup 5 --steps 10 --json "${2:-benchmark-1b.json}" "${args[@]}"
