#!/usr/bin/env bash
# Run by every task of `srun --ntasks-per-node=1` (see ../cmd_backends.sh): starts torchrun for
# this node. All nodes meet at a c10d rendezvous on the first node of the job's allocation; the
# job id names the rendezvous. torchrun does not restart failed workers (--max_restarts=0): a
# failed rank ends this node's torchrun non-zero, and srun --kill-on-bad-exit=1 ends the others.
# Usage: slurm_torchrun.sh NPROC_PER_NODE <program args for torchrun, e.g. -m asrkit train ...>
set -euo pipefail
[ $# -ge 2 ] || { echo "usage: $0 NPROC_PER_NODE -m asrkit train ..." >&2; exit 2; }
nproc=$1; shift
: "${SLURM_JOB_NODELIST:?$0 must run inside a SLURM job step (srun)}"
mapfile -t hosts < <(scontrol show hostnames "$SLURM_JOB_NODELIST")
[ "${#hosts[@]}" -gt 0 ] || { echo "$0: cannot expand SLURM_JOB_NODELIST=$SLURM_JOB_NODELIST" >&2; exit 2; }
port=${ASRKIT_RDZV_PORT:-29400}
echo "[slurm_torchrun] node ${SLURM_NODEID:-?} of ${SLURM_NNODES:-1}: $nproc process(es), rendezvous ${hosts[0]}:$port" >&2
exec torchrun --nnodes="${SLURM_NNODES:-1}" --nproc_per_node="$nproc" \
    --rdzv_backend=c10d --rdzv_endpoint="${hosts[0]}:$port" --rdzv_id="asrkit-${SLURM_JOB_ID:-0}" \
    --max_restarts=0 "$@"
