#!/usr/bin/env bash
# Hostile and careless input, one family at a time (issue "Hardening"): every case must end
# with the exact exit code (2 = bad input, 1 = a fault), a message naming the cause, within a
# time limit (nothing blocks or hangs), and without leaving an output file or losing a
# checkpoint.
# Usage: hostile_input_test.sh PATH_TO_SATDAR
set -u
SATDAR=$(realpath "$1")
HERE=$(dirname "$(realpath "$0")")
WORK="${TEST_TMPDIR:-/tmp/satdar-test-$$}/hostile"
rm -rf "$WORK" && mkdir -p "$WORK"
cd "$WORK"
unset TEST_PREMATURE_EXIT_FILE XML_OUTPUT_FILE
source "$HERE/parallel_testlib.sh"
passed=0
failed=0

# expect CODE NAME MESSAGE CMD...: CMD exits with CODE within 60 s, stderr holds MESSAGE, and no
# out.* output (or temporary) is left behind.
expect() {
  local want=$1 name=$2 message=$3
  shift 3
  rm -f out.safetensors out.json
  timeout 60 "$@" >stdout.txt 2>stderr.txt </dev/null
  local code=$?
  if [[ $code -ne $want ]]; then
    echo "FAIL $name: exit code $code, want $want"; tail -5 stderr.txt; failed=$((failed + 1))
    return
  fi
  if [[ -n $message ]] && ! grep -qF -- "$message" stderr.txt; then
    echo "FAIL $name: stderr lacks '$message':"; tail -5 stderr.txt; failed=$((failed + 1))
    return
  fi
  if compgen -G "out.safetensors*" >/dev/null || compgen -G "out.json*" >/dev/null; then
    echo "FAIL $name: left an output file"; failed=$((failed + 1)); return
  fi
  echo "ok   $name"
  passed=$((passed + 1))
}
ok() { echo "ok   $1"; passed=$((passed + 1)); }
fail() { echo "FAIL $1"; failed=$((failed + 1)); }

cat >config.json <<'JSON'
{"vocab_size": 64, "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 2,
 "num_attention_heads": 2, "max_position_embeddings": 64}
JSON
"$SATDAR" init --config config.json --out weights.safetensors || { echo "init failed"; exit 1; }
python3 - <<'PY'
import json, struct
ids = [(i * 7) % 64 for i in range(18)]
h = json.dumps({"tokens": {"dtype": "I32", "shape": [2, 9], "data_offsets": [0, 72]}}).encode()
h += b" " * ((8 - (8 + len(h)) % 8) % 8)
open("tokens.safetensors", "wb").write(struct.pack("<Q", len(h)) + h + struct.pack("<18i", *ids))
PY
G=(--config config.json --weights weights.safetensors --tokens tokens.safetensors)
# A small run; TR4 with its steps, TRQ also quiet.
TR=(train --config config.json --synthetic-data --batch-size 2 --seq-len 8)
TR4=("${TR[@]}" --steps 4)
TRQ=("${TR4[@]}" --quiet)

echo "== 1. memory and sizes"
cfg() {  # cfg NAME JSON-FIELDS: a config file with these fields over the small one
  python3 -c "
import json, sys
c = json.load(open('config.json')); c.update(json.loads(sys.argv[2]))
json.dump(c, open(sys.argv[1], 'w'))" "$1" "$2"
}
cfg huge_vocab.json '{"vocab_size": 16777216, "hidden_size": 65536, "num_attention_heads": 512}'
expect 2 huge_vocab 'satdar train needs about' "$SATDAR" train --config huge_vocab.json \
  --synthetic-data --steps 1 --batch-size 1 --seq-len 8
grep -qF 'reduce config field "vocab_size" (embedding)' stderr.txt && ok huge_vocab_names_field ||
  fail "huge_vocab_names_field: $(cat stderr.txt)"
cfg deep.json '{"num_hidden_layers": 1024, "hidden_size": 16384, "num_attention_heads": 128,
                "intermediate_size": 65536}'
expect 2 huge_depth 'config fields "hidden_size", "intermediate_size" or "num_hidden_layers"' \
  "$SATDAR" train --config deep.json --synthetic-data --steps 1 --batch-size 1 --seq-len 8
