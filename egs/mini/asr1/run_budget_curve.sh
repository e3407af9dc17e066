#!/usr/bin/env bash
# The training curve behind run_pos_compare.sh's step budget: one model trained to --max_steps with a
# checkpoint kept every --every steps, each checkpoint decoded as run.sh decodes (WFST) on --sets, and
# a table of WER [95 % bootstrap interval] against the step in exp/<tag>/budget_curve.md (and a plot,
# budget_curve.png). Choose the budget where the curve has flattened (the models are past their early
# phase).
#   ./run_budget_curve.sh [--encoding sinpos] [--seed 1] [--max_steps 2400] [--every 400] [--sets "dev"] [--threads 0]
# --threads N: training and decoding use N threads (0: torch's default, all cores); give each of
# several jobs run side by side its share, as run_pos_compare.sh --parallel does.
set -euo pipefail
cd "$(dirname "$0")"
encoding=sinpos
seed=1
max_steps=2400
every=400
sets=dev
train_config=conf/train.yaml
decode_args="decode.method=wfst decode.lm=data/lm/graph_letters_1gram decode.lm_weight=0.2"
tag=                # default: budget_<encoding>_seed<seed>
threads=0
__asrkit_opts="encoding seed max_steps every sets train_config decode_args tag threads"
. ../../TEMPLATE/asr1/utils/parse_options.sh
[ $# -eq 0 ] || { echo "$0: unexpected argument(s): $*" >&2; exit 2; }
for v in seed max_steps every threads; do
    [[ "${!v}" =~ ^[0-9]+$ ]] && [ "${!v}" -gt 0 -o "$v" = seed -o "$v" = threads ] || { echo "$0: --$v must be a positive integer (--seed, --threads: 0 or more)" >&2; exit 2; }
done
tag=${tag:-budget_${encoding}_seed${seed}}
[ "$threads" -eq 0 ] || export OMP_NUM_THREADS=$threads

./run.sh --stop_stage 3
./run.sh --stage 4 --stop_stage 4 --tag "$tag" --train_config "$train_config" --train_args \
    "encoder.pos_enc=$encoding train.seed=$seed train.max_steps=$max_steps train.max_minutes=0 train.ckpt_every_steps=$every train.keep_last=0 train.threads=$threads"
. ./path.sh
# every kept checkpoint decoded on every set (once), the table and the plot: asrkit curve
# shellcheck disable=SC2086
asrkit curve --exp-dir "exp/$tag" --sets $sets --name budget_curve $decode_args
