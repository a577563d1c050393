#!/usr/bin/env bash
# The control plane as real processes on loopback: a coordinator, workers, clients. A DP=2 job
# over two workers equals the same run started by hand; a worker killed with SIGKILL, or the
# coordinator killed and restarted, costs no more than the steps since the last checkpoint;
# cancel, failures, tokens, queueing and bad specs behave as INTERFACES.md says.
# Usage: control_plane_test.sh PATH_TO_SATDAR
set -u
SATDAR=$(realpath "$1")
HERE=$(dirname "$(realpath "$0")")
WORK="${TEST_TMPDIR:-/tmp/satdar-test-$$}/control"
rm -rf "$WORK" && mkdir -p "$WORK"
cd "$WORK"
unset TEST_PREMATURE_EXIT_FILE XML_OUTPUT_FILE SATDAR_COORDINATOR SATDAR_TOKEN_FILE
passed=0
failed=0
ok() { echo "ok   $1"; passed=$((passed + 1)); }
fail() { echo "FAIL $1"; failed=$((failed + 1)); }
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null; done; pkill -9 -f "$WORK" 2>/dev/null; }
trap cleanup EXIT

cat >sat.json <<'JSON'
{"vocab_size": 64, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
 "num_attention_heads": 4, "num_key_value_heads": 2, "value_residual": "satformer",
 "max_position_embeddings": 64}
JSON

# start_coordinator DIR [FLAGS...]: sets COORD (pid) and ADDR.
start_coordinator() {
  local dir=$1
  shift
  mkdir -p "$dir"
  rm -f "$dir/coordinator.json"
  "$SATDAR" coordinator --listen 127.0.0.1:0 --state-dir "$dir" --lease-seconds 3 "$@" \
    >>"$dir/coordinator.log" 2>&1 &
  COORD=$!
  PIDS+=("$COORD")
  for _ in $(seq 1 100); do [[ -s $dir/coordinator.json ]] && break; sleep 0.05; done
  ADDR=$(/usr/bin/python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['grpc'])" \
         "$dir/coordinator.json")
}
# start_worker NAME [FLAGS...]: sets WORKER and WPID[NAME] (its pid).
declare -A WPID
start_worker() {
  local name=$1
  shift
  "$SATDAR" worker --coordinator "$ADDR" --slots 1 --work-dir "work-$name" --shared-dir shared \
    --data-root "$WORK" --name "$name" --stop-grace-seconds 2 "$@" >>"worker-$name.log" 2>&1 &
  WORKER=$!
  WPID[$name]=$WORKER
  PIDS+=("$WORKER")
}
# field JOB KEY: a field of `satdar status --json`.
field() {
  "$SATDAR" status "$1" --coordinator "$ADDR" --json ${TOKEN:+--token-file $TOKEN} |
    /usr/bin/python3 -c "import json,sys; v=json.load(sys.stdin)['$2']; print(json.dumps(v) if isinstance(v,(dict,list)) else v)"
}
# wait_state JOB STATE SECONDS
wait_state() {
  for _ in $(seq 1 $(($3 * 10))); do
    [[ $(field "$1" state 2>/dev/null) == "$2" ]] && return 0
    sleep 0.1
  done
  return 1
}
job_spec() {  # job_spec FILE STEPS [EXTRA-TRAIN-JSON] [LAYOUT-JSON] [MAX_RESTARTS]
  local extra=${3:-} layout=${4:-} restarts=${5:-0}
  [[ -n $layout ]] || layout='{"dp": 2}'
  [[ -z $extra ]] || extra=", $extra"
  cat >"$1" <<EOF
{"name": "t", "config": "sat.json",
 "train": {"steps": $2, "batch_size": 4, "seq_len": 32, "synthetic_data": true, "seed": 5,
           "lr": 0.002, "checkpoint_every": 4 $extra},
 "layout": $layout, "max_restarts": $restarts}
EOF
}
mkdir -p shared
TOKEN=""

echo "== a DP=2 job equals the same run by hand"
start_coordinator state1
start_worker a
start_worker b
job_spec job.json 12
if out=$("$SATDAR" submit job.json --coordinator "$ADDR" --follow 2>&1); then
  JOB=$(echo "$out" | head -1)
  ok "submit --follow ($JOB)"
else
  fail "submit --follow: $out"