expect 2 huge_depth_init 'satdar init needs about' "$SATDAR" init --config deep.json --out out.safetensors
cfg long.json '{"max_position_embeddings": 4194304}'
expect 2 huge_batch 'reduce --batch-size or --seq-len (activations)' \
  "$SATDAR" train --config long.json --synthetic-data --steps 1 --batch-size 16000000 --seq-len 65536
expect 2 huge_eval_batch 'satdar eval needs about' "$SATDAR" eval --config long.json \
  --weights weights.safetensors --synthetic-data --batch-size 1000000 --seq-len 100000
expect 2 threads 'flag --threads must be <= 1024, got 100000' "$SATDAR" "${TRQ[@]}" --threads 100000
cfg vocab_2e31.json '{"vocab_size": 2147483648}'
expect 2 vocab_bound 'field "vocab_size" must be in [2, 16777216], got 2147483648' \
  "$SATDAR" info --config vocab_2e31.json
cfg experts.json '{"num_hidden_layers": 1024, "moe": {"num_experts": 4096, "top_k": 2,
                   "expert_intermediate_size": 8}}'
expect 2 expert_bound 'field "moe.num_experts" (4096) times num_hidden_layers (1024)' \
  "$SATDAR" info --config experts.json
expect 2 config_urandom '/dev/urandom is a character device, not a regular file' \
  "$SATDAR" info --config /dev/urandom
head -c 20000000 /dev/zero | tr '\0' ' ' >big.json
expect 2 config_too_big 'big.json is 20000000 bytes or more, larger than the 16777216 bytes' \
  "$SATDAR" info --config big.json
# An allocation that fails anyway (here: reading a 900 MiB tokenizer model under a 700 MiB
# address-space limit, which leaves room for the libraries) ends with exit code 1 and a
# message, never with abort's 134, and leaves no unfinished output. (prep streams its
# inputs: a 3 GiB text file no longer needs the memory. satdar-prep is the program `satdar
# prep` runs, without the CUDA libraries whose mappings alone exceed such a limit.)
truncate -s 900M sparse.model
printf 'some text\n' >small.txt
expect 1 bad_alloc_is_exit_1 'satdar: error: out of memory' \
  bash -c "ulimit -v 700000 && exec '$(dirname "$SATDAR")/satdar-prep' --input small.txt --tokenizer sparse.model --out ds_oom --quiet"
if compgen -G "ds_oom*" >/dev/null; then echo "FAIL bad_alloc_leaves_output: $(ls -d ds_oom*)"; failed=$((failed + 1)); fi
rm -f sparse.model small.txt

echo "== 2. things that are not regular files"
mkfifo fifo
expect 2 fifo_config 'fifo is a FIFO (named pipe), not a regular file' \
  "$SATDAR" grad --config fifo --weights weights.safetensors --tokens tokens.safetensors --out out.safetensors
expect 2 fifo_weights '--weights: fifo is a FIFO' \
  "$SATDAR" grad --config config.json --weights fifo --tokens tokens.safetensors --out out.safetensors
expect 2 fifo_tokens '--tokens: fifo is a FIFO' \
  "$SATDAR" grad --config config.json --weights weights.safetensors --tokens fifo --out out.safetensors
expect 2 fifo_eval_weights '--weights: fifo is a FIFO' \
  "$SATDAR" eval --config config.json --weights fifo --synthetic-data --seq-len 8
expect 2 fifo_export '--checkpoint: fifo is a FIFO' \
  "$SATDAR" export --config config.json --checkpoint fifo --out out.safetensors
expect 2 fifo_data '--data: fifo is a FIFO (named pipe), not a folder' \
  "$SATDAR" train --config config.json --data fifo --steps 1 --batch-size 2 --seq-len 8
expect 2 fifo_prep_input '--input: fifo is a FIFO' \
  "$SATDAR" prep --input fifo --out ds_fifo --vocab-size 300
expect 2 fifo_tokenizer '--tokenizer: fifo is a FIFO' \
  "$SATDAR" prep --input config.json --tokenizer fifo --out ds_fifo
mkdir -p ck_fifo && mkfifo ck_fifo/ckpt_00000002.safetensors
expect 2 fifo_checkpoint 'ckpt_00000002.safetensors is a FIFO' \
  "$SATDAR" "${TRQ[@]}" --checkpoint-dir ck_fifo --resume
expect 2 device_weights '--weights: /dev/zero is a character device' \
  "$SATDAR" grad --config config.json --weights /dev/zero --tokens tokens.safetensors --out out.safetensors

