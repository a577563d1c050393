#!/usr/bin/env bash
# `satdar plan` predicts exactly what `satdar train --log-jsonl` logs for global rank 0: the
# bytes handed to each group (comm_bytes) and every pipeline boundary's (pp_boundary_bytes),
# compared with the second step of real runs under mpirun for many designs and layouts (TP,
# PP, DP, sequence parallelism, interleaving, recomputation, ZeRO-1, an odd vocabulary). EP's
# all-to-alls depend on the routing: there the prediction is an expectation and only the other
# groups must match. Also: the memory it reports is the train command's estimate, and bad
# input exits 2 naming the flag.
# Usage: plan_test.sh PATH_TO_SATDAR
set -u
SATDAR=$(realpath "$1")
HERE=$(dirname "$(realpath "$0")")
source "$HERE/parallel_testlib.sh"
enter_workdir plan

write_small_configs
python3 - <<'PY'
import json
base = json.load(open("base.json"))
json.dump(dict(base, residual="dar", block_size=4, num_hidden_layers=4,
               value_residual="satformer"), open("dar4.json", "w"))
json.dump(dict(base, residual="muddformer"), open("mudd.json", "w"))
json.dump(dict(base, residual="hc"), open("hc.json", "w"))
json.dump(dict(base, value_residual="resformer", resformer_mode="learnable_plus"),
          open("lplus.json", "w"))
json.dump(dict(base, vocab_size=67, tie_word_embeddings=False), open("vocab67.json", "w"))
PY

# check NAME CONFIG DP TP PP EP [FLAGS...]: plan and a 2-step run of the same step.
check() {
  local name=$1 config=$2 dp=$3 tp=$4 pp=$5 ep=$6
  shift 6
  local run="run-$name" common=(--batch-size $((8 / (dp * ep))) --seq-len 16 --microbatches 2 "$@")
  mkdir -p "$run"
  if ! "$SATDAR" plan --config "$config" --layout "$dp,$tp,$pp,$ep" --dtype f64 --json \
      "${common[@]}" >"$run/plan.json" 2>"$run/plan.err"; then
    echo "FAIL $name: plan"; cat "$run/plan.err"; failed=$((failed + 1)); return
  fi
  "${MPIRUN[@]}" -np $((dp * tp * pp * ep)) "$SATDAR" train --config "$config" --synthetic-data \
    --steps 2 --dtype f64 --threads 1 --quiet --stats-every 0 --dp "$dp" --tp "$tp" --pp "$pp" \
    --ep "$ep" "${common[@]}" --log-jsonl "$run/log.jsonl" >"$run/out.txt" 2>&1
  if python3 - "$run/plan.json" "$run/log.jsonl" <<'PY'
import json, sys
plan = json.load(open(sys.argv[1]))
line = [json.loads(l) for l in open(sys.argv[2])][-1]
logged = dict(line.get("comm_bytes", {}))
predicted = dict(plan["comm_bytes"])
if not plan["ep_bytes_exact"]:
    assert ("ep" in logged) == ("ep" in predicted), (logged, predicted)
    logged.pop("ep", None); predicted.pop("ep", None)
assert logged == predicted, ("comm_bytes", logged, predicted)
assert line.get("pp_boundary_bytes", []) == plan["pp_boundary_bytes"], \
    ("pp_boundary_bytes", line.get("pp_boundary_bytes"), plan["pp_boundary_bytes"])
PY
  then echo "ok   $name"; passed=$((passed + 1))
  else echo "FAIL $name"; cat "$run/out.txt"; failed=$((failed + 1)); fi
}

check baseline_dp2 baseline.json 2 1 1 1
check baseline_tp2 baseline.json 1 2 1 1
check baseline_pp2 baseline.json 1 1 2 1
check baseline_dp2_tp2 baseline.json 2 2 1 1
check baseline_tp2_pp2 baseline.json 1 2 2 1
check baseline_dp2_zero baseline.json 2 1 1 1 --zero 1
check satformer_tp2_pp2 satformer.json 1 2 2 1
check dar_tp2_sp dar.json 1 2 1 1 --sequence-parallel
check dar_tp2_sp_full dar.json 1 2 1 1 --sequence-parallel --recompute full
check dar4_pp2_v2 dar4.json 1 1 2 1 --virtual-stages 2
check dar4_tp2_pp2_sp dar4.json 1 2 2 1 --sequence-parallel
check mudd_tp2 mudd.json 1 2 1 1
check mudd_tp2_sp mudd.json 1 2 1 1 --sequence-parallel
check hc_pp2 hc.json 1 1 2 1
check lplus_tp2_pp2 lplus.json 1 2 2 1
check vocab67_tp2 vocab67.json 1 2 1 1 --vocab-multiple 8
check dar_moe_dp2_ep2_zero dar_moe.json 2 1 1 2 --zero 1
check dar_moe_tp2_sp dar_moe.json 1 2 1 1 --sequence-parallel

# The memory is the estimate `satdar train` prints for the same layout.
"$SATDAR" plan --config dar.json --layout 1,2,1,1 --batch-size 8 --seq-len 16 --json \
  --sequence-parallel >mem.json
"${MPIRUN[@]}" -np 2 "$SATDAR" train --config dar.json --synthetic-data --steps 1 --tp 2 \
  --batch-size 8 --seq-len 16 --sequence-parallel --summary-json mem-summary.json >/dev/null 2>&1
if python3 -c "
import json
plan = json.load(open('mem.json'))['memory_bytes']
est = json.load(open('mem-summary.json'))['activation_bytes_estimate']
assert plan['activations'] == est, (plan, est)
assert plan['total'] == plan['weights'] + plan['gradients'] + plan['optimizer'] + plan['activations']
"; then echo "ok   memory is the train estimate"; passed=$((passed + 1))
else echo "FAIL memory"; failed=$((failed + 1)); fi

expect_fail() {  # NAME MESSAGE ARGS...
  local name=$1 message=$2
  shift 2
  "$SATDAR" plan "$@" >out.txt 2>&1
  local code=$?
  if [[ $code -ne 2 ]] || ! grep -qF -- "$message" out.txt; then
    echo "FAIL $name (exit $code)"; cat out.txt; failed=$((failed + 1))
  else
    echo "ok   $name"; passed=$((passed + 1))
  fi
}
P=(--config baseline.json --batch-size 8 --seq-len 16)
expect_fail layout_form "flag --layout must be DP,TP,PP,EP" "${P[@]}" --layout 2,2
expect_fail layout_zero "flag --layout must be DP,TP,PP,EP" "${P[@]}" --layout 0,1,1,1
expect_fail heads "does not divide config field \"num_attention_heads\" (4)" "${P[@]}" --layout 1,3,1,1
expect_fail microbatches "--batch-size 8 is not divisible by --microbatches 3" "${P[@]}" \
  --layout 1,1,1,1 --microbatches 3
expect_fail seq_len "--seq-len 600 exceeds max_position_embeddings 512" \
  --config baseline.json --batch-size 8 --seq-len 600 --layout 1,1,1,1
expect_fail no_config "--config" --batch-size 8 --seq-len 16 --layout 1,1,1,1

echo "$passed passed, $failed failed"
[[ $failed -eq 0 ]]
