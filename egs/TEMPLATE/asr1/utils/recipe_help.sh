#!/usr/bin/env bash
# `run.sh --help` (or -h) answers before anything is set up. Sourced by every egs/*/asr1/run.sh
# right after its `cd`, before path.sh: with --help among the arguments it prints the recipe's
# header (its comment lines) and exports __ASRKIT_HELP=1, so path.sh neither builds the
# virtualenv nor installs anything and the recipe skips its own work (downloads, checks); the
# shared asr.sh then prints its options with this recipe's values and exits. Without --help it
# does nothing.
for __asrkit_a in "$@"; do
    case "$__asrkit_a" in
    --help|-h)
        sed -n '2,/^[^#]/{/^#/s/^# \{0,1\}//p}' "$0"
        echo
        echo "The options of the shared stage script egs/TEMPLATE/asr1/asr.sh (values: this recipe's):"
        export __ASRKIT_HELP=1
        break ;;
    esac
done
unset __asrkit_a