echo "== 3. numbers"
expect 2 batch_overflow 'flag --batch-size must be <= 16777216, got 4294967298' \
  "$SATDAR" train --config config.json --synthetic-data --steps 1 --batch-size 4294967298 --seq-len 8
expect 2 seq_overflow 'flag --seq-len must be <= 4194304, got 4294967312' \
  "$SATDAR" train --config config.json --synthetic-data --steps 1 --batch-size 2 --seq-len 4294967312
expect 2 int64_overflow 'flag --steps is out of range' \
  "$SATDAR" train --config config.json --synthetic-data --steps 99999999999999999999 --batch-size 2 --seq-len 8
expect 2 lr_inf "flag --lr must be a finite number, got 'inf'" "$SATDAR" "${TRQ[@]}" --lr inf
expect 2 lr_nan "flag --lr must be a finite number, got 'nan'" "$SATDAR" "${TRQ[@]}" --lr nan
expect 2 eps_huge "flag --eps must be a finite number, got '1e999'" "$SATDAR" "${TRQ[@]}" --eps 1e999
expect 2 beta_one 'flag --beta2 must be <= 0.999999, got 1' "$SATDAR" "${TRQ[@]}" --beta2 1
cfg float_overflow.json '{}'
sed -i 's/"max_position_embeddings": 64/"max_position_embeddings": 64, "rope_theta": 1e999/' float_overflow.json
expect 2 config_float_overflow "number overflow parsing '1e999'" "$SATDAR" info --config float_overflow.json
python3 - <<'PY'
import json, struct
def write(path, header, data=b""):
    h = json.dumps(header).encode()
    h += b" " * ((8 - (8 + len(h)) % 8) % 8)
    open(path, "wb").write(struct.pack("<Q", len(h)) + h + data)
# 2^32 * 2^32 elements wrap to 0 in 64 bits: it must not pass for an empty tensor.
write("tokens_wrap.safetensors", {"tokens": {"dtype": "I32", "shape": [4294967296, 4294967296],
                                             "data_offsets": [0, 0]}})
# 2^62 * 4 bytes overflow the byte count.
write("tokens_bytes_wrap.safetensors", {"tokens": {"dtype": "I32", "shape": [4611686018427387904, 1],
                                                   "data_offsets": [0, 0]}})
PY
expect 2 shape_product_wraps "tensor 'tokens': shape [4294967296,4294967296] has more elements than fit" \
  "$SATDAR" grad --config config.json --weights weights.safetensors --tokens tokens_wrap.safetensors --out out.safetensors
expect 2 shape_bytes_wrap "has more elements than fit in 64 bits" \
  "$SATDAR" grad --config config.json --weights weights.safetensors --tokens tokens_bytes_wrap.safetensors --out out.safetensors

echo "== 4. duplicates and defaults"
python3 - <<'PY'
import struct
raw = open("weights.safetensors", "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
header = raw[8:8 + n].decode().rstrip()
# The same tensor name twice in the header text (json.dumps cannot write this).
entry_start = header.index('"model.norm.weight"')
entry_end = header.index("}", entry_start) + 1
dup = header[:-1] + ", " + header[entry_start:entry_end] + "}"
dup = dup.encode()
dup += b" " * ((8 - (8 + len(dup)) % 8) % 8)
open("dup_tensor.safetensors", "wb").write(struct.pack("<Q", len(dup)) + dup + raw[8 + n:])
PY
expect 2 duplicate_tensor 'duplicate key "model.norm.weight"' \
  "$SATDAR" grad --config config.json --weights dup_tensor.safetensors --tokens tokens.safetensors --out out.safetensors
printf '{"vocab_size": 64, "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 2,
 "num_attention_heads": 2, "max_position_embeddings": 64, "hidden_size": 32}' >dup_key.json
expect 2 duplicate_config_key 'dup_key.json: not valid JSON: duplicate key "hidden_size"' \
  "$SATDAR" info --config dup_key.json
printf '{"vocab_size": 64, "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 2,
 "num_attention_heads": 2}' >no_positions.json
expect 2 missing_max_positions 'field "max_position_embeddings" is required' \
  "$SATDAR" info --config no_positions.json
expect 2 data_format_bogus "flag --data-format must be auto, text or brown, got 'bogus'" \
  "$SATDAR" "${TRQ[@]}" --data-format bogus
