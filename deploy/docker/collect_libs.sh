#!/usr/bin/env bash
# collect_libs.sh OUT BINARY...: copies into OUT/lib every shared library the binaries load
# that the runtime image's base (a CUDA runtime image: glibc, libstdc++, libgcc_s and the CUDA
# libraries) does not already have: Debian 12's gRPC, protobuf, Abseil, OpenBLAS, Open MPI,
# Gloo, SQLite, civetweb, prometheus-cpp, SentencePiece and what they need. Prints one line
# per library copied. The binaries find them through their RUNPATH-free loader path:
# LD_LIBRARY_PATH=OUT/lib (the Dockerfile sets it).
set -euo pipefail
out=$1
shift
mkdir -p "$out/lib"
# What the base provides (never copied): glibc's libraries and loader, the GCC runtime, and
# the CUDA runtime libraries (cudart, cuBLAS(Lt), NCCL: nvidia/cuda's runtime images).
base='^(linux-vdso|ld-linux|libc\.|libm\.|libdl\.|libpthread\.|librt\.|libresolv\.|libutil\.|libgcc_s\.|libstdc\+\+\.|libcudart\.|libcublas\.|libcublasLt\.|libnccl\.|libcuda\.)'
for bin in "$@"; do
  ldd "$bin" | while read -r name arrow path rest; do
    [[ $arrow == "=>" && -f $path ]] || continue
    [[ $name =~ $base ]] && continue
    if [[ ! -e "$out/lib/$name" ]]; then
      cp -L "$path" "$out/lib/$name"
      echo "$name"
    fi
  done
done
