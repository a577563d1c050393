#!/usr/bin/env bash
# Tokens/s and peak memory of every design at one CPU shape (configs/bench/*.json: d=384,
# L=6, H=6, dff=1536, vocab 256; B=8, T=256, f32, random tokens), side by side with the
# baseline. The designs run in rounds (every design once per round, in the same order), and each
# reports the median over all its timed steps (every step but a run's first) of all rounds:
# a shared machine drifts by several percent within a minute, and the median of interleaved
# samples resists that better than any one run's average.
# Usage: bench/designs.sh [STEPS] [THREADS] [ROUNDS] [DESIGN ...]
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
STEPS=${1:-6}
THREADS=${2:-2}
ROUNDS=${3:-2}
shift $(($# < 3 ? $# : 3))
DESIGNS=("$@")
if ((${#DESIGNS[@]} == 0)); then
  DESIGNS=(transformer satformer resformer attnres transparent dar dar-full hc mhc denseformer
           muddformer dar-moe)
fi
OUT=$(mktemp -d)
bazel build //:satdar >/dev/null 2>&1 || bazel build //:satdar
echo "machine: $(nproc) cores, $(lscpu | sed -n 's/^Model name: *//p'), $(date -u +%Y-%m-%d)"
for round in $(seq 1 "$ROUNDS"); do
  for design in "${DESIGNS[@]}"; do
    bazel-bin/satdar train --config "configs/bench/$design.json" --synthetic-data \
      --steps "$STEPS" --batch-size 8 --seq-len 256 --threads "$THREADS" --quiet \
      --stats-every 0 --summary-json "$OUT/$design.$round.json" --log-jsonl "$OUT/$design.$round.jsonl"
  done
done
/usr/bin/python3 - "$OUT" "$ROUNDS" "${DESIGNS[@]}" <<'PY'
import json, statistics, sys
out, rounds, designs = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
tps, rss, params = {}, {}, {}
for d in designs:
    samples = []
    for r in range(1, rounds + 1):
        steps = [json.loads(l) for l in open("%s/%s.%d.jsonl" % (out, d, r))]
        samples += [s["tokens_per_second"] for s in steps[1:]]
        summary = json.load(open("%s/%s.%d.json" % (out, d, r)))
        rss[d] = max(rss.get(d, 0), summary["peak_rss_bytes"])
        params[d] = summary["parameters"]
    tps[d] = statistics.median(samples)
base = tps.get("transformer")
print("| design | tokens/s (median step) | vs transformer | peak RSS MiB | parameters |")
print("|---|---|---|---|---|")
for d in designs:
    ratio = "%.3f" % (tps[d] / base) if base else "-"
    print("| %s | %.0f | %s | %.0f | %.2fM |" % (d, tps[d], ratio, rss[d] / 1048576, params[d] / 1e6))
PY
rm -rf "$OUT"
