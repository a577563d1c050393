#!/usr/bin/env bash
# The data pipeline end to end through the command line: prep a tagged Brown-format corpus,
# train SATFormer on it with validation, resume exactly, analyse gates by part of speech,
# evaluate MQAR recall; and every bad data input exits with code 2 naming the file and problem.
# Usage: data_e2e_test.sh PATH_TO_SATDAR
set -u
SATDAR=$(realpath "$1")
HERE=$(dirname "$(realpath "$0")")
WORK="${TEST_TMPDIR:-/tmp/satdar-test-$$}/data"
rm -rf "$WORK" && mkdir -p "$WORK"
cd "$WORK"
source "$(dirname "$(realpath "$0")")/cli_checks.sh"

# A tagged corpus in the Brown layout (cats.txt marks the folder).
python3 "$HERE/tiny_brown.py" 30
cat >sat.json <<'JSON'
{"vocab_size": 320, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 3,
 "num_attention_heads": 4, "num_key_value_heads": 2, "value_residual": "satformer",
 "max_position_embeddings": 64}
JSON

"$SATDAR" prep --input brown --out ds --vocab-size 300 --val-fraction 0.2 --quiet >prep.txt 2>&1 \
  && [[ -f ds/manifest.json && -f ds/train_00000.pos ]] && ok prep || { fail prep; cat prep.txt; }

T=(train --config sat.json --data ds --steps 6 --batch-size 4 --seq-len 16 --threads 2 --quiet)
"$SATDAR" "${T[@]}" --eval-every 3 --log-jsonl full.jsonl --checkpoint-dir ck --checkpoint-every 3 \
  && python3 -c "
import json
lines = [json.loads(l) for l in open('full.jsonl')]
assert len(lines) == 6 and 'val_loss' in lines[2] and 'val_loss' in lines[5], lines
" && ok train_with_validation || fail train_with_validation
rm -f ck/ckpt_00000006.safetensors
"$SATDAR" "${T[@]}" --eval-every 3 --log-jsonl resumed.jsonl --checkpoint-dir ck --resume \
  && python3 -c "
import json
full = {j['step']: j for j in map(json.loads, open('full.jsonl'))}
res = [json.loads(l) for l in open('resumed.jsonl')]
assert [r['step'] for r in res] == [4, 5, 6], res
assert all(r['loss'] == full[r['step']]['loss'] for r in res)
assert res[-1]['val_loss'] == full[6]['val_loss']
" && ok resume_on_dataset_is_exact || fail resume_on_dataset_is_exact

"$SATDAR" eval --config sat.json --weights ck/ckpt_00000006.safetensors --data ds --seq-len 16 \
  --batch-size 2 --batches 2 --gate-by-category --json cat.json >cat.txt \
  && grep -q "mean SATFormer gate by part-of-speech group" cat.txt && python3 -c "
import json
r = json.load(open('cat.json'))
g = r['gate_by_category']
assert set(g) == {'content', 'function', 'punctuation'}, g
assert len(g['content']) == 2 and len(g['content'][0]) == 2
assert r['category_tokens']['content'] > 0 and r['category_tokens']['punctuation'] > 0
" && ok gate_by_category || { fail gate_by_category; cat cat.txt; }

# A group without tokens has no mean: "n/a" in the table, null in the JSON, never 0.0000.
mkdir -p nopunct && cp brown/cats.txt nopunct/
for f in brown/c[a-r][0-9][0-9]; do
  python3 -c "
import re, sys
for line in open(sys.argv[1]):
    print(' '.join(t for t in line.split() if re.search('[a-z]', t.rsplit('/', 1)[-1])))
" "$f" >"nopunct/$(basename "$f")"
done
"$SATDAR" prep --input nopunct --out ds_np --tokenizer ds/tokenizer.model --val-fraction 0.2 \
  --quiet >/dev/null 2>&1 && "$SATDAR" eval --config sat.json --weights ck/ckpt_00000006.safetensors \
  --data ds_np --seq-len 16 --batch-size 2 --batches 2 --gate-by-category --json np.json >np.txt \
  && python3 -c "
import json
r = json.load(open('np.json'))
assert r['category_tokens']['punctuation'] == 0, r['category_tokens']
assert all(v is None for row in r['gate_by_category']['punctuation'] for v in row), r
assert all(v is not None for row in r['gate_by_category']['content'] for v in row), r
rows = [l.split() for l in open('np.txt') if len(l.split()) == 5 and l.split()[1].isdigit()]
assert rows and all(row[-1] == 'n/a' and row[2] != 'n/a' for row in rows), rows
" && ok gate_by_category_empty_group_is_na || { fail gate_by_category_empty_group_is_na; cat np.txt; }

"$SATDAR" eval --config sat.json --weights ck/ckpt_00000006.safetensors --task mqar \
  --mqar-keys 20 --mqar-values 20 --mqar-pairs 4 --mqar-queries 4 --seq-len 16 --batches 2 \
  --json mqar.json >/dev/null && python3 -c "
import json
r = json.load(open('mqar.json'))
assert 0 <= r['mqar_accuracy'] <= 1 and r['queries'] == 2 * 8 * 4, r
" && ok mqar_eval || fail mqar_eval

