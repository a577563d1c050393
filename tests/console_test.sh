#!/usr/bin/env bash
# What `satdar train` prints: one redrawn progress line with --progress bar (a terminal's
# default), plain lines into a pipe or file, and the metrics flags' bad input.
# Usage: console_test.sh PATH_TO_SATDAR
set -u
SATDAR=$(realpath "$1")
WORK="${TEST_TMPDIR:-/tmp/satdar-test-$$}/console"
rm -rf "$WORK" && mkdir -p "$WORK"
cd "$WORK"
passed=0
failed=0
ok() { echo "ok   $1"; passed=$((passed + 1)); }
fail() { echo "FAIL $1"; failed=$((failed + 1)); }
cat >m.json <<'JSON'
{"vocab_size": 64, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
 "num_attention_heads": 4, "max_position_embeddings": 64}
JSON
T=(train --config m.json --steps 12 --batch-size 2 --seq-len 16 --synthetic-data --log-every 5)

"$SATDAR" "${T[@]}" --progress bar >bar.txt 2>&1
if /usr/bin/python3 - bar.txt <<'PY'
import sys
out = open(sys.argv[1], newline="").read()  # keep the carriage returns
bar = [l for l in out.split("\n") if "\r" in l]
assert len(bar) == 1, out                      # one line, redrawn
frames = bar[0].split("\r\x1b[K")[1:]
assert len(frames) == 12, len(frames)          # every step
assert frames[-1].startswith("step 12/12 [########################] 100%"), frames[-1]
assert all("| loss " in f and "tok/s" in f and "| ETA " in f for f in frames), frames
assert "\ndone: 12 steps" in out, out          # the summary starts its own line
PY
then ok "--progress bar redraws one line per step and ends it"; else fail "--progress bar"; cat -A bar.txt | head; fi

"$SATDAR" "${T[@]}" >plain.txt 2>&1
if ! grep -q $'\r' plain.txt && [[ $(grep -cE '^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9:.]+Z step ' plain.txt) == 4 ]]; then
  ok "into a file: plain lines at steps 1, 5, 10 and 12"
else
  fail "plain output"; cat -A plain.txt
fi

expect_fail() {  # NAME CODE TEXT ARGS...
  local name=$1 code=$2 text=$3
  shift 3
  "$SATDAR" "$@" >out.txt 2>&1
  local c=$?
  if [[ $c == "$code" ]] && grep -qF -- "$text" out.txt; then ok "$name"; else fail "$name (exit $c)"; cat out.txt; fi
}
expect_fail "--progress must be one of its choices" 2 "--progress" "${T[@]}" --progress fancy
expect_fail "--job-id must be printable ASCII" 2 "--job-id must be 1 to 256 printable ASCII" \
  "${T[@]}" --job-id $'bad\nid'
expect_fail "--peak-tflops must not be negative" 2 "--peak-tflops" "${T[@]}" --peak-tflops -1
expect_fail "coordinator --http must be HOST:PORT" 2 "satdar coordinator: error: http 'nope' is not HOST:PORT" coordinator --listen 127.0.0.1:0 \
  --state-dir "$WORK/state" --http nope
expect_fail "--metrics-listen must be HOST:PORT" 2 "--metrics-listen 'nope' is not HOST:PORT" \
  "${T[@]}" --metrics-listen nope
/usr/bin/python3 -c "
import socket, time
s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen(1)
open('port', 'w').write(str(s.getsockname()[1])); time.sleep(20)" &
holder=$!
for _ in $(seq 1 50); do [[ -s port ]] && break; sleep 0.1; done
expect_fail "a metrics port in use fails with exit 1, naming it" 1 \
  "cannot serve metrics on 127.0.0.1:$(cat port)" "${T[@]}" --metrics-listen "127.0.0.1:$(cat port)"
kill "$holder" 2>/dev/null

echo "$passed passed, $failed failed"
[[ $failed == 0 ]]
