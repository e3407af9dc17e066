#!/usr/bin/env bash
# mini: a synthetic speech corpus (espeak-ng: 507 common English words, 176 voice variants) in LibriSpeech's layout,
# end to end on one CPU in under 20 minutes: synthesis -> Lhotse -> CTC Transformer -> WER report.
#   ./run.sh                          all stages (finished ones are skipped)
#   ./run.sh --stage 4 --stop_stage 6 a range
#   ./run.sh --train_args "encoder.pos_enc=cape" --tag cape
#   ./run.sh --seeds 1 2 3 --tag cape --train_args "encoder.pos_enc=cape"
#                                     one model per seed: exp/cape_seed1 ... (train.seed=1 ...),
#                                     one row with mean and spread in RESULTS.md (asrkit compare)
# Test sets: test (1-10 s), test-longform (20-45 s) and test-span (2-45 s, the same amount of audio
# in each duration bin <10, 10-15, 15-20, >=20 s: >= 1000 words per bin).
set -euo pipefail
cd "$(dirname "$0")"
. "${ASRKIT_ROOT:-../../..}/egs/TEMPLATE/asr1/utils/recipe_help.sh"  # --help: answers before any set-up
. ./db.sh
. ./path.sh
. ../../TEMPLATE/asr1/utils/seeds.sh

# Letters CTC (frontend stride 4: 40 ms per frame) decoded with a TLG graph: the 507-word lexicon
# spelled in letters + a word unigram LM of the training text (LM weight 0.2, picked on dev), so
# every hypothesis is a sequence of real words. Greedy CTC: --decode_args "decode.method=greedy".
recipe=(
    --corpus mini --corpus_dir "$MINI" --prepare_args "--train-hours 12 --span-minutes 32"
    --train_sets train --dev_set dev --test_sets "test test-longform test-span"
    --token_type letters --lm_order 1
    --train_config conf/train.yaml
    --decode_args "decode.method=wfst decode.lm=data/lm/graph_letters_1gram decode.lm_weight=0.2"
)
export ASRKIT_RECIPE_CMD="./run.sh$(printf ' %q' "$@")"  # how error messages say to rerun
seeds_split "$@"
if [ -z "$__seeds" ]; then
    exec ../../TEMPLATE/asr1/asr.sh "${recipe[@]}" "${__args[@]}"
fi
config=$(opt_last train_config conf/train.yaml "${__args[@]}")
tag=$(opt_last tag "" "${__args[@]}")
tag=${tag:-$(basename "${config%.*}")}
train_args=$(opt_last train_args "" "${__args[@]}")
for seed in $__seeds; do
    ../../TEMPLATE/asr1/asr.sh "${recipe[@]}" "${__args[@]}" \
        --tag "${tag}_seed${seed}" --train_args "${train_args:+$train_args }train.seed=${seed}"
done
