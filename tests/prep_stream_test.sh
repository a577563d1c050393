#!/usr/bin/env bash
# satdar prep in bounded memory (issue 28, part 8): a large single file is streamed (peak RSS
# far below what holding it would take), the tokenizer trains on a bounded sample, a document
# longer than a shard is cut into documents the loader reads, the same file given twice is
# refused, a signal or a full disk leaves no unfinished output, and ENOSPC is reported as such.
# Usage: prep_stream_test.sh PATH_TO_SATDAR
set -u
SATDAR=$(realpath "$1")
WORK="${TEST_TMPDIR:-/tmp/satdar-test-$$}/prep_stream"
rm -rf "$WORK" && mkdir -p "$WORK"
cd "$WORK"
passed=0 failed=0
ok() { echo "ok: $1"; passed=$((passed + 1)); }
fail() { echo "FAIL: $1"; failed=$((failed + 1)); }

# 40 MB of English-like text in one file: one document.
python3 - <<'PY'
import random
r = random.Random(7)
words = ("the of and to in a is that for it as was with be by on not he this are or his from at "
         "which but have an they you were her all she there would their we him been has when "
         "who will more no if out so said what up its about into than them can only other new "
         "some could time these two may then do first any my now such like our over man me even "
         "most made after also did many before must through back years where much your way well "
         "down should because each just those people how too little state good very make world").split()
words += ["".join(r.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(r.randint(4, 11)))
          for _ in range(3000)]
with open("big.txt", "w") as f:
    n = 0
    while n < 40_000_000:
        line = " ".join(r.choice(words) for _ in range(r.randint(5, 30))).capitalize() + ".\n"
        f.write(line)
        n += len(line)
PY
# Peak RSS of the prep process tree (the satdar launcher execs satdar-prep).
peak_rss_mb() {  # ARGS...
  python3 - "$@" <<'PY'
import resource, subprocess, sys
rc = subprocess.run(sys.argv[1:], stdout=open("prep.txt", "w"), stderr=subprocess.STDOUT).returncode
print(rc, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss // 1024)
PY
}
read -r rc mb < <(peak_rss_mb "$SATDAR" prep --input big.txt --out ds_big --vocab-size 2000 --threads 2 --quiet)
echo "prep of 40 MB in one file: exit $rc, peak RSS $mb MiB"
# Holding the file and training on all of it took 4.7 GB for 55 MB before.
if [[ $rc == 0 ]] && ((mb < 1024)); then ok "40 MB in one file, peak RSS $mb MiB (< 1 GiB)"; else
  fail "bounded memory (exit $rc, $mb MiB)"; cat prep.txt; fi
if grep -qE "the tokenizer was trained on 1[0-9]\.[0-9] MB of text sampled" prep.txt; then
  ok "the tokenizer trains on a bounded sample"
else fail "tokenizer sample"; cat prep.txt; fi

# A document longer than a shard is cut where the shard ends; the loader reads every shard.
head -c 3000000 big.txt >long.txt
"$SATDAR" prep --input long.txt --out ds_cut --vocab-size 400 --shard-tokens 200000 --quiet \
  >cut.txt 2>&1 || { fail "cut prep"; cat cut.txt; }
cat >tiny.json <<'JSON'
{"vocab_size": 400, "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1,
 "max_position_embeddings": 32, "num_attention_heads": 2, "num_key_value_heads": 1}
JSON
if grep -q "were cut where their shard ended" cut.txt && python3 - <<'PY'
import json
m = json.load(open("ds_cut/manifest.json"))
shards = [s for s in m["shards"] if s["split"] == "train"]
assert len(shards) >= 3, shards
assert all(s["tokens"] >= 200000 for s in shards[:-1]), shards
assert m["documents"] == sum(s["documents"] for s in m["shards"]), m
PY
then
  "$SATDAR" train --config tiny.json --data ds_cut --steps 2 --batch-size 2 --seq-len 16 --quiet \
    && ok "a long document cut across shards, every shard valid" || fail "train on cut shards"
else fail "cut documents"; cat cut.txt; fi

# The same file twice (also through a link) is refused.
ln -s long.txt link.txt
for second in long.txt link.txt; do
  "$SATDAR" prep --input long.txt "$second" --out ds_twice --vocab-size 400 >twice.txt 2>&1
  c=$?
  if [[ $c == 2 ]] && grep -q "is the same file as long.txt (given twice" twice.txt && [[ ! -e ds_twice ]]; then
    ok "the same file twice ($second) is refused"
  else fail "same file twice ($second): exit $c"; cat twice.txt; fi
done

# A signal ends prep without leaving its unfinished output.
"$SATDAR" prep --input big.txt --out ds_sig --vocab-size 2000 --quiet >sig.txt 2>&1 &
pid=$!
for _ in $(seq 1 200); do compgen -G "ds_sig.tmp.*" >/dev/null && break; sleep 0.05; done
sleep 0.5
kill -TERM $pid
wait $pid
c=$?
if [[ $c == 143 ]] && ! compgen -G "ds_sig*" >/dev/null && grep -q "stopped by signal 15; removed" sig.txt; then
  ok "SIGTERM removes the unfinished output (exit 143)"
else fail "signal cleanup: exit $c, left: $(ls -d ds_sig* 2>/dev/null)"; cat sig.txt; fi

# A full disk: ENOSPC named, nothing left behind (a 2 MB tmpfs; needs root to mount).
mkdir -p small_fs
if mount -t tmpfs -o size=2m tmpfs small_fs 2>/dev/null; then
  "$SATDAR" prep --input long.txt --out small_fs/ds --vocab-size 400 --quiet >full.txt 2>&1
  c=$?
  if [[ $c == 1 ]] && grep -q "No space left on device" full.txt && [[ -z $(ls small_fs) ]]; then
    ok "ENOSPC reported as such, no output left"
  else fail "ENOSPC: exit $c, left: $(ls small_fs)"; cat full.txt; fi
  umount small_fs
else
  echo "skip: ENOSPC (cannot mount a tmpfs here)"
fi

echo "$passed passed, $failed failed"
[[ $failed == 0 ]]