fi
"$SATDAR" train --config sat.json --steps 12 --batch-size 4 --seq-len 32 --synthetic-data --seed 5 \
  --lr 0.002 --dp 2 --launcher threads --quiet --log-jsonl byhand.jsonl
if /usr/bin/python3 - "shared/jobs/$JOB/log.jsonl" byhand.jsonl <<'PY'
import json, sys
a = [json.loads(l)["loss"] for l in open(sys.argv[1])]
b = [json.loads(l)["loss"] for l in open(sys.argv[2])]
assert len(a) == 12 and a == b, (a, b)
PY
then ok "same losses as by hand"; else fail "losses differ from the run by hand"; fi
[[ $(field "$JOB" state) == SUCCEEDED && $(field "$JOB" attempts) == 1 && $(field "$JOB" step) == 12 ]] &&
  ok "status: SUCCEEDED after 1 attempt at step 12" || fail "status: $(field "$JOB" state)"
field "$JOB" summary | grep -q '"final_loss"' && ok "status carries rank 0's summary" ||
  fail "no summary in status"
"$SATDAR" status "$JOB" --coordinator "$ADDR" --json | /usr/bin/python3 -c "
import json, sys
j = json.load(sys.stdin)
assert all(k in j for k in ['job_id', 'name', 'state', 'attempts', 'exit_code', 'reason', 'step', 'steps', 'summary'])" &&
  ok "status --json has every field INTERFACES.md names" || fail "status --json fields"
"$SATDAR" logs "$JOB" --coordinator "$ADDR" --rank 0 | grep -q "done: 12 steps" &&
  ok "logs --rank 0 has the rank's last line" || fail "logs"
"$SATDAR" jobs --coordinator "$ADDR" | grep -q "$JOB .*SUCCEEDED" && ok "jobs table" || fail "jobs table"
"$SATDAR" workers --coordinator "$ADDR" --json | grep -q '"name": *"a"' && ok "workers --json" ||
  fail "workers --json: $("$SATDAR" workers --coordinator "$ADDR" --json)"

echo "== bad specs are refused and nothing is stored"
before=$("$SATDAR" jobs --coordinator "$ADDR" --json)
bad() {  # bad NAME MESSAGE SPEC-JSON
  echo "$3" >bad.json
  "$SATDAR" submit bad.json --coordinator "$ADDR" >out.txt 2>&1
  local code=$?
  if [[ $code -eq 2 ]] && grep -qF -- "$2" out.txt; then ok "$1"; else fail "$1: exit $code $(cat out.txt)"; fi
}
bad malformed_spec "bad.json: not valid JSON" '{"config": "sat.json",'
bad unknown_field 'unknown field "priority"' '{"config": "sat.json", "priority": 3, "train": {"steps": 1}}'
bad unknown_train_flag 'train.colour: is not a satdar train flag' \
  '{"config": "sat.json", "train": {"steps": 1, "batch_size": 2, "seq_len": 8, "synthetic_data": true, "colour": 1}}'
bad reserved_flag 'train.checkpoint_dir: is not allowed in a job spec (checkpoints live in <shared-dir>/jobs/<job_id>/' \
  '{"config": "sat.json", "train": {"steps": 1, "batch_size": 2, "seq_len": 8, "synthetic_data": true, "checkpoint_dir": "/tmp"}}'
bad impossible_layout 'layout: layout.tp 3 does not divide config field "num_attention_heads"' \
  '{"config": "sat.json", "train": {"steps": 1, "batch_size": 2, "seq_len": 8, "synthetic_data": true}, "layout": {"tp": 3}}'
bad data_outside_root 'train.data: "../elsewhere" must be a path inside' \
  '{"config": "sat.json", "train": {"steps": 1, "batch_size": 2, "seq_len": 8, "data": "../elsewhere"}}'
bad bad_number 'train.batch_size must be <= 16777216' \
  '{"config": "sat.json", "train": {"steps": 1, "batch_size": 4294967298, "seq_len": 8, "synthetic_data": true}}'
bad missing_config 'job spec: config: cannot open' '{"config": "nope.json", "train": {"steps": 1}}'
# Specs are data: no control bytes in any string ("..\u0000" passed the data-root check as
# ".."), an allow-list of train flags (tls_ca made every rank read a file of the worker host),
# and train's own rules between flags at submit.
bad data_nul "job spec: train.data: holds the control character 0x00 at byte 2; a job spec's strings are printable text" \
  '{"config": "sat.json", "train": {"steps": 1, "batch_size": 2, "seq_len": 8, "data": "..\u0000"}}'
