#!/usr/bin/env bash
# Shared ASR recipe: every egs/<corpus>/asr1/run.sh calls this with its sets and configs.
# Stages (each calls one asrkit command; a finished stage leaves a .done marker and is skipped):
#   1 data       corpus on disk (or synthesized, for mini) -> Lhotse manifests
#   2 manifests  check every utterance's audio; store the fbank of the train and dev sets
#                (data/fbank, with --feats stored); build long-form windows
#   3 tokens     train the tokenizer (letters / sentencepiece / phones of --lexicon); with --lm_order N also a word
#                n-gram LM on the training text (+ --lm_text files) and its TLG decoding graph
#   4 train      train the model (resumes automatically after a crash)
#   5 decode     decode the test sets (with --average_num N: first average N checkpoints)
#   6 score      score them, write exp/<tag>/RESULTS.md and exp/RESULTS.md (all experiments side by side)
# Usage: asr.sh [--stage N] [--stop_stage M] [--option value ...]
set -euo pipefail

# ---- options (all may be given as --name value or --name-value; unknown ones are errors)
stage=1
stop_stage=6
corpus=            # name known to `asrkit prepare` (mini, librispeech, wsj, tedlium2, tedlium3, speechocean762),
                   # or your own data: kaldi (every set a Kaldi data dir <corpus_dir>/<set>) | lhotse (Lhotse
                   # manifests in <corpus_dir>; see asrkit/data/kaldi.py)
corpus_dir=        # where the corpus lies (mini: where it is synthesized)
corpus_name=       # the name in manifests, configs and reports (default: --corpus; kaldi/lhotse: name your data)
score_norm=        # scoring normalizer (default: the corpus' own; kaldi/lhotse: librispeech = upper-case + whitespace)
train_sets=        # space-separated parts
aux_train_sets=    # more training parts that do not feed the tokenizer and LM of stage 3 (e.g. synthetic
                   # speech: speechocean762's train_synth); given after stages 1-2 ran, those two run for them alone
dev_set=
test_sets=
longform_sets=     # parts to cut into 10..45 s windows (decoded as <part>-longform<W>)
prepare_args=      # extra args for `asrkit prepare` (given several times, all are passed)
on_bad=raise       # stage 2, audio that does not decode: raise | skip (drop those utterances)
feats=stored       # stored: stage 2 computes the fbank of the train and dev sets once (data/fbank), training
                   # reads it (padded pipeline; padfree computes its own) | on_the_fly: every epoch
manifest_dir=data/manifests
shar_dir=          # non-empty: stage 2 also writes the training sets as Lhotse Shar shards there, and
                   # training reads them (data.shar_dir: each rank its own shards, sequentially; for clusters)
token_type=letters # letters | bpe | unigram | phones (a lexicon's phones: needs --lexicon; decode with TLG)
nbpe=256
lexicon=           # --token_type phones: pronunciation lexicon (Kaldi lexicon.txt: WORD phone phone ...)
token_fold=none    # none | ascii: fold accented letters to ASCII before tokenizing (CAFÉ -> CAFE); scoring folds refs alike
train_config=
train_args=        # key=value overrides for training
expdir=
tag=               # experiment name (default: config file name)
decode_args=       # decode.* overrides
tune_grid=         # decode.KEY=V1,V2,... items: stage 5 first chooses these decoding weights on --dev_set
                   # (asrkit tune: every combination; exp/<tag>/tune_<dev_set>/), then decodes the test sets with
                   # the best, e.g. --tune_grid "decode.lm_weight=0.5,1.0,1.5 decode.blank_penalty=0,1"
checkpoint=last    # last | best | avg
average_num=0      # >0: average the last/best N epoch checkpoints before decoding (needs train.keep_last >= N)
average_by=best    # last | best (dev WER)
lm_order=0         # >0: train a word n-gram LM of this order in stage 3 (and a TLG graph)
lm_text=           # extra LM training text files (e.g. WSJ's LM corpus)
ngpu=              # 0: train on the CPU even where there is a GPU (as ESPnet); N >= 1: N processes (N > 1:
                   # torchrun --nproc_per_node N), each on a GPU where there is one; empty: one process, on the
                   # GPU when there is one (train.device=auto)
gpu_inference=false # true: decode (and tune) on the GPU, decode.device=cuda, one process (as ESPnet's
                   # --gpu_inference); false: on the CPU with --nj processes (decode.device=cpu)
