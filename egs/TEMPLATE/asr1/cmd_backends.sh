# shellcheck shell=bash
# Launching `asrkit train` on one process, several local processes, or several nodes.
# Sourced by asr.sh (stage 4); the backend is chosen in the recipe's cmd.sh:
#
#   backend=local  this machine. --ngpu N (N > 1): torchrun --standalone --nproc_per_node N
#                  (one process per GPU; on a CPU-only machine, N gloo processes). --num_nodes > 1
#                  is an error (use slurm).
#   backend=slurm  srun starts one task per node (--num_nodes M, default 1); each task runs
#                  utils/slurm_torchrun.sh, i.e. torchrun with --nnodes M --nproc_per_node N and a
#                  c10d rendezvous on the first node of the allocation. srun --kill-on-bad-exit=1
#                  ends every node when one fails. Partition, time limit, CPUs, memory and extra
#                  srun options come from $slurm_conf (default: conf/slurm.conf next to this file;
#                  the format is documented there). asr.sh may run on a login node (srun then asks
#                  for the allocation) or inside `salloc`/`sbatch` (srun uses the allocation).
#
# The experiment dir, manifests and tokenizer must be on a file system all nodes share: every
# rank reads the data, rank 0 writes checkpoints, and a rerun resumes from them.
# A non-empty $train_cmd (cmd.sh) overrides all this: it is used verbatim as the launcher prefix
# and must end with the program, e.g. train_cmd="torchrun --standalone --nproc_per_node 2 -m asrkit".
#
# train_launcher NGPU NUM_NODES  sets the array `launcher`; run "${launcher[@]}" train --config ...
#
# Stop signals. `asrkit train` stopped by SIGTERM/SIGINT/SIGUSR1 finishes its step, saves a
# checkpoint and exits 75 (torchrun, itself signalled, exits 1; train_interrupted tells both
# apart from a failure by EXP/train_info.json). slurm: signal_lead_s in $slurm_conf makes SLURM
# send SIGTERM that many seconds before the time limit (srun --signal=TERM@N, for allocations that
# srun makes; in an sbatch script put `#SBATCH --signal=TERM@N` yourself), and torchrun waits as
# long for its workers to save (TORCH_ELASTIC_SHUTDOWN_TIMEOUT) instead of 30 s. requeue=true
# makes an interrupted sbatch job requeue itself (train_requeue): the requeued job reruns the
# recipe, which resumes training.

_asrkit_backends_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

_asrkit_read_slurm_conf() {  # key=value lines of $1 -> variables slurm_<key>
    local file=$1 key value
    slurm_partition= slurm_time_limit= slurm_gpus_per_node=auto slurm_cpus_per_gpu= slurm_cpus_per_task=
    slurm_mem= slurm_rdzv_port=29400 slurm_extra_args= slurm_signal_lead_s=0 slurm_requeue=false
    [ -f "$file" ] || { echo "cmd_backends.sh: slurm config $file does not exist" >&2; return 2; }
    while IFS= read -r line || [ -n "$line" ]; do
        line=${line%%#*}
        [[ "$line" =~ ^[[:space:]]*$ ]] && continue
        key=${line%%=*}; value=${line#*=}
        key=$(echo "$key" | tr -d '[:space:]'); value=$(echo "$value" | sed 's/^[[:space:]]*//; s/[[:space:]]*$//')
        case "$key" in
            partition|time_limit|gpus_per_node|cpus_per_gpu|cpus_per_task|mem|rdzv_port|extra_args|signal_lead_s|requeue)
                printf -v "slurm_$key" '%s' "$value" ;;
            *) echo "cmd_backends.sh: $file: unknown key '$key' (valid: partition time_limit gpus_per_node" \
                    "cpus_per_gpu cpus_per_task mem rdzv_port extra_args signal_lead_s requeue)" >&2; return 2 ;;
        esac
    done < "$file"
    [[ "$slurm_signal_lead_s" =~ ^[0-9]+$ ]] || {
        echo "cmd_backends.sh: $file: signal_lead_s must be a whole number of seconds, got '$slurm_signal_lead_s'" >&2; return 2; }
    [[ "$slurm_requeue" =~ ^(true|false)$ ]] || {
        echo "cmd_backends.sh: $file: requeue must be true or false, got '$slurm_requeue'" >&2; return 2; }
}