expect 2 task_bogus "flag --task must be lm or mqar, got 'qa'" "$SATDAR" "${TRQ[@]}" --task qa
expect 2 mqar_flag_without_task "flag --mqar-keys needs --task mqar" "$SATDAR" "${TRQ[@]}" --mqar-keys 8

echo "== 5. checkpoints"
"$SATDAR" "${TRQ[@]}" --checkpoint-dir ck --checkpoint-every 2 --log-jsonl ck.jsonl --summary-json ck.json ||
  fail "checkpointed run"
python3 - <<'PY'
import json, struct
raw = bytearray(open("ck/ckpt_00000004.safetensors", "rb").read())
n = struct.unpack("<Q", raw[:8])[0]
header = raw[8:8 + n].decode()
# One byte of the stored data position changed ("data_position":"16" -> "26"), and one of the
# tensor data: both are corruption.
i = header.index('"data_position":"') + len('"data_position":"')
meta = bytearray(raw); meta[8 + i] = ord("2")
open("meta_flip.safetensors", "wb").write(meta)
data = bytearray(raw); data[-3] ^= 0x10
open("data_flip.safetensors", "wb").write(data)
PY
mkdir -p ck_meta ck_data && cp meta_flip.safetensors ck_meta/ckpt_00000004.safetensors &&
  cp data_flip.safetensors ck_data/ckpt_00000004.safetensors
expect 2 resume_flipped_metadata 'checksum mismatch: the file is corrupted' \
  "$SATDAR" "${TR[@]}" --quiet --steps 6 --checkpoint-dir ck_meta --resume
expect 2 resume_flipped_data 'checksum mismatch: the file is corrupted' \
  "$SATDAR" "${TR[@]}" --quiet --steps 6 --checkpoint-dir ck_data --resume
expect 2 eval_corrupted_checkpoint 'satdar eval: error: weights: checkpoint meta_flip.safetensors: checksum mismatch' \
  "$SATDAR" eval --config config.json --weights meta_flip.safetensors --synthetic-data --seq-len 8
expect 2 grad_corrupted_checkpoint '--weights: checkpoint data_flip.safetensors: checksum mismatch' \
  "$SATDAR" grad "${G[@]/weights.safetensors/data_flip.safetensors}" --out out.safetensors
expect 2 export_corrupted_checkpoint '--checkpoint: checkpoint meta_flip.safetensors: checksum mismatch' \
  "$SATDAR" export --config config.json --checkpoint meta_flip.safetensors --out out.safetensors
cfg wider.json '{"hidden_size": 32}'
expect 2 eval_checkpoint_of_other_config 'was written for a different model config: field "hidden_size" is 16 there, 32 in this config' \
  "$SATDAR" eval --config wider.json --weights ck/ckpt_00000004.safetensors --synthetic-data --seq-len 8
mkdir -p ck_renamed && cp ck/ckpt_00000004.safetensors ck_renamed/ckpt_00000009.safetensors
expect 2 renamed_checkpoint 'its name says step 9 but it holds step 4' \
  "$SATDAR" "${TR[@]}" --quiet --steps 12 --checkpoint-dir ck_renamed --resume
expect 2 fresh_run_into_used_folder 'already holds checkpoints (newest: ck/ckpt_00000004.safetensors); set resume' \
  "$SATDAR" "${TRQ[@]}" --checkpoint-dir ck --checkpoint-every 2
[[ -f ck/ckpt_00000004.safetensors && -f ck/ckpt_00000002.safetensors ]] && ok refused_run_kept_checkpoints ||
  fail refused_run_kept_checkpoints
# Resuming a finished run trains nothing, says so, and reports the stored final loss.
expect 0 resume_finished_run '' "$SATDAR" "${TR4[@]}" --checkpoint-dir ck --resume --summary-json done.json
grep -qF 'the run already finished all 4 steps; nothing to train' stdout.txt &&
  python3 -c "
import json
a, b = json.load(open('ck.json')), json.load(open('done.json'))
assert b['already_complete'] and b['steps'] == 4 and b['final_loss'] == a['final_loss'], (a, b)" &&
  ok resume_finished_run_summary || fail "resume_finished_run_summary: $(cat stdout.txt)"
# Two trainers on one folder: the second is refused while the first runs.
"$SATDAR" train --config config.json --synthetic-data --steps 100000 --batch-size 2 --seq-len 8 \
  --quiet --checkpoint-dir ck_busy --checkpoint-every 1000 &
