#!/usr/bin/env bash
# Several training seeds in recipe scripts (sourced): `--seeds 1 2 3` or `--seeds "1 2 3"`.
# Experiments of seed N are named <tag>_seedN and trained with train.seed=N; `asrkit compare`
# groups them into one row (mean, spread, significance that holds across seeds).
#
#   seeds_join "$@"; set -- "${__args[@]}"
#       joins the values of a multi-valued --seeds into one argument ("--seeds 1 2 3" ->
#       --seeds "1 2 3"), so utils/parse_options.sh reads it as one option
#   seeds_split "$@"
#       the same, then takes --seeds out: $__seeds (space-separated, "" if not given) and the
#       other arguments in the array __args
#   opt_last NAME DEFAULT ARGS...
#       prints the last value given to --NAME (or --NAME-with-dashes, --NAME=VALUE) in ARGS,
#       else DEFAULT (the value parse_options.sh would end up with)

seeds_join() {
    __args=()
    local v
    while [ $# -gt 0 ]; do
        case "$1" in
        --seeds)
            shift; v=""
            while [ $# -gt 0 ] && [[ "$1" =~ ^[0-9][0-9,\ ]*$ ]]; do v="${v:+$v }$1"; shift; done
            [ -n "$v" ] || { echo "$0: option --seeds needs one or more non-negative integers" >&2; exit 2; }
            __args+=(--seeds "$v") ;;
        *) __args+=("$1"); shift ;;
        esac
    done
}

seeds_split() {
    seeds_join "$@"
    set -- "${__args[@]}"
    __args=(); __seeds=""
    while [ $# -gt 0 ]; do
        case "$1" in
        --seeds) __seeds="$2"; shift 2 ;;
        --seeds=*) __seeds="${1#--seeds=}"; shift ;;
        *) __args+=("$1"); shift ;;
        esac
    done
    __seeds=$(echo "$__seeds" | tr ',' ' ' | xargs)
    local s
    for s in $__seeds; do
        [[ "$s" =~ ^[0-9]+$ ]] || { echo "$0: --seeds: '$s' is not a non-negative integer" >&2; exit 2; }
    done
}

opt_last() {
    local name=$1 value=$2 dashed=${1//_/-}
    shift 2
    while [ $# -gt 0 ]; do
        case "$1" in
        "--$name"|"--$dashed") [ $# -ge 2 ] && value=$2; shift ;;
        "--$name="*|"--$dashed="*) value=${1#*=} ;;
        esac
        shift
    done
    printf '%s' "$value"
}
