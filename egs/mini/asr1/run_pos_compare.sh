#!/usr/bin/env bash
# Train the mini model once per positional encoding, everything else identical (one config key
# apart), decode test + long-form, and write one comparison table and PNG plots of WER per duration
# bin and per long-form window (the shape of the CAPE paper's figures 5 and 6). Long-form: the
# synthesized test-longform set (20-45 s utterances) and windows of 10..45 s cut from the test set
# (the same words at every window size; training utterances are 1-5 s).
# Every model gets the same number of optimizer steps (not wall time), so the comparison does not
# depend on machine load; --parallel N trains N models at once (one thread each).
#   ./run_pos_compare.sh [--encodings "nopos sinpos cape"] [--steps 1200] [--parallel 2] [--windows "10 20 30 45"]
# NAME+cape trains NAME with CAPE's augmentation of the frame times (encoder.pos.augment=cape; rope, alibi).
set -euo pipefail
cd "$(dirname "$0")"
encodings="nopos abspos sinpos relpos relpos_first cape shape cpe spe_sine spe_conv concat_sin rope rope+cape alibi alibi+cape"
steps=1200          # training budget per model (train.max_steps)
parallel=1          # models trained at once
train_config=conf/train.yaml
extra_args=         # more key=value overrides for every model
out=exp/pos_compare
windows="10 20 30 45"  # long-form window sizes (s) cut from the test set
__asrkit_opts="encodings steps parallel train_config extra_args out windows"
. ../../TEMPLATE/asr1/utils/parse_options.sh

./run.sh --stop_stage 3   # data and tokens (skipped when done)
. ./path.sh
window_sets=""
for w in $windows; do
    window_sets="$window_sets test-longform$w"
    [ -f "data/manifests/mini_cuts_test-longform$w.jsonl.gz" ] || need_windows=1
done
# shellcheck disable=SC2086
[ -z "${need_windows:-}" ] || asrkit longform mini --manifests data/manifests --parts test --windows $windows
tags=()
train_one() {
    local enc=$1 threads=$2 args
    args="encoder.pos_enc=${enc%+cape} train.max_steps=$steps train.max_minutes=0 train.threads=$threads"
    case "$enc" in spe_*) args="$args encoder.attention=linear_relu" ;; *+cape) args="$args encoder.pos.augment=cape" ;; esac
    ./run.sh --stage 4 --stop_stage 6 --tag "pos_${enc}" --train_config "$train_config" --nj 1 \
        --test_sets "test test-longform$window_sets" --train_args "$args $extra_args" > "exp/pos_${enc}.log" 2>&1 \
        || { echo "pos_${enc} failed: see exp/pos_${enc}.log" >&2; return 1; }
    echo "pos_${enc}: done"
}
mkdir -p exp
threads=$(( $(nproc) / parallel )); [ "$threads" -ge 1 ] || threads=1
running=0
for enc in $encodings; do
    train_one "$enc" "$threads" &
    tags+=("exp/pos_${enc}")
    running=$((running + 1))
    if [ "$running" -ge "$parallel" ]; then wait -n; running=$((running - 1)); fi
done
wait
asrkit compare "${tags[@]}" --out "$out"
echo "table: $out/compare.md"
