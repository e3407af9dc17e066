#!/usr/bin/env bash
# Park & Sung on mini: a small gated-conv encoder + LSTM attention decoder (conf/conv_gated_small.yaml),
# trained with positional encoding (concat_sin) and without (nopos), decoded with attention beam search,
# then the paper's error analyses: looping/skipping counts and errors vs transcription length (Fig. 4).
#   ./run_conv.sh                        both models, all stages (finished ones are skipped)
#   ./run_conv.sh --pos_encs "nopos"     only one of them
#   ./run_conv.sh --train_args "train.max_minutes=30"  extra overrides for both
#   ./run_conv.sh --seeds 1 2 3          one model per seed: exp/<tag>_seed<N> (train.seed=N)
# Stages 1-2 (data, manifests) are the ones of ./run.sh and shared with it; stage 3 adds a BPE tokenizer.
set -euo pipefail
cd "$(dirname "$0")"

config=conf/conv_gated_small.yaml
pos_encs="concat_sin nopos"
train_args=
decode_args=
min_span=4
token_type=bpe
nbpe=400
seeds=              # training seeds ("": one model each, no _seed suffix)
__asrkit_opts="config pos_encs train_args decode_args min_span token_type nbpe seeds"
. ../../TEMPLATE/asr1/utils/seeds.sh
seeds_join "$@"; set -- "${__args[@]}"
. ../../TEMPLATE/asr1/utils/parse_options.sh
[ $# -eq 0 ] || { echo "$0: unexpected argument(s): $*" >&2; exit 2; }
seeds=${seeds//,/ }
. ./path.sh

# word pieces, not run.sh's letters: 80 ms per encoder frame is too coarse for letters' CTC
toks=(--token_type "$token_type" --nbpe "$nbpe")
./run.sh --stage 1 --stop_stage 3 "${toks[@]}"
name=$(basename "${config%.*}")
dirs=()
for pos in $pos_encs; do
    for seed in ${seeds:-_}; do
        if [ "$pos" = concat_sin ]; then tag=${name}_pos; args=""; else tag=${name}_${pos}; args="encoder.pos_enc=$pos encoder.pos={}"; fi
        [ "$seed" = _ ] || { tag=${tag}_seed$seed; args="$args train.seed=$seed"; }
        ./run.sh --stage 4 --stop_stage 6 --train_config "$config" --tag "$tag" "${toks[@]}" \
            --test_sets "test test-longform" --train_args "$args $train_args" --decode_args "$decode_args"
        dirs+=("exp/$tag")
    done
done

for s in test test-longform; do
    ds=(); for d in "${dirs[@]}"; do ds+=("$d/decode_$s"); done
    asrkit analysis looping "${ds[@]}" --min-span "$min_span" --json "exp/${name}_looping_${s}.json"
    asrkit analysis errors-vs-length "${ds[@]}" --names $(for d in "${dirs[@]}"; do basename "$d"; done) \
        --out "exp/${name}_errors_vs_length_${s}.png"
done
