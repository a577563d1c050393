#!/usr/bin/env bash
# A dead or stalled worker never costs the job (issue 28, part 1), as real processes on
# loopback: kill -9, and a 60 s SIGSTOP, of the worker under a 1-rank job and under a dp=2
# job. Each job ends SUCCEEDED with the uninterrupted run's final loss; its log holds every
# step once, in order (two attempts never wrote at once); no rank of the fenced attempt is
# left running, also while its worker is still stopped (the rank's own lease fences it). A
# rank that fails is quoted by its error line, not its last line.
# Usage: worker_fault_test.sh PATH_TO_SATDAR
set -u
SATDAR=$(realpath "$1")
WORK="${TEST_TMPDIR:-/tmp/satdar-test-$$}/worker_fault"
rm -rf "$WORK" && mkdir -p "$WORK"
cd "$WORK"
unset TEST_PREMATURE_EXIT_FILE XML_OUTPUT_FILE SATDAR_COORDINATOR SATDAR_TOKEN_FILE
passed=0 failed=0
ok() { echo "ok   $1"; passed=$((passed + 1)); }
fail() { echo "FAIL $1"; failed=$((failed + 1)); }
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill -CONT "$p" 2>/dev/null; kill -9 "$p" 2>/dev/null; done
  pkill -9 -f "$WORK" 2>/dev/null
}
trap cleanup EXIT
cat >model.json <<'JSON'
{"vocab_size": 64, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
 "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 128}
JSON
mkdir -p state shared
"$SATDAR" coordinator --listen 127.0.0.1:0 --state-dir state --lease-seconds 3 \
  >>coordinator.log 2>&1 &
PIDS+=($!)
for _ in $(seq 1 100); do [[ -s state/coordinator.json ]] && break; sleep 0.05; done
ADDR=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['grpc'])" \
       state/coordinator.json)
declare -A WPID
start_worker() {
  "$SATDAR" worker --coordinator "$ADDR" --slots 1 --work-dir "work-$1" --shared-dir shared \
    --data-root "$WORK" --name "$1" --stop-grace-seconds 2 >>"worker-$1.log" 2>&1 &
  WPID[$1]=$!
  PIDS+=($!)
}
for w in a b c; do start_worker $w; done
status_json() { "$SATDAR" status "$1" --coordinator "$ADDR" --json; }
field() { status_json "$1" | python3 -c "import json,sys; print(json.load(sys.stdin)['$2'])"; }
wait_state() {  # JOB STATE SECONDS
  for _ in $(seq 1 $(($3 * 10))); do
    [[ $(field "$1" state 2>/dev/null) == "$2" ]] && return 0
    sleep 0.1
  done
  return 1
}
# The workers that run attempt 1 of JOB.
workers_of() {
  status_json "$1" | python3 -c "
import json, sys
h = json.load(sys.stdin)['history']
print(' '.join(sorted({r['worker'] for r in h[0]['ranks']})))"
}
spec() {  # FILE DP STEPS
  cat >"$1" <<SPEC
{"name": "fault", "config": "model.json",
 "train": {"steps": $3, "batch_size": 8, "seq_len": 64, "synthetic_data": true, "seed": 9,
           "lr": 0.002, "checkpoint_every": 100},
 "layout": {"dp": $2}, "max_restarts": 3}
SPEC
}
# The log of a job: every step once, in order, in time order.
log_once_in_order() {  # JOB STEPS
  python3 - "shared/jobs/$1/log.jsonl" "$2" <<'PY'
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
steps = [r["step"] for r in recs]
assert steps == list(range(1, int(sys.argv[2]) + 1)), steps
times = [r["time"] for r in recs]
assert times == sorted(times), "records out of time order: two attempts wrote at once"
PY
}
# The ranks of JOB's attempt 1 on WORKER.
ranks_of() { pgrep -f -- "work-$2/jobs/$1/attempt-1/" | tr '\n' ' '; }

# Uninterrupted runs: the final losses every faulted job must reach.
# Long enough (about 20 s here) that the job still runs well after its first checkpoint, and
# after a stopped worker's lease and its rank's have run out.
STEPS=1600
declare -A REF LOSS
for dp in 1 2; do
  spec ref$dp.json $dp $STEPS
  REF[$dp]=$("$SATDAR" submit ref$dp.json --coordinator "$ADDR")
