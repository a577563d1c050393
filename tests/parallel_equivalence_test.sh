#!/usr/bin/env bash
# Every parallel layout equals one rank. For the baseline, SATFormer, Block DAR and DAR+MoE,
# each (dp, tp, pp, ep) among (2,1,1,1) (1,2,1,1) (1,1,2,1) (1,1,1,2) (2,2,1,1) (2,1,2,1)
# (1,2,2,1) logs the per-step losses of one rank over 5 steps within 1e-9 relative in f64 and
# ends with the same weights (its sharded checkpoint exported to one file), and the tensor and
# pipeline layouts log the same statistics (gates, depth weights, expert load); so do Full and
# Block AttnRes, Full DAR and a 4-stage Block DAR under pipeline layouts, and the designs whose
# state is wider than one stream (HC, mHC, DenseFormer, MUDDFormer), ResFormer learnable_plus
# and a vocabulary that no TP size divides (padded inside the model). Also: a sharded
# checkpoint resumes under another data-parallel size, the pipeline logs the bytes each
# boundary carries, and bad layouts exit with code 2 naming the cause.
# CI's time: the matrix above is split by launcher (MPI: baseline and Block DAR; Gloo: SATFormer
# and DAR+MoE); the MPI run checks HC, mHC, learnable_plus, the odd vocabulary, full
# recomputation and sequence parallelism for Block and Full DAR; the Gloo run DenseFormer,
# MUDDFormer (pp, tp, tp x pp), the odd vocabulary with --vocab-multiple, selective
# recomputation and sequence parallelism for SATFormer, DAR-MoE (with EP) and MUDDFormer.
# Every design x tp/pp/tp x pp pair, and recomputation, is checked in-process by
# //model:layout_split_test; here recomputation runs once per launcher under tp x pp.
# Usage: parallel_equivalence_test.sh PATH_TO_SATDAR [mpi|gloo]
set -u
SATDAR=$(realpath "$1")
HERE=$(dirname "$(realpath "$0")")
COMPARE=$HERE/compare_runs.py
LAUNCHER=${2:-mpi}
WORK="${TEST_TMPDIR:-/tmp/satdar-test-$$}/parallel-$LAUNCHER"
rm -rf "$WORK" && mkdir -p "$WORK"
cd "$WORK"
unset TEST_PREMATURE_EXIT_FILE XML_OUTPUT_FILE
source "$HERE/parallel_testlib.sh"
passed=0
failed=0
launches=0

# launch NP ARGS...: NP ranks of satdar ARGS, started by mpirun or (gloo) as NP background
# processes meeting in a rendezvous folder; returns the worst exit status.
launch() {
  local np=$1
  shift
  if [[ $LAUNCHER == mpi ]]; then
    "${MPIRUN[@]}" -np "$np" "$SATDAR" "$@"
    return $?
  fi
  launches=$((launches + 1))
  local rdv="$WORK/rendezvous-$launches"  # a fresh folder per launch
  mkdir -p "$rdv"
  local pids=() worst=0
  for ((r = 0; r < np; r++)); do
    "$SATDAR" "$@" --launcher gloo --rank "$r" --world-size "$np" --rendezvous "$rdv" &
    pids+=($!)
  done
  for p in "${pids[@]}"; do
    wait "$p"
    local c=$?
    [[ $c -gt $worst ]] && worst=$c
  done
  rm -rf "$rdv"
  return $worst
}

write_small_configs
python3 - <<'PY'
import json
base = json.load(open("base.json"))
# More designs whose state crosses pipeline stages: Full AttnRes (every sublayer output is a
# history entry), Block AttnRes with SATFormer, Full DAR, and 4 stages of Block DAR (entries
# made on stage 0 travel to stage 3).
json.dump(dict(base, residual="attnres"), open("attnres.json", "w"))
json.dump(dict(base, residual="attnres", block_size=4, value_residual="satformer"),
          open("attnres_sat.json", "w"))
# Transparent Attention: AttnRes' state with static depth weights, Block with SATFormer.
json.dump(dict(base, residual="transparent", block_size=4, value_residual="satformer"),
          open("transparent_sat.json", "w"))
