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

# Letters CTC (frontend stride 4: 40 ms per frame) decoded with a TLG graph: the 507-word lexicon
# spelled in letters + a word unigram LM of the training text (LM weight 0.2, picked on dev), so
# every hypothesis is a sequence of real words. Greedy CTC: --decode_args "decode.method=greedy".
../../TEMPLATE/asr1/asr.sh \
    --corpus mini --corpus_dir "$MINI" --prepare_args "--train-hours 12 --span-minutes 32" \
    --train_sets train --dev_set dev --test_sets "test test-longform test-span" \
    --token_type letters --lm_order 1 \
    --train_config conf/train.yaml \
    --decode_args "decode.method=wfst decode.lm=data/lm/graph_letters_1gram decode.lm_weight=0.2" \
    "$@"
