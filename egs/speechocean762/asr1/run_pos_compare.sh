#!/usr/bin/env bash
# The positional-encoding question on real speech: one model per encoding and seed, trained from
# scratch with this recipe's conf/train.yaml (one config key apart: encoder.pos_enc), the same
# number of optimizer steps each, decoded with the recipe's TLG graph on the official test set and
# the real long-form sets, compared with `asrkit compare` (WER with 95 % bootstrap intervals per
# set and duration bin, mean and spread over seeds, MAPSSWE / sign tests against the baselines).
# From scratch, not from the synthetic mini model: only ALiBi has a pretrained mini model of this
# shape, and the question is about the encodings, not about pretraining.
# Writes exp/pos_compare/{compare.md,compare.json,wer_vs_duration.png}.
#   ./run_pos_compare.sh [--encodings "nopos sinpos cape cpe relpos rope alibi"] [--seeds "1 2 3"]
#                        [--steps 1000] [--parallel 2] [--test_sets "test test_longform"]
#                        [--train_config conf/train.yaml] [--prefix pos] [--tune_grid "decode.KEY=V1,V2 ..."]
#                        [--pretrained "../../mini/asr1/exp/conformer_{enc}"]
# --train_config: the model of every run (e.g. conf/train_conformer.yaml, the recipe's default:
# Conformer layers); --prefix: the experiments' name prefix, so that studies of two configs
# live side by side. --tune_grid: the decoding weights stage 5 chooses from on dev (default: run.sh's
# 30-point grid; a smaller one saves ~45 s of dev decoding per point for a weak from-scratch model).
# --pretrained: each model starts from a synthetic model of its own encoding (run.sh --pretrained,
# train.init_from): the experiment dir or checkpoint named by the pattern, {enc} replaced by the
# encoding (NAME+cape: NAME's);
# every one must exist before any work. Make them in egs/mini/asr1 with, per encoding ENC:
#   ./run.sh --stop_stage 4 --tag conformer_ENC --train_config conf/train_conformer.yaml --train_args "encoder.pos_enc=ENC train.seed=1"
# Experiments: exp/<prefix>_<encoding>_seed<N>; a finished model is skipped on a rerun, an interrupted
# one resumes; one trained with another --steps is refused (utils/budget.sh). NAME+cape trains NAME
# with CAPE's augmentation of the frame times (encoder.pos.augment=cape).
# Results of the 2026-11-26 run: docs/results/speechocean762_pos_study.md.
set -euo pipefail
cd "$(dirname "$0")"
encodings="nopos sinpos cape cpe relpos rope alibi"
seeds="1"
steps=1000
baselines="nopos sinpos"
parallel=2
test_sets="test test_longform"
extra_args=
out=exp/pos_compare
train_config=conf/train.yaml
prefix=pos
tune_grid=
pretrained=
__asrkit_opts="encodings seeds steps baselines parallel test_sets extra_args out train_config prefix tune_grid pretrained"
. ../../TEMPLATE/asr1/utils/seeds.sh
seeds_join "$@"; set -- "${__args[@]}"
. ../../TEMPLATE/asr1/utils/parse_options.sh
[ $# -eq 0 ] || { echo "$0: unexpected argument(s): $*" >&2; exit 2; }
seeds=${seeds//,/ }
for s in $seeds; do [[ "$s" =~ ^[0-9]+$ ]] || { echo "$0: --seeds: '$s' is not a non-negative integer" >&2; exit 2; }; done
[[ "$steps" =~ ^[1-9][0-9]*$ ]] || { echo "$0: --steps must be a positive integer, got '$steps'" >&2; exit 2; }
[[ "$parallel" =~ ^[1-9][0-9]*$ ]] || { echo "$0: --parallel must be a positive integer, got '$parallel'" >&2; exit 2; }

# the synthetic model an encoding starts from: PATTERN with {enc} replaced by its name (NAME+cape: NAME's)
pretrained_of() { echo "${pretrained//\{enc\}/${1%%+*}}"; }
if [ -n "$pretrained" ]; then
    [[ "$pretrained" == *"{enc}"* ]] || { echo "$0: --pretrained must contain {enc} (the encoding's name), got '$pretrained'" >&2; exit 2; }
    for enc in $encodings; do
        src=$(pretrained_of "$enc")
        [ -e "$src" ] || { echo "$0: --pretrained: $src (encoding ${enc%%+*}) does not exist; train it in egs/mini/asr1:" \
            "./run.sh --stop_stage 4 --tag conformer_${enc%%+*} --train_config conf/train_conformer.yaml" \
            "--train_args \"encoder.pos_enc=${enc%%+*} train.seed=1\"" \
            "(it is written to ../../mini/asr1/exp/conformer_${enc%%+*}: give --pretrained \"../../mini/asr1/exp/conformer_{enc}\")" >&2; exit 2; }
    done
fi

dirs=(); for enc in $encodings; do for seed in $seeds; do dirs+=("exp/${prefix}_${enc}_seed${seed}"); done; done
. ../../TEMPLATE/asr1/utils/budget.sh
budget_check "$steps" "${dirs[@]}"

./run.sh --stop_stage 3   # data, features, tokens, LM (skipped when done)
. ./path.sh

train_one() {
    local enc=$1 seed=$2 threads=$3 tag=${prefix}_${1}_seed${2} args
    args="encoder.pos_enc=${enc%%+*} train.max_steps=$steps train.threads=$threads train.seed=$seed"
    case "$enc" in *+cape) args="$args encoder.pos.augment=cape" ;; esac
    export OMP_NUM_THREADS=$threads  # decoding: each of the parallel jobs gets its share of the cores
    { ./run.sh --stage 4 --stop_stage 5 --tag "$tag" --nj 1 --test_sets "$test_sets" --train_config "$train_config" \
        ${tune_grid:+--tune_grid "$tune_grid"} ${pretrained:+--pretrained "$(pretrained_of "$enc")"} \
        --train_args "$args $extra_args" && asrkit report "exp/$tag" --score; } \
        > "exp/$tag.log" 2>&1 || { echo "$tag failed: see exp/$tag.log" >&2; return 1; }
    echo "$(date '+%F %T') $tag: done"
}
mkdir -p exp
threads=$(( $(nproc) / parallel )); [ "$threads" -ge 1 ] || threads=1
one() { train_one "${1%:*}" "${1##*:}" "$threads"; }  # one ENC:SEED
items=(); for enc in $encodings; do for seed in $seeds; do items+=("$enc:$seed"); done; done
. ../../TEMPLATE/asr1/utils/parallel.sh
parallel_each "$parallel" one "${items[@]}" || { echo "$0: some models failed (see exp/${prefix}_*.log)" >&2; exit 1; }

base=()
for b in $baselines; do case " $encodings " in *" $b "*) base+=("${prefix}_$b") ;; esac; done
asrkit compare "${dirs[@]}" --out "$out" ${base:+--baseline "$(IFS=,; echo "${base[*]}")"} > /dev/null
echo "tables: $out/compare.md; every figure: $out/compare.json"