json.dump(dict(base, residual="dar", block_size=2), open("dar_full.json", "w"))
json.dump(dict(base, residual="dar", block_size=4, num_hidden_layers=4), open("dar4.json", "w"))
json.dump(dict(base, residual="hc"), open("hc.json", "w"))
json.dump(dict(base, residual="mhc", hc_streams=2), open("mhc.json", "w"))
json.dump(dict(base, residual="denseformer", num_hidden_layers=4), open("denseformer.json", "w"))
json.dump(dict(base, residual="muddformer", value_residual="satformer"), open("mudd.json", "w"))
json.dump(dict(base, value_residual="resformer", resformer_mode="learnable_plus"),
          open("lplus.json", "w"))
json.dump(dict(base, vocab_size=67), open("vocab67.json", "w"))  # no TP size divides it
PY

compare() {  # A_DIR B_DIR: per-step losses and exported weights within 1e-9 relative
  python3 "$COMPARE" "$1/log.jsonl" "$2/log.jsonl" "$1/weights.safetensors" "$2/weights.safetensors"
}
# same_stats A_DIR B_DIR: the last line's statistics (the whole model's, gathered from the
# tensor and pipeline ranks) equal within 1e-9 relative.
same_stats() {
  python3 - "$1/log.jsonl" "$2/log.jsonl" <<'PY'
import json, sys
a, b = (json.loads(open(f).read().splitlines()[-1])["stats"] for f in sys.argv[1:])
def same(x, y, path):
    if isinstance(x, (int, float)) and isinstance(y, (int, float)):
        assert abs(x - y) <= 1e-9 * max(1.0, abs(x), abs(y)), (path, x, y)
    elif isinstance(x, list) and isinstance(y, list):
        assert len(x) == len(y), (path, len(x), len(y))
        for i, (u, v) in enumerate(zip(x, y)):
            same(u, v, "%s[%d]" % (path, i))
    else:
        assert x == y, (path, x, y)
assert sorted(a) == sorted(b), (sorted(a), sorted(b))
for k in a:
    same(a[k], b[k], k)
PY
}

T=(train --synthetic-data --steps 5 --seq-len 16 --dtype f64 --threads 1 --quiet --seed 7
   --microbatches 2 --stats-every 5)
LAYOUTS=("2 1 1 1" "1 2 1 1" "1 1 2 1" "1 1 1 2" "2 2 1 1" "2 1 2 1" "1 2 2 1")
# The launcher only carries the messages, so CI's time is split: the MPI run takes the full
# matrix for the baseline and Block DAR, the Gloo run for SATFormer and DAR+MoE.
MATRIX=(baseline dar)
[[ $LAUNCHER == mpi ]] || MATRIX=(satformer dar_moe)
for model in "${MATRIX[@]}"; do
  mkdir -p one
  "$SATDAR" "${T[@]}" --config $model.json --batch-size 8 --log-jsonl one/log.jsonl \
    --checkpoint-dir one/ckpt
  "$SATDAR" export --config $model.json --dtype f64 --checkpoint one/ckpt/ckpt_00000005.safetensors \
    --out one/weights.safetensors
  for layout in "${LAYOUTS[@]}"; do
    read -r dp tp pp ep <<<"$layout"
    name="$model ($dp,$tp,$pp,$ep)"
    run="run_${dp}${tp}${pp}${ep}"
    mkdir -p "$run"
    # Every replica takes its share of the 8 sequences of a step.
    if launch $((dp * tp * pp * ep)) "${T[@]}" --config $model.json --batch-size $((8 / (dp * ep))) \
        --dp "$dp" --tp "$tp" --pp "$pp" --ep "$ep" --log-jsonl "$run/log.jsonl" \
        --checkpoint-dir "$run/ckpt" >"$run/out.txt" 2>&1 &&
      "$SATDAR" export --config $model.json --dtype f64 --checkpoint "$(ls -d "$run"/ckpt/ckpt_00000005*)" \
        --out "$run/weights.safetensors" >>"$run/out.txt" 2>&1 &&
      compare one "$run" && { [[ $dp$ep != 11 ]] || same_stats one "$run"; }; then
      echo "ok   $name"; passed=$((passed + 1))
    else
      echo "FAIL $name"; cat "$run/out.txt"; failed=$((failed + 1))
    fi
  done
  # The pipeline logs what each boundary carried: Block DAR's boundary holds h0, the block
  # entries and both partial sums, SATFormer's also V1.
  if [[ -f run_1121/log.jsonl ]] && python3 - run_1121/log.jsonl $model <<'PY'
