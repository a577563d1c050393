#!/usr/bin/env bash
# satdar analyze end to end through the command line: train a small Full DAR and a 2-stream
# mHC on random tokens, then `satdar analyze cka` (its matrices equal PyTorch's linear CKA over
# the depth states it saved, tests/reference/cka_reference.py) and `satdar analyze rescue`
# (both streams restore the clean run, neither none, JSON and PNG written), and every bad input
# exits 2 naming what is wrong and writes nothing.
# Usage: analyze_test.sh PATH_TO_SATDAR PATH_TO_CKA_REFERENCE_PY
set -u
SATDAR=$(realpath "$1")
REFERENCE=$(realpath "$2")
WORK="${TEST_TMPDIR:-/tmp/satdar-test-$$}/analyze"
rm -rf "$WORK" && mkdir -p "$WORK"
cd "$WORK"
source "$(dirname "$(realpath "$0")")/cli_checks.sh"

config() {  # NAME RESIDUAL_FIELDS
  cat >"$1.json" <<JSON
{"vocab_size": 64, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 4,
 "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 64,
 "tie_word_embeddings": true, $2}
JSON
}
config dar '"residual": "dar", "block_size": 2'
config mhc '"residual": "mhc", "hc_streams": 2'
config std '"residual": "attnres"'
for m in dar mhc std; do
  if "$SATDAR" train --config "$m.json" --synthetic-data --steps 20 --batch-size 4 --seq-len 32 \
      --threads 2 --quiet --checkpoint-dir "ck_$m" --checkpoint-every 20 >train.txt 2>&1; then
    ok "train $m"
  else
    fail "train $m"; cat train.txt
  fi
done
COMMON=(--synthetic-data --seq-len 32 --batch-size 4 --batches 3 --threads 2)

for m in dar mhc; do
  if "$SATDAR" analyze cka --config "$m.json" --checkpoint "ck_$m" "${COMMON[@]}" \
      --json "cka_$m.json" --png "cka_$m.png" --save-states "states_$m.npy" >cka.txt 2>&1; then
    ok "analyze cka $m"
  else
    fail "analyze cka $m"; cat cka.txt
  fi
  grep -q "cross-stream, unpaired depths" cka.txt && ok "cka $m prints its summary" ||
    fail "cka $m summary"
  if /usr/bin/python3 "$REFERENCE" --states "states_$m.npy" --json "cka_$m.json" >ref.txt 2>&1; then
    ok "cka $m equals PyTorch's linear CKA on the saved states"
  else
    fail "cka $m against PyTorch"; cat ref.txt
  fi
  [[ "$(head -c 8 "cka_$m.png" | od -An -c | tr -d ' ')" == "211PNG\r\n032\n" ]] &&
    ok "cka $m PNG" || fail "cka $m PNG"
  if "$SATDAR" analyze rescue --config "$m.json" --checkpoint "ck_$m" "${COMMON[@]}" \
      --json "rescue_$m.json" --png "rescue_$m.png" >rescue.txt 2>&1; then
    ok "analyze rescue $m"
  else
    fail "analyze rescue $m"; cat rescue.txt
  fi
  /usr/bin/python3 - "cka_$m.json" "rescue_$m.json" <<'PY' >check.txt 2>&1 && ok "$m JSON: CKA diagonal 1, depths 0..4; rescue both 1, neither 0, layers 1..3" || { fail "$m JSON"; cat check.txt; }
import json, sys
cka, rescue = (json.load(open(p)) for p in sys.argv[1:3])
assert cka["command"] == "cka" and cka["streams"] == 2, cka
assert cka["depths"] == [0, 1, 2, 3, 4], cka["depths"]
for name in ("s0-s0", "s1-s1"):
    m = cka["matrices"][name]
    assert all(abs(m[i][i] - 1) < 1e-9 for i in range(5)), name
assert abs(cka["matrices"]["s0-s1"][0][0] - 1) < 1e-9  # both streams start from the embedding
assert rescue["command"] == "rescue" and [d["layer"] for d in rescue["depths"]] == [1, 2, 3]
for d in rescue["depths"]:
    assert abs(d["gain"]["both"] - 1) < 1e-6 and abs(d["gain"]["neither"]) < 1e-12, d
    assert set(d["gain"]) == {"neither", "s0", "s1", "both"}, d
PY
done

# Random corruption, chosen layers and precision.
if "$SATDAR" analyze rescue --config dar.json --checkpoint ck_dar "${COMMON[@]}" --dtype f64 \
    --corruption random --corrupt-fraction 0.25 --layers 2,3 --score after --json r2.json \
    >r2.txt 2>&1 &&
    /usr/bin/python3 -c "
import json; r = json.load(open('r2.json'))
assert r['corruption'] == 'random' and r['corrupted_positions'] == 8, r
assert r['scored'] == 'after' and r['scored_positions'] == 24, r
assert [d['layer'] for d in r['depths']] == [2, 3]" >/dev/null 2>&1; then
  ok "rescue --corruption random --corrupt-fraction 0.25 --layers 2,3 --score after --dtype f64"