num_nodes=1        # >1: multi-node through cmd.sh's backend
nj=2
force=false        # true: rerun stages even if their .done marker exists

__asrkit_opts="stage stop_stage corpus corpus_dir corpus_name score_norm train_sets aux_train_sets dev_set test_sets longform_sets prepare_args on_bad feats manifest_dir shar_dir token_type nbpe lexicon token_fold train_config train_args expdir tag decode_args tune_grid checkpoint average_num average_by lm_order lm_text ngpu gpu_inference num_nodes nj force"
__asrkit_append_opts="prepare_args"
# how to rerun this recipe from its directory, for the remedies that error messages print
# (run.sh exports its own command line; called directly, this script's)
export ASRKIT_RECIPE_CMD=${ASRKIT_RECIPE_CMD:-$(printf '%q ' "$0" "$@")}
. "$(dirname "${BASH_SOURCE[0]}")/utils/parse_options.sh"
[ $# -eq 0 ] || { echo "$0: unexpected argument(s): $*" >&2; exit 2; }
# option values are checked before any work: a typo must neither run nothing nor half a stage
for v in stage stop_stage nbpe average_num lm_order ngpu num_nodes nj; do
    [ "$v" = ngpu ] && [ -z "$ngpu" ] && continue  # empty: one process, the GPU when there is one
    [[ "${!v}" =~ ^[0-9]+$ ]] || { echo "$0: --${v} must be a whole number >= 0, got '${!v}'" >&2; exit 2; }
    printf -v "$v" '%d' "$((10#${!v}))"  # 08 is 8, not an octal error later
done
for v in num_nodes nj nbpe; do
    [ "${!v}" -ge 1 ] || { echo "$0: --${v} must be >= 1, got ${!v}" >&2; exit 2; }
done
[ "$stage" -le "$stop_stage" ] || { echo "$0: --stage $stage is after --stop_stage $stop_stage: nothing to run" >&2; exit 2; }
for v in "token_type letters bpe unigram phones" "token_fold none ascii" "average_by last best" "on_bad raise skip" "force true false" "gpu_inference true false" "feats stored on_the_fly"; do
    read -r name valid <<< "$v"
    [[ " $valid " == *" ${!name} "* ]] || { echo "$0: --${name} must be one of: $valid; got '${!name}'" >&2; exit 2; }
done

for v in corpus corpus_dir train_sets test_sets train_config; do
    [ -n "${!v}" ] || { echo "$0: --${v} is required" >&2; exit 2; }
done
[ -f "$train_config" ] || { echo "$0: --train_config $train_config does not exist" >&2; exit 2; }
[ -z "$tune_grid" ] || [ -n "$dev_set" ] || { echo "$0: --tune_grid needs --dev_set: decoding weights are chosen on a development set, never on a test set" >&2; exit 2; }
[ -f path.sh ] && . ./path.sh
[ -f cmd.sh ] && . ./cmd.sh
: "${train_cmd:=}"

corpus_name=${corpus_name:-$corpus}
[[ "$corpus_name" =~ ^[A-Za-z0-9][A-Za-z0-9._-]*$ ]] || { echo "$0: --corpus_name '$corpus_name': use letters, digits, '.', '_' and '-'" >&2; exit 2; }
if [ "$corpus" = kaldi ] || [ "$corpus" = lhotse ]; then
    score_norm=${score_norm:-librispeech}  # hypotheses are upper-case; references of your data may not be
    prepare_args="--name $corpus_name${prepare_args:+ $prepare_args}"
fi
tag=${tag:-$(basename "${train_config%.*}")}
expdir=${expdir:-exp/${tag}}
if [ "$token_type" = phones ] && [ "$stage" -le 3 ] && [ "$stop_stage" -ge 3 ]; then
    [ -f "$lexicon" ] || { echo "$0: --token_type phones needs --lexicon FILE (a Kaldi lexicon.txt); got '$lexicon'" >&2; exit 2; }
    lexicon=$(realpath "$lexicon")
fi
token_file=data/tokens/${token_type}$([[ " letters phones " == *" $token_type "* ]] || echo "$nbpe")$([ "$token_fold" = none ] || echo "_$token_fold").json
markers=data/.done

log() { echo "$(date '+%F %T') [asr.sh] $*"; }
run_stage() {  # run_stage N marker_dir name: true if stage N is to run now
    local n=$1 dir=$2 name=$3
    [ "$stage" -le "$n" ] && [ "$stop_stage" -ge "$n" ] || return 1
    if [ -f "$dir/stage$n.done" ] && [ "$force" != true ]; then
        log "stage $n ($name): done before ($dir/stage$n.done), skipping"; return 1
    fi
    log "stage $n: $name"; return 0
}
finish_stage() { mkdir -p "$2"; date > "$2/stage$1.done"; }

[ -z "$aux_train_sets" ] || [ -z "$shar_dir" ] || { echo "$0: --aux_train_sets and --shar_dir together are not supported yet: train the extra parts from manifests (drop --shar_dir)" >&2; exit 2; }
all_sets="$train_sets${aux_train_sets:+ $aux_train_sets} $dev_set $test_sets"
aux_new=""  # training-only parts asked for after stage 1 had run: stages 1 and 2 for them alone
for part in $aux_train_sets; do [ -f "$manifest_dir/${corpus_name}_cuts_${part}.jsonl.gz" ] || aux_new="$aux_new $part"; done
if [ -n "$aux_new" ] && [ -f "$markers/stage1.done" ] && [ "$force" != true ]; then
    [ "$stage" -le 2 ] || { echo "$0: no cuts manifest of --aux_train_sets part(s)$aux_new in $manifest_dir: rerun with --stage 1 (stages 1 and 2 then run for them alone)" >&2; exit 2; }
    log "stages 1-2 for the new training part(s)$aux_new"
    # shellcheck disable=SC2086
    asrkit prepare "$corpus" --corpus-dir "$corpus_dir" --out "$manifest_dir" --parts $aux_new --nj "$nj" $prepare_args
    fbank=(); [ "$feats" = stored ] && fbank=(--fbank-parts $aux_new --speed-parts $aux_new --train-config "$train_config" --train-args "$train_args")
    # shellcheck disable=SC2086
    asrkit cuts --corpus "$corpus_name" --manifest-dir "$manifest_dir" --parts $aux_new --nj "$nj" \
        --on-bad "$on_bad" ${fbank[@]+"${fbank[@]}"}
fi

if run_stage 1 $markers "data"; then
    # shellcheck disable=SC2086
    asrkit prepare "$corpus" --corpus-dir "$corpus_dir" --out "$manifest_dir" --parts $all_sets --nj "$nj" $prepare_args
    finish_stage 1 $markers
fi

if run_stage 2 $markers "manifests: audio check, stored fbank, long-form windows"; then
    fbank=(); [ "$feats" = stored ] && fbank=(--fbank-parts $train_sets $aux_train_sets $dev_set --speed-parts $train_sets $aux_train_sets --train-config "$train_config" --train-args "$train_args")
    [ -n "$shar_dir" ] && fbank+=(--shar-dir "$shar_dir" --shar-parts $train_sets)
    # shellcheck disable=SC2086
    asrkit cuts --corpus "$corpus_name" --manifest-dir "$manifest_dir" --parts $all_sets --nj "$nj" \
        --on-bad "$on_bad" ${longform_sets:+--longform $longform_sets} ${fbank[@]+"${fbank[@]}"}
    finish_stage 2 $markers
fi

tok_markers=$markers/$(basename "${token_file%.json}")  # one marker per tokenizer: several may coexist
if run_stage 3 "$tok_markers" "tokens ($token_type)"; then
    cuts=""; for s in $train_sets; do cuts="$cuts $manifest_dir/${corpus_name}_cuts_${s}.jsonl.gz"; done
    # shellcheck disable=SC2086
    asrkit tokens --cuts $cuts --kind "$token_type" --vocab-size "$nbpe" --fold "$token_fold" --out "$token_file" \
        ${lexicon:+--lexicon "$lexicon"}
    if [ "$lm_order" -gt 0 ]; then
        arpa=data/lm/${lm_order}gram$([ "$token_fold" = none ] || echo "_$token_fold").arpa
        # shellcheck disable=SC2086
        asrkit lm train --text $cuts $lm_text --order "$lm_order" --fold "$token_fold" --out "$arpa"
        asrkit lm graph --tokens "$token_file" --arpa "$arpa" --out "data/lm/graph_$(basename "${token_file%.json}")_${lm_order}gram"
    fi
    finish_stage 3 "$tok_markers"
fi

train_sets_yaml="[$(echo $train_sets $aux_train_sets | sed 's/ /, /g')]"
if run_stage 4 "$expdir/.done" "train -> $expdir"; then
    mkdir -p "$expdir"
    # backend (cmd.sh): local = this machine (torchrun --nproc_per_node $ngpu when > 1);
    # slurm = srun + torchrun on $num_nodes nodes (conf/slurm.conf). Rerunning resumes.
    . "$(dirname "${BASH_SOURCE[0]}")/cmd_backends.sh"
    train_launcher "${ngpu:-0}" "$num_nodes" || exit 2
    log "launcher: ${launcher[*]}"
    : > "$expdir/.train_started"
    rc=0
    # a stop signal is for training (which saves and exits 75); this script waits for it, then says so
    trap 'log "stage 4: signal received: training stops at its next step with a checkpoint"' TERM INT USR1
    # the dev WER during training is also computed with the decoder stage 5 uses (train.valid_decode=auto):
    # the decode.* overrides of --decode_args go to training too (they may change on a resume)
    valid_dec=(); for a in $decode_args; do [[ $a == decode.* ]] && valid_dec+=("$a"); done
    # shellcheck disable=SC2086
    "${launcher[@]}" train --config "$train_config" --exp-dir "$expdir" ${valid_dec[@]+"${valid_dec[@]}"} \
        data.corpus="$corpus_name" data.manifest_dir="$manifest_dir" data.train_sets="$train_sets_yaml" \
        data.dev_set="$dev_set" tokens.kind="$token_type" tokens.path="$token_file" \
        $([ "$feats" = stored ] || echo data.features=on_the_fly) ${shar_dir:+data.shar_dir="$shar_dir"} \
        $([ "$ngpu" != 0 ] || echo train.device=cpu) $train_args || rc=$?
    trap - TERM INT USR1
    if [ "$rc" -ne 0 ]; then
        # stopped by a signal (time limit, preemption, Ctrl-C) with a checkpoint: resumable
        if train_interrupted "$expdir" "$rc"; then
            log "stage 4: training stopped by a signal with a checkpoint; rerun the same command to resume"
            train_requeue
            exit 75
        fi
        exit "$rc"
    fi
    finish_stage 4 "$expdir/.done"
fi

decode_sets="$test_sets"
for s in $longform_sets; do
    for f in "$manifest_dir/${corpus_name}_cuts_${s}"-longform*.jsonl.gz; do
        [ -e "$f" ] || continue
        w=${f##*_cuts_}; decode_sets="$decode_sets ${w%.jsonl.gz}"
    done
done

if run_stage 5 "$expdir/.done" "decode"; then
    if [ "$average_num" -gt 0 ]; then
        asrkit average --exp-dir "$expdir" --num "$average_num" --by "$average_by"
        checkpoint=avg
    fi
    # where decoding runs (--gpu_inference): decode.device first, so --decode_args may still override it
    if [ "$gpu_inference" = true ]; then dev_args=decode.device=cuda; dec_nj=1; else dev_args=decode.device=cpu; dec_nj=$nj; fi
    tuned=""
    if [ -n "$tune_grid" ]; then
        # shellcheck disable=SC2086
        asrkit tune --exp-dir "$expdir" --sets "$dev_set" --checkpoint "$checkpoint" --nj "$dec_nj" \
            ${score_norm:+--norm "$score_norm"} $dev_args $decode_args --grid $tune_grid
        tuned=$(cat "$expdir/tune_$dev_set/best.args")
        log "decoding with the weights chosen on $dev_set: $tuned"
    fi
    # shellcheck disable=SC2086
    asrkit decode --exp-dir "$expdir" --sets $decode_sets --checkpoint "$checkpoint" --nj "$dec_nj" --no-score \
        ${score_norm:+--norm "$score_norm"} $dev_args $decode_args $tuned
    finish_stage 5 "$expdir/.done"
fi

if run_stage 6 "$expdir/.done" "score and report"; then
    asrkit report "$expdir" --score ${score_norm:+--norm "$score_norm"}
    # exp/RESULTS.md: every scored experiment of this recipe side by side (+ PNG plots); the recipe's
    # committed RESULTS.md holds the reference figures and is never overwritten
    scored=(); for d in exp/*/; do [ -f "$d/RESULTS.md" ] && scored+=("${d%/}"); done
    asrkit compare "${scored[@]}" --out exp --md-name RESULTS.md > /dev/null
    finish_stage 6 "$expdir/.done"
fi
log "finished stages $stage..$stop_stage"
