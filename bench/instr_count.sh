#!/usr/bin/env bash
# CPU performance guard rail that does not depend on the VM's wall-clock noise: user-space
# instruction counts (perf stat -e instructions:u) of short, deterministic CPU training runs of an
# OLD and a NEW satdar binary, design by design, plus peak RSS (/usr/bin/time -v, "Maximum
# resident set size") and tokens/s (satdar's own summary; wall-clock, so informational only).
#   bench/instr_count.sh OLD_SATDAR [NEW_SATDAR] [DESIGN ...]
# DESIGN names a config in configs/bench/ (default: all of them). With one binary (NEW_SATDAR left
# out, or given as -) it only measures that one. Each run:
#   satdar train --config configs/bench/DESIGN.json --synthetic-data --steps 5 --batch-size 4
#     --seq-len 128 --threads 1 --seed 0 --peak-tflops 1 --stats-every 0 --quiet --summary-json TMP
# in a temporary folder (nothing is written into the repository). --peak-tflops 1 skips the timed
# GEMM that measures the CPU's peak at start, whose length (and so instruction count) depends on
# the clock. Each binary runs REPS times per design, interleaved old, new, old, new, ...; the
# table shows the medians and the spread ((max - min) / median) of the repetitions.
# Gate per design (medians): instructions at most +1%, peak RSS at most +3% over OLD.
# Exit status: 0 all designs pass (or only one binary), 1 a design fails the gate, 2 usage or
# environment error (missing binary, unknown design, instructions:u not countable, failed run).
# Environment: STEPS (5), BATCH (4), SEQ (128), THREADS (1), REPS (3), INSTR_GATE_PCT (1),
# RSS_GATE_PCT (3), PERF (/usr/bin/perf), GNU_TIME (/usr/bin/time), ALLOW_NO_INSTRUCTIONS=1 (where
# the machine cannot count instructions: measure and gate RSS only, and say so), OPENBLAS_CORETYPE
# (kept as set; Haswell when unset, as in the other bench scripts).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

STEPS=${STEPS:-5}
BATCH=${BATCH:-4}
SEQ=${SEQ:-128}
THREADS=${THREADS:-1}
REPS=${REPS:-3}
INSTR_GATE_PCT=${INSTR_GATE_PCT:-1}
RSS_GATE_PCT=${RSS_GATE_PCT:-3}
PERF=${PERF:-/usr/bin/perf}
GNU_TIME=${GNU_TIME:-/usr/bin/time}
ALLOW_NO_INSTRUCTIONS=${ALLOW_NO_INSTRUCTIONS:-0}
export OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-Haswell}

die() {
  echo "instr_count.sh: error: $*" >&2
  exit 2
}
usage() {
  sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "${BASH_SOURCE[0]}" >&2
  exit 2
}

