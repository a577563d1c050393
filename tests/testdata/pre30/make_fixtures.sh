#!/usr/bin/env bash
# How the fixtures of tests/checkpoint_compat_test.sh were made (2026-12-03), with satdar built
# at 24a32d6 (before issue 30's code): 6-step runs of config.json checkpointed every 3 steps,
# one rank and --tp 2 --pp 2; the step-3 checkpoints kept, and the losses and gradient norms of
# steps 4 to 6 in expected.json.
# Usage: make_fixtures.sh PATH_TO_OLD_SATDAR (from this folder)
set -euo pipefail
OLD=$(realpath "$1")
cd "$(dirname "${BASH_SOURCE[0]}")"
export OPENBLAS_CORETYPE=Haswell
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
T=(train --config config.json --synthetic-data --steps 6 --batch-size 2 --seq-len 8 --threads 1
   --seed 7 --checkpoint-every 3 --quiet --launcher threads)
"$OLD" "${T[@]}" --checkpoint-dir "$tmp/one" --log-jsonl "$tmp/one.jsonl"
"$OLD" "${T[@]}" --tp 2 --pp 2 --checkpoint-dir "$tmp/tp2pp2" --log-jsonl "$tmp/tp2pp2.jsonl"
rm -rf sharded ckpt_00000003.safetensors && mkdir sharded
cp "$tmp/one/ckpt_00000003.safetensors" .
cp -r "$tmp/tp2pp2/ckpt_00000003" sharded/
python3 - "$tmp/one.jsonl" "$tmp/tp2pp2.jsonl" <<'PY' >expected.json
import json, sys
def steps(path):
    return [{"step": j["step"], "loss": j["loss"], "grad_norm": j["grad_norm"]}
            for j in map(json.loads, open(path)) if j["step"] > 3]
print(json.dumps({"single": steps(sys.argv[1]), "sharded": steps(sys.argv[2])}, indent=1))
PY
