#!/usr/bin/env bash
# A worker is one identity (issue 28, part 4), as real processes on loopback: a coordinator
# with client and worker tokens, two real workers running a dp=2 job of 1,000,000 steps, and
# "mallory", a holder of the worker token that registers a worker of its own and then tries
# to speak for the others over gRPC (Python, stubs from proto/): another worker's heartbeat,
# forged progress and metrics address, log lines, rendezvous keys, a rank lease and an exit
# that would mark the job SUCCEEDED. Every forgery is PERMISSION_DENIED and counted in
# satdar_worker_calls_denied_total; nothing of it shows in the job, its logs or the Prometheus
# targets; worker ids are random; and the real workers' own calls (and their ranks') still
# work: a second dp=2 job meets in the rendezvous store and SUCCEEDS.
# Usage: worker_identity_test.sh PATH_TO_SATDAR PATH_TO_CONTROL_PROTO
set -u
SATDAR=$(realpath "$1")
PROTO=$(realpath "$2")
WORK="${TEST_TMPDIR:-/tmp/satdar-test-$$}/worker_identity"
rm -rf "$WORK" && mkdir -p "$WORK"
cd "$WORK"
unset TEST_PREMATURE_EXIT_FILE XML_OUTPUT_FILE SATDAR_COORDINATOR SATDAR_TOKEN_FILE
passed=0 failed=0
ok() { echo "ok   $1"; passed=$((passed + 1)); }
fail() { echo "FAIL $1"; failed=$((failed + 1)); }
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null; done; pkill -9 -f "$WORK" 2>/dev/null; }
trap cleanup EXIT
PY=/usr/bin/python3

