#!/usr/bin/env bash
# Extending and fine-tuning a run (issue 27, part 5):
#  - --resume --steps N beyond the checkpoint's schedule continues, the schedule recomputed for
#    the new total (warmup kept) and said; any other changed flag is refused naming it;
#  - --init-from starts a new run from a checkpoint's weights (a sharded one, any layout) at
#    step 0 with fresh optimizer moments;
#  - after a resume the --log-jsonl holds each step once;
#  - every record carries a timestamp, and MFU and the step phases are logged without
#    --metrics-listen.
# Usage: train_extend_test.sh PATH_TO_SATDAR
set -u
SATDAR=$(realpath "$1")
WORK="${TEST_TMPDIR:-/tmp/satdar-test-$$}/extend"
rm -rf "$WORK" && mkdir -p "$WORK"
cd "$WORK"
passed=0 failed=0
ok() { echo "ok: $1"; passed=$((passed + 1)); }
fail() { echo "FAIL: $1"; failed=$((failed + 1)); }
cat >config.json <<'JSON'
{"vocab_size": 256, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
 "max_position_embeddings": 64, "num_attention_heads": 4, "num_key_value_heads": 2}
JSON
T=(train --config config.json --synthetic-data --seq-len 16 --progress line --checkpoint-every 3)
B=(--batch-size 4)
S=(--seed 5)

# 1. A 6-step run, its step-6 checkpoint lost (as if killed after step 6 was logged).
"$SATDAR" "${T[@]}" "${B[@]}" "${S[@]}" --steps 6 --checkpoint-dir ck --log-jsonl log.jsonl >run1.txt 2>&1 \
  || { fail "first run"; cat run1.txt; }
rm -f ck/ckpt_00000006.safetensors
# 2. Resumed with --steps 12: continues at step 4, says the schedule changes, drops steps 4..6.
"$SATDAR" "${T[@]}" "${B[@]}" "${S[@]}" --steps 12 --checkpoint-dir ck --log-jsonl log.jsonl --resume \
  --summary-json summary.json >run2.txt 2>&1
rc=$?
if [[ $rc == 0 ]] && grep -q "resume: the run's total changes from 6 to 12 steps: the learning-rate schedule is recomputed for 12 steps (warmup 0)" run2.txt \
   && grep -q "resume: dropped 3 entries past step 3 from log.jsonl" run2.txt; then
  ok "--resume --steps 12 extends a 6-step run and says so"
else
  fail "extend (exit $rc)"; cat run2.txt
fi
if python3 - <<'PY'
import json, math, re
recs = [json.loads(l) for l in open("log.jsonl")]
assert [r["step"] for r in recs] == list(range(1, 13)), [r["step"] for r in recs]
# Steps 4..12 follow the cosine schedule of 12 steps (peak 1e-3, floor 0.1, warmup 0 kept
# from the 6-step run, whose default was 6/10 = 0).
for r in recs[3:]:
    want = 1e-4 + (1e-3 - 1e-4) * 0.5 * (1 + math.cos(math.pi * r["step"] / 12))
    assert abs(r["lr"] - want) <= 1e-12, (r["step"], r["lr"], want)
iso = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")
for r in recs:
    assert iso.match(r["time"]), r
    assert 0 < r["mfu"] < 1, r
    assert set(r["phase_seconds"]) == {"data", "compute", "comm_wait", "pipeline_bubble", "optimizer"}, r
assert iso.match(json.load(open("summary.json"))["time"])
PY
then ok "the log holds steps 1..12 once, the new schedule, a time, MFU and phases on every record"
else fail "log contents"; fi
if grep -qE '^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9:.]+Z step    12/12 ' run2.txt; then
  ok "console lines carry the time"
else fail "console timestamp"; fi

# 3. Other changed flags are refused, naming the flag and both values; fewer steps too.
expect2() {  # NAME TEXT ARGS...
  local name=$1 text=$2
  shift 2
  "$SATDAR" "$@" >out.txt 2>&1
  local c=$?
  if [[ $c == 2 ]] && grep -qF -- "$text" out.txt; then ok "$name"; else
    fail "$name (exit $c)"; cat out.txt; fi
}
expect2 "a changed --lr is named" \
  "was written with lr 0.001, this run has 0.002; resume with the same value" \
  "${T[@]}" "${B[@]}" "${S[@]}" --steps 12 --checkpoint-dir ck --resume --lr 2e-3
expect2 "a changed global batch is named" "was written with batch_size (the global batch" \
  "${T[@]}" "${S[@]}" --steps 12 --checkpoint-dir ck --resume --batch-size 8
expect2 "a changed --seed is named" "was written with seed 5, this run has 6" \
  "${T[@]}" "${B[@]}" --steps 12 --checkpoint-dir ck --resume --seed 6