import json, sys
line = json.loads(open(sys.argv[1]).readline())
fwd, bwd = line["pp_boundary_bytes"][0]
rows, c, v1 = 4 * 16, 32, 4 * 16 * 2 * 8   # per micro-batch: (B*T, C) tensors, V1 (B*T, NKV*HS)
# After layer 1 (sublayer 2) with blocks of 4: h0, no completed block entry, 2 partials -> 3.
tensors = {"baseline": 1, "satformer": 1, "dar": 3, "dar_moe": 3}[sys.argv[2]]
expect = 2 * 8 * (tensors * rows * c + (v1 if sys.argv[2] == "satformer" else 0))
assert fwd == bwd == expect, (fwd, bwd, expect)
PY
  then echo "ok   $model pipeline boundary bytes"; passed=$((passed + 1))
  else echo "FAIL $model pipeline boundary bytes"; failed=$((failed + 1)); fi
  rm -rf one run_*
done

# check_layouts MODEL LAYOUT...: like the matrix above, for more designs and layouts; the
# parallel runs also get the flags in EXTRA.
EXTRA=()
check_layouts() {
  local model=$1
  shift
  mkdir -p one
  "$SATDAR" "${T[@]}" --config $model.json --batch-size 8 \
    --log-jsonl one/log.jsonl --checkpoint-dir one/ckpt
  "$SATDAR" export --config $model.json --dtype f64 --checkpoint one/ckpt/ckpt_00000005.safetensors \
    --out one/weights.safetensors
  for layout in "$@"; do
    read -r dp tp pp ep <<<"$layout"
    run="run_${dp}${tp}${pp}${ep}"
    mkdir -p "$run"
    if launch $((dp * tp * pp * ep)) "${T[@]}" "${EXTRA[@]}" --config $model.json \
        --batch-size $((8 / (dp * ep))) --dp "$dp" --tp "$tp" --pp "$pp" --ep "$ep" \
        --log-jsonl "$run/log.jsonl" --checkpoint-dir "$run/ckpt" >"$run/out.txt" 2>&1 &&
      "$SATDAR" export --config $model.json --dtype f64 --checkpoint "$run/ckpt/ckpt_00000005" \
        --out "$run/weights.safetensors" >>"$run/out.txt" 2>&1 &&
      compare one "$run" && { [[ $dp$ep != 11 ]] || same_stats one "$run"; }; then
      echo "ok   $model ($dp,$tp,$pp,$ep)"; passed=$((passed + 1))
    else
      echo "FAIL $model ($dp,$tp,$pp,$ep)"; cat "$run/out.txt"; failed=$((failed + 1))
    fi
  done
  rm -rf one run_*
}
check_layouts attnres "1 1 2 1" "1 2 2 1"
check_layouts attnres_sat "1 1 2 1" "1 2 2 1"
check_layouts transparent_sat "1 1 2 1" "1 2 2 1"
check_layouts dar_full "1 1 2 1" "1 2 2 1"
check_layouts dar4 "1 1 4 1"
# Interleaved 1F1B: 2 ranks x 2 virtual stages of 4-layer Block DAR (entries cross 3 virtual
# boundaries, two of them back from rank 1 to rank 0).
EXTRA=(--virtual-stages 2)
if [[ $LAUNCHER == mpi ]]; then
  check_layouts dar4 "1 1 2 1" "1 2 2 1"
  # Each virtual boundary's bytes: after layers 1, 2 and 3 of Block DAR (S=4) it carries 3, 3
  # and 5 hidden states (h0, entries, partials) per micro-batch of 4 x 16 rows x 32 in f64.
  launch 2 "${T[@]}" --config dar4.json --batch-size 8 --pp 2 --virtual-stages 2 \
    --log-jsonl vbytes.jsonl >vbytes.txt 2>&1
  if python3 - vbytes.jsonl <<'PY'
import json, sys
got = json.loads(open(sys.argv[1]).readline())["pp_boundary_bytes"]
one = 2 * 4 * 16 * 32 * 8  # two micro-batches of one (B*T, C) f64 tensor
assert got == [[3 * one] * 2, [3 * one] * 2, [5 * one] * 2], got
PY
  then echo "ok   interleaved boundary bytes"; passed=$((passed + 1))
  else echo "FAIL interleaved boundary bytes"; cat vbytes.txt; failed=$((failed + 1)); fi
else
  check_layouts dar4 "1 1 2 1" "2 1 2 1"