echo client-token-0123456789 >client.token
echo worker-token-0123456789 >worker.token
chmod 600 client.token worker.token
cat >model.json <<'JSON'
{"vocab_size": 64, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
 "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 64}
JSON
mkdir -p state shared
"$SATDAR" coordinator --listen 127.0.0.1:0 --http 127.0.0.1:0 --state-dir state \
  --token-file client.token --worker-token-file worker.token --lease-seconds 3 \
  >>coordinator.log 2>&1 &
PIDS+=($!)
for _ in $(seq 1 100); do [[ -s state/coordinator.json ]] && break; sleep 0.05; done
ADDR=$($PY -c "import json,sys; print(json.load(open(sys.argv[1]))['grpc'])" state/coordinator.json)
HTTP=$($PY -c "import json,sys; print(json.load(open(sys.argv[1]))['http'])" state/coordinator.json)
for w in a b; do
  "$SATDAR" worker --coordinator "$ADDR" --slots 1 --work-dir "work-$w" --shared-dir shared \
    --data-root "$WORK" --name "$w" --token-file worker.token >>"worker-$w.log" 2>&1 &
  PIDS+=($!)
done
C=(--coordinator "$ADDR" --token-file client.token)
field() {
  "$SATDAR" status "$1" "${C[@]}" --json | $PY -c "import json,sys; print(json.load(sys.stdin)$2)"
}
wait_state() {  # JOB STATE SECONDS
  for _ in $(seq 1 $(($3 * 10))); do
    [[ $(field "$1" "['state']" 2>/dev/null) == "$2" ]] && return 0
    sleep 0.1
  done
  return 1
}
spec() {  # FILE STEPS
  cat >"$1" <<SPEC
{"name": "identity", "config": "model.json",
 "train": {"steps": $2, "batch_size": 4, "seq_len": 32, "synthetic_data": true, "seed": 3,
           "checkpoint_every": 1000000},
 "layout": {"dp": 2}}
SPEC
}

spec long.json 1000000
JOB=$("$SATDAR" submit long.json "${C[@]}")
for _ in $(seq 1 600); do
  [[ $(field "$JOB" "['step']" 2>/dev/null) -ge 2 ]] 2>/dev/null && break
  sleep 0.1
done
[[ $(field "$JOB" "['state']") == RUNNING ]] && ok "a dp=2 job of 1,000,000 steps runs on a and b" ||
  fail "the job is $(field "$JOB" "['state']"): $(field "$JOB" "['reason']")"

# Worker ids: random, not worker-0001.
ids=$("$SATDAR" workers "${C[@]}" --json | $PY -c "
import json, re, sys
ws = json.load(sys.stdin)
assert len(ws) == 2, ws
for w in ws:
    assert re.fullmatch(r'worker-[0-9a-f]{16}', w['worker_id']), w['worker_id']
print(' '.join(w['worker_id'] for w in ws))") &&
  ok "worker ids are random: $ids" || fail "worker ids: $ids"
A_ID=$(field "$JOB" "['history'][0]['ranks'][0]['worker_id']")

mkdir -p py/proto/satdar/v1
cp "$PROTO" py/proto/satdar/v1/
(cd py && protoc -I. --python_out=. --grpc_out=. \
   --plugin=protoc-gen-grpc=/usr/bin/grpc_python_plugin proto/satdar/v1/control.proto)
if out=$(cd py && $PY - "$ADDR" "$JOB" "$A_ID" 2>&1 <<'PY'
import sys, grpc
from proto.satdar.v1 import control_pb2 as pb, control_pb2_grpc as rpc
addr, job, a_id = sys.argv[1:4]
token = [("authorization", "Bearer worker-token-0123456789")]
stub = rpc.WorkerServiceStub(grpc.insecure_channel(addr))
# A cuda worker: no cpu job is placed on it.
reg = stub.RegisterWorker(pb.RegisterWorkerRequest(name="mallory", slots=1, device="cuda"),
                          metadata=token, timeout=10)
mine = token + [("satdar-worker-session", reg.session)]
stub.Heartbeat(pb.HeartbeatRequest(worker_id=reg.worker_id), metadata=mine, timeout=10)
print("mallory registered as", reg.worker_id, "and its own heartbeat works")
forged_rank = pb.RankStatus(job_id=job, attempt=1, rank=0, pid=1, step=999999, loss=0.001,
                            tokens_per_second=1e12, metrics_address="10.6.6.6:9999")
exit0 = dict(job_id=job, attempt=1, rank=0, exit_code=0, summary_json='{"steps": 1000000}')
calls = [
    ("Heartbeat", "as a, with mallory's session", stub.Heartbeat,
     pb.HeartbeatRequest(worker_id=a_id), mine),
    ("Heartbeat", "as a, without a session", stub.Heartbeat,
     pb.HeartbeatRequest(worker_id=a_id), token),
    ("Heartbeat", "as a, with a made-up session", stub.Heartbeat,
     pb.HeartbeatRequest(worker_id=a_id), token + [("satdar-worker-session", "0" * 64)]),
    ("Heartbeat", "a's rank's progress and metrics address", stub.Heartbeat,
     pb.HeartbeatRequest(worker_id=reg.worker_id, ranks=[forged_rank]), mine),
    ("UploadLogs", "log lines for a's rank", stub.UploadLogs,
     pb.LogUpload(worker_id=reg.worker_id, job_id=job, attempt=1, rank=0,
                  lines=["FORGED: the job is done"]), mine),
    ("UploadLogs", "log lines as a", stub.UploadLogs,
     pb.LogUpload(worker_id=a_id, job_id=job, attempt=1, rank=0,
                  lines=["FORGED: the job is done"]), mine),
    ("KvSet", "a rendezvous key of the job", stub.KvSet,
     pb.KvSetRequest(job_id=job, attempt=1, key="forged", value=b"10.6.6.6:1"), mine),
    ("KvGet", "a rendezvous key of the job", stub.KvGet,
     pb.KvGetRequest(job_id=job, attempt=1, key="forged"), mine),
    ("RenewRankLease", "a's rank's lease", stub.RenewRankLease,
     pb.RankLeaseRequest(job_id=job, attempt=1, rank=0), mine),
    ("ReportExit", "a's rank's exit 0", stub.ReportExit,
     pb.RankExit(worker_id=reg.worker_id, **exit0), mine),
    ("ReportExit", "a's rank's exit 0, as a", stub.ReportExit,
     pb.RankExit(worker_id=a_id, **exit0), mine),
]
bad = 0
for method, what, fn, req, md in calls:
    try:
        fn(req, metadata=md, timeout=10)
        print("ACCEPTED", method, what)
        bad += 1
    except grpc.RpcError as e:
        if e.code() != grpc.StatusCode.PERMISSION_DENIED:
            print("WRONG CODE", method, what, e.code(), e.details())
            bad += 1
        else:
            print("denied", method, what, "--", e.details())
sys.exit(1 if bad else 0)
PY
); then
  ok "11 forged calls of another worker's ranks are PERMISSION_DENIED"
else
  fail "forged calls: $out"
fi
echo "$out" | sed 's/^/    /'

sleep 1.5  # a heartbeat of each real worker since
state=$(field "$JOB" "['state']") step=$(field "$JOB" "['step']") loss=$(field "$JOB" "['loss']")
[[ $state == RUNNING && $step -lt 999999 && $loss != 0.001 ]] &&
  ok "the job is still RUNNING at its own step $step, loss $loss (not the forged exit or progress)" ||
  fail "the job after the forgeries: $state, step $step, loss $loss"
"$SATDAR" logs "$JOB" "${C[@]}" >logs.txt 2>&1
! grep -q FORGED logs.txt && grep -q "step" logs.txt &&
  ok "the job's logs hold its ranks' lines, none of mallory's" || fail "logs: $(grep FORGED logs.txt)"
targets=$(curl -s --max-time 5 "http://$HTTP/prometheus/targets")
[[ $targets == *"127.0.0.1"* && $targets != *"10.6.6.6"* ]] &&
  ok "/prometheus/targets lists the real ranks only" || fail "targets: $targets"
metrics=$(curl -s --max-time 5 "http://$HTTP/metrics")
denied=$(echo "$metrics" | $PY -c "
import re, sys
got = {m: float(v) for m, v in re.findall(r'^satdar_worker_calls_denied_total\{method=\"(\w+)\"\} (\S+)$', sys.stdin.read(), re.M)}
want = {'Heartbeat': 4, 'UploadLogs': 2, 'KvSet': 1, 'KvGet': 1, 'RenewRankLease': 1, 'ReportExit': 2}
print(got)
sys.exit(0 if got == want else 1)") &&
  ok "satdar_worker_calls_denied_total counts each denied call by method" ||
  fail "denied counter: $denied"

"$SATDAR" cancel "$JOB" "${C[@]}" >/dev/null
wait_state "$JOB" CANCELLED 30 && ok "the job is cancelled as usual" || fail "cancel: $(field "$JOB" "['state']")"
# The real workers and their ranks (the rendezvous store, rank leases, exits) still work.
spec short.json 20
JOB2=$("$SATDAR" submit short.json "${C[@]}")
wait_state "$JOB2" SUCCEEDED 120 &&
  ok "a dp=2 job on the real workers SUCCEEDED (their sessions pass every check)" ||
  fail "second job: $(field "$JOB2" "['state']"): $(field "$JOB2" "['reason']")"

echo "worker_identity_test: $passed passed, $failed failed"
[[ $failed == 0 ]]
