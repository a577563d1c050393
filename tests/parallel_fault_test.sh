#!/usr/bin/env bash
# A parallel run whose rank is killed mid-training ends everywhere within 60 s (nothing hangs,
# every surviving rank exits non-zero - 1 for a fault - naming the cause) and leaves only
# complete checkpoints behind. Layouts: data parallel and pipeline under mpirun, tensor
# parallel over Gloo (processes started without mpirun). A rank that is stopped instead
# (SIGSTOP: alive but silent) ends every other rank within --comm-timeout plus a few seconds,
# under mpirun and over Gloo.
# Usage: parallel_fault_test.sh PATH_TO_SATDAR
set -u
SATDAR=$(realpath "$1")
HERE=$(dirname "$(realpath "$0")")
WORK="${TEST_TMPDIR:-/tmp/satdar-test-$$}/fault"
rm -rf "$WORK" && mkdir -p "$WORK"
cd "$WORK"
unset TEST_PREMATURE_EXIT_FILE XML_OUTPUT_FILE
source "$HERE/parallel_testlib.sh"
cat >config.json <<'JSON'
{"vocab_size": 256, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "max_position_embeddings": 512,
 "num_attention_heads": 4}
JSON
passed=0
failed=0

# Every checkpoint under its final name (a file, or a folder of shards) is complete.
check_checkpoints() {
  local dir=$1 bad=0
  for f in "$dir"/ckpt_*.safetensors "$dir"/ckpt_*[0-9]/*.safetensors; do
    [[ -e $f ]] || continue
    python3 - "$f" <<'PY' || { echo "FAIL: $f is incomplete"; bad=1; }
import json, struct, sys
raw = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
header = json.loads(raw[8:8 + n])
end = max(v["data_offsets"][1] for k, v in header.items() if k != "__metadata__")
assert len(raw) == 8 + n + end, "truncated"
PY
  done
  for d in "$dir"/ckpt_*[0-9]; do
    [[ -d $d ]] || continue
    # A folder under its final name holds every piece (two here).
    [[ $(ls "$d" | wc -l) -eq 2 ]] || { echo "FAIL: $d is missing shards"; bad=1; }
  done
  return $bad
}

# start_ranks NAME LAUNCHER CHECKPOINT TRAIN-ARGS...: start 2 ranks (under mpirun, or two
# Gloo processes), wait until checkpoint CHECKPOINT (8 digits) exists, and set PIDS (what to
# wait for) and VICTIM (the last satdar process of the run, the one to kill or stop).
start_ranks() {
  local name=$1 launcher=$2 checkpoint=$3
  shift 3
  PIDS=()
  if [[ $launcher == mpi ]]; then
    "${MPIRUN[@]}" -np 2 "$SATDAR" "$@" >"run-$name.txt" 2>&1 &
    PIDS=($!)
  else
    mkdir -p "rdv-$name"
    for r in 0 1; do
      "$SATDAR" "$@" --launcher gloo --rank $r --world-size 2 --rendezvous "rdv-$name" \
        >"run-$name-$r.txt" 2>&1 &
      PIDS+=($!)
    done
  fi
  # Checkpoint CHECKPOINT or any later one: a fast run prunes the early ones (3 are kept), and
  # a poll that missed it waited 30 s while the run finished, leaving no rank to kill.
  for _ in $(seq 1 600); do
    local newest
    newest=$(ls -d "ckpt-$name"/ckpt_* 2>/dev/null | sed -n 's/.*ckpt_\([0-9]\{8\}\).*/\1/p' |
             sort | tail -1)
    [[ -n $newest ]] && ((10#$newest >= 10#$checkpoint)) && break
    sleep 0.05
  done
  local seed
  seed=$(printf '%s\n' "$@" | grep -A1 -x -- --seed | tail -1)
  # Only this test's ranks (run in $WORK): tests run side by side, and another test's rank
  # may have the same seed.
  VICTIM=$(pgrep -f -- "--seed $seed" | while read -r p; do
    [[ $(ps -o comm= -p "$p") == satdar && $(readlink "/proc/$p/cwd") == "$(pwd -P)" ]] &&
      echo "$p"; done | tail -1)
}

# run_case NAME LAUNCHER FLAGS...: start 2 ranks, kill one after checkpoint 4, expect the rest
# to end within 60 s with a non-zero status.
run_case() {
  local name=$1 launcher=$2
  shift 2
  local seed=$((RANDOM + 100))
  local T=(train --config config.json --synthetic-data --steps 400 --batch-size 4 --seq-len 64
           --threads 1 --quiet --checkpoint-dir "ckpt-$name" --checkpoint-every 2 --seed "$seed"
           --comm-timeout 30 "$@")
  start_ranks "$name" "$launcher" 00000004 "${T[@]}"
  local pids=("${PIDS[@]}") victim=$VICTIM
  if [[ -z "$victim" ]]; then echo "FAIL $name: no rank to kill"; failed=$((failed + 1)); return; fi
  local start
  start=$(date +%s)
  kill -9 "$victim"
  local survivors=()
  for p in "${pids[@]}"; do [[ $p != "$victim" ]] && survivors+=("$p"); done
  for _ in $(seq 1 600); do
    local alive=0
    for p in "${survivors[@]}"; do kill -0 "$p" 2>/dev/null && alive=1; done
    [[ $alive -eq 0 ]] && break
    sleep 0.1
  done
  local ok=1 status
  for p in "${survivors[@]}"; do
    if kill -0 "$p" 2>/dev/null; then
      echo "FAIL $name: still running 60 s after a rank was killed"; kill -9 "$p"; ok=0
      continue
    fi
    wait "$p"; status=$?
    [[ $status -ne 0 ]] || { echo "FAIL $name: exit status 0"; ok=0; }
    [[ $launcher == mpi || $status -eq 1 ]] || { echo "FAIL $name: exit $status, not 1"; ok=0; }
  done
  if [[ $launcher == gloo ]] && ! grep -q "rank" run-$name-*.txt; then
    echo "FAIL $name: no message naming the lost rank"; cat run-$name-*.txt; ok=0
  fi
  check_checkpoints "ckpt-$name" || ok=0
  if [[ $ok -eq 1 ]]; then
    echo "ok   $name: ended $(( $(date +%s) - start )) s after rank $victim was killed"
    passed=$((passed + 1))
  else
    failed=$((failed + 1))
  fi
}

run_case dp mpi --dp 2
run_case pp mpi --pp 2 --microbatches 2
run_case tp-gloo gloo --tp 2

# stuck_case NAME LAUNCHER FLAGS...: start 2 ranks with --comm-timeout 10, stop one (SIGSTOP:
# alive, connections open, never answering) after checkpoint 2, and expect every other rank
# to end within the timeout plus a few seconds with exit code 1, naming the stuck rank. Under
# mpirun the job ends altogether (the stuck rank too); over Gloo the stuck rank, once
# continued, finds its peers gone and ends as well.
stuck_case() {
  local name=$1 launcher=$2
  shift 2
  local seed=$((RANDOM + 100))
  local T=(train --config config.json --synthetic-data --steps 100000 --batch-size 4 --seq-len 64
           --threads 1 --quiet --checkpoint-dir "ckpt-$name" --checkpoint-every 2 --seed "$seed"
           --comm-timeout 10 "$@")
  start_ranks "$name" "$launcher" 00000002 "${T[@]}"
  local pids=("${PIDS[@]}") victim=$VICTIM
  if [[ -z "$victim" ]]; then echo "FAIL $name: no rank to stop"; failed=$((failed + 1)); return; fi
  local start
  start=$(date +%s)
  kill -STOP "$victim"
  local survivors=()
  for p in "${pids[@]}"; do [[ $p != "$victim" ]] && survivors+=("$p"); done
  local ok=1 status
  for p in "${survivors[@]}"; do
    for _ in $(seq 1 300); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    if kill -0 "$p" 2>/dev/null; then
      echo "FAIL $name: still running 30 s after a rank was stopped (timeout 10 s)"; kill -9 "$p"
      ok=0
      continue
    fi
    wait "$p"; status=$?
    [[ $status -eq 1 ]] || { echo "FAIL $name: exit $status, not 1"; ok=0; }
  done
  local took=$(( $(date +%s) - start ))
  if ! cat run-$name*.txt | grep -q "ranks that never arrived: [01]"; then
    echo "FAIL $name: no message naming the stuck rank"; cat run-$name*.txt; ok=0
  fi
  if [[ $launcher == gloo ]]; then
    kill -CONT "$victim"
    for _ in $(seq 1 100); do kill -0 "$victim" 2>/dev/null || break; sleep 0.1; done
    if kill -0 "$victim" 2>/dev/null; then
      echo "FAIL $name: the continued rank did not end"; kill -9 "$victim"; ok=0
    else
      wait "$victim"; status=$?
      [[ $status -eq 1 ]] || { echo "FAIL $name: the continued rank exited $status, not 1"; ok=0; }
    fi
  else
    for _ in $(seq 1 50); do kill -0 "$victim" 2>/dev/null || break; sleep 0.1; done
    if kill -0 "$victim" 2>/dev/null; then
      echo "FAIL $name: the stopped rank survived the job"; kill -9 "$victim"; ok=0
    fi
  fi
  check_checkpoints "ckpt-$name" || ok=0
  if [[ $ok -eq 1 ]]; then
    echo "ok   $name: ended $took s after rank $victim was stopped (timeout 10 s)"
    passed=$((passed + 1))
  else
    failed=$((failed + 1))
  fi
}

stuck_case stuck-dp mpi --dp 2
stuck_case stuck-pp mpi --pp 2 --microbatches 2
stuck_case stuck-dp-gloo gloo --dp 2
stuck_case stuck-tp-gloo gloo --tp 2
echo "$passed passed, $failed failed"
[[ $failed -eq 0 ]]
