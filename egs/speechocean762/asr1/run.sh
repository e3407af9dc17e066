#!/usr/bin/env bash
# speechocean762 (OpenSLR 101, CC BY 4.0): real read English speech of 250 Mandarin-L1 speakers,
# half of them children; 2.9 h of training audio. A letters CTC Conformer for one 2-core CPU
# (conf/train_conformer.yaml; conf/train.yaml is the Transformer of the same shape),
# decoded with a TLG graph (the training words spelled in letters + a word 3-gram of the
# training text; at most 1000 active states per frame: the same test WER as 7000 at 1.4-1.7x
# the decoding speed, RESULTS.md), its LM weight and blank penalty chosen on dev (stage 5: asrkit tune). Sets (README.md): train, dev (10 % of the training speakers, children and adults
# alike, speaker-disjoint), the official test set, test_longform (each test speaker's utterances
# joined into 20-45 s recordings, real pauses kept) and test_session (each speaker's whole session).
# Stage 1 also writes the split as Kaldi data dirs (data/kaldi/<set>) for other toolkits.
#   ./run.sh                               all stages (finished ones are skipped)
#   ./run.sh --download true               stage 0 first: fetch + check + unpack the corpus into downloads/
#   ./run.sh --corpus_dir /data/speechocean762   (or SPEECHOCEAN762=... in the environment, db.sh)
#   ./run.sh --stage 4 --tag alibi --train_args "encoder.pos_enc=alibi"
#   ./run.sh --pretrained ../../mini/asr1/exp/train_conformer   start from the synthetic model of
#                                          egs/mini with the same layers (trained first:
#                                          cd ../../mini/asr1 && ./run.sh --stage 4 --stop_stage 4
#                                          --tag train_conformer --train_config conf/train_conformer.yaml;
#                                          train.init_from, README.md)
#   ./run.sh --train_config conf/train.yaml --pretrained ../../mini/asr1/exp/train   the Transformer
#   ./run.sh --token_type phones --tag phones   phone targets (ARPAbet, stress removed) of the corpus's
#                                          resource/lexicon.txt, decoded with a TLG graph of the phones
#   ./run.sh --synth_hours 2.6 --tag mix   mix espeak-ng speech of the training text (2.6 h, part
#                                          train_synth, data/synth) into training; tokens and LM stay the real text's
# Recipe options (parsed here): --download true|false (default false), --download_sha256 HEX,
# --pretrained EXP_DIR_OR_CHECKPOINT (added to --train_args as train.init_from=<absolute path>),
# --synth_hours H (> 0: --prepare_args "--synth-hours H" --aux_train_sets train_synth).
# Every option of ../../TEMPLATE/asr1/asr.sh may be given too (they override the ones set here).
set -euo pipefail
cd "$(dirname "$0")"
. "${ASRKIT_ROOT:-../../..}/egs/TEMPLATE/asr1/utils/recipe_help.sh"  # --help: answers before any set-up
export ASRKIT_RECIPE_CMD="./run.sh$(printf ' %q' "$@")"  # how error messages say to rerun
. ./db.sh
. ./path.sh
. "$ASRKIT_ROOT/egs/TEMPLATE/asr1/utils/seeds.sh"

download=false
pretrained=
synth_hours=0
sha256=$SPEECHOCEAN762_SHA256
corpus_dir=$SPEECHOCEAN762
args=()
while [ $# -gt 0 ]; do
    case "$1" in
    --download|--download_sha256|--download-sha256|--corpus_dir|--corpus-dir|--pretrained|--synth_hours|--synth-hours)
        [ $# -ge 2 ] || { echo "$0: option $1 needs a value" >&2; exit 2; }
        case "$1" in
        --download) download=$2 ;;
        --pretrained) pretrained=$2 ;;
        --synth_hours|--synth-hours) synth_hours=$2 ;;
        --download_sha256|--download-sha256) sha256=$2 ;;
        *) corpus_dir=$2 ;;
        esac
        shift 2 ;;
    --download=*) download=${1#*=}; shift ;;
    --pretrained=*) pretrained=${1#*=}; shift ;;
    --synth_hours=*|--synth-hours=*) synth_hours=${1#*=}; shift ;;
    --download_sha256=*|--download-sha256=*) sha256=${1#*=}; shift ;;
    --corpus_dir=*|--corpus-dir=*) corpus_dir=${1#*=}; shift ;;
    *) args+=("$1"); shift ;;
    esac
done
[[ " true false " == *" $download "* ]] || { echo "$0: --download must be true or false, got '$download'" >&2; exit 2; }
stage=$(opt_last stage 1 ${args[@]+"${args[@]}"})
stop_stage=$(opt_last stop_stage 6 ${args[@]+"${args[@]}"})