(($# >= 1)) || usage
case $1 in -h | --help) usage ;; esac

# A binary: an absolute path (the runs happen in a temporary folder).
resolve_binary() {
  local what=$1 path=$2
  [ -e "$path" ] || die "$what binary '$path' does not exist"
  if [ ! -f "$path" ] || [ ! -x "$path" ]; then
    die "$what binary '$path' is not an executable file"
  fi
  echo "$(cd "$(dirname "$path")" && pwd)/$(basename "$path")"
}
old=$(resolve_binary OLD "$1")
shift
new=
# The second argument is NEW_SATDAR when it looks like a path or names a file, '-' for no NEW;
# anything else is the first design.
if (($# >= 1)); then
  if [ "$1" = - ]; then
    shift
  elif [[ "$1" == */* ]] || [ -e "$1" ]; then
    new=$(resolve_binary NEW "$1")
    shift
  fi
fi
sides=(old)
[ -n "$new" ] && sides=(old new)

# Every config in configs/bench/: the baseline first, the known designs, then any newer ones.
available=()
for d in transformer resformer satformer attnres dar dar-full dar-moe denseformer hc mhc \
  muddformer; do
  [ -f "$ROOT/configs/bench/$d.json" ] && available+=("$d")
done
for f in "$ROOT"/configs/bench/*.json; do
  d=$(basename "$f" .json)
  [[ " ${available[*]} " == *" $d "* ]] || available+=("$d")
done
designs=("$@")
((${#designs[@]} > 0)) || designs=("${available[@]}")
for d in "${designs[@]}"; do
  [ -f "$ROOT/configs/bench/$d.json" ] ||
    die "unknown design '$d': no configs/bench/$d.json (designs: ${available[*]})"
done
for n in STEPS BATCH SEQ THREADS REPS; do
  [[ "${!n}" =~ ^[1-9][0-9]*$ ]] || die "$n must be a positive integer, got '${!n}'"
done
[ -x "$GNU_TIME" ] || die "GNU time not found at $GNU_TIME (apt-get install time, or set GNU_TIME)"
command -v python3 >/dev/null || die "python3 is needed for the tables"

tmp=$(mktemp -d /tmp/instr_count.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
mkdir "$tmp/cwd"

# Can this machine count user-space instructions? perf exits 0 and prints "<not supported>" or
# "<not counted>" when it cannot, so look at the count itself.
count_instructions=1
perf_problem() {
  local paranoid cpu_pmu=no
  paranoid=$(cat /proc/sys/kernel/perf_event_paranoid 2>/dev/null || echo unknown)
  for pmu in /sys/bus/event_source/devices/cpu /sys/bus/event_source/devices/cpu_core; do
    [ -e "$pmu" ] && cpu_pmu=yes
  done
  echo "user-space instructions (perf stat -e instructions:u) cannot be counted on this machine."
  echo "  $PERF stat said: $1"
  echo "  kernel.perf_event_paranoid = $paranoid; running as uid $(id -u); hardware PMU in"
  echo "  /sys/bus/event_source/devices: $cpu_pmu"
  if [ "$cpu_pmu" = no ]; then
    echo "  The kernel has no hardware performance-monitoring unit (PMU): the hypervisor does not"
    echo "  expose one to this VM (dmesg: 'PMU not available due to virtualization'; e.g. Firecracker"
    echo "  microVMs, or KVM/QEMU without a vPMU: -cpu host,pmu=on gives one), so only software"
    echo "  events (task-clock, page-faults, ...) exist and no permission setting changes that."
    echo "  Run this on bare metal or in a VM with a virtual PMU."
  elif [ "$paranoid" != unknown ] && ((paranoid > 2)) && [ "$(id -u)" != 0 ]; then
    echo "  perf_event_paranoid $paranoid forbids unprivileged processes any perf events; counting"
    echo "  your own process's user-space instructions needs 2 or lower:"
    echo "    sudo sysctl kernel.perf_event_paranoid=2   (or run as root / with CAP_PERFMON)"
  else
    echo "  A PMU exists but the event could not be opened (perf_event_paranoid, a container's"
    echo "  seccomp profile, or all counters taken, e.g. by the NMI watchdog); see"
    echo "  '$PERF stat -e instructions:u -- true'."
  fi
  echo "  ALLOW_NO_INSTRUCTIONS=1 measures and gates peak RSS only (tokens/s is shown, not gated)."
}
if [ ! -x "$PERF" ]; then
  problem=$(perf_problem "perf is not installed at $PERF (apt-get install linux-perf, or set PERF)")
else
  probe=$({ "$PERF" stat -x, -e instructions:u -o "$tmp/probe.txt" -- true 2>&1 &&
    grep -v '^#' "$tmp/probe.txt" | grep instructions; } || true)
  first=$(echo "$probe" | grep instructions | head -n1 | cut -d, -f1)
  if [[ "$first" =~ ^[0-9]+$ ]] && ((first > 0)); then
    problem=
  else
    problem=$(perf_problem "${probe:-no output}")
  fi
fi
if [ -n "$problem" ]; then
  if [ "$ALLOW_NO_INSTRUCTIONS" = 1 ]; then
    echo "WARNING: $problem" | sed '2,$s/^/WARNING: /' >&2
    echo "WARNING: continuing without instruction counts (ALLOW_NO_INSTRUCTIONS=1)." >&2
    count_instructions=0
  else
    echo "instr_count.sh: error: $problem" >&2
    exit 2
  fi
fi

echo "machine: $(nproc) cores, $(lscpu | sed -n 's/^Model name: *//p'), $(date -u '+%Y-%m-%d %H:%M UTC')"
echo "shape: batch $BATCH x $SEQ, $STEPS steps, $THREADS thread(s), f32, synthetic tokens, seed 0;" \
  "$REPS runs per binary and design; OPENBLAS_CORETYPE=$OPENBLAS_CORETYPE"
echo "old: $old"
[ -n "$new" ] && echo "new: $new"
echo "counter: $([ $count_instructions = 1 ] && echo "$PERF stat -e instructions:u" || echo none)"
echo

# One run: appends "design side rep instructions rss_kib tokens_per_second" to results.tsv.
results=$tmp/results.tsv
: >"$results"
run_one() {
  local design=$1 side=$2 rep=$3 bin=$old instr=NA rss tps
  [ "$side" = new ] && bin=$new
  local cmd=("$bin" train --config "$ROOT/configs/bench/$design.json" --synthetic-data
    --steps "$STEPS" --batch-size "$BATCH" --seq-len "$SEQ" --threads "$THREADS" --seed 0
    --peak-tflops 1 --stats-every 0 --quiet --summary-json "$tmp/summary.json")
  local counter=()
  # shellcheck disable=SC2054 # -x, is perf's CSV separator, not an array separator
  [ $count_instructions = 1 ] && counter=("$PERF" stat -x, -e instructions:u -o "$tmp/perf.txt" --)
  rm -f "$tmp/summary.json" "$tmp/perf.txt" "$tmp/time.txt"
  if ! (cd "$tmp/cwd" && "$GNU_TIME" -v -o "$tmp/time.txt" ${counter[@]+"${counter[@]}"} "${cmd[@]}") \
    >"$tmp/log.txt" 2>&1; then
    echo "instr_count.sh: error: $side run of $design failed:" >&2
    echo "  ${counter[*]} ${cmd[*]}" >&2
    tail -n 20 "$tmp/log.txt" >&2
    [ -f "$tmp/time.txt" ] && tail -n 3 "$tmp/time.txt" >&2
    exit 2
  fi
  if [ $count_instructions = 1 ]; then
    instr=$(grep -v '^#' "$tmp/perf.txt" | grep instructions | head -n1 | cut -d, -f1)
    [[ "$instr" =~ ^[0-9]+$ ]] || die "no instruction count from perf for $side $design: $(cat "$tmp/perf.txt")"
  fi
  rss=$(sed -n 's/^[[:space:]]*Maximum resident set size (kbytes): *//p' "$tmp/time.txt")
  [[ "$rss" =~ ^[0-9]+$ ]] || die "no peak RSS from $GNU_TIME for $side $design"
  tps=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["tokens_per_second"])' \
    "$tmp/summary.json" 2>/dev/null) || die "no tokens_per_second in $side $design's --summary-json"
  printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$design" "$side" "$rep" "$instr" "$rss" "$tps" >>"$results"
  printf '  run %d/%d %-12s %-3s instructions %-15s peak RSS %7.1f MiB  %6.0f tokens/s\n' \
    "$rep" "$REPS" "$design" "$side" "$instr" "$(awk -v k="$rss" 'BEGIN { print k / 1024 }')" "$tps" >&2
}

# Rounds outside, designs inside, and old then new within a design: each pair runs back to back
# and a design's repetitions are spread over the whole measurement.
for rep in $(seq 1 "$REPS"); do
  for design in "${designs[@]}"; do
    for side in "${sides[@]}"; do
      run_one "$design" "$side" "$rep"
    done
  done
done
echo >&2

python3 - "$results" "$INSTR_GATE_PCT" "$RSS_GATE_PCT" "$count_instructions" "${#sides[@]}" \
  "${designs[@]}" <<'PY'
import statistics, sys
path, instr_gate, rss_gate = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
counted, two, designs = sys.argv[4] == "1", sys.argv[5] == "2", sys.argv[6:]
rows = [l.rstrip("\n").split("\t") for l in open(path)]
sides = ["old", "new"] if two else ["old"]

def samples(design, side, col):
    return [float(r[col]) for r in rows if r[0] == design and r[1] == side and r[col] != "NA"]

def med(xs): return statistics.median(xs) if xs else float("nan")
def spread(xs): return 100.0 * (max(xs) - min(xs)) / med(xs) if xs and med(xs) else float("nan")

failed, summary = [], []
for d in designs:
    ins = {s: samples(d, s, 3) for s in sides}
    rss = {s: [x / 1024 for x in samples(d, s, 4)] for s in sides}
    tps = {s: samples(d, s, 5) for s in sides}
    print("== %s" % d)
    head = "%-18s" % "metric" + "".join("%18s" % s for s in sides)
    print(head + ("%10s" % "new/old" if two else "") + "   spread " + " / ".join(sides))
    def line(name, vals, fmt):
        out = "%-18s" % name + "".join("%18s" % (fmt.format(med(vals[s])) if vals[s] else "n/a") for s in sides)
        if two:
            r = med(vals["new"]) / med(vals["old"]) * 100 if vals["old"] and vals["new"] else None
            out += "%10s" % ("%.2f%%" % r if r is not None else "n/a")
        out += "   " + " / ".join(("%.3f%%" % spread(vals[s]) if vals[s] else "n/a") for s in sides)
        print(out)
    line("instructions:u", ins, "{:,.0f}")
    line("peak RSS MiB", rss, "{:.1f}")
    line("tokens/s median", tps, "{:.0f}")
    if two:
        di = (med(ins["new"]) / med(ins["old"]) - 1) * 100 if counted else None
        dr = (med(rss["new"]) / med(rss["old"]) - 1) * 100
        ok_i = di is None or di <= instr_gate
        ok_r = dr <= rss_gate
        ok = ok_i and ok_r
        if not ok: failed.append(d)
        parts = ["instructions %s (gate +%g%%)%s" % (
                     "%+.2f%%" % di if di is not None else "not measured", instr_gate,
                     "" if ok_i else " FAIL"),
                 "peak RSS %+.2f%% (gate +%g%%)%s" % (dr, rss_gate, "" if ok_r else " FAIL")]
        print("verdict %s: %s: %s" % (d, "PASS" if ok else "FAIL", ", ".join(parts)))
    else:
        print("verdict %s: measured only (one binary, no gate)" % d)
    print()
    summary.append((d, ins, rss, tps))

# One markdown table for docs/PERFORMANCE.md.
cols = ["design"]
for s in sides: cols += ["instructions %s" % s]
if two: cols += ["instr new/old"]
for s in sides: cols += ["instr spread %s" % s]
for s in sides: cols += ["peak RSS MiB %s" % s]
if two: cols += ["RSS new/old"]
for s in sides: cols += ["tokens/s %s" % s]
print("| " + " | ".join(cols) + " |")
print("|" + "---|" * len(cols))
for d, ins, rss, tps in summary:
    c = [d]
    c += ["{:,.0f}".format(med(ins[s])) if ins[s] else "n/a" for s in sides]
    if two: c += ["%.2f%%" % (med(ins["new"]) / med(ins["old"]) * 100) if ins["old"] and ins["new"] else "n/a"]
    c += ["%.3f%%" % spread(ins[s]) if ins[s] else "n/a" for s in sides]
    c += ["%.1f" % med(rss[s]) for s in sides]
    if two: c += ["%.2f%%" % (med(rss["new"]) / med(rss["old"]) * 100)]
    c += ["%.0f" % med(tps[s]) for s in sides]
    print("| " + " | ".join(c) + " |")
print()
if not counted:
    print("NOTE: instructions were not counted on this machine; only peak RSS was gated.")
if two:
    if failed:
        print("RESULT: FAIL (%d of %d designs): %s" % (len(failed), len(designs), " ".join(failed)))
        sys.exit(1)
    print("RESULT: PASS (all %d designs)" % len(designs))
PY
