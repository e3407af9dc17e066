# Sourced by the comparison scripts (run_pos_compare.sh, run_padfree_compare.sh): a finished model is
# skipped on a rerun, so one trained with another step budget would enter the comparison as if it had
# this one. budget_check STEPS EXP_DIR...: exits 2, before any work, naming the first existing
# experiment whose config.yaml has another train.max_steps, with a remedy that works as printed.
budget_check() {
    local steps=$1 dir cfg had
    shift
    for dir in "$@"; do
        cfg=$dir/config.yaml
        [ -f "$cfg" ] || continue
        had=$(awk '/^train:/{t=1;next} /^[^ ]/{t=0} t && $1=="max_steps:"{print $2}' "$cfg")
        if [ -n "$had" ] && [ "$had" != "$steps" ]; then
            echo "$0: $dir was trained with train.max_steps=$had, not --steps $steps;" \
                "rerun with --steps $had to reuse it, or move it away to train anew: mv $dir ${dir}_steps$had" >&2
            exit 2
        fi
    done
}
