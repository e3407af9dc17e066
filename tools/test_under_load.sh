#!/usr/bin/env bash
# The test suite on a busy machine: tools/test.sh beside N CPU-bound busy processes (default 2),
# which end with this script (trap; and each one ends by itself once this script is gone, even
# after a kill -9). Tests of races, signals and time-outs must pass here as on a quiet machine.
#   tools/test_under_load.sh [--busy N] [pytest arguments...]
#   tools/test_under_load.sh --busy 2 tests/test_robustness.py tests/test_learning.py
# ASRKIT_UNDER_LOAD_CMD replaces tools/test.sh (e.g. ".venv/bin/python -m pytest": no set-up check).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
busy=2
if [ "${1:-}" = "--busy" ]; then
    busy=${2:?"--busy needs a number of processes"}
    shift 2
fi
case "$busy" in
    ''|*[!0-9]*) echo "test_under_load.sh: --busy must be a whole number, got '$busy'" >&2; exit 2 ;;
esac
if [ "$busy" -gt 64 ]; then
    echo "test_under_load.sh: --busy $busy is more than 64 processes; use at most 64" >&2
    exit 2
fi
me=$$
pids=()
stop_busy() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
}
trap stop_busy EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
for _ in $(seq 1 "$busy"); do
    # spins while this script lives (kill -0: is it still there?), so that it cannot outlive it
    ( trap - EXIT INT TERM; while kill -0 "$me" 2>/dev/null; do :; done ) &
    pids+=($!)
done
read -r -a test_cmd <<< "${ASRKIT_UNDER_LOAD_CMD:-$root/tools/test.sh}"
echo "[test_under_load] $busy busy processes (pids ${pids[*]:-none}) beside ${test_cmd[*]} on $(getconf _NPROCESSORS_ONLN) CPUs"
set +e
"${test_cmd[@]}" "$@"
rc=$?
set -e
exit "$rc"
