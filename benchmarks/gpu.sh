#!/usr/bin/env bash
# The GPU runs behind the README's performance table and the shipped-YAML checks, on a GPU machine with its own
# torch: Composer, streaming, liger-kernel and torchao come as wheels (bash ../shared/tools/device-wheels.sh
# torchao==0.17.0 fills .whl/), torchtitan from bash ../shared/anchors/prepare.sh (.anchors/). From the repo root:
#   bash benchmarks/gpu.sh tests [PART ...]    the GPU suite (make test-gpu) in named parts (default: all), each
#                                               under an 8-minute limit, its log $OUT/tests-PART.log; then a table of
#                                               parts, seconds and results (COMMIT names the code: write it into the
#                                               command from your checkout; the device's git may name the commit its
#                                               first copy of the session came from). Parts: units,
#                                               checkpointing, shipped-1b, shipped-mlm1b, shipped-8b, shipped-70b,
#                                               shipped-mixtral (one GPU or more); 2gpu (context parallel and
#                                               llama8b-131k.yaml: listed as not run on one GPU)
#   bash benchmarks/gpu.sh tests-of [pytest args]  make test-gpu on the named tests (make splits its arguments at
#                                               spaces: a -k expression goes in PYTEST_ADDOPTS='-k "a and not b"')
#   bash benchmarks/gpu.sh shipped              llama8b.yaml as shipped (data and global batch aside) and llama70b.yaml
#                                               with 2 layers: 10 steps and a checkpoint, then the same command resumes
#                                               to 20 (shipped-8b, shipped-70b: one of them)
#   bash benchmarks/gpu.sh hsdp                 the 1B, 20 batches: FSDP over the GPUs present beside HSDP (a replica a
#                                               GPU) stopped at 10 and resumed; losses and tokens/s a batch
#   bash benchmarks/gpu.sh bench-1b [out.json]  one H100: 1B at local batch 2 and 4 beside torchtitan, HF, and the
#                                               loss compiled instead of liger's
#   bash benchmarks/gpu.sh speed-1b [REPEATS]  one H100: yamls/llama1b.yaml as shipped beside torchtitan compile at local
#                                               batch 2 and 4, each pair REPEATS times (default 1): the spread
#   bash benchmarks/gpu.sh plan-1b [settings|versus]  one GPU: the run plan's predicted peak memory and tokens/s
#                                               beside the measured ones, 1B at 8 samples a step: eight settings
#                                               (micro-batch, checkpointing, float8); or the shipped YAML's auto
#                                               choice beside torchtitan compile (LBS 4), twice
#   bash benchmarks/gpu.sh plan-8b [settings|versus]  the GPUs present (2): the same for the 8B at 2 samples a GPU,
#                                               eight settings (PLAN_ROWS="1 2 3 4" runs those alone); or
#                                               llama8b.yaml as shipped beside torchtitan compile (LBS 1), twice
#   bash benchmarks/gpu.sh syncs-1b             one H100: where a batch of yamls/llama1b.yaml (local batch 2) syncs
#   bash benchmarks/gpu.sh profile-1b           one H100: kernel time by category, GPU busy and idle time of the 1B at
#                                               local batch 2, ours beside torchtitan's (compiled)
#   bash benchmarks/gpu.sh profile-1b-ours      the same, ours alone
#   bash benchmarks/gpu.sh profile-8b [MODES]   the same for the 8B on the GPUs present, local batch 1, each mode
#                                               (as bench-8b's; default none)
#   bash benchmarks/gpu.sh profile-8b-ours [MODES]  the same, ours alone
#   bash benchmarks/gpu.sh float8-8b            2 GPUs: llama8b.yaml with model.float8=true (auto's until 2026-11-29)
#                                               at its 2 samples a GPU beside torchtitan fp8 (LBS 2 and 1), twice; the
#                                               bf16 row (no AC, kept gathered, LBS 1) beside torchtitan compile
#   bash benchmarks/gpu.sh float8-1b            2 GPUs, a lane each at once: llama1b.yaml with model.float8=true at
#                                               its 4 samples a GPU, twice, with the garbage_collection callback,
#                                               and at local batch 2 and 8; torchtitan compile (LBS 4)
#   bash benchmarks/gpu.sh float8-output        2 GPUs, a lane each at once: llama1b.yaml at its 4 samples a GPU in
#                                               float8 with the output layer's GEMMs (model.float8_output=true) beside
#                                               float8 on the blocks alone, twice; torchtitan compile and fp8 (LBS 4);
#                                               the float8 output layer's GPU test
#   bash benchmarks/gpu.sh bench-8b [MODES]     2 GPUs: 8B as shipped beside torchtitan, each mode (none selective full
#                                               float8: AC none / selective / full, float8 without AC; default all);
#                                               REPEATS=3 runs the modes three times over (ours' launches part by up
#                                               to 5.5 %: two_gpu_2xh200_7579c4b)
#   bash benchmarks/gpu.sh bench-mixtral [LAYERS] [LOCAL]  Mixtral-8x7B width (LAYERS layers, default 3) at 4,096
#                                               tokens, LOCAL samples per GPU a step (default 4, the YAML's) in
#                                               micro-batches of 1, no AC: ours beside transformers'
#                                               MixtralForCausalLM (its default grouped_mm experts, and its loop)
#   bash benchmarks/gpu.sh plan-mixtral [LAYERS]  the GPUs present: Mixtral-8x7B width, LAYERS layers (2), 4 samples
#                                               of 4,096 tokens a GPU: predicted peak memory and tokens/s beside the
#                                               measured at six settings (micro-batch 1/2/4, checkpointing), the auto
#                                               choice, and transformers' MixtralForCausalLM at micro-batch 4
#   bash benchmarks/gpu.sh float8-mixtral [LAYERS]  the GPUs present: Mixtral-8x7B width, LAYERS layers (2), 4 samples
#                                               of 4,096 tokens a GPU on auto settings: bf16, float8 on the blocks,
#                                               and float8 on the experts' grouped GEMMs too (model.float8_experts)
#   bash benchmarks/gpu.sh mfu-mixtral [LAYERS]  one GPU: Mixtral-8x7B width, LAYERS layers (2), on auto settings at
#                                               4, 8 (twice) and 16 samples of 4,096 tokens a step, transformers'
#                                               MixtralForCausalLM at 8 (micro-batch 4): MFU as the batch amortises
#                                               the optimizer's step over every weight of the model (issue 67)
#   bash benchmarks/gpu.sh lanes "COMMAND-A" "COMMAND-B"  2 GPUs: this script's COMMAND-A on GPU 0 while COMMAND-B
#                                               runs on GPU 1, e.g. "mfu-mixtral" "grid python 3e-4 ROW..."
#   bash benchmarks/gpu.sh ep-mixtral [LAYERS]  2 GPUs: Mixtral-8x7B width, LAYERS layers (8), 4 samples of 4,096 tokens a
#                                               GPU on auto settings: FSDP2 alone beside expert parallel 2 (CPU
#                                               and meta builds)
#   bash benchmarks/gpu.sh bench ARGS           scripts/measure_speed.py ARGS on the GPUs present
#   bash benchmarks/gpu.sh learning SEEDS ROW...  scripts/measure_learning.py: 1B (llama1b.yaml untied, local batch 2) on
#                                               the same tokens, each ROW (ours gpt2 titan hf float8 float8-rowwise
#                                               liger eager titan-again; shipped: the YAML's auto settings) on each
#                                               of SEEDS ("1 2"; hf on the first only); STEPS (500) steps;
#                                               CORPUS_MB (40) of text; the rows nofsdp, compiled-loss and matched of
#                                               the recorded runs equal ours since 25bbbba;
#                                               SHARED_INIT=ours: every row of a seed starts from ours' fresh weights;
#                                               LEARNING_GPUS=2 (row ours-2gpu: the same global batch of 2 on 2 GPUs);
#                                               LR (3e-4); ROOTS and SUFFIX: another corpus (.corpora/linux-doc
#                                               .rst.txt: data_prep/linux_doc_corpus.sh); EVAL_EVERY: held-out loss
#                                               every so many steps and the time-to-quality table, QUALITY
#                                               (ours:torchtitan) its REFERENCE:TARGET; TT_RANKS=N: the corpus in
#                                               torchtitan's order on N GPUs (--torchtitan-ranks)
#   bash benchmarks/gpu.sh grid CORPUS LR ROW[@STEPS]...  one GPU: a cell of the time-to-quality grid
#                                               (docs/learning.md): the 1B at 4 x 8,192 tokens a step, 400 steps,
#                                               seed GRID_SEED (1), every row from grid-bf16's weights, held-out
#                                               loss every 100 steps; CORPUS python (40 MB) or prose
#                                               (.corpora/linux-doc carried, 18 MB); ROWs grid-bf16
#                                               grid-float8-blocks grid-float8 grid-float8-rowwise grid-titan
#                                               grid-titan-fp8 (~5 min a row on an H200: one row a call, calls
#                                               back to back on the warm machine); a cell's calls merge with
#                                               measure_learning.py --report FILES --quality ours-bf16:torchtitan,
#                                               the grid's with --decide FILES; ROW@N (or GRID_STEPS=N for every row): a schedule of N steps
#                                               (the table's "steps at 1.15x": the default's time-to-target run);
#                                               grid-shipped grid-shipped-blocks grid-shipped-bf16
#                                               grid-shipped-rowwise: llama1b.yaml's tied model (float8 with the
#                                               output layer, float8 blocks, bf16: the default, rowwise float8
#                                               blocks) from its own weights;
#                                               grid-8b grid-8b-titan-fp8 (2 GPUs, 300 steps of 2 x 8,192 tokens,
#                                               a call each): llama8b.yaml as shipped beside torchtitan fp8 from the
#                                               8B's weights, each GPU torchtitan's samples of its rank;
#                                               grid-mixtral-bf16 grid-mixtral-float8 grid-mixtral-float8-experts:
#                                               Mixtral's width, 2 layers, auto settings, from its own weights.
#                                               Consecutive rows from the same weights and schedule are one learning
#                                               call (a JSON); a group that would outlast STOP_BY (540 s) is not begun
#   bash benchmarks/gpu.sh grid-lanes CORPUS LR ROW-A ROW-B  2 GPUs: grid's cell, ROW-A on GPU 0 while ROW-B on GPU 1
#   bash benchmarks/gpu.sh grid-speed [ROW ...]  one GPU: the grid's rows' tokens/s in one call (default: the shipped
#                                               tied rows and torchtitan's): measure_learning.py --decide ... --speeds
#                                               grid-speed.json times every row at one machine's speed
#   bash benchmarks/gpu.sh learning-split SEEDS A B  2 GPUs: the learning benchmark's row A on GPU 0 while row B
#                                               runs on GPU 1 (each on every seed), then both in one report, A versus
#                                               B: half the time of `learning SEEDS A B`
#   bash benchmarks/gpu.sh learning-2gpu [SEED]  2 GPUs: the row ours on 1 GPU, then ours-2gpu on 2 (the same global
#                                               batch), both from SEED's (1) shared weights on the same tokens
#                                               (CORPUS_MB, here 16: the one-GPU references' since 53d922a); their
#                                               windows side by side (--versus ours-2gpu:ours)
#   bash benchmarks/gpu.sh downstream [ARGS]    one GPU: scripts/measure_downstream.py (1B trained 200 batches on the
#                                               learning corpus, a 1,000-question HellaSwag-like task scored in the
#                                               loop every 100, then by the harness's HF backend on the to-hf export).
#                                               .whl must hold lm_eval 0.4.13 and what it needs: device-wheels.sh
#                                               lm_eval==0.4.13 datasets==5.0.1 evaluate==0.4.6 pytablewriter==1.2.1
#                                               dataproperty mbstrdecoder pathvalidate tabledata tcolorpy typepy chardet
#                                               more-itertools multiprocess==0.70.19 nltk pytz, and `pip wheel --no-deps
#                                               -w .whl sqlitedict word2number rouge_score` (no wheels on PyPI)
#   bash benchmarks/gpu.sh downstream-2gpu [ARGS]  2 GPUs: the same, in the loop only, trained on 1 GPU then on 2
#                                               (the same global batch, the same first weights): each evaluation's
#                                               metrics beside the 1-GPU run's, its seconds (--batches 200 --interval
#                                               100 by default); the 2-GPU run's last checkpoint scored again in one
#                                               process (--rescore): the same weights' metrics
#   bash benchmarks/gpu.sh generation [ARGS]   one GPU: scripts/measure_generation.py (1B architecture, fresh weights: a
#                                               500-question GSM8K-like task, 4-shot, 64 tokens, ours beside the
#                                               harness's HF backend in fp32 and bf16; the same wheels as downstream)
#   bash benchmarks/gpu.sh attention            causal attention fwd+bwd by SDPA kernel, 8B heads: 8,192 tokens on one
#                                               GPU, 131,072 on a ring of all GPUs (context parallel)
#   bash benchmarks/gpu.sh profile-mixtral [LAYERS] [MICRO ...]  the GPUs present: Mixtral-8x7B width (LAYERS: 2),
#                                               SAMPLES (4) of 4,096 tokens a GPU, no checkpointing, each micro-batch
#                                               (1 2 4): kernel time by category (grouped GEMM, sort/index, ...),
#                                               busy and idle, ours beside transformers' MixtralForCausalLM
#   bash benchmarks/gpu.sh profile-long [OVERRIDES]  2 GPUs: llama8b-131k.yaml (CP 2, one sequence; its ranks 0
#                                               and 1) profiled beside torchtitan's compile_full at CP 2, 131,072 tokens
#                                               (OURS_ONLY=1: ours alone); GPU timelines in $OUT/timelines
#   bash benchmarks/gpu.sh bench-long [ROWS]    2 GPUs: llama8b-131k.yaml (CP 2) as shipped (ours:
#                                               full_except_attention) and with full AC (ours-full) beside torchtitan's
#                                               compile_full (titan) and compile_sac (titan-sac: out of memory at
#                                               131,072 on 2 H200s) at CP 2, 131,072 tokens: 4 timed steps after 2 each
#                                               (default all four: ~14 min, more than one call)
#   bash benchmarks/gpu.sh long-smoke           2 GPUs: llama8b-131k.yaml with 2 layers, 3 steps (context parallel 2)
#   bash benchmarks/gpu.sh long-8b              2 GPUs: llama8b-131k.yaml as shipped (data, init, batch and duration
#                                               aside) to 10 steps, stopping after 5 with a checkpoint: run it twice,
#                                               the second autoresumes (one call each: a run takes ~5 minutes)
#   bash benchmarks/gpu.sh long-table           2 GPUs: llama8b-131k.yaml at 8,192 and 32,768 tokens, CP 1 and 2
set -uo pipefail
cd "$(dirname "$0")/.."
SECONDS=${GPU_SH_SECONDS:-0}  # a lane (lanes) keeps its call's clock: STOP_BY counts from the call's start
[ -n "${GPU_SH_INSTALLED:-}" ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
export GPU_SH_INSTALLED=1  # a lane (lanes) installs nothing again
export PYTHONPATH=/tmp/site:$PWD PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1 OMP_NUM_THREADS=4
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1  # NVLink multicast stays off
GPUS=$(nvidia-smi -L | wc -l)
[ -n "${CUDA_VISIBLE_DEVICES:-}" ] && GPUS=$(tr , '\n' <<< "$CUDA_VISIBLE_DEVICES" | wc -l)  # a lane's GPUs
python3 -c "import torch, composer, streaming; print('torch', torch.__version__, '|', torch.cuda.get_device_name(), \
'x', torch.cuda.device_count(), '| composer', composer.__version__, '| streaming', streaming.__version__)"
echo "installed and imported in $SECONDS s"

SHIPPED=tests/test_shipped_yamls_gpu.py::test_shipped_yaml_trains_on_the_gpus_and_checkpoints
CHECKPOINTING=tests/test_parallelism_gpu.py::test_checkpointing_modes_match_the_model_without_checkpointing
declare -A PART_TESTS=(  # each part's tests: one H200 runs every part within PART_LIMIT
  [units]="tests/test_train_gpu.py tests/model/test_attention_gpu.py tests/model/test_mixtral_gpu.py
    tests/test_clipping.py tests/test_parallelism_gpu.py::test_the_float8_output_layer_gives_the_bf16_loss_and_gradients_without_more_memory"
  [checkpointing]="$CHECKPOINTING"
  [shipped-1b]="$SHIPPED[llama1b.yaml]"
  [shipped-mlm1b]="$SHIPPED[mlm1b.yaml]"
  [shipped-8b]="$SHIPPED[llama8b.yaml]"
  [shipped-70b]="$SHIPPED[llama70b.yaml]"
  [shipped-mixtral]="$SHIPPED[mixtral8x7b.yaml]"
  [2gpu]="tests/test_expert_parallel_gpu.py tests/test_parallelism_gpu.py::test_context_parallel_2_gives_the_losses_and_gradients_of_the_whole_sequence
    tests/test_parallelism_gpu.py::test_full_except_attention_under_context_parallel_2_keeps_the_ring_out_of_the_recomputation
    $SHIPPED[llama8b-131k.yaml]"
)
PARTS=(units checkpointing shipped-1b shipped-mlm1b shipped-8b shipped-70b shipped-mixtral 2gpu)
PART_LIMIT=${PART_LIMIT:-480}  # seconds: a part that does not end within it fails (timeout's exit status 124)

gpu_tests() {  # [part ...]: each part's tests (default: every part) under PART_LIMIT, its log $OUT/tests-PART.log;
  # a part whose tests need 2 GPUs is listed as not run on one; then the table (the console only: a call brings
  # back 8 files, the parts' logs)
  local part rows=() t0 status result
  for part in "${@:-${PARTS[@]}}"; do
    [ -n "${PART_TESTS[$part]:-}" ] || { echo "no part '$part'; parts: ${PARTS[*]}"; return 2; }
    if [[ $part == 2gpu && $GPUS -lt 2 ]]; then
      rows+=("$(printf '%-16s %6s  %s' "$part" - 'not run: needs 2 GPUs')"); continue
    fi
    t0=$SECONDS
    echo "===== part $part: ${PART_TESTS[$part]//$'\n'/ }"
    timeout --kill-after=20 $PART_LIMIT make test-gpu TEST_PYTHON=python3 TESTS="$(echo ${PART_TESTS[$part]})" \
      > "$OUT/tests-$part.log" 2>&1
    status=$?
    result=$(grep -E '^(=+ )?[0-9]+ (passed|failed|skipped|error)' "$OUT/tests-$part.log" | tail -1 | tr -d '=')
    [ $status = 124 ] && result="cut at ${PART_LIMIT} s: $result"
    rows+=("$(printf '%-16s %6s  exit %s: %s' "$part" $((SECONDS - t0)) $status "${result:-no summary}")")
    tail -3 "$OUT/tests-$part.log"
    rm -rf /tmp/pytest-of-*  # what a part cut by its limit left (a 70B checkpoint: ~31 GB of a 64 GB disk)
  done
  { echo "$(python3 -c 'import torch; print(torch.__version__, torch.cuda.get_device_name())') x $GPUS, commit" \
      "${COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo '?')}"
    printf '%-16s %6s  %s\n' part seconds result; printf '%s\n' "${rows[@]}"; }
}

data_root() {  # the shipped YAMLs' six streams, train (1,024 windows: the 70B's canonical nodes) and val (64), with
  # 8,192-token windows of random Llama-3 ids
  python3 -c "from tests.conftest import write_frontier_data_root as w; w('$1', 8192, 128256, lambda s: 1024 if s < 6 else 64)"
}

shipped() {  # yaml [layers]: as shipped (data root, global batch and duration aside) to 20 steps, stopped after 10
  # with a sealed checkpoint (stop_after), then the same command again: it resumes at batch 10 and writes batch 20's.
  # The checkpoint resumed from is removed once the resumed run has loaded it (the 8B's are 90 GB: two do not fit).
  local data=/tmp/shipped/data ckpt=/tmp/shipped/ckpt layers=() run watcher
  [ -d $data ] || data_root $data
  [ -n "${2:-}" ] && layers=("model.n_layers=$2")
  local command=(composer train.py "yamls/$1" "variables.data_root=$data" "variables.checkpoint_root=$ckpt"
    "global_batch_size=$GPUS" max_duration=20ba callbacks.stop_after.batches=10 "${layers[@]}")
  for run in first resumed; do
    local log="$OUT/shipped-$1-$run.log" t0=$SECONDS
    echo "===== ($run) ${command[*]}"
    if [ $run = resumed ]; then
      (until grep -q "autoresume: resuming" "$log" 2>/dev/null; do sleep 2; done; rm -rf $ckpt/*/ep0-ba10) &
      watcher=$!
    fi
    "${command[@]}" > "$log" 2>&1
    echo "exit $?, $((SECONDS - t0))s wall"
    [ $run = resumed ] && kill $watcher 2>/dev/null
    grep -E "^run |^  |^batch |^eval |Error|error:" "$log" | grep -v Warning | tail -22
    ls -la $ckpt/*/ep0-ba* && du -sh $ckpt/*/ep0-ba*
  done
  rm -rf $ckpt
}

hsdp() {  # the 1B on the GPUs present, the same 20 batches (2 samples a GPU) from the same weights (a fresh draw
  # on meta depends on the layout: DTensor's RNG), warm-up 2 batches: FSDP over all GPUs, then HSDP with one replica
  # a GPU (replicate_degree=GPUS) stopped after 10 batches with a checkpoint and resumed; losses and tokens/s a batch
  local data=/tmp/shipped/data root=/tmp/hsdp run
  [ -d $data ] || data_root $data
  python3 -c "from llmfoundry_ext.measure.learning import write_shared_init as w; \
w('yamls/llama1b.yaml', 17, '$root/init', ['variables.data_root=$data'])" || return 1
  local common=(composer train.py yamls/llama1b.yaml "variables.data_root=$data" "global_batch_size=$((2 * GPUS))"
    device_microbatch_size=2 max_duration=20ba log_interval=1ba eval_interval=20ba eval_subset_num_batches=2
    callbacks.speed_monitor.window_size=5 "model.init_from=$root/init" scheduler.t_warmup=2ba)
  for run in fsdp hsdp-first hsdp-resumed; do
    local settings=("variables.checkpoint_root=$root/${run%%-*}")
    [ $run != fsdp ] && settings+=("parallelism.fsdp.replicate_degree=$GPUS" callbacks.stop_after.batches=10)
    echo "===== ($run) ${common[*]} ${settings[*]}"
    "${common[@]}" "${settings[@]}" > "$OUT/hsdp-$run.log" 2>&1
    echo "exit $?"
    grep -E "^run |^  |^eval |rror" "$OUT/hsdp-$run.log" | grep -v Warning | tail -12
    ls $root/${run%%-*}/*/
  done
  python3 - "$OUT"/hsdp-{fsdp,hsdp-first,hsdp-resumed}.log <<'EOF'
import re, sys
lines = lambda path: re.findall(r'^batch (\d+)/\d+  loss (\S+) .*?([\d,]+) tokens/s/GPU', open(path).read(), re.M)
fsdp = {int(b): (float(l), float(t.replace(',', ''))) for b, l, t in lines(sys.argv[1])}
hsdp = {int(b): (float(l), float(t.replace(',', ''))) for path in sys.argv[2:] for b, l, t in lines(path)}
print(f"{'batch':>5} {'FSDP loss':>10} {'HSDP loss':>10} {'diff':>8} {'FSDP tok/s/GPU':>15} {'HSDP tok/s/GPU':>15}")
for batch in sorted(fsdp):
    f, h = fsdp[batch], hsdp.get(batch, (float('nan'),) * 2)
    print(f'{batch:>5} {f[0]:>10.4f} {h[0]:>10.4f} {h[0] - f[0]:>+8.4f} {f[1]:>15,.0f} {h[1]:>15,.0f}')
print('max |HSDP - FSDP| loss:', max(abs(hsdp[b][0] - fsdp[b][0]) for b in fsdp if b in hsdp))
print('tokens/s/GPU at batch 20 (speed_monitor window of batches 16-20): FSDP', fsdp[20][1], 'HSDP', hsdp[20][1])
EOF
  rm -rf $root
}

titan_profile() {  # flavor local-batch setting [wait warmup active]: torchtitan as .anchors/run.sh runs the setting
  # (CP and SEQ from the environment), profiled: `wait` steps (default 4), `warmup` (3), then `active` (3) traced
  local tt=$PWD/.anchors/torchtitan name=profile_$1_$2_$3 wait=${4:-4} warmup=${5:-3} active=${6:-3}
  FLAVOR=$1 LBS=$2 TT_TIMEOUT=1 bash .anchors/run.sh "$3" > /dev/null  # writes anchor_$3.toml (the run is cut at 1 s)
  sed -e "s/^enable_profiling = false/enable_profiling = true\nprofile_freq = $((wait + warmup + active))\nprofiler_warmup = $warmup\nprofiler_active = $active/" \
    -e "s/^steps = .*/steps = $((wait + warmup + active))/" \
    -e "s#/tmp/tt_outputs/$3\"#/tmp/tt_outputs/$name\"#" "$tt/anchor_$3.toml" > "$tt/anchor_$name.toml"
  rm -rf "/tmp/tt_outputs/$name"
  (cd "$tt" && PYTHONPATH=/tmp/site-tt:$tt HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 \
    PYTORCH_ALLOC_CONF=expandable_segments:True timeout 400 torchrun --nproc_per_node="$GPUS" \
    --rdzv_backend c10d --rdzv_endpoint=localhost:0 -m torchtitan.train --job.config_file "anchor_$name.toml") \
    > "$OUT/tt_$name.log" 2>&1 || tail -20 "$OUT/tt_$name.log"
  grep -E "step: +[0-9]+ " "$OUT/tt_$name.log" | sed 's/^.*step:/step:/' | grep -v "^$" | sort -u | tail -12
  local traces=$(ls -d /tmp/tt_outputs/$name/profile_traces/iteration_* | tail -1)
  cp "$traces/rank0_trace.json" "/tmp/titan-$1-b$2-$3.json"
  [ -f "$traces/rank1_trace.json" ] && cp "$traces/rank1_trace.json" "/tmp/titan-$1-b$2-$3.rank1.json"
}

long_data() {  # the shipped streams with 131,072-token windows of random Llama-3 ids: 32 per train, 8 per val stream
  python3 -c "from tests.conftest import write_frontier_data_root as w; w('$1', 131072, 128256, lambda s: 32 if s < 6 else 8)"
}

long_run() {  # log-name overrides...: llama8b-131k.yaml on the GPUs present from scratch, one sequence a CP group
  local data=/tmp/long/data
  [ -d $data ] || long_data $data
  local name=$1; shift
  echo "===== composer train.py yamls/llama8b-131k.yaml variables.data_root=$data variables.init_from=null" \
    "global_batch_size=$((GPUS / 2)) eval_subset_num_batches=1 $*"
  local t0=$SECONDS
  timeout -k 20 "${LONG_TIMEOUT:-540}" composer train.py yamls/llama8b-131k.yaml "variables.data_root=$data" \
    variables.init_from=null "global_batch_size=$((GPUS / 2))" eval_subset_num_batches=1 "$@" > "$OUT/$name.log" 2>&1
  echo "exit $?, $((SECONDS - t0))s wall"
  grep -E "^run |^  |^batch |^eval |rror|Traceback" "$OUT/$name.log" | grep -v Warning | tail -30
}

long_8b() {  # the same command each call: batches 1-5 and a checkpoint (stop_after), then, resumed, 6-10. A checkpoint
  # is 96 GB (fp32 weights and Adam state), two do not fit the disk: in /dev/shm where it has room, and the one
  # resumed from is removed once the resumed run has loaded it.
  local ckpt=/tmp/long/ckpt log=long-8b
  [ -d /dev/shm/long-ckpt ] || [ "$(df --output=avail -B1G /dev/shm | tail -1)" -gt 110 ] && ckpt=/dev/shm/long-ckpt
  local resumed_from=$(ls -d $ckpt/*/ep0-ba* 2>/dev/null)
  if [ -n "$resumed_from" ]; then
    log=long-8b-resumed
    (until grep -q "resuming from the latest checkpoint" "$OUT/$log.log" 2>/dev/null; do sleep 2; done
     rm -rf $resumed_from) &
  fi
  df -h /tmp /dev/shm | tail -2
  long_run $log "variables.checkpoint_root=$ckpt" max_duration=10ba callbacks.stop_after.batches=5
  du -sh $ckpt/*/*
}

AC=parallelism.fsdp.activation_checkpointing
HARNESS_NOISE='Running loglikelihood|Warning|it/s\]'  # the harness's progress lines, left out of the console
# each mode as its name says, whatever the YAML's auto would choose (bf16 unless float8, the weights kept gathered)
KEEP="parallelism.fsdp.reshard_after_forward=false"
declare -A OURS=([none]="$AC=none model.float8=false $KEEP" [selective]="$AC=selective model.float8=false $KEEP"
                 [full]="$AC=full model.float8=false $KEEP" [float8]="$AC=none model.float8=true $KEEP")
declare -A TITAN=([none]=compile [selective]=compile_sac [full]=compile_full [float8]=fp8)

# torchtitan's 1B flavor: Llama-3.2-1B's shape with an untied output layer and Llama-3.1's RoPE scaling (factor 8);
# ours in bf16 without checkpointing (S: the shipped YAML's auto settings)
S="yamls/llama1b.yaml global_batch_size=2 model.tie_embeddings=false model.rope_scaling_factor=8"
L="$S device_microbatch_size=2 $AC=none model.float8=false"
G="yamls/llama1b.yaml global_batch_size=4 model.tie_embeddings=false model.rope_scaling_factor=8"
X="yamls/mixtral8x7b.yaml global_batch_size=4 model.n_layers=2 device_microbatch_size=auto $AC=auto"
declare -A LEARN=([ours]="ours $L" [shipped]="ours-shipped $S" [gpt2]="ours-gpt2-init $L model.init_scheme=gpt2" [hf]="hf hf:$L device_microbatch_size=1"
                  [titan]="torchtitan torchtitan:compile FLAVOR=1B LBS=2" [float8]="ours-float8 $L model.float8=true model.float8_output=true"
                  [float8-blocks]="ours-float8-blocks $L model.float8=true model.float8_output=false"
                  [float8-rowwise]="ours-float8-rowwise $L model.float8=true model.float8_recipe=rowwise"
                  [liger]="ours-liger $L model.fused_kernels=[cross_entropy]" [eager]="ours-eager $L model.compile=false"
                  [titan-fp8]="torchtitan-fp8 torchtitan:fp8 FLAVOR=1B LBS=2"
                  [titan-again]="torchtitan-again torchtitan:compile FLAVOR=1B LBS=2"
                  [ours-2gpu]="ours-2gpu $L device_microbatch_size=1"
                  # the time-to-quality grid (grid): 4 x 8,192 tokens a step, the YAML's auto settings but float8
                  [grid-bf16]="ours-bf16 $G model.float8=false"
                  [grid-float8-blocks]="ours-float8-blocks $G model.float8=true model.float8_output=false"
                  [grid-float8]="ours-float8 $G model.float8=true model.float8_output=true"
                  [grid-float8-rowwise]="ours-float8-rowwise $G model.float8=true model.float8_recipe=rowwise"
                  [grid-titan]="torchtitan torchtitan:compile FLAVOR=1B LBS=4"
                  [grid-titan-fp8]="torchtitan-fp8 torchtitan:fp8 FLAVOR=1B LBS=4"
                  # the 1B's model as shipped (tied embeddings, RoPE factor 32: not torchtitan's flavor), from its
                  # own weights: float8 with the output layer (the default until the grid's first cell), float8
                  # blocks only (until its Python lr 3e-4 cell), bf16 (auto's since), rowwise float8 blocks
                  [grid-shipped]="ours-shipped yamls/llama1b.yaml global_batch_size=4 model.float8=true model.float8_output=true"
                  [grid-shipped-blocks]="ours-shipped-float8-blocks yamls/llama1b.yaml global_batch_size=4 model.float8=true model.float8_output=false"
                  [grid-shipped-bf16]="ours-shipped-bf16 yamls/llama1b.yaml global_batch_size=4 model.float8=false"
                  [grid-shipped-rowwise]="ours-shipped-float8-rowwise yamls/llama1b.yaml global_batch_size=4 model.float8=true model.float8_recipe=rowwise model.float8_output=false"
                  # 2 GPUs: llama8b.yaml as shipped (auto; one sample a GPU, so 300 steps fit a call) beside
                  # torchtitan's fp8 (its llama3 config: the output layer in bf16), from the 8B's weights
                  [grid-8b]="ours-8b yamls/llama8b.yaml global_batch_size=2"
                  [grid-8b-titan-fp8]="torchtitan-fp8 torchtitan:fp8 FLAVOR=8B LBS=1"
                  # Mixtral's width with 2 layers, from its own weights: bf16, float8 on the attention, and on the
                  # experts' grouped GEMMs too (issue 67: float8 experts where the held-out loss holds)
                  [grid-mixtral-bf16]="ours-mixtral-bf16 $X model.float8=false"
                  [grid-mixtral-float8]="ours-mixtral-float8 $X model.float8=true"
                  [grid-mixtral-float8-experts]="ours-mixtral-float8-experts $X model.float8=true model.float8_experts=true")

learning_name() {  # seeds rows...: the file name (no extension) of a learning call's JSON and log
  local seeds=$1; shift
  echo "learning-${CELL:+$CELL-}${STEPS:-500}-${seeds// /-}-$(IFS=-; echo "$*")"
}

learning() {  # seeds rows...: the learning benchmark's rows (LEARN) on each seed
  local seeds=$1 rows=() row name=$(learning_name "$@"); shift
  for row in "$@"; do rows+=(--row "${LEARN[$row]}"); done
  python3 scripts/measure_learning.py --steps "${STEPS:-500}" --seeds $seeds --single-seed hf \
    --work "${LEARNING_WORK:-/tmp/learning}" --corpus-mb "${CORPUS_MB:-40}" \
    --gpus "${LEARNING_GPUS:-1}" ${LR:+--lr "$LR"} ${ROOTS:+--roots $ROOTS --suffix "${SUFFIX:-.py}"} \
    ${SHARED_INIT:+--shared-init "${LEARN[$SHARED_INIT]}"} \
    ${EVAL_EVERY:+--eval-every "$EVAL_EVERY" --quality "${QUALITY:-ours:torchtitan}"} ${STOP_BY:+--stop-by "$STOP_BY"} \
    ${TRANSFORMERS_CHECK:+--transformers-check "$TRANSFORMERS_CHECK"} ${TT_RANKS:+--torchtitan-ranks "$TT_RANKS"} \
    --json "$OUT/$name.json" --versus ours:torchtitan "${rows[@]}" \
    2>&1 | tee "$OUT/$name.log" | grep -E "^(===|corpus|steps| +[0-9]+-|ours|hf |run |target|row |torchtitan|Traceback)|Error"
}

grid_weights() {  # row: the weights a grid row starts from: torchtitan's 1B flavor's, the shipped tied 1B's, the 8B's,
  # Mixtral's (2 layers)
  case $1 in grid-shipped*) echo shipped ;; grid-8b*) echo 8b ;; grid-mixtral*) echo mixtral ;; *) echo 1b ;; esac
}

