#!/usr/bin/env bash
# Decode with greedy CTC, prefix beam search, prefix beam + word n-gram shallow fusion, and WFST
# (TLG) decoding, and report WER and real-time factor of each in exp/<tag>/RESULTS.md.
#   ./run_decode_compare.sh [--exp exp/train] [--sets test] [--beam 8] [--lm_order 3]
set -euo pipefail
cd "$(dirname "$0")"
exp=exp/train
sets=test
beam=8
lm_order=3
lm_weight=0.5
word_bonus=0.0
tokens=data/tokens/letters.json
nj=2
__asrkit_opts="exp sets beam lm_order lm_weight word_bonus tokens nj"
. ../../TEMPLATE/asr1/utils/parse_options.sh
. ./path.sh

arpa=data/lm/${lm_order}gram.arpa
graph=data/lm/graph_$(basename "${tokens%.json}")_${lm_order}gram
[ -f "$arpa" ] || asrkit lm train --text data/manifests/mini_cuts_train.jsonl.gz --order "$lm_order" --out "$arpa"
asrkit lm graph --tokens "$tokens" --arpa "$arpa" --out "$graph"

# shellcheck disable=SC2086
{
asrkit decode --exp-dir "$exp" --sets $sets --nj "$nj" --suffix greedy decode.method=greedy
asrkit decode --exp-dir "$exp" --sets $sets --nj "$nj" --suffix "beam$beam" decode.method=prefix_beam decode.beam="$beam"
asrkit decode --exp-dir "$exp" --sets $sets --nj "$nj" --suffix "beam${beam}_${lm_order}gram" decode.method=prefix_beam \
    decode.beam="$beam" decode.lm="$arpa" decode.lm_weight="$lm_weight" decode.word_bonus="$word_bonus"
asrkit decode --exp-dir "$exp" --sets $sets --nj "$nj" --suffix "wfst_${lm_order}gram" decode.method=wfst decode.lm="$graph"
}
asrkit report "$exp"