[[ "$stage" =~ ^[0-9]+$ && "$stop_stage" =~ ^[0-9]+$ ]] || { echo "$0: --stage and --stop_stage must be whole numbers" >&2; exit 2; }
if [ -z "${__ASRKIT_HELP:-}" ] && [ "$download" = true ] && [ "$stage" -le 1 ]; then
    # stage 0: download (resumable), verify, unpack into downloads/ (which becomes the corpus dir)
    corpus_dir=$PWD/downloads/speechocean762
    if [ -f downloads/.speechocean762.unpacked ] && [ -f "$corpus_dir/train/wav.scp" ]; then
        echo "$(date '+%F %T') [run.sh] stage 0 (download): done before (downloads/.speechocean762.unpacked), skipping"
    else
        echo "$(date '+%F %T') [run.sh] stage 0: download $SPEECHOCEAN762_URL"
        python -m asrkit.data.download "$SPEECHOCEAN762_URL" downloads/speechocean762.tar.gz \
            ${sha256:+--sha256 "$sha256"} --extract downloads
        if [ -z "$sha256" ]; then
            # OpenSLR publishes no checksum of the tarball: check what it unpacked to instead
            (cd "$corpus_dir" && sha256sum --quiet -c "$OLDPWD/conf/corpus.sha256") || {
                echo "$0: stage 0: the unpacked corpus in $corpus_dir differs from speechocean762 as published" \
                     "(conf/corpus.sha256); delete downloads/speechocean762* and rerun with --download true" >&2; exit 1; }
        fi
        date > downloads/.speechocean762.unpacked
    fi
    [ "$stop_stage" -ge 1 ] || exit 0
fi
if [ -z "${__ASRKIT_HELP:-}" ] && [ ! -f "$corpus_dir/train/wav.scp" ] && [ ! -f "$corpus_dir/speechocean762/train/wav.scp" ] && [ "$stage" -le 1 ]; then
    echo "$0: speechocean762 is not at $corpus_dir (no train/wav.scp). Get it with: ./run.sh --download true" \
         "(or download https://www.openslr.org/resources/101/speechocean762.tar.gz, unpack it and" \
         "export SPEECHOCEAN762=/path/to/speechocean762, or give --corpus_dir)" >&2
    exit 1
fi

token_type=$(opt_last token_type letters ${args[@]+"${args[@]}"})
case "$token_type" in letters|phones) tokens=$token_type ;; *) tokens=$token_type$(opt_last nbpe 256 ${args[@]+"${args[@]}"}) ;; esac
recipe=(
    --corpus speechocean762 --corpus_dir "$corpus_dir"
    --train_sets train --dev_set dev --test_sets "test test_longform test_session"
    --token_type letters --lm_order 3
    --train_config conf/train_conformer.yaml
    --decode_args "decode.method=wfst decode.lm=data/lm/graph_${tokens}_3gram decode.max_active=1000"
    --tune_grid "decode.lm_weight=0.5,0.8,1.0,1.2,1.5,2.0 decode.blank_penalty=0,0.5,1.0,1.5,2.0"
)
if [ "$token_type" = phones ] && [ -z "$(opt_last lexicon "" ${args[@]+"${args[@]}"})" ]; then
    lex=$corpus_dir/resource/lexicon.txt; [ -f "$lex" ] || lex=$corpus_dir/speechocean762/resource/lexicon.txt
    recipe+=(--lexicon "$lex")  # the corpus's own (ARPAbet, stress removed by `asrkit tokens`)
fi
if [ -n "$pretrained" ] && [ -z "${__ASRKIT_HELP:-}" ]; then
    [ -e "$pretrained" ] || { echo "$0: --pretrained $pretrained does not exist: train the synthetic model first" \
        "(cd ../../mini/asr1 && ./run.sh --stop_stage 4 --tag train_conformer --train_config conf/train_conformer.yaml;" \
        "its model is ../../mini/asr1/exp/train_conformer; for --train_config conf/train.yaml: ./run.sh there, model" \
        "../../mini/asr1/exp/train), or give another experiment dir or checkpoint" >&2; exit 2; }
    args+=(--train_args "$(opt_last train_args "" ${args[@]+"${args[@]}"}) train.init_from=$(realpath "$pretrained")")
fi
[[ "$synth_hours" =~ ^[0-9]+([.][0-9]+)?$ ]] || { echo "$0: --synth_hours must be a number of hours >= 0, got '$synth_hours'" >&2; exit 2; }
if [ "$synth_hours" != 0 ] && [[ ! "$synth_hours" =~ ^0+([.]0+)?$ ]]; then
    args+=(--prepare_args "--synth-hours $synth_hours" --aux_train_sets train_synth)
fi
[ "$stage" -ge 1 ] || args+=(--stage 1)  # stage 0 is this script's
exec "$ASRKIT_ROOT/egs/TEMPLATE/asr1/asr.sh" "${recipe[@]}" ${args[@]+"${args[@]}"}
