#!/usr/bin/env bash
# The GPU path on the CUDA simulator (docs/GPU.md, "The CUDA simulator build"): every
# gpu-tagged test, built with --repo_env=SATDAR_CUDA=sim, so the real .cu kernels, cuBLASLt and
# NCCL calls run on the CPU against the CPU reference (the simulator's own tests are plain C++
# and run in scripts/test.sh's build). .ci/run runs it after scripts/test.sh. Other arguments go to `bazel test`. The last line counts the
# tests as scripts/test.sh does.
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
bash scripts/setup.sh || exit 1
LOG=$(mktemp)
bazel test --repo_env=SATDAR_CUDA=sim --test_tag_filters=gpu --build_tests_only "$@" \
  -- //... 2>&1 | tee "$LOG"
rc=${PIPESTATUS[0]}
total=$(grep -oE 'Executed [0-9]+ out of [0-9]+ tests' "$LOG" | tail -1 | awk '{print $5}')
failed=$(grep -cE '^//.* (FAILED|TIMEOUT|NO STATUS)' "$LOG")
rm -f "$LOG"
if [[ -n "$total" ]]; then
  echo "$((total - failed)) passed, $failed failed"
fi
exit $rc
