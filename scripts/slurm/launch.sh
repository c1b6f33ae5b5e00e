#!/usr/bin/env bash
# One task per node (srun --ntasks-per-node=1): start Composer's launcher for this node's GPUs, with the node
# rank and master address that Slurm gives. Re-submitting the same job autoresumes from the latest checkpoint.
#   usage: launch.sh <run.yaml> [key=value ...]
# Environment: GPUS_PER_NODE (default 8), MASTER_PORT (default 29500), DRY_RUN=1 prints the command only.
set -euo pipefail
gpus_per_node=${GPUS_PER_NODE:-8}
nodes=${SLURM_JOB_NUM_NODES:-${SLURM_NNODES:?run under Slurm (SLURM_NNODES is not set)}}
node_rank=${SLURM_NODEID:?run under srun (SLURM_NODEID is not set)}
master_addr=$(scontrol show hostnames "${SLURM_JOB_NODELIST:?SLURM_JOB_NODELIST is not set}" | head -n 1)
command=(composer --world_size $((nodes * gpus_per_node)) --nproc "$gpus_per_node" --node_rank "$node_rank"
         --master_addr "$master_addr" --master_port "${MASTER_PORT:-29500}" train.py "$@")
if [[ "${DRY_RUN:-0}" == 1 ]]; then
  echo "${command[*]}"
else
  exec "${command[@]}"
fi