fi
EXTRA=()
# ZeRO-1 with expert parallelism: dense moments sharded over the dp x ep replicas, expert
# moments over the dp replicas of each expert.
EXTRA=(--zero 1)
check_layouts dar_moe "1 1 1 2" "2 1 1 2"
EXTRA=()
if [[ $LAUNCHER == mpi ]]; then
  EXTRA=(--recompute full)
  check_layouts dar "1 2 2 1"
  EXTRA=(--sequence-parallel)  # the histories split along the tokens over the TP ranks
  check_layouts dar "1 2 1 1" "1 2 2 1" "2 2 1 1"
  check_layouts dar_full "1 2 2 1"
  EXTRA=()
  check_layouts hc "1 1 2 1" "1 2 2 1"
  check_layouts mhc "1 1 2 1"
  check_layouts lplus "1 1 2 1" "2 1 2 1"
  check_layouts vocab67 "1 2 1 1" "1 2 2 1"
  # One rank padded to 128 rows: its single-file checkpoint holds the true [67, 32] and resumes
  # with the losses of the unpadded run.
  V=(train --config vocab67.json --synthetic-data --steps 4 --seq-len 16 --batch-size 4 --dtype f64
     --threads 1 --quiet --checkpoint-every 2)
  "$SATDAR" "${V[@]}" --checkpoint-dir vp0 --log-jsonl vp0.jsonl >vp.txt 2>&1
  "$SATDAR" "${V[@]}" --checkpoint-dir vp1 --vocab-multiple 64 --log-jsonl vp1.jsonl >>vp.txt 2>&1
  rm -f vp1/ckpt_00000004.safetensors
  "$SATDAR" "${V[@]}" --checkpoint-dir vp1 --vocab-multiple 64 --resume --log-jsonl vp1r.jsonl >>vp.txt 2>&1
  if python3 - <<'PY'
import json, struct
full = [json.loads(l)["loss"] for l in open("vp0.jsonl")]
padded = [json.loads(l)["loss"] for l in open("vp1.jsonl")]
resumed = [json.loads(l)["loss"] for l in open("vp1r.jsonl")]
assert all(abs(a - b) <= 1e-9 * abs(a) for a, b in zip(full, padded)) and len(padded) == 4, padded
assert all(abs(a - b) <= 1e-9 * abs(a) for a, b in zip(full[2:], resumed)) and len(resumed) == 2, resumed
f = open("vp1/ckpt_00000002.safetensors", "rb")
header = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
assert header["model.embed_tokens.weight"]["shape"] == [67, 32], header["model.embed_tokens.weight"]
PY
  then echo "ok   padded vocabulary: true-shape checkpoint, same losses, resume"; passed=$((passed + 1))
  else echo "FAIL padded vocabulary checkpoint"; cat vp.txt; failed=$((failed + 1)); fi
else
  EXTRA=(--recompute selective)
  check_layouts satformer "1 2 2 1"
  EXTRA=(--sequence-parallel)
  check_layouts satformer "1 2 1 1" "1 2 2 1"
  check_layouts dar_moe "1 2 1 1" "1 2 1 2"
  check_layouts mudd "1 2 1 1"
  EXTRA=()
  check_layouts denseformer "1 1 2 1" "1 1 4 1"
  check_layouts mudd "1 2 1 1" "1 1 2 1" "1 2 2 1"
  EXTRA=(--vocab-multiple 8)  # 67 -> 80 rows, 40 per TP rank
  check_layouts vocab67 "1 2 1 1"
  EXTRA=()
fi

# A ZeRO-1 x EP checkpoint (moments gathered from their shards) resumes with the same losses.
Z=(train --config dar_moe.json --synthetic-data --steps 5 --seq-len 16 --dtype f64 --threads 1
   --quiet --seed 7 --checkpoint-every 3 --zero 1 --dp 2 --ep 2 --batch-size 2)
launch 4 "${Z[@]}" --log-jsonl zfull.jsonl --checkpoint-dir zs >/dev/null 2>&1
rm -rf zs/ckpt_00000005
launch 4 "${Z[@]}" --log-jsonl zresumed.jsonl --checkpoint-dir zs --resume >zresume.txt 2>&1
if python3 -c "
import json
full = {j['step']: j['loss'] for j in map(json.loads, open('zfull.jsonl'))}
res = [json.loads(l) for l in open('zresumed.jsonl')]
assert [r['step'] for r in res] == [4, 5], res
assert all(abs(r['loss'] - full[r['step']]) <= 1e-12 * abs(full[r['step']]) for r in res), res
"; then echo "ok   ZeRO-1 x EP checkpoint resumes"; passed=$((passed + 1))
else echo "FAIL ZeRO-1 x EP checkpoint resumes"; cat zresume.txt; failed=$((failed + 1)); fi

