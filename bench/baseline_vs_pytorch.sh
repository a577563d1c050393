#!/usr/bin/env bash
# Trains the ~20M-parameter baseline (configs/bench/transformer.json: d=384, L=6, H=6, dff=1536,
# vocab 256) at T=256, B=8 for the same steps in satdar and in PyTorch 1.13 (eager, fp32,
# bench/pytorch_baseline.py) with the same thread count, one after the other, and prints
# tokens/s, peak RSS and the ratios. Both time the steps after the first (warm-up) step.
# Usage: bench/baseline_vs_pytorch.sh [STEPS] [THREADS]
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
STEPS=${1:-20}
THREADS=${2:-2}
OUT=$(mktemp -d)
bazel build //:satdar >/dev/null 2>&1 || bazel build //:satdar
echo "machine: $(nproc) cores, $(lscpu | sed -n 's/^Model name: *//p'), $(date -u +%Y-%m-%d)"
echo "satdar: $STEPS steps ..."
bazel-bin/satdar train --config configs/bench/transformer.json --synthetic-data --steps "$STEPS" \
  --batch-size 8 --seq-len 256 --threads "$THREADS" --quiet --summary-json "$OUT/satdar.json"
echo "pytorch: $STEPS steps ..."
/usr/bin/python3 bench/pytorch_baseline.py --hidden 384 --layers 6 --heads 6 --kv-heads 6 \
  --ffn 1536 --vocab 256 --seq-len 256 --batch-size 8 --steps "$STEPS" --warmup-steps 1 \
  --threads "$THREADS" --json "$OUT/pytorch.json" >/dev/null
/usr/bin/python3 - "$OUT" <<'PY'
import json, sys
out = sys.argv[1]
s = json.load(open(out + "/satdar.json"))
p = json.load(open(out + "/pytorch.json"))
mib = lambda b: b / 1048576
print("%-8s %12s %14s %12s" % ("", "tokens/s", "peak RSS MiB", "final loss"))
print("%-8s %12.0f %14.0f %12.4f" % ("satdar", s["tokens_per_second"], mib(s["peak_rss_bytes"]), s["final_loss"]))
print("%-8s %12.0f %14.0f %12.4f" % ("pytorch", p["tokens_per_second"], mib(p["peak_rss_bytes"]), p["final_loss"]))
print("ratio: satdar/pytorch tokens/s = %.2fx, peak RSS = %.2fx" % (
    s["tokens_per_second"] / p["tokens_per_second"], s["peak_rss_bytes"] / p["peak_rss_bytes"]))
PY
rm -rf "$OUT"