first=$!
for _ in $(seq 1 100); do [[ -f ck_busy/.satdar-lock ]] && break; sleep 0.1; done
sleep 0.5
expect 2 second_trainer_same_folder 'checkpoint folder ck_busy is in use by another run (pid' \
  "$SATDAR" "${TRQ[@]}" --checkpoint-dir ck_busy --resume
kill "$first"; wait "$first" 2>/dev/null
# What a killed writer left is removed once the folder is locked.
mkdir -p ck_stale/ckpt_00000003.tmp && touch ck_stale/ckpt_00000002.safetensors.tmp.4242 ck_stale/keep.txt
"$SATDAR" "${TR4[@]}" --checkpoint-dir ck_stale --checkpoint-every 4 >stale.txt 2>&1
if [[ ! -e ck_stale/ckpt_00000003.tmp && ! -e ck_stale/ckpt_00000002.safetensors.tmp.4242 &&
      -e ck_stale/keep.txt && -f ck_stale/ckpt_00000004.safetensors ]] &&
   grep -qF "removed 2 temporary file(s) a killed run left in ck_stale" stale.txt; then
  ok stale_temporaries_removed
else
  fail "stale_temporaries_removed: $(ls ck_stale) $(cat stale.txt)"
fi

# Weights holding NaN or Inf: plain weights (init's, no checksum) with model.norm.weight[3] NaN,
# and a checkpoint with an Inf there whose checksum is made valid again (a diverged run writes
# such a file): grad, eval and export refuse them naming the tensor.
python3 - <<'PY'
import json, struct
M = (1 << 64) - 1
def checksum64(b, h):  # core/file_util.cc
    n = len(b); h = (h ^ (n * 0x9e3779b97f4a7c15)) & M
    for i in range(n // 8):
        h = ((h ^ int.from_bytes(b[8 * i:8 * i + 8], "little")) * 0x100000001b3) & M; h ^= h >> 29
    for i in range(n // 8 * 8, n):
        h = ((h ^ b[i]) * 0x100000001b3) & M; h ^= h >> 29
    h ^= h >> 33; h = (h * 0xff51afd7ed558ccd) & M; h ^= h >> 33
    return h
def poison(src, dst, value, checkpoint):
    raw = bytearray(open(src, "rb").read())
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n]); base = 8 + n
    at = base + header["model.norm.weight"]["data_offsets"][0] + 4 * 3
    raw[at:at + 4] = struct.pack("<f", value)
    if checkpoint:  # runtime/checkpoint.cc FileChecksum: metadata in key order, tensors in file order
        meta = header["__metadata__"]; h = 0x6a09e667f3bcc909
        for k in sorted(meta):
            if k != "checksum": h = checksum64((k + "\0" + meta[k] + "\0").encode(), h)
        for t in sorted((v for k, v in header.items() if k != "__metadata__"), key=lambda t: t["data_offsets"]):
            h = checksum64(bytes(raw[base + t["data_offsets"][0]:base + t["data_offsets"][1]]), h)
        old, new = ('"%s"' % meta["checksum"]).encode(), ('"%016x"' % h).encode()
        assert raw[8:8 + n].count(old) == 1
        raw[8:8 + n] = bytes(raw[8:8 + n]).replace(old, new)
    open(dst, "wb").write(raw)
poison("weights.safetensors", "nan_weights.safetensors", float("nan"), False)
poison("ck/ckpt_00000004.safetensors", "inf_ckpt.safetensors", float("inf"), True)
PY
NOT_FINITE="weights must be finite numbers"
expect 2 grad_nan_weights "satdar grad: error: --weights: nan_weights.safetensors: tensor 'model.norm.weight' holds NaN (element 3); $NOT_FINITE" \
  "$SATDAR" grad "${G[@]/weights.safetensors/nan_weights.safetensors}" --out out.safetensors
expect 2 eval_nan_weights "satdar eval: error: weights: nan_weights.safetensors: tensor 'model.norm.weight' holds NaN (element 3); $NOT_FINITE" \
  "$SATDAR" eval --config config.json --weights nan_weights.safetensors --synthetic-data --seq-len 8
expect 2 eval_inf_checkpoint "satdar eval: error: weights: inf_ckpt.safetensors: tensor 'model.norm.weight' holds Inf (element 3); $NOT_FINITE" \
  "$SATDAR" eval --config config.json --weights inf_ckpt.safetensors --synthetic-data --seq-len 8