expect2 "--steps below the checkpoint" "is at step 12, beyond steps 5; give steps 12 or more" \
  "${T[@]}" "${B[@]}" "${S[@]}" --steps 5 --checkpoint-dir ck --resume
expect2 "a changed --warmup-steps is named" "was written with warmup_steps 0, this run has 2" \
  "${T[@]}" "${B[@]}" "${S[@]}" --steps 12 --checkpoint-dir ck --resume --warmup-steps 2
# The same total again: the finished run trains nothing.
"$SATDAR" "${T[@]}" "${B[@]}" "${S[@]}" --steps 12 --checkpoint-dir ck --resume >out.txt 2>&1 \
  && grep -q "already finished all 12 steps" out.txt && ok "same total: nothing to train" \
  || { fail "same total"; cat out.txt; }

# 4. --init-from a sharded (tp=2) checkpoint: the same losses on one rank and on tp=2, from
# step 1 (warmup from 0); the run's own checkpoints start at step 1. A run of seed 5 starts
# from the tp=2 run's initial weights and first batch, so its first loss is the tp=2 run's
# first loss; from the trained weights it is not.
"$SATDAR" "${T[@]}" "${B[@]}" "${S[@]}" --steps 3 --checkpoint-dir ck_tp --tp 2 --launcher threads \
  --log-jsonl tp.jsonl >run3.txt 2>&1 && [[ -d ck_tp/ckpt_00000003 ]] || { fail "tp=2 run"; cat run3.txt; }
F=(train --config config.json --synthetic-data --batch-size 4 --seq-len 16 --seed 5
   --warmup-steps 2 --progress line)
"$SATDAR" "${F[@]}" --steps 4 --init-from ck_tp --log-jsonl ft1.jsonl --checkpoint-dir ck_ft \
  --checkpoint-every 1 >ft1.txt 2>&1 || { fail "init-from on one rank"; cat ft1.txt; }
"$SATDAR" "${F[@]}" --steps 4 --init-from ck_tp/ckpt_00000003 --tp 2 --launcher threads \
  --log-jsonl ft2.jsonl >ft2.txt 2>&1 || { fail "init-from on tp=2"; cat ft2.txt; }
if grep -q "init: weights from ck_tp/ckpt_00000003 (step 3 of its run); optimizer moments fresh, starting at step 0" ft1.txt \
   && python3 - <<'PY'
import json
a = [json.loads(l) for l in open("ft1.jsonl")]
b = [json.loads(l) for l in open("ft2.jsonl")]
t = [json.loads(l) for l in open("tp.jsonl")]
assert [r["step"] for r in a] == [1, 2, 3, 4]
assert abs(a[0]["lr"] - 5e-4) < 1e-15, a[0]["lr"]       # step 1 of a 2-step warmup
for x, y in zip(a, b):
    assert abs(x["loss"] - y["loss"]) <= 1e-4 * abs(x["loss"]), (x["loss"], y["loss"])
assert abs(a[0]["loss"] - t[0]["loss"]) > 1e-4, (a[0]["loss"], t[0]["loss"])
PY
then ok "--init-from a tp=2 checkpoint: step 0, same losses on 1 rank and tp=2, trained weights"
else fail "init-from"; cat ft1.txt; fi
[[ -f ck_ft/ckpt_00000001.safetensors || -f ck_ft/ckpt_00000002.safetensors ]] \
  && ok "the fine-tuning run checkpoints its own steps" || { fail "fine-tune checkpoints"; ls ck_ft; }
# Its resume continues its own checkpoint, not the --init-from one.
"$SATDAR" "${F[@]}" --steps 6 --init-from ck_tp --checkpoint-dir ck_ft --resume >ft3.txt 2>&1
grep -q "resume: init_from ck_tp is not used: the run continues its own checkpoint" ft3.txt \
  && ok "--resume wins over --init-from" || { fail "resume over init-from"; cat ft3.txt; }
sed 's/"hidden_size": 32/"hidden_size": 16/' config.json >small.json
expect2 "--init-from of another model is refused" \
  'init_from: checkpoint ck_tp/ckpt_00000003/shard-tp0-pp0-ep0.safetensors' \
  train --config small.json --synthetic-data --batch-size 4 --seq-len 16 --steps 2 --init-from ck_tp
mkdir -p empty
expect2 "--init-from a folder without checkpoints" \
  "init_from: empty holds no checkpoint" "${F[@]}" --steps 2 --init-from empty
expect2 "--init-from a missing path" "--init-from: cannot open nope" "${F[@]}" --steps 2 --init-from nope

echo "$passed passed, $failed failed"
[[ $failed == 0 ]]
