#!/usr/bin/env bash
# WSJ (LDC93S6B + LDC94S13B): the CAPE paper's WSJ acoustic model (section 5.2, Figure 5;
# appendix C.1-C.2): CTC, letters, 36 x 768 post-LN Transformer, dropout / layer drop 0.4.
# Train si284 (verbalized punctuation removed), validate on nov93dev (test_dev93),
# test on nov93dev and nov92 (test_eval92). Corpus location: db.sh. See README.md.
#   ./run.sh                                       all stages (finished ones are skipped)
#   ./run.sh --stage 1 --stop_stage 2              data preparation only
#   ./run.sh --stage 4 --tag cape --train_args "encoder.pos_enc=cape encoder.pos.max_scale=1.1"
#   ./run.sh --prepare_args "--allow-missing-discs"   a partial corpus (utterances of missing discs left out)
# Every option of ../../TEMPLATE/asr1/asr.sh may be given (they override the ones set here;
# --prepare_args adds to the recipe's own, e.g. --prepare_args "--allow-missing-discs").
set -euo pipefail
cd "$(dirname "$0")"
. "${ASRKIT_ROOT:-../../..}/egs/TEMPLATE/asr1/utils/recipe_help.sh"  # --help: answers before any set-up
# the command line as given, for the remedies error messages print ("run: ./run.sh ... --stage N ...")
export ASRKIT_RECIPE_CMD="./run.sh$(printf ' %q' "$@")"
. ./db.sh
. ./path.sh
[ -d "$WSJ" ] || echo "$0: note: WSJ=$WSJ does not exist; stage 1 needs the corpus there (see db.sh)" >&2

"$ASRKIT_ROOT/egs/TEMPLATE/asr1/asr.sh" \
    --corpus wsj --corpus_dir "$WSJ" \
    --train_sets train_si284 --dev_set test_dev93 --test_sets "test_dev93 test_eval92" \
    --prepare_args "${WSJ_FLAC:+--flac-dir $WSJ_FLAC}" \
    --token_type letters \
    --train_config conf/train.yaml \
    "$@"
