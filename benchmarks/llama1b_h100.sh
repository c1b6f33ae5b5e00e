#!/usr/bin/env bash
# Issue #6, Must show 1 and 3: the Llama-3.2-1B preset at sequence 8192 on one H100, bf16, FSDP2 (Composer),
# against transformers' LlamaForCausalLM (sdpa) under the same settings.
#   benchmarks/llama1b_h100.sh core|extra|options [out.json]
# core: the HF baseline and our eager model at the largest batch they fit without activation checkpointing (1:
#       their fp32 logits alone take 7.8 GiB per sample), our best settings, and the same with document masking.
# extra: batch 2, and flex document masking. options: float8.
set -euo pipefail
cd "$(dirname "$0")/.."
Y=yamls/llama1b.yaml
B1='global_batch_size=1 device_microbatch_size=1'
B2='global_batch_size=2 device_microbatch_size=2'
B4='global_batch_size=4 device_microbatch_size=4'
FAST='model.compile=true model.fused_kernels=[cross_entropy] parallelism.fsdp.reshard_after_forward=false
      optimizer.name=adamw optimizer.fused=true optimizer.weight_decay=0.1'
MASK='data.document_masking=true'
case "${1:-core}" in
  core) rows=("hf-b1 $Y $B1" "ours-eager-b1 $Y $B1" "ours-best-b4 $Y $B4 $FAST" "ours-best-b4-docmask $Y $B4 $FAST $MASK") ;;
  extra) rows=("ours-best-b2 $Y $B2 $FAST" "ours-best-b4-docmask-flex $Y $B4 $FAST $MASK model.attn_impl=flex") ;;
  options) rows=("ours-best-b4-float8 $Y $B4 $FAST model.float8=true") ;;
  *) echo "usage: $0 core|extra|options [out.json]" >&2; exit 2 ;;
esac
args=()
for row in "${rows[@]}"; do args+=(--row "$(echo $row)"); done
python3 scripts/benchmark.py --gpus 1 --warmup 5 --steps 10 --json "${2:-benchmark-1b.json}" "${args[@]}"