bad name_escape "job spec: name: holds the control character 0x1B at byte 0; a job spec's strings are printable text" \
  '{"name": "\u001b[2J\u001b[Hforged", "config": "sat.json", "train": {"steps": 1, "batch_size": 2, "seq_len": 8, "synthetic_data": true}}'
bad tls_ca_flag "job spec: train.tls_ca: is not allowed in a job spec (the worker sets it, or it is not a job's to set; a job may set batch_size, " \
  '{"config": "sat.json", "train": {"steps": 1, "batch_size": 2, "seq_len": 8, "synthetic_data": true, "tls_ca": "/etc/shadow"}}'
bad init_from_flag "job spec: train.init_from: is not allowed in a job spec (its path would not be confined to the worker's data root" \
  '{"config": "sat.json", "train": {"steps": 1, "batch_size": 2, "seq_len": 8, "synthetic_data": true, "init_from": "/"}}'
bad eval_every_synthetic "job spec: train.eval_every: validation needs a prepared dataset (train.data DIR written by satdar prep), whose held-out split it reads; train.synthetic_data has none" \
  '{"config": "sat.json", "train": {"steps": 1, "batch_size": 2, "seq_len": 8, "synthetic_data": true, "eval_every": 1}}'
bad bf16_on_cpu "job spec: train.dtype must be f32 or f64, got 'bf16' (bf16 is for resources.device cuda)" \
  '{"config": "sat.json", "train": {"steps": 1, "batch_size": 2, "seq_len": 8, "synthetic_data": true, "dtype": "bf16"}}'
[[ $("$SATDAR" jobs --coordinator "$ADDR" --json) == "$before" ]] && ok "nothing stored for bad specs" ||
  fail "a bad spec was stored"
"$SATDAR" status job-999999-0000 --coordinator "$ADDR" >/dev/null 2>&1
[[ $? -eq 4 ]] && ok "no such job: exit 4" || fail "no such job exit code"
# A 10 kB job id is no job (exit 4), refused before the call: never gRPC's metadata limit (exit 1).
HUGE_ID=$(printf 'j%.0s' $(seq 1 10240))
for cmd in status cancel logs; do
  "$SATDAR" $cmd "$HUGE_ID" --coordinator "$ADDR" >out.txt 2>&1
  code=$?
  [[ $code -eq 4 ]] && grep -qF "satdar $cmd: error: no such job: 'jjjjjjjjjjjjjjjjjjjjjjjjjjjjjjjjjjjjjjjjjjjjjjjjjjjjjjjjjjjjjjjj...' (10240 bytes) is not a job id (at most 128 letters, digits, '.', '_' or '-', such as job-000001-3f2a)" out.txt &&
    ok "$cmd of a 10 kB job id: exit 4" || fail "$cmd of a 10 kB job id: exit $code $(head -c 300 out.txt)"
done
"$SATDAR" status $'job-1\e[2J' --coordinator "$ADDR" >out.txt 2>&1
[[ $? -eq 4 ]] && grep -qF "no such job: 'job-1\x1b[2J' (9 bytes) is not a job id" out.txt &&
  ! grep -q $'\e' out.txt && ok "a job id with an escape: exit 4, printed escaped" ||
  fail "job id with an escape: $(cat -v out.txt)"
# The worker checks what it registers: --host is a host name or an IP literal, and a cuda slot
# is a GPU this machine has.
timeout 20 "$SATDAR" worker --coordinator "$ADDR" --slots 1 --work-dir work-badhost \
  --shared-dir shared --host 'x;touch pwned' >out.txt 2>&1
[[ $? -eq 2 ]] && grep -qF "satdar worker: error: host 'x;touch pwned' is not a host name or an IP address" out.txt &&
  ok "worker --host that is no host: exit 2 naming it" || fail "worker --host: $(cat out.txt)"
if ! nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then
  timeout 20 "$SATDAR" worker --coordinator "$ADDR" --slots 1 --work-dir work-nogpu --shared-dir shared \
    --device cuda >out.txt 2>&1
  code=$?
  [[ $code -eq 2 ]] && { grep -qF "satdar worker: error: device cuda: no CUDA GPU is visible on this machine" out.txt ||
                         grep -qF "satdar worker: error: device cuda: this satdar was built without the CUDA toolkit" out.txt; } &&
    [[ $("$SATDAR" workers --coordinator "$ADDR" --json | grep -c '"device":"cuda"') -eq 0 ]] &&
    ok "worker --device cuda without a GPU: exit 2 before registering" ||
    fail "worker --device cuda without a GPU: exit $code $(cat out.txt)"
fi
# Garbage on the gRPC port and a client that goes away mid-stream change nothing.
/usr/bin/python3 -c "
import socket, sys, os
host, port = sys.argv[1].rsplit(':', 1)
s = socket.create_connection((host, int(port))); s.sendall(os.urandom(4096)); s.close()" "$ADDR"
timeout 2 "$SATDAR" logs "$JOB" --coordinator "$ADDR" --follow >/dev/null 2>&1
[[ $(field "$JOB" state) == SUCCEEDED ]] && ok "garbage bytes on the port: still serving" ||
  fail "the coordinator stopped serving"

echo "== a job that fails with exit code 2 fails at once with the rank's message"
cat >exit2.json <<'EOF'
{"config": "sat.json", "train": {"steps": 4, "batch_size": 2, "seq_len": 8, "data": "no-such-dataset"},
 "max_restarts": 3}
EOF
J2=$("$SATDAR" submit exit2.json --coordinator "$ADDR")
wait_state "$J2" FAILED 30 && [[ $(field "$J2" attempts) == 1 && $(field "$J2" exit_code) == 2 ]] &&
  field "$J2" reason | grep -q "no-such-dataset" && ok "exit 2: FAILED after 1 attempt, reason names the data" ||
  fail "exit 2: $(field "$J2" state) $(field "$J2" attempts) $(field "$J2" reason)"
"$SATDAR" submit exit2.json --coordinator "$ADDR" --follow >/dev/null 2>&1
[[ $? -eq 1 ]] && ok "submit --follow of a failing job exits 1" || fail "follow exit code"

echo "== a job that keeps crashing fails after max_restarts"
job_spec crash.json 400 '"lr": 1000' '{"dp": 1}' 1
sed -i 's/"lr": 0.002, //' crash.json
J3=$("$SATDAR" submit crash.json --coordinator "$ADDR")
wait_state "$J3" FAILED 60 && [[ $(field "$J3" attempts) == 2 ]] &&
  field "$J3" reason | grep -q "gave up after 2 attempt(s) (max_restarts 1)" &&
  ok "crashing job: FAILED after 2 attempts with the reason" ||
  fail "crashing job: $(field "$J3" state) $(field "$J3" attempts) $(field "$J3" reason)"
# Once the job is done, its first attempt reads as what happened to it: it failed and was retried.
"$SATDAR" status "$J3" --coordinator "$ADDR" >status.txt
grep -q "^  attempt 1: failed (retried) - " status.txt && grep -q "^  attempt 2: failed - " status.txt &&
  [[ $(field "$J3" history | /usr/bin/python3 -c "import json,sys; print([a['outcome'] for a in json.load(sys.stdin)])") == "['failed (retried)', 'failed']" ]] &&
  ok "the retried attempt reads 'failed (retried)', not 'retrying'" || fail "attempt outcomes: $(cat status.txt)"

echo "== cancel: every rank is gone within 10 s"
job_spec long.json 100000
J4=$("$SATDAR" submit long.json --coordinator "$ADDR")
for _ in $(seq 1 100); do [[ $(pgrep -fc "job-id $J4") -ge 2 ]] && break; sleep 0.1; done
"$SATDAR" cancel "$J4" --coordinator "$ADDR" | grep -q "CANCELLED" && ok "cancel" || fail "cancel"
start=$(date +%s)
for _ in $(seq 1 100); do [[ $(pgrep -fc "job-id $J4") -eq 0 ]] && break; sleep 0.1; done
[[ $(pgrep -fc "job-id $J4") -eq 0 ]] && ok "cancelled ranks gone after $(( $(date +%s) - start )) s" ||
  fail "ranks of a cancelled job still run"

