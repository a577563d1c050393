#!/usr/bin/env bash
# The README's second command: installs what is missing, then builds everything and runs every
# test (bazel test //...). Tests tagged "gpu" skip themselves without a GPU.
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
bash scripts/setup.sh || exit 1
LOG=$(mktemp)
bazel test //... "$@" 2>&1 | tee "$LOG"
rc=${PIPESTATUS[0]}
total=$(grep -oE 'Executed [0-9]+ out of [0-9]+ tests' "$LOG" | tail -1 | awk '{print $5}')
failed=$(grep -cE '^//.* (FAILED|TIMEOUT|NO STATUS)' "$LOG")
rm -f "$LOG"
if [[ -n "$total" ]]; then
  echo "$((total - failed)) passed, $failed failed"
fi
exit $rc
