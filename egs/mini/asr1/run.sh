#!/usr/bin/env bash
# mini: a synthetic speech corpus (espeak-ng, 300+ words, 6+ voices) in LibriSpeech's layout,
# end to end on one CPU in under 20 minutes: synthesis -> Lhotse -> CTC Transformer -> WER report.
#   ./run.sh                          all stages (finished ones are skipped)
#   ./run.sh --stage 4 --stop_stage 6 a range
#   ./run.sh --train_args "encoder.pos_enc=cape" --tag cape
set -euo pipefail
cd "$(dirname "$0")"
. ./db.sh
. ./path.sh

../../TEMPLATE/asr1/asr.sh \
    --corpus mini --corpus_dir "$MINI" \
    --train_sets train --dev_set dev --test_sets "test test-longform" \
    --token_type unigram --nbpe 400 \
    --train_config conf/train.yaml \
    "$@"
