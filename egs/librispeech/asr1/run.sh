#!/usr/bin/env bash
# LibriSpeech: the CAPE paper's CTC Transformer (section 5.2; appendix C.2, with TED-LIUM's
# dropout / layer drop 0.1) trained on LibriSpeech. In the paper LibriSpeech test-clean and
# test-other are evaluation sets only (Figures 5-6); this recipe trains on LibriSpeech itself.
# Train on train-960 (train-clean-100 + train-clean-360 + train-other-500; --train_set picks
# another), validate on dev-clean, test on test-clean and test-other, plus long-form windows
# (10..45 s, consecutive utterances of a chapter) of dev-clean, test-clean and test-other.
# Corpus location: db.sh. See README.md.
#   ./run.sh                                       all stages (finished ones are skipped)
#   ./run.sh --stage 1 --stop_stage 2              data preparation only
#   ./run.sh --train_set train-clean-100           train on 100 h (experiment tag train_clean100)
#   ./run.sh --stage 4 --tag cape --train_args "encoder.pos_enc=cape encoder.pos.max_scale=2.0"
# Recipe option (parsed here): --train_set train-960 | train-clean-460 | train-clean-100.
# Every option of ../../TEMPLATE/asr1/asr.sh may be given too (they override the ones set here;
# --prepare_args adds to the recipe's own).
set -euo pipefail
cd "$(dirname "$0")"
. "${ASRKIT_ROOT:-../../..}/egs/TEMPLATE/asr1/utils/recipe_help.sh"  # --help: answers before any set-up
# the command line as given, for the remedies error messages print ("run: ./run.sh ... --stage N ...")
export ASRKIT_RECIPE_CMD="./run.sh$(printf ' %q' "$@")"

train_set=train-960
args=()
while [ $# -gt 0 ]; do
    case "$1" in
    --train_set|--train-set)
        [ $# -ge 2 ] || { echo "$0: option --train_set needs a value" >&2; exit 2; }
        train_set=$2; shift 2 ;;
    --train_set=*|--train-set=*) train_set=${1#*=}; shift ;;
    *) args+=("$1"); shift ;;
    esac
done
case "$train_set" in
train-960) train_sets="train-clean-100 train-clean-360 train-other-500"; tag=() ;;
train-clean-460) train_sets="train-clean-100 train-clean-360"; tag=(--tag train_clean460) ;;
train-clean-100) train_sets="train-clean-100"; tag=(--tag train_clean100) ;;
*) echo "$0: --train_set $train_set: valid values are train-960, train-clean-460, train-clean-100" >&2; exit 2 ;;
esac

. ./db.sh
. ./path.sh
[ -d "$LIBRISPEECH" ] || echo "$0: note: LIBRISPEECH=$LIBRISPEECH does not exist; stage 1 needs the corpus there (see db.sh)" >&2

"$ASRKIT_ROOT/egs/TEMPLATE/asr1/asr.sh" \
    --corpus librispeech --corpus_dir "$LIBRISPEECH" \
    --train_sets "$train_sets" --dev_set dev-clean --test_sets "test-clean test-other" \
    --longform_sets "dev-clean test-clean test-other" \
    --token_type letters \
    --train_config conf/train.yaml \
    ${tag[@]+"${tag[@]}"} ${args[@]+"${args[@]}"}
