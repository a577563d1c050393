#!/usr/bin/env bash
# The GPU checks, in one run on the GPU machine (it has nvcc, PyTorch 2, CMake and ninja but
# no Bazel, no Debian libraries and no network): run from the repository root with the
# gpu_bundle/ folder that bench/gpu_bundle.sh made here.
#  1. prints the machine's glibc, GPU and CUDA, and how the carried binaries will start
#     (through the carried Debian loader and libc when the machine's glibc is older than 2.36);
#  2. runs every carried GPU test binary (the conformance suite: each CUDA op against the CPU
#     path, forward and backward; every design's device classes against the CPU's; the NCCL
#     communicator; the CUDA engine), then tests/gpu_sim_e2e_test.sh with the carried satdar
#     (every design and layout through `satdar train --device cuda`, against the CPU trainer
#     and one GPU rank);
#  3. trains sat-130m and sat-760m (and the baseline and Block DAR at 760m, and the DAR-MoE 7B
#     shape with 4 layers: 64 experts, top 8) in PyTorch 2 eager with SDPA (bench/pytorch_gpu.py) and in satdar
#     (`satdar train --device cuda`), printing tokens/s, MFU and peak memory of each.
# It stops itself before 8 minutes.
# Usage: bash bench/gpu_check.sh [BUNDLE_DIR]
set -u
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
BUNDLE=$(realpath "${1:-gpu_bundle}")
if compgen -G "$BUNDLE/lib/*.xz" >/dev/null; then
  # The carried folder may be read-only: unpack a working copy.
  rm -rf /tmp/gpu_bundle && cp -r "$BUNDLE" /tmp/gpu_bundle && chmod -R u+w /tmp/gpu_bundle
  BUNDLE=/tmp/gpu_bundle
  for z in "$BUNDLE"/lib/*.xz; do
    xz -d -f "$z" 2>/dev/null ||
      python3 -c "import lzma, sys; open(sys.argv[1][:-3], 'wb').write(lzma.open(sys.argv[1]).read())" "$z"
    rm -f "$z"
  done
fi
START=$(date +%s)
DEADLINE=$((START + 460))
left() { echo $((DEADLINE - $(date +%s))); }

glibc=$(ldd --version 2>/dev/null | head -1 | grep -oE '[0-9]+\.[0-9]+$')
echo "== machine: glibc ${glibc:-unknown}, $(uname -m), $(nproc) cores"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null ||
  echo "   (nvidia-smi not found)"
command -v nvcc >/dev/null && nvcc --version | tail -1

# CUDA libraries from this machine's installs: PyTorch's bundled ones (pip nvidia-* wheels or
# torch/lib), then the toolkit.
LIBDIRS=()
while read -r d; do [[ -n "$d" && -d "$d" ]] && LIBDIRS+=("$d"); done < <(python3 - <<'PY' 2>/dev/null
import glob, os
try:
    import torch
    print(os.path.join(os.path.dirname(torch.__file__), "lib"))
except Exception:
    pass
try:
    import nvidia
    for base in nvidia.__path__:
        for d in sorted(glob.glob(os.path.join(base, "*", "lib"))):
            print(d)
except Exception:
    pass
PY
)
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib /usr/lib/x86_64-linux-gnu; do
  [[ -d $d ]] && LIBDIRS+=("$d")
done
LIBPATH="$BUNDLE/lib:$(IFS=:; echo "${LIBDIRS[*]}")"
for lib in libcublasLt.so libcublas.so libnccl.so libcudnn.so; do
  found=$(for d in "${LIBDIRS[@]}"; do ls "$d"/$lib* 2>/dev/null; done | head -1)
  echo "   $lib: ${found:-not found}"
done
# Start through the carried loader when this glibc is older than the build machine's.
if [[ -n "$glibc" ]] && python3 -c "import sys; sys.exit(0 if tuple(map(int, '$glibc'.split('.'))) < (2, 36) else 1)"; then
  RUN=("$BUNDLE/lib/ld-linux-x86-64.so.2" --library-path "$LIBPATH")
  echo "== glibc $glibc < 2.36: starting binaries through the carried loader"
else
  RUN=(env LD_LIBRARY_PATH="$LIBPATH")
fi
"${RUN[@]}" "$BUNDLE/bin/satdar" version

echo "== conformance suite (CUDA against the CPU path)"
pass=0; fail=0
for t in "$BUNDLE"/tests/*; do
  (( $(left) > 60 )) || { echo "   (time is short: skipping the rest)"; break; }
  if timeout 120 "${RUN[@]}" "$t" --gtest_brief=1 >"/tmp/gpu_check.$(basename "$t").log" 2>&1; then
    echo "   ok   $(basename "$t")"; pass=$((pass + 1))
  else
    echo "   FAIL $(basename "$t")"; tail -20 "/tmp/gpu_check.$(basename "$t").log"; fail=$((fail + 1))
  fi
done
echo "   $pass passed, $fail failed"

echo "== every layout through satdar train --device cuda (tests/gpu_sim_e2e_test.sh)"
# The simulator's end-to-end suite on the real GPU: every design against the CPU trainer, and
# dp, tp, sp, ep, ZeRO-1 x EP, pp, interleaved and tp x pp against one GPU rank over the staged
# communicator (and NCCL when the machine has two GPUs or more), with checkpoints continued on
# the CPU. Through a wrapper, so the binary starts as the others do.
if (( $(left) > 200 )); then
  cat >/tmp/gpu_check.satdar <<WRAP
#!/usr/bin/env bash
exec $(printf '%q ' "${RUN[@]}") $(printf '%q' "$BUNDLE/bin/satdar") "\$@"
WRAP
  chmod +x /tmp/gpu_check.satdar
  rm -rf /tmp/gpu_check.e2e && mkdir -p /tmp/gpu_check.e2e
  if TEST_TMPDIR=/tmp/gpu_check.e2e PYTHONPATH="$ROOT/tests" timeout 150 \
      bash tests/gpu_sim_e2e_test.sh /tmp/gpu_check.satdar >/tmp/gpu_check.e2e.log 2>&1; then
    echo "   ok   $(grep -c '^PASS' /tmp/gpu_check.e2e.log) checks"
  else
    echo "   FAIL (exit $?)"; grep -E '^(FAIL|skipped)' /tmp/gpu_check.e2e.log | head -20
    tail -5 /tmp/gpu_check.e2e.log
  fi
else
  echo "   (time is short: skipped)"
fi

echo "== training side by side (random tokens, bf16 compute, fp32 master weights)"
RESULTS=/tmp/gpu_check.results
rm -rf "$RESULTS" && mkdir -p "$RESULTS"
run_pair() {  # CONFIG BATCH SEQ STEPS [LAYERS]
  local config=$1 batch=$2 seq=$3 steps=$4 layers=${5:-0}
  local name
  name=$(basename "$config" .json)
  (( $(left) > 60 )) || { echo "   (time is short: skipping $name)"; return; }
  if [[ $layers -gt 0 ]]; then  # the same shape with fewer layers, for both frameworks
    name="$name-${layers}l"
    python3 -c "import json, sys; c = json.load(open(sys.argv[1])); c['num_hidden_layers'] = int(sys.argv[2]); json.dump(c, open(sys.argv[3], 'w'))" \
      "$config" "$layers" "$RESULTS/$name.config.json"
    config="$RESULTS/$name.config.json"
  fi
  echo "-- $name: batch $batch x $seq, $steps steps"
  timeout $(( ($(left) - 20) / 2 )) python3 bench/pytorch_gpu.py --config "$config" \
    --batch-size "$batch" --seq-len "$seq" --steps "$steps" --warmup-steps 5 \
    >"$RESULTS/$name.pytorch.out" 2>&1
  tail -1 "$RESULTS/$name.pytorch.out" | grep '^{' >"$RESULTS/$name.pytorch.json" ||
    { echo "   pytorch failed:"; tail -5 "$RESULTS/$name.pytorch.out"; }
  timeout $(( $(left) - 10 )) "${RUN[@]}" "$BUNDLE/bin/satdar" train --config "$config" \
    --device cuda --synthetic-data --batch-size "$batch" --seq-len "$seq" --steps "$steps" \
    --warmup-steps 5 --log-every 10 --summary-json "$RESULTS/$name.satdar.json" \
    >"$RESULTS/$name.satdar.out" 2>&1 || echo "   satdar failed (exit $?):"
  tail -3 "$RESULTS/$name.satdar.out" | sed 's/^/   satdar: /'
  cat "$RESULTS/$name.pytorch.json" 2>/dev/null | sed 's/^/   pytorch: /'
}
run_pair configs/satformer-130m.json 16 2048 200
run_pair configs/transformer-760m.json 8 2048 60
run_pair configs/satformer-760m.json 8 2048 60
run_pair configs/dar-760m.json 8 2048 60
run_pair configs/dar-moe-7b.json 4 2048 20 4

echo "== summary (tokens/s, MFU, peak GiB; the targets of issue 6 at 760m)"
python3 - "$RESULTS" <<'PY'
import glob, json, os, sys
d = sys.argv[1]
def load(path):
    try:
        return json.load(open(path))
    except Exception:
        return None
rows = {}
for f in sorted(glob.glob(os.path.join(d, '*.json'))):
    base = os.path.basename(f)
    if base.endswith('.config.json'):
        continue
    name, framework, _ = base.rsplit('.', 2)
    rows.setdefault(name, {})[framework] = load(f)
print('%-22s %14s %14s %7s %8s %8s %9s %9s' % ('config', 'satdar tok/s', 'pytorch tok/s',
      'ratio', 'MFU s', 'MFU pt', 'GiB s', 'GiB pt'))
for name, r in rows.items():
    s, p = r.get('satdar') or {}, r.get('pytorch') or {}
    st, pt = s.get('tokens_per_second', 0), p.get('tokens_per_second', 0)
    print('%-22s %14.0f %14.0f %7s %7.1f%% %7.1f%% %9.2f %9.2f' % (
        name, st, pt, '%.2fx' % (st / pt) if st and pt else '-', 100 * s.get('mfu', 0),
        100 * p.get('mfu', 0), s.get('peak_memory_gib', 0), p.get('peak_memory_gib', 0)))
base = (rows.get('transformer-760m', {}).get('satdar') or {}).get('tokens_per_second', 0)
for name, limit in (('satformer-760m', 0.97), ('dar-760m', 0.90)):
    t = (rows.get(name, {}).get('satdar') or {}).get('tokens_per_second', 0)
    if base and t:
        print('%s / transformer-760m in satdar: %.3f (target >= %.2f: %s)' % (
            name, t / base, limit, 'met' if t / base >= limit else 'MISSED'))
s = rows.get('satformer-760m', {})
if s.get('satdar') and s.get('pytorch'):
    ratio = s['satdar']['tokens_per_second'] / s['pytorch']['tokens_per_second']
    mfu = s['satdar'].get('mfu', 0)
    print('satformer-760m satdar / pytorch: %.2fx (target >= 1.0: %s), MFU %.1f%% (target >= 40%%: %s)' % (
        ratio, 'met' if ratio >= 1.0 else 'MISSED', 100 * mfu, 'met' if mfu >= 0.4 else 'MISSED'))
PY
echo "== done in $(( $(date +%s) - START )) s"