# train_interrupted EXPDIR RC: true if the training that just exited with RC stopped for a signal
# with a checkpoint (exit 75; under torchrun, whose own exit is 1: EXP/train_info.json written by
# this run says so)
train_interrupted() {
    local exp=$1 rc=$2
    [ "$rc" -eq 75 ] && return 0
    [ -f "$exp/train_info.json" ] && [ "$exp/train_info.json" -nt "$exp/.train_started" ] &&
        grep -q '"stopped_by": "signal' "$exp/train_info.json"
}

# train_requeue: with backend=slurm, requeue=true and inside a SLURM batch job, requeue it
train_requeue() {
    if [ "${backend:-local}" = slurm ] && [ "${slurm_requeue:-false}" = true ] && [ -n "${SLURM_JOB_ID:-}" ]; then
        echo "train_requeue: requeueing SLURM job $SLURM_JOB_ID (it reruns the recipe, which resumes training)" >&2
        scontrol requeue "$SLURM_JOB_ID"
    fi
}

train_launcher() {
    local ngpu=${1:-0} nodes=${2:-1} nproc gpus cpus
    nproc=$(( ngpu > 1 ? ngpu : 1 ))
    if [ -n "${train_cmd:-}" ]; then
        read -r -a launcher <<< "$train_cmd"
        return 0
    fi
    case "${backend:-local}" in
    local)
        if [ "$nodes" -gt 1 ]; then
            echo "train_launcher: --num_nodes $nodes needs backend=slurm in cmd.sh (backend=local is one machine)" >&2
            return 2
        fi
        if [ "$nproc" -gt 1 ]; then
            launcher=(torchrun --standalone --nproc_per_node "$nproc" -m asrkit)
        else
            launcher=(asrkit)
        fi
        ;;
    slurm)
        _asrkit_read_slurm_conf "${slurm_conf:-$_asrkit_backends_dir/conf/slurm.conf}" || return 2
        launcher=(srun "--nodes=$nodes" --ntasks-per-node=1 --kill-on-bad-exit=1)
        [ -n "$slurm_partition" ] && launcher+=("--partition=$slurm_partition")
        [ -n "$slurm_time_limit" ] && launcher+=("--time=$slurm_time_limit")
        if [ "$slurm_signal_lead_s" -gt 0 ]; then
            launcher+=("--signal=TERM@$slurm_signal_lead_s")
            export TORCH_ELASTIC_SHUTDOWN_TIMEOUT=$slurm_signal_lead_s
        fi
        gpus=$slurm_gpus_per_node
        [ "$gpus" = auto ] && gpus=$(( ngpu > 0 ? ngpu : 0 ))
        [ "$gpus" != none ] && [ "$gpus" -gt 0 ] && launcher+=("--gpus-per-node=$gpus")
        cpus=$slurm_cpus_per_task
        [ -z "$cpus" ] && [ -n "$slurm_cpus_per_gpu" ] && cpus=$(( slurm_cpus_per_gpu * nproc ))
        [ -n "$cpus" ] && launcher+=("--cpus-per-task=$cpus")
        [ -n "$slurm_mem" ] && launcher+=("--mem=$slurm_mem")
        if [ -n "$slurm_extra_args" ]; then
            local extra
            read -r -a extra <<< "$slurm_extra_args"
            launcher+=("${extra[@]}")
        fi
        export ASRKIT_RDZV_PORT=$slurm_rdzv_port
        launcher+=("$_asrkit_backends_dir/utils/slurm_torchrun.sh" "$nproc" -m asrkit)
        ;;
    *)
        echo "train_launcher: unknown backend '${backend}' (cmd.sh: backend=local or backend=slurm)" >&2
        return 2
        ;;
    esac
}