# Bad input.
mkdir -p empty
expect_fail prep_empty_corpus "empty corpus" "$SATDAR" prep --input empty --out e --vocab-size 300
[[ ! -e e ]] || fail "prep_empty_corpus left e"
expect_fail prep_out_exists "ds already exists" "$SATDAR" prep --input brown --out ds --vocab-size 300
expect_fail prep_no_vocab "give --vocab-size N" "$SATDAR" prep --input brown --out x
expect_fail prep_tokenizer_mismatch "has 300 pieces but vocab_size is 512" \
  "$SATDAR" prep --input brown --out y --tokenizer ds/tokenizer.model --vocab-size 512
[[ ! -e y ]] || fail "prep_tokenizer_mismatch left y"
sed 's/"vocab_size": 320/"vocab_size": 256/' sat.json >small_vocab.json
expect_fail tokenizer_larger_than_config "the tokenizer has 300 tokens but the model's vocab_size is 256" \
  "$SATDAR" train --config small_vocab.json --data ds --steps 1 --batch-size 2 --seq-len 8
mkdir -p tiny && echo "a short text" >tiny/a.txt && echo "another short one" >tiny/b.txt
"$SATDAR" prep --input tiny --out tinyds --tokenizer ds/tokenizer.model --val-fraction 0.01 --quiet >/dev/null
expect_fail seq_len_longer_than_data "fewer than seq_len + 1" \
  "$SATDAR" train --config sat.json --data tinyds --steps 1 --batch-size 2 --seq-len 60
expect_fail seq_len_longer_than_val_split "fewer than seq_len + 1" \
  "$SATDAR" eval --config sat.json --weights ck/ckpt_00000006.safetensors --data tinyds --seq-len 60
expect_fail eval_every_without_dataset "validation needs a prepared dataset" \
  "$SATDAR" train --config sat.json --synthetic-data --steps 1 --batch-size 2 --seq-len 8 --eval-every 1
expect_fail mqar_vocab "MQAR needs 401 token ids" \
  "$SATDAR" train --config sat.json --task mqar --mqar-keys 200 --mqar-values 200 --steps 1 \
  --batch-size 2 --seq-len 40
expect_fail category_without_pos "needs data_dir prepared from the tagged Brown corpus" \
  "$SATDAR" eval --config sat.json --weights ck/ckpt_00000006.safetensors --synthetic-data \
  --seq-len 8 --gate-by-category
cp -r ds corrupt
python3 -c "
f = open('corrupt/train_00000.bin', 'r+b'); f.seek(100); b = f.read(1); f.seek(100)
f.write(bytes([b[0] ^ 1])); f.close()"
expect_fail corrupted_shard "corrupt/train_00000.bin: checksum mismatch" \
  "$SATDAR" train --config sat.json --data corrupt --steps 1 --batch-size 2 --seq-len 8
cp -r ds truncated
python3 -c "
import os; p = 'truncated/val_00000.bin'; os.truncate(p, os.path.getsize(p) - 10)"
expect_fail truncated_shard "truncated/val_00000.bin: truncated" \
  "$SATDAR" train --config sat.json --data truncated --steps 1 --batch-size 2 --seq-len 8

# A POS sidecar byte outside the groups 0..3 (data/pos.h), with the shard's checksum made valid
# again: refused when the dataset opens (by train and by eval --gate-by-category alike).
cp -r ds badpos
python3 - <<'PY'
import struct
M = (1 << 64) - 1
def checksum64(b, seed=0x6a09e667f3bcc909):  # core/file_util.cc
    n = len(b); h = (seed ^ (n * 0x9e3779b97f4a7c15)) & M
    for i in range(n // 8):
        h = ((h ^ int.from_bytes(b[8 * i:8 * i + 8], "little")) * 0x100000001b3) & M; h ^= h >> 29
    for i in range(n // 8 * 8, n):
        h = ((h ^ b[i]) * 0x100000001b3) & M; h ^= h >> 29
    h ^= h >> 33; h = (h * 0xff51afd7ed558ccd) & M; h ^= h >> 33
    return h
raw = bytearray(open("badpos/train_00000.pos", "rb").read())
raw[64 + 5] = 4  # token 5's group: one past the last
raw[32:40] = struct.pack("<Q", checksum64(bytes(raw[64:])))
open("badpos/train_00000.pos", "wb").write(raw)
PY
expect_fail pos_byte_outside_groups \
  "satdar train: error: data_dir: badpos: train_00000.pos: byte 4 at offset 69 (token 5) is not a part-of-speech group (0 to 3)" \
  "$SATDAR" train --config sat.json --data badpos --steps 1 --batch-size 2 --seq-len 8
expect_fail pos_byte_outside_groups_eval \
  "satdar eval: error: data_dir: badpos: train_00000.pos: byte 4 at offset 69 (token 5) is not a part-of-speech group (0 to 3)" \
  "$SATDAR" eval --config sat.json --weights ck/ckpt_00000006.safetensors --data badpos \
  --seq-len 16 --batch-size 2 --batches 2 --gate-by-category

finish
