#!/usr/bin/env bash
# One task per node (srun --ntasks-per-node=1): start Composer's launcher for this node's GPUs, with the node
# rank and master address that Slurm gives. Re-submitting the same job autoresumes from the latest checkpoint.
#   usage: launch.sh <run.yaml> [key=value ...]
# Environment: GPUS_PER_NODE (default 8), MASTER_PORT (default 29500), DRY_RUN=1 prints the command only.
# MIN_NODES=M: torchrun's elastic agent instead (python -m llmfoundry_ext.elastic_launch: torchrun, its end told in
# one line; --nnodes=M:<the job's nodes>, its c10d rendezvous on the job's first host, MAX_RESTARTS restarts,
# default 3; JOIN_TIMEOUT seconds, default 600, for the job's minimum of nodes to gather): when a node is lost, the
# nodes left go on from the last checkpoint without a re-submission, down to M (docs/reliability.md; submit with
# sbatch --no-kill).
set -euo pipefail
gpus_per_node=${GPUS_PER_NODE:-8}
nodes=${SLURM_JOB_NUM_NODES:-${SLURM_NNODES:?run under Slurm (SLURM_NNODES is not set)}}
node_rank=${SLURM_NODEID:?run under srun (SLURM_NODEID is not set)}
master_addr=$(scontrol show hostnames "${SLURM_JOB_NODELIST:?SLURM_JOB_NODELIST is not set}" | head -n 1)
if [[ -n "${MIN_NODES:-}" ]]; then
  # each restart's workers a store of their own: torchrun's agents share theirs over restarts, and a restarted group
  # read the dead group's addresses from it (torch 2.11; tests/measure/test_elastic_chaos.py)
  export TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1
  command=(python -m llmfoundry_ext.elastic_launch --nnodes "$MIN_NODES:$nodes" --nproc-per-node "$gpus_per_node"
           --rdzv-backend c10d --rdzv-endpoint "$master_addr:${MASTER_PORT:-29500}"
           --rdzv-id "${SLURM_JOB_ID:-llmfoundry_ext}" --rdzv-conf "join_timeout=${JOIN_TIMEOUT:-600}"
           --max-restarts "${MAX_RESTARTS:-3}" train.py "$@")
else
  command=(composer --world_size $((nodes * gpus_per_node)) --nproc "$gpus_per_node" --node_rank "$node_rank"
           --master_addr "$master_addr" --master_port "${MASTER_PORT:-29500}" train.py "$@")
fi
if [[ "${DRY_RUN:-0}" == 1 ]]; then
  echo "${command[*]}"
else
  exec "${command[@]}"
fi
