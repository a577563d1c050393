#!/usr/bin/env bash
# Tokens/s and peak memory of every design at one CPU shape (configs/bench/*.json: d=384,
# L=6, H=6, dff=1536, vocab 256; B=8, T=256, f32, random tokens), side by side with the
# baseline. The designs run in rounds (every design once per round, in the same order) and each
# reports its best round, which damps the drift of a shared machine.
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
  DESIGNS=(transformer satformer resformer attnres dar dar-full hc mhc denseformer muddformer dar-moe)
fi
OUT=$(mktemp -d)
bazel build //:satdar >/dev/null 2>&1 || bazel build //:satdar
echo "machine: $(nproc) cores, $(lscpu | sed -n 's/^Model name: *//p'), $(date -u +%Y-%m-%d)"
for round in $(seq 1 "$ROUNDS"); do
  for design in "${DESIGNS[@]}"; do
    bazel-bin/satdar train --config "configs/bench/$design.json" --synthetic-data \
      --steps "$STEPS" --batch-size 8 --seq-len 256 --threads "$THREADS" --quiet \
      --stats-every 0 --summary-json "$OUT/$design.$round.json"
  done
done
/usr/bin/python3 - "$OUT" "$ROUNDS" "${DESIGNS[@]}" <<'PY'
import json, sys
out, rounds, designs = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
best = {}
for d in designs:
    runs = [json.load(open("%s/%s.%d.json" % (out, d, r))) for r in range(1, rounds + 1)]
    best[d] = max(runs, key=lambda j: j["tokens_per_second"])
base = best.get("transformer")
print("| design | tokens/s | vs transformer | peak RSS MiB | parameters |")
print("|---|---|---|---|---|")
for d in designs:
    j = best[d]
    ratio = "%.3f" % (j["tokens_per_second"] / base["tokens_per_second"]) if base else "-"
    print("| %s | %.0f | %s | %.0f | %.2fM |" % (d, j["tokens_per_second"], ratio,
                                                j["peak_rss_bytes"] / 1048576, j["parameters"] / 1e6))
PY
rm -rf "$OUT"
