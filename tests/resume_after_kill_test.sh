#!/usr/bin/env bash
# A training run killed with SIGKILL and resumed logs exactly the losses of an uninterrupted
# run, and a kill never leaves a half-written checkpoint under a final name.
# Usage: resume_after_kill_test.sh PATH_TO_SATDAR
set -u
SATDAR=$(realpath "$1")
WORK="${TEST_TMPDIR:-/tmp/satdar-test-$$}/resume"
rm -rf "$WORK" && mkdir -p "$WORK"
cd "$WORK"
cat >config.json <<'JSON'
{"vocab_size": 256, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "max_position_embeddings": 512,
 "num_attention_heads": 4, "num_key_value_heads": 2}
JSON
# Enough steps that the run is still going when the first checkpoint appears, even on a fast
# machine (a run that finishes first leaves the resumed run nothing to do).
STEPS=300
ARGS=(train --config config.json --steps $STEPS --batch-size 4 --seq-len 32 --synthetic-data
      --threads 2 --seed 3 --quiet)
"$SATDAR" "${ARGS[@]}" --log-jsonl full.jsonl || { echo "FAIL: uninterrupted run"; exit 1; }

"$SATDAR" "${ARGS[@]}" --log-jsonl part.jsonl --checkpoint-dir ckpt --checkpoint-every 2 &
pid=$!
# Kill it as soon as any checkpoint exists (or the run ends). Not a fixed step: only the newest
# 3 are kept, so a fast run may have pruned the step-4 one before the next poll.
for _ in $(seq 1 600); do
  compgen -G "ckpt/ckpt_*.safetensors" >/dev/null && break
  kill -0 $pid 2>/dev/null || break
  sleep 0.05
done
kill -9 $pid 2>/dev/null
wait $pid 2>/dev/null
last=$(ls ckpt/ckpt_*.safetensors | sort | tail -1)
echo "killed; newest checkpoint: $last"

# The resumed run appends to the killed run's log: steps the killed run logged past its newest
# checkpoint are dropped, so the log holds each step once.
"$SATDAR" "${ARGS[@]}" --log-jsonl part.jsonl --checkpoint-dir ckpt --checkpoint-every 2 --resume \
  || { echo "FAIL: resumed run"; exit 1; }
cp part.jsonl resumed.jsonl
python3 - "$STEPS" <<'PY'
import json, sys
steps = int(sys.argv[1])
full = {j["step"]: j for j in map(json.loads, open("full.jsonl"))}
resumed = [json.loads(l) for l in open("resumed.jsonl")]
assert resumed, "resumed run logged nothing"
bad = [r["step"] for r in resumed if r["loss"] != full[r["step"]]["loss"]
       or r["grad_norm"] != full[r["step"]]["grad_norm"]]
assert resumed[-1]["step"] == steps, resumed[-1]
assert [r["step"] for r in resumed] == list(range(1, steps + 1)), "a step logged twice or lost"
if bad:
    print("FAIL: losses differ at steps", bad); sys.exit(1)
print("resumed steps %d..%d match the uninterrupted run exactly" % (resumed[0]["step"], steps))
PY
rc=$?
echo "$((rc == 0 ? 1 : 0)) passed, $((rc == 0 ? 0 : 1)) failed"
exit $rc