grid() {  # corpus lr ROW[@STEPS]...: one cell of the time-to-quality grid, its rows one after the other; consecutive
  # rows from the same weights and of the same schedule train in one learning call (a JSON each)
  local corpus=$1 lr=$2 roots= suffix= megabytes=40; shift 2
  case $corpus in
    python) ;;
    prose) roots=.corpora/linux-doc suffix=.rst.txt megabytes=18 ;;  # carried: data_prep/linux_doc_corpus.sh
    *) echo "grid: the corpus is python or prose, not '$corpus'"; return 2 ;;
  esac
  local row group=() key= longest=0 t0
  for row in "$@" ""; do
    local next=${row:+$(grid_weights "${row%@*}")@$(grid_steps "$row")}
    if [ ${#group[@]} -gt 0 ] && [ "$next" != "$key" ]; then
      # STOP_BY (540 s of the call's 600): a group is not begun where its rows, as long as the longest so far,
      # would end after it (the install and imports come first, transformers' check, ~45 s on an H200, after)
      if [ $((SECONDS + longest * ${#group[@]})) -gt "${STOP_BY:-540}" ] && [ $longest -gt 0 ]; then
        echo "=== ${group[*]}: not begun: a row took up to ${longest} s, $((${STOP_BY:-540} - SECONDS)) s are left"
      else
        t0=$SECONDS
        grid_group "$corpus" "$lr" "$roots" "$suffix" "$megabytes" "${key#*@}" "${group[@]}"
        longest=$(( (SECONDS - t0) / ${#group[@]} > longest ? (SECONDS - t0) / ${#group[@]} : longest ))
      fi
      group=()
    fi
    [ -n "$row" ] && { group+=("${row%@*}"); key=$next; }
  done
}

grid_steps() {  # ROW[@STEPS]: its schedule's steps (GRID_STEPS, else the family's: 300 for the 8B, 400 else)
  if [[ $1 == *@* ]]; then echo "${1#*@}"; elif [ "$(grid_weights "$1")" = 8b ]; then echo "${GRID_STEPS:-300}"
  else echo "${GRID_STEPS:-400}"; fi
}

grid_group() {  # corpus lr roots suffix megabytes steps rows...: rows from the same weights, one learning call
  local corpus=$1 lr=$2 roots=$3 suffix=$4 megabytes=$5 steps=$6; shift 6
  local init=grid-bf16 quality=ours-bf16:torchtitan gpus=1
  case $(grid_weights "$1") in
    shipped) init=grid-shipped-bf16 quality=ours-shipped-bf16:ours-shipped-bf16 ;;
    8b) init=grid-8b quality=ours-8b:ours-8b gpus=2 ;;
    mixtral) init=grid-mixtral-bf16 quality=ours-mixtral-bf16:ours-mixtral-bf16 ;;
  esac
  CELL=$corpus-$lr STEPS=$steps LR=$lr EVAL_EVERY=100 QUALITY=$quality SHARED_INIT=$init \
    STOP_BY=$(( ${STOP_BY:-540} - SECONDS )) TRANSFORMERS_CHECK=${TRANSFORMERS_CHECK-ours-bf16} \
    LEARNING_GPUS=$gpus TT_RANKS=$gpus CORPUS_MB=$megabytes ROOTS=$roots SUFFIX=$suffix \
    LEARNING_WORK=/tmp/learning-$corpus${LANE:-} \
    learning "${GRID_SEED:-1}" "$@"
}

lanes() {  # "command-a" "command-b": 2 GPUs, a lane each at once: this script's command-a on GPU 0 while command-b
  # runs on GPU 1 (each line of their output marked [a] or [b], also in $OUT/lane-a.log and lane-b.log)
  GPU_SH_SECONDS=$SECONDS CUDA_VISIBLE_DEVICES=0 LANE=-a bash "$0" $1 2>&1 | tee "$OUT/lane-a.log" | sed 's/^/[a] /' &
  GPU_SH_SECONDS=$SECONDS CUDA_VISIBLE_DEVICES=1 LANE=-b bash "$0" $2 2>&1 | tee "$OUT/lane-b.log" | sed 's/^/[b] /' &
  wait
}

learning_split() {  # seeds row-a row-b: row-a's runs on GPU 0 while row-b's run on GPU 1 (each its own corpus from
  # the same files, every seed's weights drawn alike on the CPU), then one report of both, row-a versus row-b
  local seeds=$1 a=$2 b=$3
  CUDA_VISIBLE_DEVICES=0 LEARNING_WORK=/tmp/learning-a learning "$seeds" "$a" | sed 's/^/[a] /' &
  CUDA_VISIBLE_DEVICES=1 LEARNING_WORK=/tmp/learning-b learning "$seeds" "$b" | sed 's/^/[b] /' &
  wait
  python3 scripts/measure_learning.py --report "$OUT/$(learning_name "$seeds" "$a").json" \
    "$OUT/$(learning_name "$seeds" "$b").json" --versus "${LEARN[$a]%% *}:${LEARN[$b]%% *}" \
    --json "$OUT/$(learning_name "$seeds" "$a" "$b").json" | tee "$OUT/$(learning_name "$seeds" "$a" "$b").log"
}

bench_8b() {  # modes (none selective full float8): the 8B as shipped beside torchtitan, the mode's rows only, all
  # the modes REPEATS times (default 1; rows named MODE-I when more)
  local y=yamls/llama8b.yaml b="global_batch_size=$GPUS" rows=() mode name i repeats=${REPEATS:-1}
  for i in $(seq "$repeats"); do
    for mode in $*; do
      name=$mode
      [ "$repeats" -gt 1 ] && name=$mode-$i
      rows+=(--row "ours-$name $y $b ${OURS[$mode]}" --row "titan-$name torchtitan:${TITAN[$mode]} FLAVOR=8B LBS=1"
             --versus "ours-$name:titan-$name")
    done
  done
  local modes="$*"
  python3 scripts/measure_speed.py --gpus "$GPUS" --warmup 4 --steps 8 --json "$OUT/bench-8b-${modes// /-}.json" "${rows[@]}"
}

gpu_lane() {  # name gpu rows...: scripts/measure_speed.py's rows on that one GPU (3 warm-up, 8 timed steps), beside
  # another lane on another GPU; $OUT/NAME-gpuGPU.json and .log
  local name=$1 gpu=$2; shift 2
  CUDA_VISIBLE_DEVICES=$gpu python3 scripts/measure_speed.py --gpus 1 --warmup 3 --steps 8 \
    --json "$OUT/$name-gpu$gpu.json" "$@" 2>&1 | grep -v Warning > "$OUT/$name-gpu$gpu.log"
}

profile() {  # flavor local-batch yaml mode [ours]: ours (scripts/profile_run.py) beside torchtitan (or ours alone),
  # the same steps profiled
  local flavor=$1 lbs=$2 yaml=$3 mode=$4 name=$1-b$2-$4 traces=()
  composer -n "$GPUS" scripts/profile_run.py "$yaml" "global_batch_size=$((lbs * GPUS))" \
    "device_microbatch_size=$lbs" ${OURS[$mode]} --warmup 7 --steps 3 --trace "/tmp/ours-$name.json" --syncs 2>&1 |
    grep -v Warning | tail -45
  traces=("ours=/tmp/ours-$name.json")
  if [ -z "${5:-}" ]; then
    titan_profile "$flavor" "$lbs" "${TITAN[$mode]}"
    traces+=("torchtitan=/tmp/titan-$flavor-b$lbs-${TITAN[$mode]}.json")
  fi
  python3 scripts/compare_profiles.py "${traces[@]}" --kernels 30 --gaps 12 --json "$OUT/profile-$name.json"
}

case "${1:-}" in
  tests) shift; gpu_tests "$@" ;;
  tests-of) shift; make test-gpu TEST_PYTHON=python3 TESTS="${*:-tests}" ;;
  shipped) shipped llama8b.yaml && shipped llama70b.yaml 2 ;;
  shipped-8b) shipped llama8b.yaml ;;
  shipped-70b) shipped llama70b.yaml 2 ;;
  hsdp) hsdp ;;
  bench-1b)
    Y=yamls/llama1b.yaml
    python3 scripts/measure_speed.py --gpus 1 --warmup 5 --steps 10 --json "${2:-$OUT/bench-1b.json}" \
      --row "ours-b2 $Y global_batch_size=2 device_microbatch_size=2" --row "titan-b2 torchtitan:compile FLAVOR=1B LBS=2" \
      --row "ours-b4 $Y global_batch_size=4" --row "titan-b4 torchtitan:compile FLAVOR=1B LBS=4" \
      --row "hf hf:$Y global_batch_size=1 device_microbatch_size=1" \
      --row "ours-b2-compiled-ce $Y global_batch_size=2 device_microbatch_size=2 model.fused_kernels=[]" \
      --row "ours-b4-compiled-ce $Y global_batch_size=4 model.fused_kernels=[]" \
      --versus ours-b2:titan-b2 --versus ours-b4:titan-b4 --versus ours-b2-compiled-ce:titan-b2 \
      --versus ours-b4-compiled-ce:titan-b4 ;;
  speed-1b)  # [repeats]: ours as shipped beside torchtitan compile at local batch 2 and 4, each pair REPEATS times
    Y=yamls/llama1b.yaml rows=()
    for i in $(seq "${2:-1}"); do
      rows+=(--row "ours-b2-$i $Y global_batch_size=2 device_microbatch_size=2" --versus "ours-b2-$i:titan-b2-$i"
             --row "titan-b2-$i torchtitan:compile FLAVOR=1B LBS=2" --row "ours-b4-$i $Y global_batch_size=4"
             --row "titan-b4-$i torchtitan:compile FLAVOR=1B LBS=4" --versus "ours-b4-$i:titan-b4-$i")
    done
    python3 scripts/measure_speed.py --gpus 1 --warmup 5 --steps 15 --json "$OUT/speed-1b.json" "${rows[@]}" ;;
  plan-1b)  # [settings|versus] one GPU, 1B, 8 samples a step: the run plan's predictions beside the measured peak
    # memory and tokens/s. settings: eight explicit settings (fit_check=false: those predicted not to fit run too);
    # versus: the shipped YAML's auto choice beside torchtitan compile (its default, bf16) at local batch 4, twice
    Y="yamls/llama1b.yaml global_batch_size=8 fit_check=false" M=device_microbatch_size F=model.float8
    A=parallelism.fsdp.activation_checkpointing R=parallelism.fsdp.reshard_after_forward part=${2:-settings}
    rows=()
    if [ "$part" = settings ]; then
      for s in "1 none false" "2 none false" "4 none false" "8 none false" "8 selective false" "8 full false" \
               "4 none true" "8 none true"; do
        set -- $s
        rows+=(--row "mb$1-$2$([ "$3" = true ] && echo -f8) $Y $M=$1 $A=$2 $F=$3 $R=false")
      done
    else
      for i in 1 2; do
        rows+=(--row "shipped-$i yamls/llama1b.yaml global_batch_size=8" --row "titan-$i torchtitan:compile FLAVOR=1B LBS=4"
               --versus "shipped-$i:titan-$i")
      done
    fi
    python3 scripts/measure_speed.py --gpus 1 --warmup 3 --steps 5 --json "$OUT/plan-1b-$part.json" "${rows[@]}" ;;
  plan-8b)  # [settings|versus] the GPUs present (2), 8B, 2 samples a GPU a step: as plan-1b. settings: eight explicit
    # settings (PLAN_ROWS="1 2 3 4": those of them alone, as two calls' worth); versus: llama8b.yaml as shipped (auto)
    # at 1 sample a GPU beside torchtitan compile (bf16, LBS 1), twice
    Y="yamls/llama8b.yaml global_batch_size=$((2 * GPUS)) fit_check=false" M=device_microbatch_size F=model.float8
    A=parallelism.fsdp.activation_checkpointing R=parallelism.fsdp.reshard_after_forward part=${2:-settings} i=0
    rows=()
    if [ "$part" = settings ]; then
      for s in "1 none false false" "1 none true false" "2 none false false" "1 selective false false" \
               "2 full false false" "1 none false true" "2 none false true" "2 selective true true"; do
        i=$((i + 1))
        [ -n "${PLAN_ROWS:-}" ] && [[ " $PLAN_ROWS " != *" $i "* ]] && continue
        set -- $s
        rows+=(--row "mb$1-$2$([ "$3" = true ] && echo -reshard)$([ "$4" = true ] && echo -f8) $Y $M=$1 $A=$2 $R=$3 $F=$4")
      done
    else
      for i in 1 2; do
        rows+=(--row "shipped-$i yamls/llama8b.yaml global_batch_size=$GPUS"
               --row "titan-$i torchtitan:compile FLAVOR=8B LBS=1" --versus "shipped-$i:titan-$i")
      done
    fi
    python3 scripts/measure_speed.py --gpus "$GPUS" --warmup 3 --steps 4 --json "$OUT/plan-8b-$part.json" "${rows[@]}" ;;
  syncs-1b)  # the host syncs of one batch of yamls/llama1b.yaml at local batch 2
    composer -n 1 scripts/profile_run.py yamls/llama1b.yaml global_batch_size=2 device_microbatch_size=2 --warmup 4 \
      --steps 1 --syncs 2>&1 | grep -v Warning | tail -30 ;;
  profile-mixtral)  # [LAYERS] [MICRO ...]: Mixtral-8x7B width (LAYERS: 2), 4 samples of 4,096 tokens a GPU a step, no
    # checkpointing, at each micro-batch (1 2 4): ours beside transformers' MixtralForCausalLM, the same steps profiled
    layers=${2:-2}; shift $(( $# < 2 ? $# : 2 ))
    for micro in ${*:-1 2 4}; do
      Y="yamls/mixtral8x7b.yaml global_batch_size=$((${SAMPLES:-4} * GPUS)) model.n_layers=$layers"
      Y="$Y device_microbatch_size=$micro $AC=none"
      for model in ours hf; do
        composer -n "$GPUS" scripts/profile_run.py $Y --model $model --warmup 4 --steps 2 \
          --trace "/tmp/$model-mixtral-mb$micro.json" 2>&1 | grep -v Warning | tail -16
      done
      python3 scripts/compare_profiles.py "ours=/tmp/ours-mixtral-mb$micro.json" "hf=/tmp/hf-mixtral-mb$micro.json" \
        --kernels 25 --gaps 8 --json "$OUT/profile-mixtral-${layers}layers-b${SAMPLES:-4}-mb$micro.json"
    done ;;
  profile-1b) profile 1B 2 yamls/llama1b.yaml none ;;
  profile-1b-ours) profile 1B 2 yamls/llama1b.yaml none ours ;;
  profile-8b) shift; for mode in ${*:-none}; do profile 8B 1 yamls/llama8b.yaml "$mode"; done ;;
  profile-8b-ours) shift; for mode in ${*:-none}; do profile 8B 1 yamls/llama8b.yaml "$mode" ours; done ;;
  float8-8b)  # llama8b.yaml in float8 at 2 samples a GPU beside torchtitan fp8 at LBS 2, twice, and at LBS 1; the bf16
    # row of bench-8b (none) beside torchtitan compile, between them
    Y=yamls/llama8b.yaml F=model.float8=true
    python3 scripts/measure_speed.py --gpus "$GPUS" --warmup 3 --steps 5 --json "$OUT/float8-8b.json" \
      --row "float8-1 $Y global_batch_size=$((2 * GPUS)) $F" --row "titan-fp8-1 torchtitan:fp8 FLAVOR=8B LBS=2" \
      --row "ours-bf16 $Y global_batch_size=$GPUS ${OURS[none]}" --row "titan-compile torchtitan:compile FLAVOR=8B LBS=1" \
      --row "float8-2 $Y global_batch_size=$((2 * GPUS)) $F" --row "titan-fp8-2 torchtitan:fp8 FLAVOR=8B LBS=2" \
      --row "titan-fp8-b1 torchtitan:fp8 FLAVOR=8B LBS=1" --versus float8-1:titan-fp8-1 \
      --versus float8-2:titan-fp8-2 --versus ours-bf16:titan-compile ;;
  float8-1b)  # two lanes, one a GPU, at once: llama1b.yaml in float8 at its 4 samples a GPU, twice, and with the
    # garbage_collection callback; at local batch 2 and 8; torchtitan compile at LBS 4
    Y="yamls/llama1b.yaml model.float8=true" GC="callbacks.garbage_collection={}"
    lane() { gpu_lane float8-1b "$@"; }
    lane 0 --row "float8-1 $Y global_batch_size=4" --row "gc-1 $Y global_batch_size=4 $GC" \
      --row "b2 $Y global_batch_size=2 device_microbatch_size=2" --row "titan-b4 torchtitan:compile FLAVOR=1B LBS=4" \
      --versus float8-1:titan-b4 &
    lane 1 --row "float8-2 $Y global_batch_size=4" --row "gc-2 $Y global_batch_size=4 $GC" \
      --row "float8-b8 $Y global_batch_size=8" &
    wait
    tail -n 25 "$OUT"/float8-1b-gpu*.log ;;
  float8-output)  # two lanes, one a GPU, at once: llama1b.yaml in float8 at its 4 samples a GPU with the output
    # layer's GEMMs in float8 (model.float8_output=true) beside the output layer in bf16, twice; torchtitan compile
    # and fp8 at LBS 4; then the float8 output layer's GPU test
    Y="yamls/llama1b.yaml global_batch_size=4 model.float8=true" O=model.float8_output=true
    lane() { gpu_lane float8-output "$@"; }
    lane 0 --row "output-1 $Y $O" --row "blocks-1 $Y" --row "titan-b4 torchtitan:compile FLAVOR=1B LBS=4" \
      --versus output-1:blocks-1 --versus output-1:titan-b4 &
    lane 1 --row "output-2 $Y $O" --row "blocks-2 $Y" --row "titan-fp8-b4 torchtitan:fp8 FLAVOR=1B LBS=4" \
      --versus output-2:blocks-2 --versus output-2:titan-fp8-b4 &
    wait
    tail -n 20 "$OUT"/float8-output-gpu*.log
    make test-gpu TEST_PYTHON=python3 TESTS="tests/test_parallelism_gpu.py::test_the_float8_output_layer_gives_the_bf16_loss_and_gradients_without_more_memory" 2>&1 | tail -8 ;;
  bench-8b) shift; bench_8b "${@:-none selective full float8}" ;;
  bench-mixtral)
    M="yamls/mixtral8x7b.yaml global_batch_size=$((${3:-4} * GPUS)) model.n_layers=${2:-3} $AC=none"
    python3 scripts/measure_speed.py --gpus "$GPUS" --warmup 4 --steps 8 --json "$OUT/bench-mixtral.json" \
      --row "ours $M" --row "hf hf:$M" --row "hf-loop hf-loop:$M" --versus ours:hf --versus ours:hf-loop ;;
  plan-mixtral)  # [LAYERS] the GPUs present, Mixtral-8x7B width with LAYERS layers (default 2), 4 samples of 4,096
    # tokens a GPU a step (the YAML's share of its global batch): the run plan's predicted peak memory and tokens/s
    # beside the measured at six explicit settings (fit_check=false), the settings auto takes, and transformers'
    # MixtralForCausalLM (its grouped_mm experts) at the micro-batch auto took
    Y="yamls/mixtral8x7b.yaml global_batch_size=$((4 * GPUS)) model.n_layers=${2:-2} fit_check=false"
    M=device_microbatch_size A=parallelism.fsdp.activation_checkpointing R=parallelism.fsdp.reshard_after_forward
    rows=()
    for s in "1 none" "2 none" "4 none" "1 selective" "4 selective" "4 full"; do
      set -- $s
      rows+=(--row "mb$1-$2 $Y $M=$1 $A=$2")
    done
    python3 scripts/measure_speed.py --gpus "$GPUS" --warmup 3 --steps 5 --json "$OUT/plan-mixtral.json" "${rows[@]}" \
      --row "auto $Y $M=auto $A=auto $R=auto" --row "hf-mb4 hf:$Y $M=4 $A=none" --versus auto:hf-mb4 ;;
  float8-mixtral)  # [LAYERS] the GPUs present, Mixtral-8x7B width with LAYERS layers (default 2), 4 samples of 4,096
    # tokens a GPU, the settings auto takes: bf16, float8 on the blocks' linears, and on the experts' grouped GEMMs too
    Y="yamls/mixtral8x7b.yaml global_batch_size=$((4 * GPUS)) model.n_layers=${2:-2} fit_check=false"
    A="device_microbatch_size=auto parallelism.fsdp.activation_checkpointing=auto"
    python3 scripts/measure_speed.py --gpus "$GPUS" --warmup 3 --steps 5 --json "$OUT/float8-mixtral.json" \
      --row "bf16 $Y $A model.float8=false" --row "float8 $Y $A model.float8=true" \
      --row "float8-experts $Y $A model.float8=true model.float8_experts=true" \
      --versus float8:bf16 --versus float8-experts:bf16 ;;
  mfu-mixtral)  # [LAYERS] one GPU: Mixtral-8x7B width, LAYERS layers (2), at 4, 8 (twice) and 16 samples of 4,096
    # tokens a step on auto settings, and transformers' MixtralForCausalLM at 8 (micro-batch 4, no checkpointing)
    Y="yamls/mixtral8x7b.yaml model.n_layers=${2:-2}" A="device_microbatch_size=auto $AC=auto"
    python3 scripts/measure_speed.py --gpus 1 --warmup 3 --steps 8 --json "$OUT/mfu-mixtral.json" \
      --row "auto-b4 $Y $A global_batch_size=4" --row "auto-b8 $Y $A global_batch_size=8" \
      --row "hf-b8 hf:$Y global_batch_size=8 device_microbatch_size=4 $AC=none" \
      --row "auto-b8-again $Y $A global_batch_size=8" --row "auto-b16 $Y $A global_batch_size=16" \
      --versus auto-b8:hf-b8 2>&1 | tee "$OUT/mfu-mixtral.log" ;;
  lanes) lanes "$2" "$3" ;;
  ep-mixtral)  # [LAYERS] 2 GPUs: Mixtral-8x7B width with LAYERS layers (default 8), 4 samples of 4,096 tokens a GPU on
    # auto settings: FSDP2 alone beside the experts split over both GPUs (expert parallel 2, built on meta as auto
    # does, then on each rank's CPU as it does to load init_from: model.init_device=cpu)
    Y="yamls/mixtral8x7b.yaml global_batch_size=$((4 * GPUS)) model.n_layers=${2:-8}"
    A="device_microbatch_size=auto parallelism.fsdp.activation_checkpointing=auto parallelism.fsdp.reshard_after_forward=auto"
    E=parallelism.expert_parallel_degree
    python3 scripts/measure_speed.py --gpus "$GPUS" --warmup 3 --steps 5 --json "$OUT/ep-mixtral.json" \
      --row "fsdp $Y $A $E=1" --row "ep2 $Y $A $E=2" --row "ep2-cpu $Y $A $E=2 model.init_device=cpu" \
      --versus ep2:fsdp 2>&1 | tee "$OUT/ep-mixtral.log" ;;
  bench) shift; python3 scripts/measure_speed.py --gpus "$GPUS" "$@" ;;
  learning) shift; learning "$@" ;;
  grid) shift; grid "$@" ;;
  grid-lanes) lanes "grid $2 $3 $4" "grid $2 $3 $5" ;;  # CORPUS LR ROW-A ROW-B: grid's cell, a row a GPU at once
  grid-speed)  # [ROW ...]: the grid's rows' tokens/s in one call (random tokens at the grid's 4 x 8,192, 5 warm-up and
    # 30 timed steps; default: the shipped tied rows and torchtitan's): one machine's speeds for --decide --speeds
    shift
    rows=()
    for row in ${*:-grid-shipped-blocks grid-shipped-bf16 grid-shipped grid-titan grid-titan-fp8}; do
      rows+=(--row "${LEARN[$row]}")
    done
    python3 scripts/measure_speed.py --gpus 1 --warmup 5 --steps 30 --json "$OUT/grid-speed.json" "${rows[@]}" \
      2>&1 | tee "$OUT/grid-speed.log" ;;
  learning-split) shift; learning_split "$@" ;;
  learning-2gpu)
    seed=${2:-1}
    export SHARED_INIT=ours CORPUS_MB=${CORPUS_MB:-16}
    learning "$seed" ours && LEARNING_GPUS=2 learning "$seed" ours-2gpu || exit 1
    python3 scripts/measure_learning.py --report "$OUT/$(learning_name "$seed" ours).json" \
      "$OUT/$(learning_name "$seed" ours-2gpu).json" --versus ours-2gpu:ours \
      --json "$OUT/$(learning_name "$seed" 1gpu 2gpu).json" ;;
  downstream)
    shift
    TORCH_LOGS=recompiles python3 scripts/measure_downstream.py --json "$OUT/downstream.json" "$@" 2>&1 | tee "$OUT/downstream.log" |
      grep -v -E "$HARNESS_NOISE"
    for run in /tmp/bench_downstream/run-*gpu; do cp "$run/train.log" "$OUT/downstream-$(basename "$run")-train.log"; done ;;
  downstream-2gpu)  # in-loop only (no HF backend): on 1 GPU, then on 2 with the same global batch, metrics beside
    shift
    for n in 1 2; do
      second=()
      [ "$n" = 2 ] && second=(--against "$OUT/downstream-1gpu.json" --rescore)
      python3 scripts/measure_downstream.py --gpus "$n" "${second[@]}" --json "$OUT/downstream-${n}gpu.json" "$@" \
        --hf-batch-sizes 2>&1 | tee "$OUT/downstream-${n}gpu.log" | grep -v -E "$HARNESS_NOISE"
      cp "/tmp/bench_downstream/run-${n}gpu/train.log" "$OUT/downstream-${n}gpu-train.log"
    done ;;
  generation)
    shift
    python3 scripts/measure_generation.py --json "$OUT/generation.json" "$@" 2>&1 | tee "$OUT/generation.log" |
      grep -v -E "$HARNESS_NOISE|Running generate_until" ;;
  attention)
    timeout 60 python3 scripts/measure_step_parts.py --preset 8b --tokens 8192 --parts attention \
      --json "$OUT/attention-8192.json"
    timeout 120 torchrun --nproc_per_node "$GPUS" scripts/measure_step_parts.py --preset 8b --tokens 131072 \
      --parts attention --json "$OUT/attention-131072-cp$GPUS.json" ;;
  profile-long)  # OURS_ONLY=1: ours alone. NCCL's transports (INIT logs) are listed: a slow path shows there
    shift
    export NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT
    timeout 300 composer -n "$GPUS" scripts/profile_run.py yamls/llama8b-131k.yaml variables.init_from=null \
      "global_batch_size=$((GPUS / 2))" "$@" --warmup 2 --steps 1 --trace /tmp/ours-long.json > "$OUT/ours-long.log" 2>&1
    grep -v "Warning\|NCCL INFO" "$OUT/ours-long.log" | tail -30
    traces=(ours=/tmp/ours-long.json ours-rank1=/tmp/ours-long.rank1.json)
    if [ -z "${OURS_ONLY:-}" ]; then
      CP=2 SEQ=131072 titan_profile 8B 1 compile_full 3 1 1
      traces+=(torchtitan=/tmp/titan-8B-b1-compile_full.json torchtitan-rank1=/tmp/titan-8B-b1-compile_full.rank1.json)
    fi
    for log in "$OUT/ours-long.log" "$OUT/tt_profile_8B_1_compile_full.log"; do
      [ -f "$log" ] && echo "$log: NCCL channels" && grep -o "via [A-Za-z0-9/_]*" "$log" | sort | uniq -c
    done
    python3 scripts/compare_profiles.py "${traces[@]}" --kernels 25 --gaps 8 --json "$OUT/profile-long.json" \
      --timelines "$OUT/timelines" ;;
  bench-long)  # [ROWS]: of ours (as shipped), ours-full (full AC), titan (compile_full), titan-sac
    shift
    Y="yamls/llama8b-131k.yaml variables.init_from=null global_batch_size=$((GPUS / 2))" T="FLAVOR=8B LBS=1 CP=2 SEQ=131072"
    declare -A LONG=([ours]="ours $Y" [ours-full]="ours-full $Y $AC=full"
                     [titan]="titan torchtitan:compile_full $T" [titan-sac]="titan-sac torchtitan:compile_sac $T")
    rows=()
    for row in ${*:-ours ours-full titan titan-sac}; do rows+=(--row "${LONG[$row]}"); done
    python3 scripts/measure_speed.py --gpus "$GPUS" --warmup 2 --steps 4 --json "$OUT/bench-long-$(IFS=-; echo "${*:-all}").json" \
      "${rows[@]}" --versus ours:titan --versus ours-full:titan --versus ours:titan-sac ;;
  long-table)
    Y="yamls/llama8b-131k.yaml variables.init_from=null"
    python3 scripts/measure_speed.py --gpus "$GPUS" --warmup 2 --steps 4 --json "$OUT/long-table.json" \
      --row "8k-cp1 $Y max_seq_len=8192 parallelism.context_parallel_degree=1 global_batch_size=$GPUS" \
      --row "8k-cp2 $Y max_seq_len=8192 global_batch_size=$((GPUS / 2))" \
      --row "32k-cp1 $Y max_seq_len=32768 parallelism.context_parallel_degree=1 global_batch_size=$GPUS" \
      --row "32k-cp2 $Y max_seq_len=32768 global_batch_size=$((GPUS / 2))" ;;
  long-smoke) long_run long-smoke variables.checkpoint_root=/tmp/long/smoke model.n_layers=2 max_duration=3ba
    rm -rf /tmp/long/smoke ;;
  long-8b) long_8b ;;
  *) sed -n 2,10p "$0"; exit 2 ;;
esac
