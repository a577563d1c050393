#!/usr/bin/env bash
# Checkpoints written before the one-model change (issue 30) still resume. The fixtures in
# tests/testdata/pre30/ were written by satdar at 24a32d6 (the last commit before issue 30's
# code; tests/testdata/pre30/make_fixtures.sh is how): a 6-step run of a tiny Block DAR with
# SATFormer (config.json) checkpointed at step 3, as one file (one rank) and as a sharded
# folder (--tp 2 --pp 2, four shards), with the losses and gradient norms that binary logged
# for steps 4 to 6 of the uninterrupted runs (expected.json). Each is resumed here with
# --resume --steps 6 and must log those steps again:
#  - the single file on one rank, and as --tp 2 --pp 2;
#  - the sharded folder in its own layout, and on one rank.
# The CPU path's arithmetic did not change in issue 30 (bit for bit), so in the checkpoint's
# own layout the tolerance is 1e-6 relative, far below a step's change (about 1e-2 here),
# only to allow for another machine's BLAS kernels; across layouts 1e-4 (f32 rounding of
# other sums).
# Usage: checkpoint_compat_test.sh PATH_TO_SATDAR
set -u
SATDAR=$(realpath "$1")
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
DATA="$HERE/testdata/pre30"
WORK="${TEST_TMPDIR:-/tmp/satdar-test-$$}/compat"
rm -rf "$WORK" && mkdir -p "$WORK"
cd "$WORK"
export OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-Haswell}
passed=0 failed=0
ok() { echo "ok: $1"; passed=$((passed + 1)); }
fail() { echo "FAIL: $1"; failed=$((failed + 1)); }

T=(train --config "$DATA/config.json" --synthetic-data --steps 6 --batch-size 2 --seq-len 8
   --threads 1 --seed 7 --checkpoint-every 3 --resume --quiet --launcher threads)

# resume NAME CHECKPOINT(file or folder) EXPECTED_KEY TOLERANCE LAYOUT...
resume() {
  local name=$1 source=$2 key=$3 tol=$4
  shift 4
  rm -rf "$name" && mkdir -p "$name/ck"
  cp -rL "$source" "$name/ck/"  # real files (runfiles are links)
  if ! "$SATDAR" "${T[@]}" "$@" --checkpoint-dir "$name/ck" --log-jsonl "$name/log.jsonl" \
      >"$name/out.txt" 2>&1; then
    fail "$name: resume failed"; tail -5 "$name/out.txt"; return
  fi
  if python3 - "$DATA/expected.json" "$key" "$name/log.jsonl" "$tol" <<'PY'
import json, sys
want = json.load(open(sys.argv[1]))[sys.argv[2]]
tol = float(sys.argv[4])
got = {}
for line in open(sys.argv[3]):
    j = json.loads(line)
    got[j["step"]] = j
bad = []
for w in want:
    g = got.get(w["step"])
    if g is None:
        bad.append("step %d not logged" % w["step"])
        continue
    for k in ("loss", "grad_norm"):
        if abs(g[k] - w[k]) > tol * abs(w[k]):
            bad.append("step %d %s %.12g, want %.12g" % (w["step"], k, g[k], w[k]))
if sorted(got) != [w["step"] for w in want]:
    bad.append("logged steps %s, want %s" % (sorted(got), [w["step"] for w in want]))
if bad:
    print("\n".join(bad))
sys.exit(1 if bad else 0)
PY
  then
    ok "$name: steps 4-6 as the old binary logged them"
  else
    fail "$name"
  fi
}

[[ -f "$DATA/ckpt_00000003.safetensors" && -d "$DATA/sharded/ckpt_00000003" ]] \
  || { echo "FAIL: fixtures missing in $DATA"; exit 1; }
resume single_one_rank "$DATA/ckpt_00000003.safetensors" single 1e-6
resume sharded_own_layout "$DATA/sharded/ckpt_00000003" sharded 1e-6 --tp 2 --pp 2
# Across layouts the step-3 states and the sums differ by f32 rounding (about 1e-7).
resume single_as_tp2_pp2 "$DATA/ckpt_00000003.safetensors" sharded 1e-4 --tp 2 --pp 2
resume sharded_one_rank "$DATA/sharded/ckpt_00000003" single 1e-4

echo "$passed passed, $failed failed"
[[ $failed == 0 ]]
