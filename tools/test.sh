#!/usr/bin/env bash
# The one test command (README, .ci/run): set up what is missing, then run the pytest suite.
# Extra arguments go to pytest, e.g. tools/test.sh -k tokenizer -x
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
ASRKIT_DEV=1 "$root/tools/setup.sh"  # the dev extras (pytest, hypothesis, ruff...); users' set-up has none
cd "$root"
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
set +e
if [ "${ASRKIT_USE_CURRENT_ENV:-0}" = 1 ]; then py=$(command -v python3 || command -v python); else py=${ASRKIT_VENV:-$root/.venv}/bin/python; fi
"$py" -m pytest "$@"
rc=$?
set -e
# pytest exit code 5 = no tests collected (e.g. a -k filter that matches nothing): not a failure.
if [ "$rc" -eq 5 ]; then echo "[test] no tests collected"; exit 0; fi
exit "$rc"