echo "== two jobs that do not both fit: the second waits, then runs"
# 400 steps: the first job must still run a second after it started (40 took under a second).
job_spec first.json 400
job_spec second.json 8
JA=$("$SATDAR" submit first.json --coordinator "$ADDR")
wait_state "$JA" RUNNING 10
JB=$("$SATDAR" submit second.json --coordinator "$ADDR")
sleep 1
[[ $(field "$JB" state) == PENDING ]] && ok "the second job waits (PENDING)" || fail "second: $(field "$JB" state)"
wait_state "$JB" SUCCEEDED 120 && [[ $(field "$JA" state) == SUCCEEDED ]] && ok "then both SUCCEEDED" ||
  fail "queue: $(field "$JA" state) $(field "$JB" state)"

echo "== a job the workers can never hold says so; pending jobs show no loss; the table is aligned"
job_spec huge.json 8 "" '{"dp": 8}'
LONG=a-rather-long-job-name-for-the-jobs-table-0123456789
sed -i "s/\"name\": \"t\"/\"name\": \"$LONG\"/" huge.json
timeout 3 "$SATDAR" submit huge.json --coordinator "$ADDR" --follow >huge.txt 2>&1
JH=$(head -1 huge.txt)
NEVER="waiting: needs 8 slots, the 2 registered workers have 2"
grep -qF "$JH: $NEVER" huge.txt && ok "submit --follow says why the job cannot start" ||
  fail "follow of a job that never fits: $(cat huge.txt)"
[[ $(field "$JH" state) == PENDING && $(field "$JH" pending_reason) == "$NEVER"* ]] &&
  ok "status --json: pending_reason" || fail "pending_reason: $(field "$JH" pending_reason)"
"$SATDAR" status "$JH" --coordinator "$ADDR" >status.txt
grep -qF "  $NEVER" status.txt && ! grep -q "loss" status.txt && ok "status says why, and no loss" ||
  fail "status of a pending job: $(cat status.txt)"
"$SATDAR" jobs --coordinator "$ADDR" --json | /usr/bin/python3 -c "
import json, sys
j = [j for j in json.load(sys.stdin) if j['job_id'] == '$JH'][0]
assert j['pending_reason'].startswith('$NEVER') and j['loss'] is None and j['tokens_per_second'] is None, j" &&
  ok "jobs --json: the reason, and no loss for a pending job" || fail "jobs --json of a pending job"
"$SATDAR" jobs --coordinator "$ADDR" >jobs.txt
if /usr/bin/python3 - jobs.txt "$JH" "$LONG" "$NEVER" <<'PY'
import re, sys
lines = open(sys.argv[1]).read().splitlines()
job, name, never = sys.argv[2:5]
cells = lambda line: [m.span() for m in re.finditer(r"\S+", line)][:8]
head = cells(lines[0])
assert [lines[0][a:b] for a, b in head] == ["JOB", "NAME", "STATE", "STEP", "LOSS", "TOK/S", "AGE", "ATTEMPTS"], lines[0]
assert len(lines) >= 7, lines
for line in lines[1:]:
    row = cells(line)
    # JOB, NAME and STATE start where their header starts; the numbers end where theirs ends.
    assert [s for s, _ in row[:3]] == [s for s, _ in head[:3]], (lines[0], line)
    assert [e for _, e in row[3:]] == [e for _, e in head[3:]], (lines[0], line)
row = [l for l in lines if l.startswith(job)][0]
assert f" {name} " in row and " PENDING " in row and row.endswith(never + "; it starts once enough workers register"), row
assert [row[a:b] for a, b in cells(row)][4:6] == ["-", "-"], row  # no loss, no tokens/s
PY
then ok "jobs: every column aligned, the long name whole, the pending row without loss"
else fail "jobs table: $(cat jobs.txt)"; fi
"$SATDAR" cancel "$JH" --coordinator "$ADDR" >/dev/null

echo "== kill -9 a worker mid-run: the job restarts from its checkpoint, same final weights"
# 1200 steps: enough left after the first checkpoint that the job is still running when its
# worker dies, even on an idle machine (160 steps took 3 s, finishing first). The kill takes
# the worker's rank along (PR_SET_PDEATHSIG), so the job cannot finish in attempt 1.
job_spec resume.json 1200 "" '{"dp": 2}' 2
JR=$("$SATDAR" submit resume.json --coordinator "$ADDR")
for _ in $(seq 1 600); do compgen -G "shared/jobs/$JR/checkpoints/ckpt_*" >/dev/null && break; sleep 0.05; done
# By its pid: a pattern such as "--name b" would also match another test's worker b (the
# tests run side by side) and kill it.
kill -9 "${WPID[b]}"
sleep 4
start_worker b  # the same worker comes back (it kills what its previous life left)
wait_state "$JR" SUCCEEDED 120 && [[ $(field "$JR" attempts) -ge 2 ]] &&
  ok "restarted after a lost worker ($(field "$JR" attempts) attempts)" ||
  fail "lost worker: $(field "$JR" state) $(field "$JR" attempts) $(field "$JR" reason)"