else
  fail "rescue random"; cat r2.txt
fi

# analyze all: every analysis the design has, in one JSON and one PNG.
config satdar '"residual": "dar", "block_size": 4, "value_residual": "satformer"'
"$SATDAR" train --config satdar.json --synthetic-data --steps 10 --batch-size 4 --seq-len 32 \
  --threads 2 --quiet --checkpoint-dir ck_satdar --checkpoint-every 10 >train.txt 2>&1 ||
  { fail "train satformer dar"; cat train.txt; }
for m in satdar std; do
  if "$SATDAR" analyze all --config "$m.json" --checkpoint "ck_$m" "${COMMON[@]}" \
      --json "all_$m.json" --png "all_$m.png" >all.txt 2>&1; then
    ok "analyze all $m"
  else
    fail "analyze all $m"; cat all.txt
  fi
done
/usr/bin/python3 - all_satdar.json all_std.json <<'PY' >check.txt 2>&1 && ok "analyze all: SATFormer's ablation and the streams' analyses where the design has them, the rest skipped with the reason" || { fail "analyze all JSON"; cat check.txt; }
import json, sys
sat, std = (json.load(open(p)) for p in sys.argv[1:3])
assert sat["design"] == "dar+satformer", sat["design"]
assert "ablated_loss" in sat["eval"] and "dar_depth_weights" in sat["eval"]["stats"], sat["eval"].keys()
assert sat["cka"]["command"] == "cka" and sat["rescue"]["command"] == "rescue"
assert "part-of-speech" in sat["skipped"]["gate_by_category"], sat["skipped"]
assert "cka" not in std and "rescue" not in std and "one residual stream" in std["skipped"]["cka"]
assert "SATFormer" in std["skipped"]["gate_ablation"] and "attnres_depth_weights" in std["eval"]["stats"]
PY
[[ -s all_satdar.png && ! -e all_std.png ]] && ok "analyze all's PNG: the streams' heatmaps, none without streams" ||
  fail "analyze all PNG"

# Bad inputs: exit 2, the message names what is wrong, nothing written.
expect_fail "one-stream design" 'keeps one residual stream' \
  "$SATDAR" analyze cka --config std.json --checkpoint ck_std "${COMMON[@]}" --json bad.json
expect_fail "rescue one-stream design" 'keeps one residual stream' \
  "$SATDAR" analyze rescue --config std.json --checkpoint ck_std "${COMMON[@]}" --json bad.json
expect_fail "layer outside the model" 'layers: 4 is not between two layers' \
  "$SATDAR" analyze rescue --config dar.json --checkpoint ck_dar "${COMMON[@]}" --layers 4
expect_fail "layers not numbers" "--layers: 'x' is not a layer number" \
  "$SATDAR" analyze rescue --config dar.json --checkpoint ck_dar "${COMMON[@]}" --layers 1,x
expect_fail "corrupt fraction 1" 'corrupt_fraction' \
  "$SATDAR" analyze rescue --config dar.json --checkpoint ck_dar "${COMMON[@]}" --corrupt-fraction 1
expect_fail "swap needs two sequences" 'batch_size' \
  "$SATDAR" analyze rescue --config dar.json --checkpoint ck_dar --synthetic-data --seq-len 32 \
  --batch-size 1
expect_fail "weights and checkpoint" 'exactly one of --weights W or --checkpoint CKPT' \
  "$SATDAR" analyze cka --config dar.json "${COMMON[@]}"
expect_fail "missing checkpoint" 'ck_none' \
  "$SATDAR" analyze cka --config dar.json --checkpoint ck_none "${COMMON[@]}"
expect_fail "checkpoint of another design" 'checkpoint' \
  "$SATDAR" analyze cka --config dar.json --checkpoint ck_mhc "${COMMON[@]}" --json bad.json
expect_fail "unknown analysis" "unknown analysis 'svd'" "$SATDAR" analyze svd
expect_fail "all: weights and checkpoint" 'exactly one of --weights W or --checkpoint CKPT' \
  "$SATDAR" analyze all --config dar.json --checkpoint ck_dar --weights x "${COMMON[@]}"
expect_fail "no analysis" "name an analysis" "$SATDAR" analyze
expect_fail "png in a missing folder" '--png' \
  "$SATDAR" analyze cka --config dar.json --checkpoint ck_dar "${COMMON[@]}" --png nodir/x.png
expect_fail "seq-len over the window" 'max_position_embeddings' \
  "$SATDAR" analyze cka --config dar.json --checkpoint ck_dar --synthetic-data --seq-len 65
[[ ! -e bad.json && ! -e nodir ]] && ok "the refusals wrote nothing" || fail "a refusal wrote output"

finish
