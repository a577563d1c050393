#!/usr/bin/env bash
# Builds satdar with CUDA here and gathers what the GPU machine needs into gpu_bundle/
# (git-ignored, < 64 MiB): bin/satdar, tests/<every gpu-tagged test binary>, and lib/ with
# every shared library they load that the GPU machine may lack - Debian's (Abseil, OpenBLAS,
# SentencePiece, Open MPI, Gloo, protobuf...), the C++ runtime, glibc and its loader - but not
# the CUDA libraries (cuBLAS, cuDNN, NCCL, the driver), which bench/gpu_check.sh finds in that
# machine's CUDA and PyTorch installs. Then run on the GPU machine (see docs/GPU.md):
#   bash bench/gpu_check.sh
# Usage: bench/gpu_bundle.sh
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
OUT=gpu_bundle
bazel build //... >/dev/null
if ! bazel-bin/satdar version | grep -q "CUDA build"; then
  echo "this build has no CUDA (no toolkit at /usr/local/cuda?): nothing to carry" >&2
  exit 1
fi
rm -rf "$OUT" && mkdir -p "$OUT/bin" "$OUT/tests" "$OUT/lib"
cp bazel-bin/satdar "$OUT/bin/"
mapfile -t TESTS < <(bazel query 'attr(tags, "\bgpu\b", tests(//...))' 2>/dev/null)
for t in "${TESTS[@]}"; do
  path="bazel-bin/$(echo "${t#//}" | tr ':' '/')"
  [[ -x "$path" ]] && cp "$path" "$OUT/tests/"
done
# Libraries: everything ldd resolves, except what comes with CUDA or the driver.
for f in "$OUT"/bin/* "$OUT"/tests/*; do
  ldd "$f" | awk '/=>/ {print $3} /ld-linux/ {print $1}'
done | sort -u | while read -r lib; do
  [[ -f "$lib" ]] || continue
  case "$(basename "$lib")" in
    libcuda.so*|libcublas*|libcudnn*|libnccl*|libnvidia*|libnvrtc*) continue ;;
  esac
  cp -L "$lib" "$OUT/lib/"
done
# The CUDA runtime this build was compiled against (small; the driver must support it).
cp -L /usr/local/cuda/lib64/libcudart.so.[0-9]* "$OUT/lib/" 2>/dev/null || true
strip --strip-unneeded "$OUT"/bin/* "$OUT"/tests/* 2>/dev/null || true
# OpenBLAS (Debian's has kernels for every x86 generation, ~36 MB) travels xz-compressed;
# gpu_check.sh unpacks it on the GPU machine (xz, or Python's lzma).
xz -9 -T2 -f "$OUT"/lib/libopenblas.so.0
echo "glibc here: $(ldd --version | head -1)"
echo "$OUT: $(du -sh "$OUT" | cut -f1) ($(ls "$OUT/tests" | wc -l) GPU test binaries, $(ls "$OUT/lib" | wc -l) libraries)"
size=$(du -sm "$OUT" | cut -f1)
if ((size >= 64)); then
  echo "gpu_bundle is ${size} MiB: over the 64 MiB a device call can carry" >&2
  exit 1
fi
