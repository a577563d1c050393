#!/usr/bin/env bash
# Data parallelism equals one rank: 2 replicas with half the batch each (under mpirun, with
# and without ZeRO-1, and 4 as threads of one process) log the per-step losses of one rank
# with the whole batch, within 1e-9 relative in f64, and end with the same weights; ZeRO-1
# resumes exactly; bad layouts exit with code 2.
# Usage: dp_equivalence_test.sh PATH_TO_SATDAR
set -u
SATDAR=$(realpath "$1")
HERE=$(dirname "$(realpath "$0")")
COMPARE=$HERE/compare_runs.py
WORK="${TEST_TMPDIR:-/tmp/satdar-test-$$}/dp"
rm -rf "$WORK" && mkdir -p "$WORK"
cd "$WORK"
unset TEST_PREMATURE_EXIT_FILE XML_OUTPUT_FILE
source "$HERE/parallel_testlib.sh"
passed=0
failed=0
write_small_configs
python3 - <<'PY'
import json
base = json.load(open("base.json"))
# Every topology, so the per-layer gradient reduction overlapped with backward is checked
# against each one's backward order.
three = dict(base, num_hidden_layers=3)
json.dump(dict(three, value_residual="resformer", resformer_mode="learnable_plus"),
          open("resformer.json", "w"))
for name in ("attnres", "transparent", "hc", "mhc", "denseformer", "muddformer"):
    json.dump(dict(three, residual=name), open(name + ".json", "w"))
PY
compare() {  # NAME A_DIR B_DIR
  python3 "$COMPARE" "$2/log.jsonl" "$3/log.jsonl" "$2/ckpt/ckpt_00000005.safetensors" \
    "$3/ckpt/ckpt_00000005.safetensors"
}
for model in baseline satformer dar dar_moe resformer attnres transparent hc mhc denseformer \
             muddformer; do
  T=(train --config $model.json --synthetic-data --steps 5 --seq-len 16 --dtype f64 --threads 1
     --quiet --seed 7)
  mkdir -p one mpi thr zero
  "$SATDAR" "${T[@]}" --batch-size 8 --log-jsonl one/log.jsonl --checkpoint-dir one/ckpt
  "${MPIRUN[@]}" -np 2 "$SATDAR" "${T[@]}" --batch-size 4 --dp 2 --log-jsonl mpi/log.jsonl \
    --checkpoint-dir mpi/ckpt
  "$SATDAR" "${T[@]}" --batch-size 2 --dp 4 --launcher threads --log-jsonl thr/log.jsonl \
    --checkpoint-dir thr/ckpt
  "${MPIRUN[@]}" -np 2 "$SATDAR" "${T[@]}" --batch-size 4 --dp 2 --zero 1 \
    --log-jsonl zero/log.jsonl --checkpoint-dir zero/ckpt
  for run in mpi thr zero; do
    if compare "$model/$run" one $run; then
      echo "ok   $model dp ($run)"; passed=$((passed + 1))
    else
      echo "FAIL $model dp ($run)"; failed=$((failed + 1))
    fi
  done
  rm -rf one mpi thr zero
done

# ZeRO-1 resumes exactly: stop after step 3 (drop the step-5 checkpoint) and continue.
T=(train --config dar.json --synthetic-data --steps 5 --seq-len 16 --dtype f64 --threads 1
   --quiet --seed 7 --batch-size 4 --dp 2 --zero 1 --checkpoint-every 3)
"${MPIRUN[@]}" -np 2 "$SATDAR" "${T[@]}" --log-jsonl full.jsonl --checkpoint-dir zr
rm -f zr/ckpt_00000005.safetensors
"${MPIRUN[@]}" -np 2 "$SATDAR" "${T[@]}" --log-jsonl resumed.jsonl --checkpoint-dir zr --resume
if python3 -c "
import json
full = {j['step']: j['loss'] for j in map(json.loads, open('full.jsonl'))}
res = [json.loads(l) for l in open('resumed.jsonl')]
assert [r['step'] for r in res] == [4, 5] and all(r['loss'] == full[r['step']] for r in res), res
"; then echo "ok   zero1 resume"; passed=$((passed + 1)); else echo "FAIL zero1 resume"; failed=$((failed + 1)); fi

expect_fail() {  # NAME MESSAGE CMD...
  local name=$1 message=$2
  shift 2
  "$@" >out.txt 2>&1
  local code=$?
  if [[ $code -ne 2 ]] || ! grep -qF -- "$message" out.txt; then
    echo "FAIL $name (exit $code)"; cat out.txt; failed=$((failed + 1))
  else
    echo "ok   $name"; passed=$((passed + 1))
  fi
}
S=(train --config baseline.json --synthetic-data --steps 1 --seq-len 8 --batch-size 2)
expect_fail dp_without_ranks "--dp 2 needs 2 ranks: run under mpirun -np 2" "$SATDAR" "${S[@]}" --dp 2
expect_fail world_size_mismatch "the world has 2 ranks but mesh dp x tp x pp x ep = dp=3" \
  "${MPIRUN[@]}" -np 2 "$SATDAR" "${S[@]}" --dp 3
expect_fail bad_launcher "flag --launcher must be mpi, gloo, slurm or threads" "$SATDAR" "${S[@]}" --launcher ssh
expect_fail bad_zero "flag --zero must be 0 or 1, got '3'" "$SATDAR" "${S[@]}" --zero 3

echo "$passed passed, $failed failed"
[[ $failed -eq 0 ]]