done
for dp in 1 2; do
  wait_state "${REF[$dp]}" SUCCEEDED 180 || fail "reference dp=$dp: $(field "${REF[$dp]}" state)"
  LOSS[$dp]=$(field "${REF[$dp]}" loss)
done
echo "reference final losses: dp=1 ${LOSS[1]}, dp=2 ${LOSS[2]}"

# run_fault KIND DP: submit, wait for the first checkpoint, then kill -9 (kill) or SIGSTOP for
# 60 s (stop) a worker of attempt 1.
run_fault() {
  local kind=$1 dp=$2 job victim pid left stopped_at=0
  spec "$kind$dp.json" "$dp" $STEPS
  job=$("$SATDAR" submit "$kind$dp.json" --coordinator "$ADDR")
  for _ in $(seq 1 1200); do
    compgen -G "shared/jobs/$job/checkpoints/ckpt_*" >/dev/null && break
    sleep 0.05
  done
  local state
  state=$(field "$job" state)
  [[ $state == RUNNING ]] ||
    { fail "$kind (dp=$dp): $state at the fault, not RUNNING: $(field "$job" pending_reason)"
      "$SATDAR" workers --coordinator "$ADDR"
      for w in "${!WPID[@]}"; do echo "$w: $(cut -d' ' -f3 /proc/${WPID[$w]}/stat 2>&1)"; done; }
  victim=$(workers_of "$job" | awk '{print $1}')
  pid=${WPID[$victim]}
  if [[ $kind == kill ]]; then
    kill -9 "$pid"
    sleep 1
    left=$(ranks_of "$job" "$victim")
    [[ -z $left ]] && ok "kill -9 of worker $victim (dp=$dp): its rank died with it" ||
      fail "kill -9 (dp=$dp): ranks of attempt 1 still run: $left"
    sleep 3
    start_worker "$victim"  # the same worker comes back
  else
    kill -STOP "$pid"
    stopped_at=$SECONDS
  fi
  if wait_state "$job" SUCCEEDED 120; then
    local loss attempts
    loss=$(field "$job" loss)
    attempts=$(field "$job" attempts)
    [[ $loss == "${LOSS[$dp]}" && $attempts -ge 2 ]] &&
      ok "$kind (dp=$dp): SUCCEEDED in $attempts attempts with the uninterrupted final loss $loss" ||
      fail "$kind (dp=$dp): loss $loss (want ${LOSS[$dp]}), attempts $attempts"
  else
    fail "$kind (dp=$dp): $(field "$job" state): $(field "$job" reason)"
  fi
  if [[ $kind == stop ]]; then
    # The stopped worker cannot stop its rank: the rank's own lease did.
    left=$(ranks_of "$job" "$victim")
    [[ -z $left ]] && ok "SIGSTOP of worker $victim (dp=$dp): its rank stopped itself" ||
      fail "SIGSTOP (dp=$dp): ranks of attempt 1 still run: $left"
    local rest=$((60 - (SECONDS - stopped_at)))
    ((rest > 0)) && sleep $rest
    local before
    before=$(grep -c "registered as" "worker-$victim.log")
    kill -CONT "$pid"
    # Its first calls may wait out their deadlines on a connection that died meanwhile.
    for _ in $(seq 1 450); do
      (($(grep -c "registered as" "worker-$victim.log") > before)) && break
      sleep 0.1
    done
    kill -0 "$pid" 2>/dev/null && grep -q "registering again" "worker-$victim.log" &&
      (($(grep -c "registered as" "worker-$victim.log") > before)) &&
      ok "the worker stopped for 60 s came back and registered again" ||
      fail "worker $victim after SIGCONT: $(tail -3 "worker-$victim.log")"
  fi
  log_once_in_order "$job" $STEPS && ok "$kind (dp=$dp): every step logged once, in order" ||
    fail "$kind (dp=$dp): the log"
  left=$(pgrep -f -- "jobs/$job/" | tr '\n' ' ')
  [[ -z $left ]] && ok "$kind (dp=$dp): no rank left running" || fail "$kind (dp=$dp): left: $left"
}
run_fault kill 1
run_fault kill 2
run_fault stop 1
run_fault stop 2

echo "$passed passed, $failed failed"
[[ $failed == 0 ]]
