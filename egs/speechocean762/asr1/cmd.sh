# How training (stage 4) is launched; see ../../TEMPLATE/asr1/cmd_backends.sh.
#   backend=local  this machine: one process, or torchrun --nproc_per_node N with --ngpu N > 1
#   backend=slurm  srun + torchrun on --num_nodes M nodes x --ngpu N processes; SLURM options
#                  (partition, time limit, CPUs, memory, extra srun args) in $slurm_conf
backend=${ASRKIT_BACKEND:-local}
slurm_conf=${ASRKIT_SLURM_CONF:-${ASRKIT_ROOT:-../../..}/egs/TEMPLATE/asr1/conf/slurm.conf}
# train_cmd="torchrun --standalone --nproc_per_node 2 -m asrkit"  # a verbatim launcher prefix (overrides the above)
