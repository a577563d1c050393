#!/usr/bin/env bash
# The coordinator's HTTP side is not starved (issue 28, part 7): with 5, then 20, slow
# clients holding connections (a header byte a second, reconnecting when cut), every one of
# 40 /healthz probes is answered within 1 s. (With 4 server threads and a 10 s request
# timeout, 5 slow clients made 7 of 40 probes time out.)
# Usage: http_slow_clients_test.sh PATH_TO_SATDAR
set -u
SATDAR=$(realpath "$1")
HERE=$(dirname "$(realpath "$0")")
WORK="${TEST_TMPDIR:-/tmp/satdar-test-$$}/http_slow"
rm -rf "$WORK" && mkdir -p "$WORK"
cd "$WORK"
passed=0 failed=0
"$SATDAR" coordinator --listen 127.0.0.1:0 --http 127.0.0.1:0 --state-dir state >coord.log 2>&1 &
COORD=$!
trap 'kill -9 $COORD 2>/dev/null' EXIT
for _ in $(seq 1 100); do [[ -s state/coordinator.json ]] && break; sleep 0.05; done
HTTP=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['http'])" state/coordinator.json)
for slow in 5 20; do
  out=$(python3 "$HERE/http_slow_clients.py" "$HTTP" "$slow")
  if [[ $out == "40 ok, 0 timed out"* ]]; then
    echo "ok: $slow slow clients: $out"; passed=$((passed + 1))
  else
    echo "FAIL: $slow slow clients: $out"; failed=$((failed + 1))
  fi
done
echo "$passed passed, $failed failed"
[[ $failed == 0 ]]
