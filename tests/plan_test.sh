#!/usr/bin/env bash
# `satdar plan` predicts exactly what `satdar train --log-jsonl` logs for global rank 0: the
# bytes handed to each group (comm_bytes) and every pipeline boundary's (pp_boundary_bytes),
# compared with the second step of real runs under mpirun for many designs and layouts (TP,
# PP, DP, sequence parallelism, interleaving, recomputation, ZeRO-1, an odd vocabulary). EP's
# all-to-alls depend on the routing: there the prediction is an expectation and only the other
# groups must match. Also: the memory it reports is the train command's estimate; with --gpu
# the step time's parts add up and the memory is mixed precision's; a search (--nodes) lists
# fitting layouts of the cluster fastest first; and bad input exits 2 naming the flag.
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

# The step time, search and hardware (model/step_time.h, layout_search.h, hardware.h).
"$SATDAR" plan --config dar.json --layout 2,1,1,1 --batch-size 8 --seq-len 16 --gpu h200 \
  --json >gpu.json
"$SATDAR" plan --config dar.json --layout 2,1,1,1 --batch-size 8 --seq-len 16 --json >cpu.json
"$SATDAR" plan --config dar_moe.json --nodes 1 --gpus-per-node 4 --gpu a100 \
  --global-batch-size 16 --seq-len 32 --top 5 --json >search.json
"$SATDAR" plan --config dar_moe.json --nodes 1 --gpus-per-node 4 --gpu a100 \
  --global-batch-size 16 --seq-len 32 >search.txt
"$SATDAR" plan --config dar_moe.json --nodes 1 --gpus-per-node 4 --gpu a100 \
  --global-batch-size 16 --seq-len 32 --microbatches 2 --zero 1 --recompute full --json \
  >fixed.json
if python3 - <<'PY'
import json
gpu, cpu = json.load(open("gpu.json")), json.load(open("cpu.json"))
# bf16 mixed precision: fp32 gradients reduced (the f32 CPU step's data bytes), bf16 weights,
# fp32 master weights and both moments.
assert gpu["comm_bytes"]["data"] == cpu["comm_bytes"]["data"], (gpu, cpu)
m, c = gpu["memory_bytes"], cpu["memory_bytes"]
assert m["weights"] * 2 == c["weights"] and m["gradients"] == c["gradients"], (m, c)
assert m["optimizer"] == 3 * m["gradients"], m
assert c["optimizer"] == 2 * c["gradients"], c
assert gpu["hardware"] == "h200" and gpu["fits"] is True
t = gpu["step_time"]
parts = t["compute"] + t["bubble"] + t["pp"] + t["data"] + t["optimizer"]
assert abs(parts - gpu["step_seconds"]) < 1e-12 * parts, (parts, gpu["step_seconds"])
assert abs(gpu["tokens_per_second"] * gpu["step_seconds"] - 2 * 8 * 16) < 1e-6
assert 0 < gpu["mfu"] < 1 and gpu["ops"] and {"name", "flops", "bytes", "seconds"} <= set(gpu["ops"][0])
assert "step_seconds" not in cpu
s = json.load(open("search.json"))
assert s["cluster"] == {"nodes": 1, "gpus_per_node": 4, "hardware": "a100"}, s["cluster"]
assert 0 < len(s["layouts"]) <= 5 and s["fitting"] >= len(s["layouts"]) and s["tried"] >= s["fitting"]
speeds = [l["tokens_per_second"] for l in s["layouts"]]
assert speeds == sorted(speeds, reverse=True), speeds
for l in s["layouts"]:
    L = l["layout"]
    assert L["dp"] * L["tp"] * L["pp"] * L["ep"] == 4 and L["batch_size"] * L["dp"] * L["ep"] == 16, L
    assert l["fits"] and l["comm_bytes"] and "memory_bytes" in l
fixed = json.load(open("fixed.json"))["layouts"]
assert fixed and all(l["layout"]["microbatches"] == 2 and l["layout"]["zero"] == 1 and
                     l["layout"]["recompute"] == "full" for l in fixed), fixed
text = open("search.txt").read()
assert "layouts tried" in text and "tokens/s" in text and "MFU" in text, text
PY
then echo "ok   step time, search and mixed-precision memory"; passed=$((passed + 1))
else echo "FAIL step time or search"; failed=$((failed + 1)); fi

echo '{"name": "x", "description": "x"}' >bad_hw.json
S=(--config dar_moe.json --seq-len 32)
expect_fail layout_and_nodes "give --layout DP,TP,PP,EP (one layout) or --nodes N (a search)" \
  "${S[@]}" --batch-size 8 --layout 1,1,1,1 --nodes 1
expect_fail neither "give --layout DP,TP,PP,EP (one layout) or --nodes N (a search)" "${S[@]}" \
  --batch-size 8
expect_fail search_batch "a search needs --global-batch-size" "${S[@]}" --nodes 1
expect_fail search_two_batches "a search needs --global-batch-size" "${S[@]}" --nodes 1 \
  --batch-size 8 --global-batch-size 16
expect_fail search_fixed "is not divisible by 3 micro-batches" "${S[@]}" --nodes 1 \
  --gpus-per-node 2 --global-batch-size 16 --microbatches 3
expect_fail search_nodes "flag --nodes must be" "${S[@]}" --nodes 0 --global-batch-size 16
expect_fail gpu_name "--gpu" "${S[@]}" --nodes 1 --global-batch-size 16 --gpu b200
expect_fail gpu_and_file "give --gpu or --hardware, not both" "${S[@]}" --nodes 1 \
  --global-batch-size 16 --gpu h100 --hardware bad_hw.json
expect_fail hw_missing "--hardware" "${S[@]}" --nodes 1 --global-batch-size 16 --hardware nope.json
expect_fail hw_field "bad_hw.json: field \"peak_flops\" is missing" "${S[@]}" --nodes 1 \
  --global-batch-size 16 --hardware bad_hw.json
expect_fail bf16_cpu "--dtype bf16 needs --gpu" "${S[@]}" --layout 1,1,1,1 --batch-size 8 \
  --dtype bf16
expect_fail top_layout "--global-batch-size and --top are for a search" "${S[@]}" \
  --layout 1,1,1,1 --batch-size 8 --top 3
expect_fail nothing_fits "layouts fits in" --config dar_moe.json --seq-len 512 --nodes 1 \
  --gpus-per-node 1 --global-batch-size 16777216 --gpu a100
expect_fail gpu_f32 "on a GPU the planner models bf16 mixed precision" "${S[@]}" \
  --layout 1,1,1,1 --batch-size 8 --gpu h100 --dtype f32
expect_fail huge_layout "flag --layout 65536,65536,1,1 is 4294967296 ranks, more than 65536" \
  "${S[@]}" --layout 65536,65536,1,1 --batch-size 8
expect_fail tp_across "tp 2 spans more than the 1 ranks of a node" "${S[@]}" --layout 1,2,1,1 \
  --batch-size 8 --gpu h100 --gpus-per-node 1

echo "$passed passed, $failed failed"
[[ $failed -eq 0 ]]
