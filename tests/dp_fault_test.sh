#!/usr/bin/env bash
# A data-parallel run whose rank is killed mid-training ends everywhere within 60 s (nothing
# hangs, the launch exits non-zero), and leaves only complete checkpoints behind.
# Usage: dp_fault_test.sh PATH_TO_SATDAR
set -u
SATDAR=$(realpath "$1")
WORK="${TEST_TMPDIR:-/tmp/satdar-test-$$}/fault"
rm -rf "$WORK" && mkdir -p "$WORK"
cd "$WORK"
unset TEST_PREMATURE_EXIT_FILE XML_OUTPUT_FILE
MPIRUN=(mpirun --allow-run-as-root --oversubscribe --mca btl self,tcp --mca btl_tcp_if_include lo
        --mca oob_tcp_if_include lo)
cat >config.json <<'JSON'
{"vocab_size": 256, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
 "num_attention_heads": 4}
JSON
T=(train --config config.json --synthetic-data --steps 400 --batch-size 4 --seq-len 64 --dp 2
   --threads 1 --quiet --checkpoint-dir ckpt --checkpoint-every 2 --seed 11)
"${MPIRUN[@]}" -np 2 "$SATDAR" "${T[@]}" >run.txt 2>&1 &
launcher=$!
for _ in $(seq 1 600); do
  [[ -e ckpt/ckpt_00000004.safetensors ]] && break
  sleep 0.05
done
victim=$(pgrep -f "seed 11" | grep -v "^$launcher$" | while read -r p; do
  [[ $(ps -o comm= -p "$p") == satdar ]] && echo "$p"; done | tail -1)
if [[ -z "$victim" ]]; then echo "FAIL: no rank to kill"; echo "0 passed, 1 failed"; exit 1; fi
start=$(date +%s)
kill -9 "$victim"
status=0
for _ in $(seq 1 600); do
  kill -0 "$launcher" 2>/dev/null || break
  sleep 0.1
done
if kill -0 "$launcher" 2>/dev/null; then
  echo "FAIL: the run still hangs 60 s after a rank was killed"; kill -9 "$launcher"
  echo "0 passed, 1 failed"; exit 1
fi
wait "$launcher"; status=$?
echo "killed rank $victim; the launcher exited with $status after $(( $(date +%s) - start )) s"
passed=0
failed=0
if [[ $status -ne 0 ]]; then passed=$((passed + 1)); else echo "FAIL: exit status 0"; failed=$((failed + 1)); fi
# Every checkpoint under its final name is complete.
for f in ckpt/ckpt_*.safetensors; do
  python3 - "$f" <<'PY' || { echo "FAIL: $f is incomplete"; failed=$((failed + 1)); }
import json, os, struct, sys
raw = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
header = json.loads(raw[8:8 + n])
end = max(v["data_offsets"][1] for k, v in header.items() if k != "__metadata__")
assert len(raw) == 8 + n + end, "truncated"
PY
done
[[ $failed -eq 0 ]] && passed=$((passed + 1))
ls ckpt | grep -q "\.tmp\." && echo "(a temporary file of the interrupted write remains; no final name points at it)"
echo "$passed passed, $failed failed"
[[ $failed -eq 0 ]]
