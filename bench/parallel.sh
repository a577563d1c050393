#!/usr/bin/env bash
# Parallel runtime on this machine (CPU ranks over mpirun):
#  1. tokens/s of data parallelism (2 ranks x 1 thread) against one rank (1 and 2 threads), at
#     the same global batch (configs/bench/transformer.json: d=384, L=6; B=8, T=256, f32);
#  2. payload bytes per optimizer step that each group moves (the comm_bytes and
#     pp_boundary_bytes of the --log-jsonl lines) for the designs and layouts that matter:
#     the data-parallel gradient all-reduce, the TP activations, and what crosses a pipeline
#     boundary (hidden state, V1, AttnRes/DAR histories, HC/mHC streams, DenseFormer and
#     MUDDFormer sources), with rank 0's peak RSS (parameters, moments and activations);
#  3. activation recomputation (--recompute none|selective|full): tokens/s and peak RSS.
# Usage: bench/parallel.sh [STEPS]
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
STEPS=${1:-8}
OUT=$(mktemp -d)
MPIRUN=(mpirun --allow-run-as-root --oversubscribe --mca btl self,tcp --mca btl_tcp_if_include lo
        --mca oob_tcp_if_include lo)
bazel build //:satdar >/dev/null 2>&1 || bazel build //:satdar
S=bazel-bin/satdar
echo "machine: $(nproc) cores, $(lscpu | sed -n 's/^Model name: *//p'), $(date -u +%Y-%m-%d)"
T=(train --config configs/bench/transformer.json --synthetic-data --steps "$STEPS" --seq-len 256
   --quiet --stats-every 0)
for round in 1 2; do
  "$S" "${T[@]}" --batch-size 8 --threads 1 --log-jsonl "$OUT/one1.$round.jsonl"
  "$S" "${T[@]}" --batch-size 8 --threads 2 --log-jsonl "$OUT/one2.$round.jsonl"
  "${MPIRUN[@]}" -np 2 "$S" "${T[@]}" --batch-size 4 --threads 1 --dp 2 \
    --log-jsonl "$OUT/dp2.$round.jsonl"
done
/usr/bin/python3 - "$OUT" <<'PY'
import json, statistics, sys
out = sys.argv[1]
def median(name):
    s = []
    for r in (1, 2):
        s += [json.loads(l)["tokens_per_second"] for l in open("%s/%s.%d.jsonl" % (out, name, r))][1:]
    return statistics.median(s)
base = median("one1")
print("\n%-34s %12s %8s" % ("run (global batch 8 x 256)", "tokens/s", "vs 1x1"))
for name, label in (("one1", "1 rank x 1 thread"), ("one2", "1 rank x 2 threads"),
                    ("dp2", "dp=2 ranks x 1 thread (mpirun)")):
    m = median(name)
    print("%-34s %12.0f %7.2fx" % (label, m, m / base))
PY

# Bytes per step: 2 steps each, the second one's counts.
echo
printf "%-12s %-30s %10s %10s %10s %10s %26s %9s %10s\n" design layout tp pp ep data \
  "pp boundaries fwd/bwd (n)" "act.est" "peak RSS"
SP=--sequence-parallel
VS="--virtual-stages 3"
for case in "transformer 1 1 1 1" "transformer 2 1 1 1" "transformer 1 2 1 1" "transformer 1 2 1 1 $SP" \
            "transformer 1 1 2 1" "transformer 1 1 2 1 $VS" \
            "satformer 1 2 1 1" "satformer 1 2 1 1 $SP" "satformer 1 1 2 1" "satformer 1 1 2 1 $VS" \
            "dar 1 2 1 1" "dar 1 2 1 1 $SP" "dar 1 1 2 1" "dar 1 1 2 1 $VS" \
            "dar-full 1 2 1 1" "dar-full 1 2 1 1 $SP" "dar-full 1 1 2 1" "dar-full 1 1 2 1 $VS" \
            "attnres 1 1 2 1" "hc 1 1 2 1" "mhc 1 1 2 1" \
            "denseformer 1 1 2 1" "muddformer 1 2 1 1" "muddformer 1 1 2 1" \
            "dar-moe 1 1 1 2" "dar-moe 1 2 1 1" "dar-moe 2 1 1 2" "dar-moe 2 1 1 2 --zero 1"; do
  read -r design dp tp pp ep extra <<<"$case"
  log="$OUT/bytes-$design-$dp$tp$pp$ep.jsonl"
  rm -f "$log"
  # shellcheck disable=SC2086  # extra: more flags, split on purpose
  "${MPIRUN[@]}" -np $((dp * tp * pp * ep)) "$S" train --config "configs/bench/$design.json" \
    --synthetic-data --steps 2 --seq-len 256 --batch-size $((8 / (dp * ep))) --microbatches 2 \
    --threads 1 --progress line --log-every 100 --stats-every 0 --dp "$dp" --tp "$tp" --pp "$pp" \
    --ep "$ep" $extra --log-jsonl "$log" --summary-json "$OUT/summary.json" >"$OUT/out.txt"
  /usr/bin/python3 - "$log" "$design" "($dp,$tp,$pp,$ep)${extra:+ $extra}" "$OUT/summary.json" \
      "$OUT/out.txt" <<'PY'
import json, re, sys
line = [json.loads(l) for l in open(sys.argv[1])][-1]
rss = json.load(open(sys.argv[4]))["peak_rss_bytes"] / 2**20
est = re.search(r"activations: about ([0-9.]+ [MGT]iB)", open(sys.argv[5]).read())
est = est.group(1).replace(" ", "") if est else "-"
b = line.get("comm_bytes", {})
mib = lambda k: "%.2f MiB" % (b[k] / 2**20) if k in b else "-"
pb = line.get("pp_boundary_bytes")
pbs = ("%.2f / %.2f MiB (%d)" % (sum(b[0] for b in pb) / 2**20, sum(b[1] for b in pb) / 2**20,
                                 len(pb))) if pb else "-"
print("%-12s %-30s %10s %10s %10s %10s %26s %9s %6.0f MiB" % (sys.argv[2], sys.argv[3], mib("tp"),
      mib("pp"), mib("ep"), mib("data"), pbs, est, rss))
PY
done

# Part 3: activation recomputation, one rank (B=8 x T=256, f32, 2 threads): tokens/s (median of
# the timed steps) and peak RSS per design and --recompute.
echo
printf "%-12s %-10s %10s %12s\n" design recompute tokens/s "peak RSS"
for design in transformer satformer dar dar-full; do
  for r in none selective full; do
    "$S" train --config "configs/bench/$design.json" --synthetic-data --steps 6 --seq-len 256 \
      --batch-size 8 --threads 2 --quiet --stats-every 0 --recompute "$r" \
      --log-jsonl "$OUT/rc.jsonl" --summary-json "$OUT/rc.json"
    /usr/bin/python3 - "$OUT/rc.jsonl" "$OUT/rc.json" "$design" "$r" <<'PY'
import json, statistics, sys
tps = [json.loads(l)["tokens_per_second"] for l in open(sys.argv[1])][1:]
rss = json.load(open(sys.argv[2]))["peak_rss_bytes"] / 2**20
print("%-12s %-10s %10.0f %8.0f MiB" % (sys.argv[3], sys.argv[4], statistics.median(tps), rss))
PY
    rm -f "$OUT/rc.jsonl"
  done
done
rm -rf "$OUT"
