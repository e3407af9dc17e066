#!/usr/bin/env bash
# TED-LIUM release 2: the CAPE paper's TED-LIUM setup (section 5.2, Figure 6; appendix C.2:
# dropout / layer drop 0.1) trained on the release-2 training set (207 h) instead of release 3.
# The paper trains on v3 (../../tedlium3/asr1); dev and test are the same talks in both releases,
# so this recipe gives a smaller-data point on the same test sets. Train on train, validate on
# dev, test on dev and test, plus long-form windows (10..45 s) of dev and test. Training segments
# padded as in Kaldi's recipe. Corpus location: db.sh. See README.md.
#   ./run.sh                                       all stages (finished ones are skipped)
#   ./run.sh --stage 1 --stop_stage 2              data preparation only
#   ./run.sh --stage 4 --tag cape --train_args "encoder.pos_enc=cape encoder.pos.max_scale=2.0"
# Every option of ../../TEMPLATE/asr1/asr.sh may be given (they override the ones set here;
# --prepare_args adds to the recipe's own, e.g. --prepare_args "--keep-unk").
set -euo pipefail
cd "$(dirname "$0")"
. "${ASRKIT_ROOT:-../../..}/egs/TEMPLATE/asr1/utils/recipe_help.sh"  # --help: answers before any set-up
# the command line as given, for the remedies error messages print ("run: ./run.sh ... --stage N ...")
export ASRKIT_RECIPE_CMD="./run.sh$(printf ' %q' "$@")"
. ./db.sh
. ./path.sh
[ -d "$TEDLIUM2" ] || echo "$0: note: TEDLIUM2=$TEDLIUM2 does not exist; stage 1 needs the corpus there (see db.sh)" >&2

"$ASRKIT_ROOT/egs/TEMPLATE/asr1/asr.sh" \
    --corpus tedlium2 --corpus_dir "$TEDLIUM2" \
    --train_sets train --dev_set dev --test_sets "dev test" --longform_sets "dev test" \
    --prepare_args "--pad-segments" \
    --token_type letters \
    --train_config conf/train.yaml \
    "$@"
