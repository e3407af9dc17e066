#!/usr/bin/env bash
# The positional-encoding study on mini: one model per encoding and seed, everything else identical
# (one config key apart), the same number of optimizer steps each (not wall time, so the comparison
# does not depend on machine load); decoded on
#   test           1-10 s utterances
#   test-longform  20-45 s files
#   test-span      2-45 s files, the same amount of audio in each duration bin (<10, 10-15, 15-20, >=20 s)
#   test-longform<W>       windows of W = 10..45 s cut from test (the same words at every size)
#   test-span-longform<W>  windows of 60 s, 120 s and whole chapters (~4 min) cut from test-span
# and compared with `asrkit compare`: WER with 95 % bootstrap intervals per bin and window, mean and
# spread over the seeds, significance against the baselines (MAPSSWE and sign test per pair of seeds,
# a permutation test over the seeds), decoding time and peak memory per bin and window. Writes
#   exp/pos_compare/compare.md, compare.json, wer_vs_duration.png, wer_vs_window.png
# and copies them to exp/RESULTS.md (+ PNGs) (a later ./run.sh stage 6 rewrites exp/RESULTS.md
# with every experiment and no baselines; rerunning this script, which skips every finished model,
# writes the study's again; a model trained with another --steps is refused, not reused).
#   ./run_pos_compare.sh [--encodings "nopos sinpos cape"] [--seeds "1 2 3"] [--steps 2000] [--parallel 2]
# NAME+cape trains NAME with CAPE's augmentation of the frame times (encoder.pos.augment=cape; rope, alibi).
# NAME+linear trains NAME with ReLU linear attention (encoder.attention=linear_relu), the attention SPE
# needs (spe_* always use it): nopos+linear is the control that separates SPE from its attention.
# Experiments: exp/pos_<encoding>_seed<N> (train.seed=N); --parallel N trains N models at once.
set -euo pipefail
cd "$(dirname "$0")"
encodings="nopos abspos sinpos relpos relpos_first cape shape cpe spe_sine spe_conv nopos+linear concat_sin rope rope+cape alibi alibi+cape"
seeds="1 2 3"       # training seeds: --seeds 1 2 3 or --seeds "1 2 3"
steps=2000          # training budget per model (train.max_steps): see docs/results/mini_pos_study.md, "Budget"
baselines="nopos sinpos"  # encodings every other one is tested against (those trained)
parallel=1          # models trained at once
train_config=conf/train.yaml
extra_args=         # more key=value overrides for every model
out=exp/pos_compare
windows="10 20 30 45"      # long-form window sizes (s) cut from the test set
long_windows="60 120 whole" # window sizes cut from test-span (whole: one window per chapter)
results=exp/RESULTS.md  # copy of the comparison beside the experiments ("" : only $out)
__asrkit_opts="encodings seeds steps baselines parallel train_config extra_args out windows long_windows results"
. ../../TEMPLATE/asr1/utils/seeds.sh
seeds_join "$@"; set -- "${__args[@]}"
. ../../TEMPLATE/asr1/utils/parse_options.sh
[ $# -eq 0 ] || { echo "$0: unexpected argument(s): $*" >&2; exit 2; }
seeds=${seeds//,/ }
[ -n "$seeds" ] || { echo "$0: --seeds needs at least one seed" >&2; exit 2; }
for s in $seeds; do [[ "$s" =~ ^[0-9]+$ ]] || { echo "$0: --seeds: '$s' is not a non-negative integer" >&2; exit 2; }; done
[[ "$steps" =~ ^[1-9][0-9]*$ ]] || { echo "$0: --steps must be a positive integer, got '$steps'" >&2; exit 2; }

dirs=(); for enc in $encodings; do for seed in $seeds; do dirs+=("exp/pos_${enc}_seed${seed}"); done; done
. ../../TEMPLATE/asr1/utils/budget.sh
budget_check "$steps" "${dirs[@]}"  # a model trained with another budget: refused (utils/budget.sh)

./run.sh --stop_stage 3   # data and tokens (skipped when done)
if [ ! -f data/manifests/mini_cuts_test-span.jsonl.gz ]; then
    # data made before test-span existed: synthesize and check it (finished parts are kept)
    ./run.sh --stage 1 --stop_stage 2 --force true
fi
. ./path.sh
# long-form windows (built once): the sizes of a part that have no manifest yet
for part in test test-span; do
    todo=""
    for w in $([ "$part" = test ] && echo "$windows" || echo "$long_windows"); do
        [ -f "data/manifests/mini_cuts_${part}-longform$w.jsonl.gz" ] || todo="$todo $w"
    done
    # shellcheck disable=SC2086
    [ -z "$todo" ] || asrkit longform mini --manifests data/manifests --parts "$part" --windows $todo
done
test_sets="test test-longform test-span"
for w in $windows; do test_sets="$test_sets test-longform$w"; done
for w in $long_windows; do test_sets="$test_sets test-span-longform$w"; done

train_one() {
    local enc=$1 seed=$2 threads=$3 tag=pos_${1}_seed${2} args
    args="encoder.pos_enc=${enc%%+*} train.max_steps=$steps train.max_minutes=0 train.threads=$threads train.seed=$seed"
    case "$enc" in spe_*|*+linear) args="$args encoder.attention=linear_relu" ;; *+cape) args="$args encoder.pos.augment=cape" ;; esac
    # decoding takes torch's default thread count (all cores): with --parallel N the N jobs would ask
    # for N x cores threads and OpenMP's barriers on shared cores made decoding ~5-10x slower (measured:
    # model RTF 0.0079 with 2 threads vs 0.0020 with 1 beside a busy core); each job gets its share
    export OMP_NUM_THREADS=$threads
    # stages 4-5 here, scoring below: stage 6 would also rewrite RESULTS.md from every experiment each time
    { ./run.sh --stage 4 --stop_stage 5 --tag "$tag" --train_config "$train_config" --nj 1 \
        --test_sets "$test_sets" --train_args "$args $extra_args" && asrkit report "exp/$tag" --score; } \
        > "exp/$tag.log" 2>&1 || { echo "$tag failed: see exp/$tag.log" >&2; return 1; }
    echo "$tag: done"
}
mkdir -p exp
threads=$(( $(nproc) / parallel )); [ "$threads" -ge 1 ] || threads=1
one() { train_one "${1%:*}" "${1##*:}" "$threads"; }  # one ENC:SEED
items=(); for enc in $encodings; do for seed in $seeds; do items+=("$enc:$seed"); done; done
. ../../TEMPLATE/asr1/utils/parallel.sh
parallel_each "$parallel" one "${items[@]}" || { echo "$0: some models failed (see exp/pos_*.log)" >&2; exit 1; }

base=()
for b in $baselines; do case " $encodings " in *" $b "*) base+=("pos_$b") ;; esac; done
asrkit compare "${dirs[@]}" --out "$out" ${base:+--baseline "$(IFS=,; echo "${base[*]}")"} > /dev/null
if [ -n "$results" ]; then
    cp "$out/compare.md" "$results"
    cp "$out"/wer_vs_*.png "$(dirname "$results")"/
fi
echo "tables: $out/compare.md${results:+ (and $results)}; every figure: $out/compare.json"
