#!/usr/bin/env bash
# How well `satdar plan`'s step-time model predicts real runs: ten CPU layouts trained under
# mpirun (f32, global batch 8 x 256, configs/bench/: d=384, L=6), twice each, the layouts taken
# in turn. Right before and right after each run bench/cpu_hardware measures this machine (one
# core's GEMM rate and the fraction the model's GEMM forms reach, the copy bandwidth; the MPI
# link's latency and bandwidth once at the start), and the run is predicted from the mean of
# the two: nothing is fitted to the runs, and a VM whose speed drifts from minute to minute is
# measured around the minute of the run. Each run's step time (the median of steps 3..STEPS)
# against `satdar plan --layout ... --hardware` with that measurement; a layout's error is the
# median of its two runs'.
# Usage: bench/plan_accuracy.sh [STEPS]   (prints a table and the mean absolute error)
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
STEPS=${1:-8}
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
MPIRUN=(mpirun --allow-run-as-root --oversubscribe --mca btl self,tcp --mca btl_tcp_if_include lo
        --mca oob_tcp_if_include lo)
bazel build //:satdar //bench:cpu_hardware >/dev/null 2>&1 || bazel build //:satdar //bench:cpu_hardware
S=bazel-bin/satdar
echo "machine: $(nproc) cores, $(lscpu | sed -n 's/^Model name: *//p'), $(date -u +%Y-%m-%d)"
"${MPIRUN[@]}" -np 2 bazel-bin/bench/cpu_hardware --measure-link --out "$OUT/link.json"

CASES=("transformer 1 1 1 1 1" "transformer 1 1 1 1 2" "transformer 2 1 1 1 1"
       "transformer 1 2 1 1 1" "transformer 1 2 1 1 1 --sequence-parallel"
       "transformer 1 1 2 1 1 --microbatches 4" "dar 1 1 1 1 1 --recompute full"
       "dar 1 1 2 1 1 --microbatches 4" "satformer 1 2 1 1 1" "dar-moe 1 1 1 2 1")
for round in 1 2; do
  for n in "${!CASES[@]}"; do
    read -r design dp tp pp ep threads extra <<<"${CASES[$n]}"
    bazel-bin/bench/cpu_hardware --dtype f32 --link "$OUT/link.json" --out "$OUT/$n.$round.cpu.json" \
      >"$OUT/$n.$round.cpu.txt"
    # shellcheck disable=SC2086  # extra: more flags, split on purpose
    "${MPIRUN[@]}" -np $((dp * tp * pp * ep)) "$S" train --config "configs/bench/$design.json" \
      --synthetic-data --steps "$STEPS" --seq-len 256 --batch-size $((8 / (dp * ep))) \
      --threads "$threads" --quiet --stats-every 0 --dp "$dp" --tp "$tp" --pp "$pp" --ep "$ep" \
      $extra --log-jsonl "$OUT/$n.$round.jsonl" >/dev/null
    bazel-bin/bench/cpu_hardware --dtype f32 --link "$OUT/link.json" --out "$OUT/$n.$round.after.json" \
      >/dev/null
    /usr/bin/python3 - "$OUT/$n.$round.cpu.json" "$OUT/$n.$round.after.json" <<'PY'
import json, sys
before, after = (json.load(open(p)) for p in sys.argv[1:3])
for k in ("peak_flops", "gemm_efficiency", "memory_bandwidth", "op_overhead"):
    before[k] = (before[k] + after[k]) / 2
json.dump(before, open(sys.argv[1], "w"), indent=2)
PY
  done
done
printf "\n%-12s %-36s %8s %18s %18s %8s\n" design "layout (dp,tp,pp,ep) flags" "GFLOP/s" \
  "measured (2 runs)" "predicted" error
for n in "${!CASES[@]}"; do
  read -r design dp tp pp ep threads extra <<<"${CASES[$n]}"
  for round in 1 2; do
    # shellcheck disable=SC2086
    "$S" plan --config "configs/bench/$design.json" --layout "$dp,$tp,$pp,$ep" --seq-len 256 \
      --batch-size $((8 / (dp * ep))) --threads "$threads" --hardware "$OUT/$n.$round.cpu.json" \
      $extra --json >"$OUT/$n.$round.plan.json"
  done
  /usr/bin/python3 - "$OUT/$n" "$design" \
      "($dp,$tp,$pp,$ep)${extra:+ $extra}$([ "$threads" != 1 ] && echo " ${threads} threads")" \
      >>"$OUT/rows.txt" <<'PY'
import json, statistics, sys
base = sys.argv[1]
measured, predicted, rates = [], [], []
for r in (1, 2):
    measured.append(statistics.median(
        [json.loads(l)["step_seconds"] for l in open("%s.%d.jsonl" % (base, r))][2:]))
    predicted.append(json.load(open("%s.%d.plan.json" % (base, r)))["step_seconds"])
    rates.append(json.load(open("%s.%d.cpu.json" % (base, r)))["peak_flops"] / 1e9)
err = statistics.median([(p - m) / m for p, m in zip(predicted, measured)])
print("%-12s %-36s %3.0f/%-4.0f %8.0f/%-6.0f ms %8.0f/%-6.0f ms %+7.0f%%" % (
    sys.argv[2], sys.argv[3], rates[0], rates[1], measured[0] * 1e3, measured[1] * 1e3,
    predicted[0] * 1e3, predicted[1] * 1e3, 100 * err))
PY
  tail -n 1 "$OUT/rows.txt"
done
/usr/bin/python3 - "$OUT/rows.txt" <<'PY'
import sys
errs = [abs(float(l.split()[-1].rstrip('%'))) for l in open(sys.argv[1])]
print("\nmean absolute error %.0f%%, largest %.0f%% over %d layouts" %
      (sum(errs) / len(errs), max(errs), len(errs)))
PY