"$SATDAR" train --config sat.json --steps 1200 --batch-size 4 --seq-len 32 --synthetic-data --seed 5 \
  --lr 0.002 --dp 2 --launcher threads --quiet --checkpoint-dir byhand-ck --checkpoint-every 4
same_weights() {
  /usr/bin/python3 - "$1" "$2" <<'PY'
import json, struct, sys
def tensors(p):
    raw = open(p, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    h = json.loads(raw[8:8 + n])
    return {k: raw[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]]
            for k, v in h.items() if k != "__metadata__"}
a, b = tensors(sys.argv[1]), tensors(sys.argv[2])
assert a.keys() == b.keys() and all(a[k] == b[k] for k in a), "weights differ"
PY
}
same_weights "shared/jobs/$JR/checkpoints/ckpt_00001200.safetensors" byhand-ck/ckpt_00001200.safetensors &&
  ok "same final weights as an uninterrupted run" || fail "final weights differ"

echo "== kill -9 the coordinator mid-run and restart it: the job finishes, no rank ran twice"
job_spec survive.json 60 "" '{"dp": 2}'
JS=$("$SATDAR" submit survive.json --coordinator "$ADDR")
wait_state "$JS" RUNNING 10
sleep 1.5
kill -9 "$COORD"
sleep 1
old_addr=$ADDR
"$SATDAR" coordinator --listen "$old_addr" --state-dir state1 --lease-seconds 3 >>state1/coordinator.log 2>&1 &
COORD=$!
PIDS+=("$COORD")
wait_state "$JS" SUCCEEDED 120 && [[ $(field "$JS" attempts) == 1 ]] &&
  ok "the job finished after a coordinator restart, in 1 attempt" ||
  fail "coordinator restart: $(field "$JS" state) $(field "$JS" attempts) $(field "$JS" reason)"
starts=$(cat worker-*.log | grep -c "started $JS attempt 1 rank")
[[ $starts -eq 2 ]] && ok "no rank ran twice (2 starts)" || fail "ranks started $starts times"
[[ $(field "$J2" state) == FAILED && $(field "$JA" state) == SUCCEEDED ]] &&
  ok "history intact after the restart" || fail "history lost"

echo "== a partitioned worker kills its ranks; the job restarts when the coordinator is back"
job_spec part.json 100000 "" '{"dp": 2}' 1
JP=$("$SATDAR" submit part.json --coordinator "$ADDR")
wait_state "$JP" RUNNING 10
for _ in $(seq 1 100); do [[ $(pgrep -fc "job-id $JP") -ge 2 ]] && break; sleep 0.1; done
kill -STOP "$COORD"  # the workers can no longer reach it
for _ in $(seq 1 600); do [[ $(pgrep -fc "job-id $JP") -eq 0 ]] && break; sleep 0.1; done  # 60 s: a loaded CI machine
# Whoever notices first stops them: the worker (its heartbeats unanswered for a lease), or
# each rank itself (its own lease, agent/rank_lease.h; its worker may be stuck in calls to the
# stopped coordinator for longer).
[[ $(pgrep -fc "job-id $JP") -eq 0 ]] &&
  { grep -q "longer than the lease: killing every rank" worker-*.log ||
    grep -rqs "lost its lease" work-*/jobs/"$JP"/; } &&
  ok "cut off from the coordinator past the lease, the ranks were stopped" ||
  fail "ranks survived the partition: $(pgrep -fa "job-id $JP" | cut -c1-160; tail -n 5 worker-*.log)"
kill -CONT "$COORD"
for _ in $(seq 1 150); do [[ $(field "$JP" attempts 2>/dev/null) -ge 2 ]] && break; sleep 0.1; done
[[ $(field "$JP" attempts) -ge 2 ]] && ok "after the partition the job restarts (attempt $(field "$JP" attempts))" ||
  fail "no restart after the partition: $(field "$JP" state) $(field "$JP" reason)"