expect 2 export_inf_checkpoint "satdar export: error: --checkpoint: inf_ckpt.safetensors: tensor 'model.norm.weight' holds Inf (element 3); $NOT_FINITE" \
  "$SATDAR" export --config config.json --checkpoint inf_ckpt.safetensors --out out.safetensors

echo "== 6. datasets"
mkdir -p text
python3 -c "
import random
r = random.Random(0)
words = 'the of and to in is was he for it with as his on be at by had not are but from or have'.split()
for f in range(3):
    open('text/doc%d.txt' % f, 'w').write('\n'.join(' '.join(r.choice(words) for _ in range(12)) for _ in range(200)))
"
"$SATDAR" prep --input text --out ds --vocab-size 300 --quiet >/dev/null || fail prep
cat >ds_config.json <<'JSON'
{"vocab_size": 300, "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 2,
 "num_attention_heads": 2, "max_position_embeddings": 64}
JSON
D=(train --config ds_config.json --steps 2 --batch-size 2 --seq-len 16 --quiet)
"$SATDAR" "${D[@]}" --data ds >/dev/null && ok good_dataset || fail good_dataset
variant() {  # variant NAME PYTHON: a copy of ds whose manifest m the code changes
  rm -rf "$1" && cp -r ds "$1"
  python3 -c "
import json
m = json.load(open('$1/manifest.json'))
$2
json.dump(m, open('$1/manifest.json', 'w'))"
}
echo "x" >outside.bin
variant ds_escape 'm["shards"][0]["file"] = "../outside.bin"'
expect 2 shard_outside_folder 'shards[0].file "../outside.bin" must be a file name inside the dataset folder' \
  "$SATDAR" "${D[@]}" --data ds_escape
variant ds_abs 'm["shards"][0]["file"] = "'"$WORK"'/outside.bin"'
expect 2 shard_absolute_path 'must be a file name inside the dataset folder' "$SATDAR" "${D[@]}" --data ds_abs
variant ds_twice 'm["shards"].append(dict(m["shards"][0]))'
expect 2 shard_listed_twice 'manifest.json: train_00000.bin is listed twice' "$SATDAR" "${D[@]}" --data ds_twice
variant ds_eos 'm["eos_id"] = 300'
expect 2 eos_out_of_vocab 'manifest.json: eos_id 300 is not below vocab_size 300' "$SATDAR" "${D[@]}" --data ds_eos
variant ds_eos_wrong 'm["eos_id"] = 5'
expect 2 eos_not_the_shards 'does not end with eos_id 5' "$SATDAR" "${D[@]}" --data ds_eos_wrong
variant ds_width 'm["token_bytes"] = 4'
expect 2 token_width 'holds 2-byte ids of a vocabulary of 300, the manifest says 4-byte ids of 300' \
  "$SATDAR" "${D[@]}" --data ds_width
variant ds_count 'm["shards"][0]["tokens"] += 1'
expect 2 shard_token_count 'manifest.json says train_00000.bin holds' "$SATDAR" "${D[@]}" --data ds_count
variant ds_total 'm["train_tokens"] += 7'
expect 2 manifest_totals 'manifest.json: train_tokens is' "$SATDAR" "${D[@]}" --data ds_total
variant ds_vocab 'm["vocab_size"] = "300"'
expect 2 manifest_types 'manifest.json: vocab_size must be an integer >= 0' "$SATDAR" "${D[@]}" --data ds_vocab
variant ds_unknown 'm["compression"] = "zstd"'
expect 2 manifest_unknown_field 'manifest.json: unknown field "compression"' "$SATDAR" "${D[@]}" --data ds_unknown
rm -rf ds_nomanifest && cp -r ds ds_nomanifest && rm ds_nomanifest/manifest.json
expect 2 manifest_missing 'like a dataset written by satdar prep, but its manifest.json is missing' \
  "$SATDAR" "${D[@]}" --data ds_nomanifest
mkdir -p binary && head -c 5000 /dev/urandom >binary/blob.dat
expect 2 binary_as_text 'blob.dat is not text' \
  "$SATDAR" train --config ds_config.json --steps 1 --batch-size 2 --seq-len 8 --data binary
