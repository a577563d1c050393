#!/usr/bin/env bash
# The control plane's servers refuse to start where they would harm a running one, and say
# why (issue 28, parts 3 and 6), as real processes on loopback:
#   - one coordinator per port (no SO_REUSEPORT) and per --state-dir (a lock naming its pid);
#     a coordinator killed with SIGKILL restarts on the same port and folder;
#   - a state.db that is empty or missing beside a coordinator.json, or not satdar's, is
#     refused and left untouched;
#   - one worker per --work-dir, whose running ranks a second worker no longer kills;
#   - bad --tls-cert/--tls-key/--tls-ca files (missing, not PEM, encrypted, a key of another
#     certificate) are exit 2 naming the file, for the coordinator, workers and clients;
#   - a client or worker and a coordinator that disagree about TLS are told so at once;
#   - a worker's token problems are exit 3, as a client's;
#   - a coordinator without tokens on a non-loopback address warns.
# Every error path asserts its exit code and its whole message.
# Usage: control_plane_startup_test.sh PATH_TO_SATDAR
set -u
SATDAR=$(realpath "$1")
WORK="${TEST_TMPDIR:-/tmp/satdar-test-$$}/startup"
rm -rf "$WORK" && mkdir -p "$WORK"
cd "$WORK"
unset TEST_PREMATURE_EXIT_FILE XML_OUTPUT_FILE SATDAR_COORDINATOR SATDAR_TOKEN_FILE SATDAR_TLS_CA \
  SATDAR_WORKER_TOKEN_FILE
passed=0
failed=0
ok() { echo "ok   $1"; passed=$((passed + 1)); }
fail() { echo "FAIL $1"; failed=$((failed + 1)); }
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null; done; pkill -9 -f "$WORK" 2>/dev/null; }
trap cleanup EXIT

# start_coordinator DIR [FLAGS...]: sets COORD (pid) and ADDR (what it bound).
start_coordinator() {
  local dir=$1
  shift
  mkdir -p "$dir"
  rm -f "$dir/coordinator.json"
  "$SATDAR" coordinator --listen 127.0.0.1:0 --state-dir "$dir" --lease-seconds 3 "$@" \
    >>"$dir/coordinator.log" 2>&1 &
  COORD=$!
  PIDS+=("$COORD")
  for _ in $(seq 1 200); do [[ -s $dir/coordinator.json ]] && break; sleep 0.05; done
  ADDR=$(/usr/bin/python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['grpc'])" \
         "$dir/coordinator.json")
}
# run CMD...: runs CMD (at most 20 s) with its output in out.txt, less gRPC's own log lines
# ("E1202 11:53:31.482504870   24791 ssl_transport_security.cc:1501] Handshake failed ...");
# sets GOT to its exit code.
run() {
  timeout 20 "$@" >raw.txt 2>&1 </dev/null
  GOT=$?
  grep -Ev '^[DIWE][0-9]{4} [0-9:.]+ +[0-9]+ [A-Za-z0-9_]+\.cc:[0-9]+\]' raw.txt >out.txt
}
# expect NAME CODE MESSAGE CMD...: CMD exits CODE and its output is exactly MESSAGE.
expect() {
  local name=$1 code=$2 message=$3
  shift 3
  run "$@"
  local got=$GOT
  if [[ $got -eq $code && "$(cat out.txt)" == "$message" ]]; then
    ok "$name"
  else
    fail "$name: exit $got (want $code): $(cat out.txt) [want: $message]"
  fi
}
# expect_prefix NAME CODE PREFIX CMD...: as expect, for messages whose tail varies (a host
# name, a time).
expect_prefix() {
  local name=$1 code=$2 prefix=$3
  shift 3
  run "$@"
  local got=$GOT
  local text
  text=$(cat out.txt)
  if [[ $got -eq $code && "$text" == "$prefix"* && $(wc -l <out.txt) -eq 1 ]]; then
    ok "$name"
  else
    fail "$name: exit $got (want $code): $text [want prefix: $prefix]"
  fi
}

echo "client-secret-token" >client.token
echo "worker-secret-token" >worker.token
echo "wrong-token-value" >wrong.token
echo "short" >short.token

