#!/usr/bin/env bash
# The one test command (README, .ci/run): set up what is missing, then run the pytest suite.
# Extra arguments go to pytest, e.g. tools/test.sh -k tokenizer -x
# The tests run in ASRKIT_TEST_WORKERS processes (pytest-xdist; default: one per CPU, at most 8), each
# test file in one of them (its module fixtures built once); ASRKIT_TEST_WORKERS=0 runs them in this
# process (for -s, --pdb).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
workers=${ASRKIT_TEST_WORKERS:-$(nproc 2>/dev/null || echo 1)}
case $workers in ''|*[!0-9]*) echo "tools/test.sh: ASRKIT_TEST_WORKERS must be a number of processes (0: none, the tests run in pytest's own process), got '$workers'" >&2; exit 2 ;; esac
[ "$workers" -le 8 ] || workers=8
ASRKIT_DEV=1 "$root/tools/setup.sh"  # the dev extras (pytest, hypothesis, ruff...); users' set-up has none
cd "$root"
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
set +e
if [ "${ASRKIT_USE_CURRENT_ENV:-0}" = 1 ]; then py=$(command -v python3 || command -v python); else py=${ASRKIT_VENV:-$root/.venv}/bin/python; fi
if [ "$workers" -gt 0 ]; then "$py" -m pytest -n "$workers" --dist loadfile "$@"; else "$py" -m pytest "$@"; fi
rc=$?
set -e
# pytest exit code 5 = no tests collected (e.g. a -k filter that matches nothing): not a failure.
if [ "$rc" -eq 5 ]; then echo "[test] no tests collected"; exit 0; fi
exit "$rc"
