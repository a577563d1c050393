#!/usr/bin/env bash
# The CUDA simulator build under AddressSanitizer and UBSan (--config=sim-san in .bazelrc;
# docs/GPU.md, "Sanitizers"): the simulator's own tests (//core/cuda/sim:all, which include
# asan_sim_test's proof that the sanitizers see a kernel's out-of-bounds access) and the
# gpu-tagged tests, except the slowest (SLOW below) unless --all is given. Other arguments go to
# `bazel test` (e.g. --test_output=streamed, or more targets). The last line is a one-line
# summary with the date, to copy into docs/GPU.md; the exit status is bazel's, or 1 when
# asan_sim_test skipped its cases (the build was not sanitized after all).
#
# Usage: scripts/sim_sanitizers.sh [--all] [bazel test args...]
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"

# The slowest even unsanitized (docs/PERFORMANCE.md).
SLOW=(//runtime:cuda_engine_test)
all=0
args=()
for a in "$@"; do
  if [[ "$a" == "--all" ]]; then all=1; else args+=("$a"); fi
done

# The gpu-tagged tests, found by tag so a new one is covered without editing this script.
# (The tags attribute reads "[gpu, manual]": the pattern matches one whole element.)
mapfile -t gpu_tests < <(bazel query --noshow_progress 'attr(tags, "[\[ ]gpu[,\]]", tests(//...))' \
                           2>/dev/null)
if [[ ${#gpu_tests[@]} -eq 0 ]]; then
  echo "sim_sanitizers: bazel query found no gpu-tagged tests" >&2
  exit 2
fi
targets=(//core/cuda/sim:all)
skipped=""
for t in "${gpu_tests[@]}"; do
  if [[ $all -eq 0 && " ${SLOW[*]} " == *" $t "* ]]; then
    skipped+=" $t"
  else
    targets+=("$t")
  fi
done
[[ -n "$skipped" ]] && skipped=" (not run:$skipped; --all runs them)"

LOG=$(mktemp)
trap 'rm -f "$LOG"' EXIT
start=$(date +%s)
bazel test --config=sim-san --keep_going "${args[@]}" -- "${targets[@]}" 2>&1 | tee "$LOG"
rc=${PIPESTATUS[0]}
minutes=$(( ($(date +%s) - start + 59) / 60 ))

total=$(grep -oE 'Executed [0-9]+ out of [0-9]+ tests' "$LOG" | tail -1 | awk '{print $5}')
failed=$(grep -cE '^//.* (FAILED|TIMEOUT|NO STATUS|INCOMPLETE)' "$LOG")

# asan_sim_test passes by skipping in a build without the sanitizers: here that is a failure.
note=""
asan_log=bazel-testlogs/core/cuda/sim/asan_sim_test/test.log
if [[ ! -f "$asan_log" ]]; then
  note="; asan_sim_test did not run"
  [[ $rc -eq 0 ]] && rc=1
elif grep -q '\[  SKIPPED \]' "$asan_log"; then
  note="; asan_sim_test SKIPPED its sanitizer cases (the build was not sanitized)"
  [[ $rc -eq 0 ]] && rc=1
fi

day=$(date -u +%Y-%m-%d)
if [[ -n "$total" ]]; then
  summary="$((total - failed)) passed, $failed failed"
else
  summary="no test ran (build failed?)"
fi
echo "sim-san $day: $summary, ${minutes} min, exit $rc$skipped$note"
exit "$rc"
