#!/usr/bin/env bash
# Padding-free batching with a variable STFT hop (CAPE appendix C.3) vs the classic padded pipeline,
# with sinpos and with CAPE: four mini models, everything else identical (data.sampler and
# encoder.pos_enc apart), the same number of optimizer steps each. Writes
#   exp/padfree_compare/compare.md + PNGs      WER per duration bin and long-form set, all four
#   exp/padfree_compare/throughput.md          training throughput (audio-s/s, from train_info.json)
#   exp/padfree_report/padding.md              padding fraction per sampler on the mini training cuts
#   exp/padfree_report/padfree_hops.png        histogram of the hops of one epoch (paper Fig. 14)
#   exp/<pf_sinpos>/hop_curve_<set>.{md,png}   decoding hop vs WER and speed (paper Fig. 17)
#   ./run_padfree_compare.sh [--steps 1200] [--encodings "sinpos cape"] [--hops 5,8,10,12,15,20] [--seeds 1 2 3]
# --seeds: one model per seed (exp/<tag>_seed<N>, train.seed=N), one row each in compare.md (mean, spread).
set -euo pipefail
cd "$(dirname "$0")"
steps=1200              # training budget per model (train.max_steps): same work for every model
encodings="sinpos cape"
train_config=conf/train.yaml
extra_args=             # more key=value overrides for every model
hops=5,8,10,12,15,20    # inference hops (ms) of the hop curve
hop_sets="test test-longform"  # sets of the hop curve (long utterances show the model's own speed-up)
# decoding of the hop curve: the one run.sh reports (letters CTC + lexicon TLG)
decode_args="decode.method=wfst decode.lm=data/lm/graph_letters_1gram decode.lm_weight=0.2"
out=exp/padfree_compare
seeds=                  # training seeds ("": one model each, the config's seed, no _seed suffix)
__asrkit_opts="steps encodings train_config extra_args hops hop_sets decode_args out seeds"
. ../../TEMPLATE/asr1/utils/seeds.sh
seeds_join "$@"; set -- "${__args[@]}"
. ../../TEMPLATE/asr1/utils/parse_options.sh
[ $# -eq 0 ] || { echo "$0: unexpected argument(s): $*" >&2; exit 2; }
seeds=${seeds//,/ }
dirs=()
for enc in $encodings; do for sampler in pd pf; do for seed in ${seeds:-_}; do
    dirs+=("exp/${sampler}_${enc}$([ "$seed" = _ ] || echo "_seed$seed")")
done; done; done
. ../../TEMPLATE/asr1/utils/budget.sh
budget_check "$steps" "${dirs[@]}"  # a model trained with another budget: refused (utils/budget.sh)

./run.sh --stop_stage 3   # data and tokens (skipped when done)
. ./path.sh
mkdir -p "$out" exp/padfree_report
max_duration=$(asrkit config "$train_config" | python -c "import sys, yaml; print(yaml.safe_load(sys.stdin)['data']['max_duration'])")
asrkit padfree padding --cuts data/manifests/mini_cuts_train.jsonl.gz \
    --max-duration "$max_duration" --out exp/padfree_report
asrkit padfree hops --cuts data/manifests/mini_cuts_train.jsonl.gz \
    --max-duration "$max_duration" --out exp/padfree_report

tags=()
for enc in $encodings; do
    for sampler in bucketing padfree; do
        for seed in ${seeds:-_}; do
            tag=$([ "$sampler" = padfree ] && echo pf || echo pd)_${enc}
            sargs=""; [ "$seed" = _ ] || { tag=${tag}_seed$seed; sargs="train.seed=$seed"; }
            ./run.sh --stage 4 --stop_stage 6 --tag "$tag" --train_config "$train_config" \
                --train_args "encoder.pos_enc=$enc data.sampler=$sampler train.max_steps=$steps train.max_minutes=0 $sargs $extra_args"
            tags+=("exp/$tag")
        done
    done
done
asrkit compare "${tags[@]}" --out "$out"

{
    echo "| model | sampler | steps | audio seconds | wall s | audio-s/s |"
    echo "| :--- | :--- | ---: | ---: | ---: | ---: |"
    for t in "${tags[@]}"; do
        python - "$t" <<'EOF'
import json, sys, yaml
t = sys.argv[1]
i = json.load(open(f"{t}/train_info.json"))
c = yaml.safe_load(open(f"{t}/config.yaml"))
print(f"| {t.split('/')[-1]} | {c['data']['sampler']} | {i['steps']} | {i['audio_seconds']:.0f} | "
      f"{i['train_wall_seconds']:.0f} | {i['audio_sec_per_sec']:.1f} |")
EOF
    done
} > "$out/throughput.md"
cat "$out/throughput.md"

first_pf=$(for t in "${tags[@]}"; do case "$t" in */pf_*) echo "$t"; break ;; esac; done)
for s in $hop_sets; do
    asrkit padfree hop-curve --exp-dir "$first_pf" --set "$s" --hops "$hops" $decode_args
done
echo "tables: $out/compare.md $out/throughput.md exp/padfree_report/padding.md $first_pf/hop_curve_*.md"
