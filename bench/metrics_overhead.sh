#!/usr/bin/env bash
# The step-time cost of metrics: the same CPU run with and without --metrics-listen (statistics
# every 5 steps in both), interleaved run by run (the VM's speed drifts, so back-to-back pairs
# are the fair comparison), while a scraper reads the rank's /metrics every 0.5 s.
#   bench/metrics_overhead.sh [ROUNDS] [DESIGN ...]     (DESIGN: a config in configs/bench/)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
rounds=${1:-3}
shift $(( $# < 1 ? $# : 1 ))
designs=("$@")
[ ${#designs[@]} -eq 0 ] && designs=(transformer dar)
export OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-Haswell}
bin=bazel-bin/satdar
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"; kill $(jobs -p) 2>/dev/null || true' EXIT
echo "round design metrics tokens_per_second"
for round in $(seq "$rounds"); do
  for design in "${designs[@]}"; do
    for side in off on; do
      extra=()
      [ "$side" = on ] && extra=(--metrics-listen 127.0.0.1:0)
      "$bin" train --config "configs/bench/$design.json" --synthetic-data --steps 15 \
        --batch-size 4 --seq-len 128 --threads 2 --stats-every 5 --summary-json "$tmp/s.json" \
        "${extra[@]}" >"$tmp/out.txt" 2>&1 &
      pid=$!
      if [ "$side" = on ]; then  # scrape while it trains
        while kill -0 "$pid" 2>/dev/null; do
          addr=$(grep -o 'http://[0-9.:]*/metrics' "$tmp/out.txt" | head -1 || true)
          [ -n "$addr" ] && curl -s -o /dev/null "$addr" || true
          sleep 0.5
        done
      fi
      wait "$pid"
      python3 -c "import json,sys; j=json.load(open(sys.argv[1])); print(sys.argv[2], sys.argv[3], sys.argv[4], round(j['tokens_per_second']))" \
        "$tmp/s.json" "$round" "$design" "$side"
    done
  done
done