"$SATDAR" cancel "$JP" --coordinator "$ADDR" >/dev/null

echo "== tokens"
kill "$COORD" 2>/dev/null; wait "$COORD" 2>/dev/null
for p in $(pgrep -f "satdar worker"); do kill "$p"; done
sleep 1
echo "client-secret-token" >client.token
echo "worker-secret-token" >worker.token
echo "wrong-token-value" >wrong.token
start_coordinator state2 --token-file client.token --worker-token-file worker.token
start_worker t1 --token-file worker.token
job_spec small.json 4 "" '{"dp": 1}'
"$SATDAR" submit small.json --coordinator "$ADDR" >out.txt 2>&1
[[ $? -eq 3 ]] && grep -q "needs a bearer token" out.txt && ok "no token: exit 3 (UNAUTHENTICATED)" ||
  fail "no token: $(cat out.txt)"
"$SATDAR" submit small.json --coordinator "$ADDR" --token-file wrong.token >out.txt 2>&1
[[ $? -eq 3 ]] && grep -q "not valid" out.txt && ok "wrong token: exit 3" || fail "wrong token: $(cat out.txt)"
"$SATDAR" submit small.json --coordinator "$ADDR" --token-file worker.token >out.txt 2>&1
[[ $? -eq 3 ]] && grep -q "a worker token cannot call the job service" out.txt &&
  ok "worker token cannot submit: exit 3 (PERMISSION_DENIED)" || fail "worker token: $(cat out.txt)"
[[ $("$SATDAR" jobs --coordinator "$ADDR" --token-file client.token --json) == "[]" ]] &&
  ok "refused calls stored nothing" || fail "a refused call stored a job"
TOKEN=client.token
JT=$("$SATDAR" submit small.json --coordinator "$ADDR" --token-file client.token)
wait_state "$JT" SUCCEEDED 60 && ok "with the right tokens the job runs" || fail "token job: $(field "$JT" state)"

echo "== another team's Python client, with stubs generated from proto/"
PROTO=$HERE/../proto
mkdir -p py/proto/satdar/v1 py/std
cp "$PROTO/satdar/v1/control.proto" py/proto/satdar/v1/
cat >py/std/health.proto <<'EOF'
syntax = "proto3";
package grpc.health.v1;
message HealthCheckRequest { string service = 1; }
message HealthCheckResponse {
  enum ServingStatus { UNKNOWN = 0; SERVING = 1; NOT_SERVING = 2; SERVICE_UNKNOWN = 3; }
  ServingStatus status = 1;
}
service Health { rpc Check(HealthCheckRequest) returns (HealthCheckResponse); }
EOF
(cd py && protoc -I. --python_out=. --grpc_out=. --plugin=protoc-gen-grpc=/usr/bin/grpc_python_plugin \
   proto/satdar/v1/control.proto std/health.proto)
if (cd py && /usr/bin/python3 - "$ADDR" "$WORK" <<'PY'
import sys, time, grpc
from proto.satdar.v1 import control_pb2 as pb, control_pb2_grpc as rpc
from std import health_pb2, health_pb2_grpc  # the standard grpc.health.v1 service
addr, work = sys.argv[1], sys.argv[2]
ch = grpc.insecure_channel(addr)
health = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=5)
assert health.status == health_pb2.HealthCheckResponse.SERVING, health
md = [("authorization", "Bearer client-secret-token")]
jobs = rpc.JobServiceStub(ch)
spec = pb.JobSpec(name="py", config_json=open(work + "/sat.json").read(),
                  train=[pb.TrainFlag(name=k, value=v) for k, v in
                         [("steps", "6"), ("batch_size", "2"), ("seq_len", "16"),
                          ("synthetic_data", "true")]],
                  layout=pb.Layout(dp=1))
r1 = jobs.SubmitJob(pb.SubmitJobRequest(request_id="py-1", spec=spec), metadata=md)
r2 = jobs.SubmitJob(pb.SubmitJobRequest(request_id="py-1", spec=spec), metadata=md)
assert r1.created and not r2.created and r1.job_id == r2.job_id, (r1, r2)  # idempotent
other = pb.JobSpec(); other.CopyFrom(spec); other.max_restarts = 1
try:
    jobs.SubmitJob(pb.SubmitJobRequest(request_id="py-1", spec=other), metadata=md)
    raise SystemExit("a used request_id with another spec was accepted")