# A sharded checkpoint (tp 2 x dp 2) resumes with one data-parallel replica (tp 2).
R=(train --config dar_moe.json --synthetic-data --steps 5 --seq-len 16 --dtype f64 --threads 1
   --quiet --seed 7 --checkpoint-every 3 --tp 2)
launch 4 "${R[@]}" --dp 2 --batch-size 4 --log-jsonl full.jsonl --checkpoint-dir rs >/dev/null 2>&1
rm -rf rs/ckpt_00000005
launch 2 "${R[@]}" --batch-size 8 --log-jsonl resumed.jsonl --checkpoint-dir rs --resume \
  >resume.txt 2>&1
if python3 -c "
import json
full = {j['step']: j['loss'] for j in map(json.loads, open('full.jsonl'))}
res = [json.loads(l) for l in open('resumed.jsonl')]
assert [r['step'] for r in res] == [4, 5], res
assert all(abs(r['loss'] - full[r['step']]) <= 1e-9 * abs(full[r['step']]) for r in res), res
"; then echo "ok   sharded checkpoint resumes with another dp"; passed=$((passed + 1))
else echo "FAIL sharded checkpoint resumes with another dp"; cat resume.txt; failed=$((failed + 1)); fi

expect_fail() {  # NAME MESSAGE NP ARGS...
  local name=$1 message=$2 np=$3
  shift 3
  launch "$np" "$@" >out.txt 2>&1
  local code=$?
  if [[ $code -ne 2 ]] || ! grep -qF -- "$message" out.txt; then
    echo "FAIL $name (exit $code)"; cat out.txt; failed=$((failed + 1))
  else
    echo "ok   $name"; passed=$((passed + 1))
  fi
}
S=(train --synthetic-data --steps 1 --seq-len 8 --batch-size 2 --microbatches 2)
# mpirun: the library's check (comm::ValidateMesh, naming the mesh); gloo: satdar train's own,
# naming its flags.
world_message="the world has 3 ranks but mesh dp x tp x pp x ep = dp=1 tp=2"
[[ $LAUNCHER == mpi ]] || world_message="the world has 3 ranks but --dp x --tp x --pp x --ep = dp=1 tp=2"
expect_fail world_size "$world_message" 3 \
  "${S[@]}" --config baseline.json --tp 2
expect_fail heads "--tp 3 does not divide config field \"num_attention_heads\" (4)" 3 \
  "${S[@]}" --config baseline.json --tp 3
expect_fail layers "--pp 3 does not divide config field \"num_hidden_layers\" (2)" 3 \
  train --synthetic-data --steps 1 --seq-len 8 --config baseline.json --pp 3 --microbatches 3 \
  --batch-size 3
expect_fail experts "--ep 3 does not divide config field \"moe.num_experts\" (4)" 3 \
  "${S[@]}" --config dar_moe.json --ep 3
expect_fail sequence_parallel_rows "--sequence-parallel: a micro-batch's 15 tokens (--batch-size / --microbatches x --seq-len) are not divisible by --tp 2" 2 \
  train --synthetic-data --steps 1 --seq-len 5 --batch-size 6 --microbatches 2 --config baseline.json --tp 2 --sequence-parallel
expect_fail sequence_parallel_tp "--sequence-parallel needs --tp 2 or more" 1 \
  "${S[@]}" --config baseline.json --sequence-parallel
expect_fail virtual_microbatches "--virtual-stages 2 needs --microbatches a multiple of --pp 2 (the interleaved schedule moves them in groups of --pp), got 3" 2 \
  train --synthetic-data --steps 1 --seq-len 8 --batch-size 3 --microbatches 3 --config dar4.json --pp 2 --virtual-stages 2
expect_fail virtual_layers "--pp 2 x --virtual-stages 2 = 4 virtual stages do not divide config field \"num_hidden_layers\" (2)" 2 \
  "${S[@]}" --config baseline.json --pp 2 --virtual-stages 2
expect_fail vocab_padding "--tp 2 with --vocab-multiple 64 pads config field \"vocab_size\" (64) to 128, which leaves the last tensor-parallel rank no vocabulary row; use --vocab-multiple 32" 2 \
  "${S[@]}" --config baseline.json --tp 2 --vocab-multiple 64

echo "$passed passed, $failed failed"
[[ $failed -eq 0 ]]
