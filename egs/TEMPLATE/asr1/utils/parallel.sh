# Sourced by the comparison scripts (run_pos_compare.sh of mini and speechocean762).
# parallel_each N FUNC ITEM...: runs `FUNC ITEM` for every ITEM in the background, at most N at a
# time, in order; waits for all of them; returns 1 if any failed (each failure is FUNC's to report).
parallel_each() {
    local n=$1 fn=$2 item running=0 failed=0
    shift 2
    for item in "$@"; do
        "$fn" "$item" &
        running=$((running + 1))
        if [ "$running" -ge "$n" ]; then wait -n || failed=1; running=$((running - 1)); fi
    done
    while [ "$running" -gt 0 ]; do wait -n || failed=1; running=$((running - 1)); done
    return "$failed"
}