echo "== one coordinator per port and per state folder"
start_coordinator s1
A=$COORD
A_ADDR=$ADDR
A_PORT=${A_ADDR##*:}
expect "a second coordinator on a served port: exit 2 naming it" 2 \
  "satdar coordinator: error: listen: $A_ADDR is already in use (another coordinator, or another program, serves it); give another port, or 0 for a free one" \
  "$SATDAR" coordinator --listen "$A_ADDR" --state-dir s2 --quiet
cmp -s raw.txt out.txt && [[ ! -e s2/state.db ]] &&
  ok "  ... before touching its state folder, and without gRPC's log of the failed bind" ||
  fail "port refusal: state.db created or gRPC noise: $(cat raw.txt)"
# Also on the wildcard address of the same port (SO_REUSEPORT would have let it share).
expect "a second coordinator on 0.0.0.0 of a served port: exit 2" 2 \
  "satdar coordinator: error: listen: 0.0.0.0:$A_PORT is already in use (another coordinator, or another program, serves it); give another port, or 0 for a free one" \
  "$SATDAR" coordinator --listen "0.0.0.0:$A_PORT" --state-dir s2b --quiet --token-file client.token \
  --worker-token-file worker.token
start=$(date +%s.%N)
expect_prefix "a second coordinator on the same --state-dir: exit 2 naming the holder's pid" 2 \
  "satdar coordinator: error: state_dir: s1 is in use by another coordinator (pid $A on host " \
  "$SATDAR" coordinator --listen 127.0.0.1:0 --state-dir s1 --quiet
elapsed=$(/usr/bin/python3 -c "import sys; print(float(sys.argv[2]) - float(sys.argv[1]))" "$start" "$(date +%s.%N)")
/usr/bin/python3 -c "import sys; assert float(sys.argv[1]) < 4" "$elapsed" &&
  ok "  ... at once (${elapsed%???????} s, not SQLite's 5 s busy wait)" || fail "state-dir refusal took $elapsed s"
all_ok=1
for _ in $(seq 1 10); do
  "$SATDAR" jobs --coordinator "$A_ADDR" --json >out.txt 2>&1 && [[ $(cat out.txt) == "[]" ]] || all_ok=0
done
[[ $all_ok -eq 1 ]] && kill -0 "$A" 2>/dev/null && ok "the first coordinator still serves every call" ||
  fail "the first coordinator: $(cat out.txt)"
grep -q "^pid $A on host " s1/coordinator.lock && ok "s1/coordinator.lock names the holder" ||
  fail "lock file: $(cat s1/coordinator.lock)"
kill -9 "$A"
wait "$A" 2>/dev/null
"$SATDAR" coordinator --listen "$A_ADDR" --state-dir s1 --quiet &
A=$!
PIDS+=("$A")
restarted=0
for _ in $(seq 1 100); do
  "$SATDAR" jobs --coordinator "$A_ADDR" >/dev/null 2>&1 && { restarted=1; break; }
  sleep 0.1
done
[[ $restarted -eq 1 ]] && kill -0 "$A" 2>/dev/null &&
  ok "killed with SIGKILL, it restarts on the same port and folder" || fail "restart after kill -9"
kill "$A"
wait "$A" 2>/dev/null

echo "== a state.db that is lost or not satdar's is refused and left as it is"
mkdir -p s-empty s-missing s-foreign s-columns s-text s-appid
for d in s-empty s-missing s-foreign s-columns s-text s-appid; do cp s1/coordinator.json "$d/"; done
: >s-empty/state.db
expect "0-byte state.db beside coordinator.json: exit 2" 2 \
  "satdar coordinator: error: state_dir: s-empty/state.db is empty (0 bytes), but s-empty/coordinator.json shows that a coordinator served from this folder: its jobs would be lost. Restore s-empty/state.db, or remove s-empty/coordinator.json to start with no jobs" \
  "$SATDAR" coordinator --listen 127.0.0.1:0 --state-dir s-empty --quiet
[[ ! -s s-empty/state.db ]] && ok "  ... and it stays empty (nothing created)" || fail "0-byte state.db was written"
expect "deleted state.db beside coordinator.json: exit 2" 2 \
  "satdar coordinator: error: state_dir: s-missing/state.db is missing, but s-missing/coordinator.json shows that a coordinator served from this folder: its jobs would be lost. Restore s-missing/state.db, or remove s-missing/coordinator.json to start with no jobs" \
  "$SATDAR" coordinator --listen 127.0.0.1:0 --state-dir s-missing --quiet
[[ ! -e s-missing/state.db ]] && ok "  ... and none is created" || fail "a state.db was created"
/usr/bin/python3 - <<'PY'
import sqlite3
c = sqlite3.connect("s-foreign/state.db")
c.execute("CREATE TABLE users (name TEXT, password TEXT)")
c.execute("INSERT INTO users VALUES ('ann', 'x')")
c.commit()
c = sqlite3.connect("s-columns/state.db")
c.execute("CREATE TABLE jobs (id INTEGER PRIMARY KEY, spec TEXT)")
c.commit()
c = sqlite3.connect("s-appid/state.db")
c.execute("PRAGMA application_id = 1234")
c.execute("CREATE TABLE jobs (job_id TEXT PRIMARY KEY, record BLOB NOT NULL)")
c.commit()
PY
sum_before=$(md5sum s-foreign/state.db s-columns/state.db s-appid/state.db)
expect "a foreign SQLite file (another program's table): exit 2" 2 \
  "satdar coordinator: error: state_dir: s-foreign/state.db is not a satdar coordinator's state (it holds a table \"users\"); give a folder of its own to state_dir" \
  "$SATDAR" coordinator --listen 127.0.0.1:0 --state-dir s-foreign --quiet
expect "a foreign SQLite file (a jobs table of other columns): exit 2" 2 \
  "satdar coordinator: error: state_dir: s-columns/state.db is not a satdar coordinator's state (its table \"jobs\" has columns (id, spec), not (job_id, record)); give a folder of its own to state_dir" \
  "$SATDAR" coordinator --listen 127.0.0.1:0 --state-dir s-columns --quiet
expect "a foreign SQLite file (another application id): exit 2" 2 \
  "satdar coordinator: error: state_dir: s-appid/state.db is not a satdar coordinator's state (its SQLite application id is 1234); give a folder of its own to state_dir" \
  "$SATDAR" coordinator --listen 127.0.0.1:0 --state-dir s-appid --quiet
[[ $(md5sum s-foreign/state.db s-columns/state.db s-appid/state.db) == "$sum_before" && ! -e s-foreign/state.db-wal ]] &&
  ok "  ... and the foreign files are not modified" || fail "a foreign file was modified"
echo "not a database at all, but long enough to have a header line......................." >s-text/state.db
expect "a state.db that is not SQLite: exit 2" 2 \
  "satdar coordinator: error: state_dir: s-text/state.db is not a satdar coordinator's state (not a SQLite database); give a folder of its own to state_dir" \
  "$SATDAR" coordinator --listen 127.0.0.1:0 --state-dir s-text --quiet
# A satdar state of an earlier build (no application id, no series table) is still adopted,
# beside its coordinator.json.
mkdir -p s-old
/usr/bin/python3 -c "
import sqlite3
c = sqlite3.connect('s-old/state.db')
c.execute('CREATE TABLE jobs (job_id TEXT PRIMARY KEY, record BLOB NOT NULL)')
c.execute('CREATE TABLE workers (worker_id TEXT PRIMARY KEY, record BLOB NOT NULL)')
c.commit()"
echo '{"grpc": "127.0.0.1:1", "http": null}' >s-old/coordinator.json
"$SATDAR" coordinator --listen 127.0.0.1:0 --state-dir s-old --quiet >s-old/coordinator.log 2>&1 &
COORD=$!
PIDS+=("$COORD")
for _ in $(seq 1 200); do grep -q 127.0.0.1:1\" s-old/coordinator.json || break; sleep 0.05; done
ADDR=$(/usr/bin/python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['grpc'])" s-old/coordinator.json)
"$SATDAR" jobs --coordinator "$ADDR" --json >out.txt 2>&1 && [[ $(cat out.txt) == "[]" ]] &&
  ok "an earlier build's state (satdar's tables, no application id) is adopted" || fail "old state: $(cat out.txt; cat s-old/coordinator.log)"
kill "$COORD"
wait "$COORD" 2>/dev/null

echo "== one worker per --work-dir"
cat >sat.json <<'JSON'
{"vocab_size": 64, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
 "num_attention_heads": 4, "num_key_value_heads": 2, "value_residual": "satformer",
 "max_position_embeddings": 64}
JSON
cat >long.json <<'JSON'
{"name": "long", "config": "sat.json",
 "train": {"steps": 1000000, "batch_size": 4, "seq_len": 32, "synthetic_data": true, "seed": 5},
 "layout": {"dp": 1}, "max_restarts": 0}
JSON
mkdir -p shared
start_coordinator s3
"$SATDAR" worker --coordinator "$ADDR" --slots 1 --work-dir wA --shared-dir shared --name first \
  >worker-first.log 2>&1 &
W1=$!
PIDS+=("$W1")
JOB=$("$SATDAR" submit long.json --coordinator "$ADDR")
for _ in $(seq 1 300); do pgrep -f "job-id $JOB" >/dev/null && break; sleep 0.1; done
RANK=$(pgrep -f "job-id $JOB" | head -1)
[[ -n $RANK ]] && ok "the first worker runs a rank (pid $RANK)" || fail "no rank started: $(tail -3 worker-first.log)"
expect_prefix "a second worker on the same --work-dir: exit 2 naming the holder's pid" 2 \
  "satdar worker: error: work_dir: wA is in use by another worker (pid $W1 on host " \
  "$SATDAR" worker --coordinator "$ADDR" --slots 1 --work-dir wA --shared-dir shared --name second --quiet
sleep 0.5
[[ -n $RANK ]] && kill -0 "$RANK" 2>/dev/null && kill -0 "$W1" 2>/dev/null &&
  ok "  ... and the first worker and its rank live on" || fail "the first worker's rank was killed"
"$SATDAR" cancel "$JOB" --coordinator "$ADDR" >/dev/null 2>&1
kill "$W1"
wait "$W1" 2>/dev/null
kill "$COORD"
wait "$COORD" 2>/dev/null

echo "== bad TLS files: exit 2 naming the file, for the coordinator, workers and clients"
openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=localhost \
  -addext subjectAltName=IP:127.0.0.1 -keyout tls.key -out tls.crt >/dev/null 2>&1
openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=other -keyout other.key \
  -out other.crt >/dev/null 2>&1
openssl rsa -in tls.key -aes256 -passout pass:secret -out encrypted.key >/dev/null 2>&1
echo "this is not PEM" >garbage.pem
expect "coordinator --tls-cert not PEM" 2 \
  "satdar coordinator: error: tls_cert: garbage.pem holds no PEM certificate (-----BEGIN CERTIFICATE-----)" \
  "$SATDAR" coordinator --listen 127.0.0.1:0 --state-dir s4 --tls-cert garbage.pem --tls-key tls.key --quiet
expect "coordinator --tls-cert given the key" 2 \
  "satdar coordinator: error: tls_cert: tls.key holds no PEM certificate (-----BEGIN CERTIFICATE-----)" \
  "$SATDAR" coordinator --listen 127.0.0.1:0 --state-dir s4 --tls-cert tls.key --tls-key tls.key --quiet
expect "coordinator --tls-key not PEM" 2 \
  "satdar coordinator: error: tls_key: garbage.pem holds no unencrypted PEM private key (-----BEGIN PRIVATE KEY-----)" \
  "$SATDAR" coordinator --listen 127.0.0.1:0 --state-dir s4 --tls-cert tls.crt --tls-key garbage.pem --quiet
expect "coordinator --tls-key given the certificate" 2 \
  "satdar coordinator: error: tls_key: tls.crt holds no unencrypted PEM private key (-----BEGIN PRIVATE KEY-----)" \
  "$SATDAR" coordinator --listen 127.0.0.1:0 --state-dir s4 --tls-cert tls.crt --tls-key tls.crt --quiet
expect "coordinator --tls-key encrypted (refused, never prompted for)" 2 \
  "satdar coordinator: error: tls_key: encrypted.key holds no unencrypted PEM private key (-----BEGIN PRIVATE KEY-----)" \
  "$SATDAR" coordinator --listen 127.0.0.1:0 --state-dir s4 --tls-cert tls.crt --tls-key encrypted.key --quiet
expect "coordinator --tls-key of another certificate" 2 \
  "satdar coordinator: error: tls_key: other.key is not the key of the certificate in tls.crt (tls_cert)" \
  "$SATDAR" coordinator --listen 127.0.0.1:0 --state-dir s4 --tls-cert tls.crt --tls-key other.key --quiet
expect "coordinator --tls-cert missing" 2 \
  "satdar coordinator: error: --tls-cert: cannot open missing.pem: No such file or directory" \
  "$SATDAR" coordinator --listen 127.0.0.1:0 --state-dir s4 --tls-cert missing.pem --tls-key tls.key --quiet
expect "client --tls-ca not PEM (no 10 s connect timeout)" 2 \
  "satdar jobs: error: --tls-ca: garbage.pem holds no PEM certificate (-----BEGIN CERTIFICATE-----)" \
  "$SATDAR" jobs --coordinator 127.0.0.1:1 --tls-ca garbage.pem
expect "client --tls-ca missing" 2 \
  "satdar status: error: --tls-ca: cannot open missing.pem: No such file or directory" \
  "$SATDAR" status job-1 --coordinator 127.0.0.1:1 --tls-ca missing.pem
expect "client \$SATDAR_TLS_CA not PEM" 2 \
  "satdar workers: error: --tls-ca: garbage.pem holds no PEM certificate (-----BEGIN CERTIFICATE-----)" \
  env SATDAR_TLS_CA=garbage.pem "$SATDAR" workers --coordinator 127.0.0.1:1
expect "worker --tls-ca not PEM" 2 \
  "satdar worker: error: --tls-ca: garbage.pem holds no PEM certificate (-----BEGIN CERTIFICATE-----)" \
  "$SATDAR" worker --coordinator 127.0.0.1:1 --slots 1 --work-dir wB --shared-dir shared --tls-ca garbage.pem --quiet

echo "== TLS on one side only: said at once"
start_coordinator s5 --tls-cert tls.crt --tls-key tls.key
TLS_ADDR=$ADDR
SECONDS=0
expect "plaintext client to a TLS coordinator: exit 2, says so" 2 \
  "satdar jobs: error: the coordinator at $TLS_ADDR speaks TLS; give --tls-ca FILE (or \$SATDAR_TLS_CA) with the PEM roots of its certificate" \
  "$SATDAR" jobs --coordinator "$TLS_ADDR"
[[ $SECONDS -le 8 ]] && ok "  ... within 8 s (${SECONDS} s, not 10 retries)" || fail "plaintext vs TLS took $SECONDS s"
expect "plaintext logs to a TLS coordinator: exit 2, says so" 2 \
  "satdar logs: error: the coordinator at $TLS_ADDR speaks TLS; give --tls-ca FILE (or \$SATDAR_TLS_CA) with the PEM roots of its certificate" \
  "$SATDAR" logs job-1 --coordinator "$TLS_ADDR"
expect "plaintext worker to a TLS coordinator: exit 2, says so" 2 \
  "satdar worker: error: the coordinator at $TLS_ADDR speaks TLS; give --tls-ca FILE (or \$SATDAR_TLS_CA) with the PEM roots of its certificate" \
  "$SATDAR" worker --coordinator "$TLS_ADDR" --slots 1 --work-dir wC --shared-dir shared --quiet
"$SATDAR" jobs --coordinator "$TLS_ADDR" --tls-ca tls.crt --json >out.txt 2>&1 && [[ $(cat out.txt) == "[]" ]] &&
  ok "with --tls-ca the same client is served" || fail "TLS client: $(cat out.txt)"
SECONDS=0
expect "client whose --tls-ca did not sign the coordinator's certificate: exit 2, says so" 2 \
  "satdar jobs: error: the coordinator at $TLS_ADDR presents a certificate that --tls-ca other.crt does not verify (self-signed certificate)" \
  "$SATDAR" jobs --coordinator "$TLS_ADDR" --tls-ca other.crt
[[ $SECONDS -le 8 ]] && ok "  ... within 8 s (${SECONDS} s, not 10 retries)" || fail "untrusted took $SECONDS s"
expect "worker whose --tls-ca did not sign the coordinator's certificate: exit 2" 2 \
  "satdar worker: error: the coordinator at $TLS_ADDR presents a certificate that --tls-ca other.crt does not verify (self-signed certificate)" \
  "$SATDAR" worker --coordinator "$TLS_ADDR" --slots 1 --work-dir wC --shared-dir shared --tls-ca other.crt --quiet
# The certificate is for 127.0.0.1 (its subjectAltName): reached as localhost, it does not fit.
LOCAL_ADDR="localhost:${TLS_ADDR##*:}"
expect "client reaching the coordinator by a name its certificate lacks: exit 2" 2 \
  "satdar jobs: error: the coordinator at $LOCAL_ADDR presents a certificate that --tls-ca tls.crt does not verify (it is not for localhost)" \
  "$SATDAR" jobs --coordinator "$LOCAL_ADDR" --tls-ca tls.crt
kill "$COORD"
wait "$COORD" 2>/dev/null
start_coordinator s6
PLAIN_ADDR=$ADDR
expect "TLS client to a plaintext coordinator: exit 2, says so" 2 \
  "satdar jobs: error: the coordinator at $PLAIN_ADDR does not speak TLS; drop --tls-ca (and \$SATDAR_TLS_CA)" \
  "$SATDAR" jobs --coordinator "$PLAIN_ADDR" --tls-ca tls.crt

echo "== a worker's token problems: exit 3, as a client's"
kill "$COORD"
wait "$COORD" 2>/dev/null
start_coordinator s7 --token-file client.token --worker-token-file worker.token
expect "worker without a token: exit 3" 3 \
  "satdar worker: error: the coordinator refused to register this worker: this call needs a bearer token (the caller's token file)" \
  "$SATDAR" worker --coordinator "$ADDR" --slots 1 --work-dir wD --shared-dir shared --quiet
expect "worker with a wrong token: exit 3" 3 \
  "satdar worker: error: the coordinator refused to register this worker: the token is not valid" \
  "$SATDAR" worker --coordinator "$ADDR" --slots 1 --work-dir wD --shared-dir shared --token-file wrong.token --quiet
expect "worker with the client token: exit 3" 3 \
  "satdar worker: error: the coordinator refused to register this worker: a client token cannot call the worker service" \
  "$SATDAR" worker --coordinator "$ADDR" --slots 1 --work-dir wD --shared-dir shared --token-file client.token --quiet
expect "client with a wrong token: exit 3 (the same)" 3 \
  "satdar jobs: error: the token is not valid" \
  "$SATDAR" jobs --coordinator "$ADDR" --token-file wrong.token
expect "worker with an unusable token file: exit 2" 2 \
  "satdar worker: error: token_file: token file short.token: a token must be 8 to 4096 characters, got 5" \
  "$SATDAR" worker --coordinator "$ADDR" --slots 1 --work-dir wD --shared-dir shared --token-file short.token --quiet
kill "$COORD"
wait "$COORD" 2>/dev/null

echo "== a coordinator without tokens on a non-loopback address warns"
mkdir -p s8
"$SATDAR" coordinator --listen 0.0.0.0:0 --state-dir s8 --quiet 2>s8/stderr.txt &
C8=$!
PIDS+=("$C8")
for _ in $(seq 1 200); do [[ -s s8/coordinator.json ]] && break; sleep 0.05; done
sed -E 's/^[0-9TZ:.-]+ //' s8/stderr.txt >s8/warnings.txt
cat >want.txt <<'EOF'
coordinator: warning: 0.0.0.0:0 is not a loopback address and there is no client token: anyone who reaches it can submit and cancel jobs
coordinator: warning: 0.0.0.0:0 is not a loopback address and there is no worker token: anyone who reaches it can register a worker and take jobs' ranks
EOF
diff -u want.txt s8/warnings.txt >/dev/null && ok "0.0.0.0 without tokens: both warnings (even with --quiet)" ||
  fail "warnings: $(cat s8/stderr.txt)"
kill "$C8"
wait "$C8" 2>/dev/null
rm -f s8/coordinator.json
"$SATDAR" coordinator --listen 0.0.0.0:0 --state-dir s8 --token-file client.token \
  --worker-token-file worker.token --quiet 2>s8/stderr2.txt &
C8=$!
PIDS+=("$C8")
for _ in $(seq 1 200); do [[ -s s8/coordinator.json ]] && break; sleep 0.05; done
[[ ! -s s8/stderr2.txt ]] && ok "0.0.0.0 with both tokens: no warning" || fail "warned with tokens: $(cat s8/stderr2.txt)"
kill "$C8"
wait "$C8" 2>/dev/null
[[ ! -s s1/coordinator.log ]] || ! grep -q "warning" s1/coordinator.log &&
  ok "127.0.0.1 without tokens: no warning" || fail "warned on loopback: $(cat s1/coordinator.log)"

echo "$passed passed, $failed failed"
[[ $failed -eq 0 ]]
