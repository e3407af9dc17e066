#!/usr/bin/env bash
# Train the mini model once per positional encoding, everything else identical (one config key
# apart), decode test + long-form, and write one comparison table and PNG plots of WER per duration
# bin and per long-form window (the shape of the CAPE paper's figures 5 and 6).
#   ./run_pos_compare.sh [--encodings "nopos sinpos cape"] [--minutes 12] [--train_config conf/train.yaml]
set -euo pipefail
cd "$(dirname "$0")"
encodings="nopos abspos sinpos relpos relpos_first cape shape cpe spe_sine spe_conv concat_sin"
minutes=12          # training budget per model (train.max_minutes)
train_config=conf/train.yaml
extra_args=         # more key=value overrides for every model
out=exp/pos_compare
__asrkit_opts="encodings minutes train_config extra_args out"
. ../../TEMPLATE/asr1/utils/parse_options.sh

./run.sh --stop_stage 3   # data and tokens (skipped when done)
tags=()
for enc in $encodings; do
    args="encoder.pos_enc=$enc train.max_minutes=$minutes"
    case "$enc" in spe_*) args="$args encoder.attention=linear_relu" ;; esac
    ./run.sh --stage 4 --stop_stage 6 --tag "pos_${enc}" --train_args "$args $extra_args"
    tags+=("exp/pos_${enc}")
done
. ./path.sh
asrkit compare "${tags[@]}" --out "$out"
echo "table: $out/compare.md"
