#!/usr/bin/env bash
# Strict option parsing for recipe scripts (ESPnet convention), sourced after the defaults are set:
#   --stage 3 --stop_stage 5 --foo-bar x   sets stage=3, stop_stage=5, foo_bar=x
# Both --foo_bar and --foo-bar are accepted. An option whose variable is not already defined by the
# script is an error (typos never pass silently). `--help` prints the script's header and options.
# Options named in $__asrkit_append_opts accumulate: each value is appended (space-separated).
# Remaining (positional) arguments are left in "$@".
while [ $# -gt 0 ]; do
    case "$1" in
    --help|-h)
        sed -n '2,/^[^#]/{/^#/s/^# \{0,1\}//p}' "$0"
        echo "options (current values):"
        for __v in ${__asrkit_opts:-}; do
            echo "  --$__v ${!__v}"
            # what it is: the comment beside its default in the script (and its continuation lines)
            awk -v v="$__v" '$0 ~ "^"v"=" {on=1; sub(/^[^#]*#? ?/, ""); if ($0 != "") print "        " $0; next}
                on && /^ +# / {sub(/^ +# ?/, ""); print "        " $0; next} {on=0}' "$0"
        done
        exit 0 ;;
    --*=*)
        __name=${1%%=*}; __name=${__name#--}; __name=${__name//-/_}; __val=${1#*=}; shift ;;
    --*)
        __name=${1#--}; __name=${__name//-/_}
        if [ $# -lt 2 ]; then echo "$0: option --${__name} needs a value" >&2; exit 2; fi
        __val=$2; shift 2 ;;
    *) break ;;
    esac
    if ! [[ "$__name" =~ ^[A-Za-z_][A-Za-z0-9_]*$ ]] || [ -z "${!__name+x}" ]; then
        echo "$0: unknown option --${__name//_/-}" >&2
        [ -n "${__asrkit_opts:-}" ] && echo "valid options: $(for v in $__asrkit_opts; do printf -- '--%s ' "$v"; done)" >&2
        exit 2
    fi
    case " ${__asrkit_append_opts:-} " in
    *" $__name "*) [ -z "${!__name}" ] || __val="${!__name} $__val" ;;
    esac
    printf -v "$__name" '%s' "$__val"
done
unset __name __val __v