except grpc.RpcError as e:  # another spec under a used request id is an error, not that job
    assert e.code() == grpc.StatusCode.INVALID_ARGUMENT, e
    assert e.details() == ("request_id: already used by %s with a different job spec; a new job "
                           "needs a new request_id" % r1.job_id), e.details()
kinds = [e.kind for e in jobs.WatchJob(pb.WatchJobRequest(job_id=r1.job_id), metadata=md)]
assert kinds[0] == "submitted" and kinds[-1] == "succeeded", kinds
job = jobs.GetJob(pb.GetJobRequest(job_id=r1.job_id), metadata=md)
assert job.state == pb.SUCCEEDED and job.history[0].number == 1, job
lines = [l.text for c in jobs.GetLogs(pb.GetLogsRequest(job_id=r1.job_id, rank=-1), metadata=md)
         for l in c.lines]
assert any("done: 6 steps" in l for l in lines), lines[-3:]
listed = jobs.ListJobs(pb.ListJobsRequest(states=[pb.SUCCEEDED]), metadata=md)
assert r1.job_id in [j.job_id for j in listed.jobs]
assert jobs.CancelJob(pb.CancelJobRequest(job_id=r1.job_id), metadata=md).state == pb.SUCCEEDED
try:
    jobs.GetJob(pb.GetJobRequest(job_id="job-nope"), metadata=md)
    raise SystemExit("no error for a missing job")
except grpc.RpcError as e:
    assert e.code() == grpc.StatusCode.NOT_FOUND, e
try:
    rpc.WorkerServiceStub(ch).Heartbeat(pb.HeartbeatRequest(worker_id="worker-9999"),
                                       metadata=[("authorization", "Bearer worker-secret-token")])
    raise SystemExit("no error for an unknown worker")
except grpc.RpcError as e:
    assert e.code() == grpc.StatusCode.NOT_FOUND, e
PY
); then ok "python client: health, idempotent submit, watch, get, logs, list, errors"; else fail "python client"; fi

echo "== TLS"
openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=localhost \
  -addext subjectAltName=IP:127.0.0.1 -keyout tls.key -out tls.crt >/dev/null 2>&1
start_coordinator state3 --tls-cert tls.crt --tls-key tls.key
start_worker s1 --tls-ca tls.crt
TOKEN=""
job_spec tls.json 4 "" '{"dp": 1}'
JL=$("$SATDAR" submit tls.json --coordinator "$ADDR" --tls-ca tls.crt 2>&1) &&
  "$SATDAR" status "$JL" --coordinator "$ADDR" --tls-ca tls.crt >/dev/null &&
  for _ in $(seq 1 300); do
    [[ $("$SATDAR" status "$JL" --coordinator "$ADDR" --tls-ca tls.crt --json | grep -c SUCCEEDED) -eq 1 ]] && break
    sleep 0.1
  done
"$SATDAR" status "$JL" --coordinator "$ADDR" --tls-ca tls.crt --json | grep -q '"state":"SUCCEEDED"' &&
  ok "a job over TLS (worker and client verify the coordinator)" || fail "TLS job: $JL"
# Names from elsewhere print escaped: a worker named with an escape sequence cannot clear the
# terminal or forge a row of `workers`.
start_worker $'evil\e[2J\rforged' --tls-ca tls.crt
for _ in $(seq 1 100); do
  "$SATDAR" workers --coordinator "$ADDR" --tls-ca tls.crt --json | grep -q 'evil' && break
  sleep 0.1
done
"$SATDAR" workers --coordinator "$ADDR" --tls-ca tls.crt >out.txt 2>&1
grep -qF 'evil\x1b[2J\x0dforged' out.txt && ! grep -q $'[\e\r]' out.txt &&
  ok "workers prints a name's control characters escaped" || fail "workers table: $(cat -v out.txt)"
timeout 20 "$SATDAR" jobs --coordinator "$ADDR" >out.txt 2>&1
[[ $? -eq 2 ]] && grep -qF "speaks TLS; give --tls-ca FILE" out.txt &&
  ok "a plaintext client cannot talk to the TLS coordinator, and is told so (exit 2)" ||
  fail "plaintext vs TLS: $(cat out.txt)"
echo "$passed passed, $failed failed"
[[ $failed -eq 0 ]]