# prep skips a binary file with a warning naming it (here the only one: an empty corpus), or
# with --strict-utf8 refuses it.
expect 2 binary_prep_input 'warning: skipping binary/blob.dat: binary (' \
  "$SATDAR" prep --input binary --out ds_bin --vocab-size 300
expect 2 binary_prep_strict 'blob.dat is not text' \
  "$SATDAR" prep --input binary --out ds_bin --vocab-size 300 --strict-utf8

echo "== 7. parallel runs that disagree"
for r in 0 1; do
  "$SATDAR" "${TRQ[@]}" --dp 2 --launcher gloo --rank $r --world-size 2 --rendezvous rdv_seed \
    --seed $r --comm-timeout 30 >seed$r.txt 2>&1 &
  eval pid$r=$!
done
wait "$pid0"; s0=$?; wait "$pid1"; s1=$?
if [[ $s0 -eq 2 && $s1 -eq 2 ]] &&
   grep -qF 'rank 1 was started with a different seed than rank 0 (1 instead of 0)' seed0.txt &&
   grep -qF 'rank 1 was started with a different seed than rank 0' seed1.txt; then
  ok gloo_different_seed
else
  fail "gloo_different_seed: exit $s0/$s1 $(cat seed0.txt seed1.txt)"
fi
cat >mpi_rank_config.sh <<EOF
#!/usr/bin/env bash
# Rank 1 gets another model config.
c=$WORK/config.json; [[ \$OMPI_COMM_WORLD_RANK == 1 ]] && c=$WORK/wider.json
exec "$SATDAR" train --config "\$c" --synthetic-data --steps 2 --batch-size 2 --seq-len 8 --dp 2 --quiet
EOF
chmod +x mpi_rank_config.sh
expect 2 mpi_different_config 'rank 1 was started with a different model config than rank 0' \
  "${MPIRUN[@]}" -np 2 ./mpi_rank_config.sh

echo "== 8. outputs"
start=$(date +%s)
expect 2 summary_folder_missing '--summary-json: cannot write nope/s.json: the folder nope does not exist' \
  "$SATDAR" train --config config.json --synthetic-data --steps 100000 --batch-size 2 --seq-len 8 \
  --summary-json nope/s.json
(( $(date +%s) - start < 10 )) && ok summary_checked_up_front || fail summary_checked_up_front
touch a_file
expect 2 checkpoint_dir_is_file '--checkpoint-dir: a_file is a regular file, not a folder' \
  "$SATDAR" "${TRQ[@]}" --checkpoint-dir a_file --checkpoint-every 2
expect 2 log_is_folder '--log-jsonl: text is a folder; an output must be a regular file' \
  "$SATDAR" "${TRQ[@]}" --log-jsonl text
expect 2 eval_json_missing_folder '--json: cannot write no/r.json' \
  "$SATDAR" eval --config config.json --weights weights.safetensors --synthetic-data --seq-len 8 --json no/r.json
sum_before=$(md5sum weights.safetensors)
expect 2 grad_out_is_weights '--out: weights.safetensors is also --weights; an output never overwrites an input' \
  "$SATDAR" grad "${G[@]}" --out weights.safetensors
ln -f weights.safetensors hardlink.safetensors
expect 2 grad_out_links_weights '--out: hardlink.safetensors is also --weights' \
  "$SATDAR" grad "${G[@]}" --out hardlink.safetensors
[[ $(md5sum weights.safetensors) == "$sum_before" ]] && ok weights_untouched || fail weights_untouched
expect 2 export_out_is_checkpoint '--out: ck/ckpt_00000004.safetensors is also --checkpoint' \
  "$SATDAR" export --config config.json --checkpoint ck/ckpt_00000004.safetensors --out ck/ckpt_00000004.safetensors
expect 2 log_is_summary '--log-jsonl and --summary-json are the same file' \
  "$SATDAR" "${TRQ[@]}" --log-jsonl same.json --summary-json same.json
# A write error on --log-jsonl (a full disk; here the file-size limit) fails the run with exit
# code 1 and says so, instead of exit 0 with a truncated log.
expect 1 log_write_error 'log_jsonl: cannot write full.jsonl: File too large' \
  bash -c "trap '' XFSZ; ulimit -f 1 && exec '$SATDAR' train --config '$WORK/config.json' --synthetic-data --steps 50 --batch-size 2 --seq-len 8 --quiet --log-jsonl full.jsonl"

echo "$passed passed, $failed failed"
[[ $failed -eq 0 ]]
