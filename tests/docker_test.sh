#!/usr/bin/env bash
# deploy/docker/Dockerfile without Docker (no base image can be fetched here): the build
# stage's own commands after `bazel build` run against this build, every file the runtime
# stage copies exists afterwards, and the binaries run from a root file system holding only
# what the image would: what the runtime stage copies plus what its CUDA runtime base provides
# (glibc, libstdc++, libgcc_s, the CUDA libraries). In it `satdar version`, `satdar-prep
# --help` and a short training run work.
# Usage: docker_test.sh PATH_TO_SATDAR
set -u
SATDAR=$(realpath "$1")
BIN=$(dirname "$SATDAR")
HERE=$(dirname "$(realpath "$0")")
ROOT=$(dirname "$HERE")
DOCKERFILE=$ROOT/deploy/docker/Dockerfile
WORK="${TEST_TMPDIR:-/tmp/satdar-test-$$}/docker"
# A run killed before its cleanup leaves /proc and /dev/null mounted in its root: unmount
# them, and never let rm cross into another file system.
umount "$WORK/rootfs/proc" "$WORK/rootfs/dev/null" 2>/dev/null
rm -rf --one-file-system "$WORK" && mkdir -p "$WORK"
cd "$WORK"
passed=0
failed=0
ok() { echo "ok   $1"; passed=$((passed + 1)); }
fail() { echo "FAIL $1"; failed=$((failed + 1)); }

# 1. The build stage's commands after the build, rooted in $WORK (bazel-bin is this build's).
post=$(python3 - "$DOCKERFILE" <<'PY'
import re, sys
text = open(sys.argv[1]).read().replace("\\\n", " ")
run = [l for l in text.splitlines() if l.startswith("RUN bazel build")][0]
print(run.split("&&", 1)[1])
PY
)
mkdir -p "$WORK/src/deploy/docker" "$WORK/src/bazel-bin"
cp "$SATDAR" "$BIN/satdar-prep" "$WORK/src/bazel-bin/"
cp "$ROOT/deploy/docker/collect_libs.sh" "$WORK/src/deploy/docker/"
cp -r "$ROOT/configs" "$WORK/src/configs"
(cd "$WORK/src" && eval "${post//\/opt\/satdar/$WORK/opt/satdar}") >collect.txt 2>&1 &&
  ok "the build stage's commands run ($(wc -l <collect.txt) libraries collected)" ||
  { fail "build stage commands"; cat collect.txt; }

# 2. Every file the runtime stage copies exists.
missing=0
while read -r src; do
  [[ -e "$WORK$src" ]] || { echo "  missing $src"; missing=1; }
done < <(grep -E '^COPY --from=build ' "$DOCKERFILE" | awk '{print $3}')
[[ $missing -eq 0 && -n $(grep -E '^COPY --from=build ' "$DOCKERFILE") ]] &&
  ok "every COPY --from=build source exists after the build" || fail "COPY sources"

# 3. A root file system with only the image's files and the base's libraries.
R=$WORK/rootfs
mkdir -p "$R/lib64" "$R/lib/x86_64-linux-gnu" "$R/usr/local/cuda/lib64" "$R/tmp" "$R/proc" "$R/dev" \
  "$R/work"
while read -r src; do
  dst=$(grep -E "^COPY --from=build $src " "$DOCKERFILE" | awk '{print $4}')
  mkdir -p "$R$(dirname "$dst")" && cp -r "$WORK$src" "$R$dst"
done < <(grep -E '^COPY --from=build ' "$DOCKERFILE" | awk '{print $3}')
base='^(ld-linux|libc\.|libm\.|libdl\.|libpthread\.|librt\.|libresolv\.|libutil\.|libgcc_s\.|libstdc\+\+\.|libcudart\.|libcublas\.|libcublasLt\.|libnccl\.)'
for b in "$R/opt/satdar/bin/satdar" "$R/opt/satdar/bin/satdar-prep"; do
  LD_LIBRARY_PATH=$R/opt/satdar/lib ldd "$b" | while read -r name arrow path rest; do
    [[ $name =~ $base ]] || continue
    case $name in
      libcu*|libnccl*) cp -L "$path" "$R/usr/local/cuda/lib64/$name" ;;
      ld-linux*) ;;
      *) cp -L "$path" "$R/lib/x86_64-linux-gnu/$name" ;;
    esac
  done
done
cp -L /lib64/ld-linux-x86-64.so.2 "$R/lib64/"
touch "$R/dev/null" && mount --bind /dev/null "$R/dev/null" 2>/dev/null
mount -t proc proc "$R/proc" 2>/dev/null
cleanup() { umount "$R/proc" 2>/dev/null; umount "$R/dev/null" 2>/dev/null; }
trap cleanup EXIT
RUN=(env -i LD_LIBRARY_PATH=/opt/satdar/lib:/usr/local/cuda/lib64 OPENBLAS_CORETYPE=Haswell
     PATH=/opt/satdar/bin "$(command -v chroot)" "$R")
"${RUN[@]}" /opt/satdar/bin/satdar version >version.txt 2>&1 && grep -q "satdar 0.1.0" version.txt &&
  ok "satdar version runs with only the image's libraries: $(cat version.txt)" ||
  { fail "satdar version in the image's files"; cat version.txt; }
"${RUN[@]}" /opt/satdar/bin/satdar-prep --help >prep.txt 2>&1 && grep -q -- "--input" prep.txt &&
  ok "satdar-prep runs (SentencePiece and its libraries copied)" || { fail "satdar-prep"; cat prep.txt; }
"${RUN[@]}" /opt/satdar/bin/satdar train --config /opt/satdar/configs/demo.json --synthetic-data \
  --steps 2 --batch-size 2 --seq-len 16 --log-jsonl /work/log.jsonl >train.txt 2>&1 &&
  [[ $(wc -l <"$R/work/log.jsonl") -eq 2 ]] &&
  ok "a training run in the image's files logs its steps" || { fail "train in the image"; cat train.txt; }
# Nothing leaks in from this machine: without one copied library the binary cannot start.
mv "$R/opt/satdar/lib/libgrpc.so.29" "$WORK/" 2>/dev/null
"${RUN[@]}" /opt/satdar/bin/satdar version >leak.txt 2>&1
[[ $? -ne 0 ]] && grep -q "libgrpc.so.29" leak.txt &&
  ok "without a copied library it does not start (nothing comes from outside the image)" ||
  { fail "a missing library went unnoticed"; cat leak.txt; }
echo "$passed passed, $failed failed"
[[ $failed -eq 0 ]]
