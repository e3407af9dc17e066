# How training jobs are launched: backend=local (torchrun on this node) or slurm (srun + torchrun
# on every node; see ../../TEMPLATE/asr1/conf/slurm.conf). Used only when --ngpu > 1 or --num_nodes > 1.
backend=${ASRKIT_BACKEND:-local}
