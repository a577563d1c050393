#!/usr/bin/env bash
# The GPU checks, in one run on the GPU machine (it has nvcc, PyTorch 2, CMake and ninja but
# no Bazel, no Debian libraries and no network): run from the repository root with the
# gpu_bundle/ folder that bench/gpu_bundle.sh made here.
#  1. prints the machine's glibc, GPU and CUDA, and how the carried binaries will start
#     (through the carried Debian loader and libc when the machine's glibc is older than 2.36);
#  2. runs every carried GPU test binary (the conformance suite: each CUDA op against the CPU
#     path, forward and backward; the NCCL communicator);
#  3. trains sat-130m and sat-760m (and the baseline and Block DAR at 760m, and the DAR-MoE 7B
#     shape with 4 layers) in PyTorch 2 eager with SDPA (bench/pytorch_gpu.py) and in satdar
#     (`satdar train --device cuda`), printing tokens/s, MFU and peak memory of each.
# It stops itself before 8 minutes.
# Usage: bash bench/gpu_check.sh [BUNDLE_DIR]
set -u
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
BUNDLE=$(realpath "${1:-gpu_bundle}")
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

echo "== training side by side (random tokens, bf16 compute, fp32 master weights)"
run_pair() {  # CONFIG BATCH SEQ STEPS [LAYERS]
  local config=$1 batch=$2 seq=$3 steps=$4 layers=${5:-0}
  (( $(left) > 45 )) || { echo "   (time is short: skipping $config)"; return; }
  local extra=()
  [[ $layers -gt 0 ]] && extra=(--layers "$layers")
  timeout $(( $(left) - 30 )) python3 bench/pytorch_gpu.py --config "$config" \
    --batch-size "$batch" --seq-len "$seq" --steps "$steps" --warmup-steps 5 "${extra[@]}" ||
    echo "   pytorch: $config failed"
  timeout 60 "${RUN[@]}" "$BUNDLE/bin/satdar" train --config "$config" --device cuda \
    --synthetic-data --batch-size "$batch" --seq-len "$seq" --steps "$steps" --quiet \
    --summary-json /tmp/gpu_check.satdar.json 2>&1 | tail -2 &&
    cat /tmp/gpu_check.satdar.json 2>/dev/null
}
run_pair configs/satformer-130m.json 16 2048 40
run_pair configs/transformer-760m.json 8 2048 30
run_pair configs/satformer-760m.json 8 2048 30
run_pair configs/dar-760m.json 8 2048 30
run_pair configs/dar-moe-7b.json 4 2048 20 4
echo "== done in $(( $(date +%s) - START )) s"
