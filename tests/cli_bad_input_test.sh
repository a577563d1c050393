#!/usr/bin/env bash
# Bad input to the satdar command line: every case must exit with code 2 and print a message
# naming the flag, file or field, and must not leave an output file behind.
# Usage: cli_bad_input_test.sh PATH_TO_SATDAR
set -u
SATDAR=$(realpath "$1")
WORK="${TEST_TMPDIR:-/tmp/satdar-test-$$}/cli"
rm -rf "$WORK" && mkdir -p "$WORK"
cd "$WORK"
passed=0
failed=0

# expect_fail NAME EXPECTED_MESSAGE CMD...
expect_fail() {
  local name=$1 message=$2
  shift 2
  rm -f out.safetensors
  "$@" >stdout.txt 2>stderr.txt
  local code=$?
  if [[ $code -ne 2 ]]; then
    echo "FAIL $name: exit code $code, want 2"; cat stderr.txt; failed=$((failed + 1)); return
  fi
  if ! grep -qF -- "$message" stderr.txt; then
    echo "FAIL $name: stderr lacks '$message':"; cat stderr.txt; failed=$((failed + 1)); return
  fi
  if [[ -e out.safetensors ]] || compgen -G "out.safetensors.tmp.*" >/dev/null; then
    echo "FAIL $name: left an output file"; failed=$((failed + 1)); return
  fi
  echo "ok   $name"
  passed=$((passed + 1))
}

cat >config.json <<'JSON'
{"vocab_size": 64, "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 2,
 "num_attention_heads": 2, "max_position_embeddings": 64}
JSON
"$SATDAR" init --config config.json --out weights.safetensors || { echo "init failed"; exit 1; }
# A valid token batch [2, 9] of int32, and variants, written with the standard library only.
python3 - <<'PY'
import json, struct
def write(path, tensors):
    header, blobs, off = {}, [], 0
    for name, (dtype, shape, raw) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + len(raw)]}
        blobs.append(raw); off += len(raw)
    h = json.dumps(header).encode()
    h += b" " * ((8 - (8 + len(h)) % 8) % 8)
    open(path, "wb").write(struct.pack("<Q", len(h)) + h + b"".join(blobs))
ids = [(i * 7) % 64 for i in range(18)]
write("tokens.safetensors", {"tokens": ("I32", [2, 9], struct.pack("<18i", *ids))})
write("tokens_oov.safetensors", {"tokens": ("I32", [2, 9], struct.pack("<18i", *(ids[:-1] + [64])))})
write("tokens_named.safetensors", {"ids": ("I32", [2, 9], struct.pack("<18i", *ids))})
write("tokens_1d.safetensors", {"tokens": ("I32", [18], struct.pack("<18i", *ids))})
write("tokens_f32.safetensors", {"tokens": ("F32", [2, 9], struct.pack("<18f", *ids))})
# Weights: truncated, one tensor mis-shaped, one extra tensor, one unknown dtype.
raw = open("weights.safetensors", "rb").read()
open("truncated.safetensors", "wb").write(raw[: len(raw) - 100])
n = struct.unpack("<Q", raw[:8])[0]
header = json.loads(raw[8:8 + n])
data = raw[8 + n:]
def rewrite(path, header):
    h = json.dumps(header).encode()
    h += b" " * ((8 - (8 + len(h)) % 8) % 8)
    open(path, "wb").write(struct.pack("<Q", len(h)) + h + data)
bad = json.loads(json.dumps(header))
bad["model.norm.weight"]["shape"] = [4, 4]
rewrite("misshaped.safetensors", bad)
extra = json.loads(json.dumps(header))
extra["model.extra.weight"] = {"dtype": "F32", "shape": [0], "data_offsets": [0, 0]}
rewrite("extra.safetensors", extra)
unknown = json.loads(json.dumps(header))
unknown["model.norm.weight"]["dtype"] = "Q7"
rewrite("unknown_dtype.safetensors", unknown)
PY
printf '{"vocab_size": 64, "hidden_size": 16,' >malformed.json
cat >unknown_field.json <<'JSON'
{"vocab_size": 64, "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 2, "max_position_embeddings": 512,
 "num_attention_heads": 2, "dropout": 0.1}
JSON
cat >bad_heads.json <<'JSON'
{"vocab_size": 64, "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 2, "max_position_embeddings": 512,
 "num_attention_heads": 3}
JSON

G=(--weights weights.safetensors --tokens tokens.safetensors --out out.safetensors)
expect_fail no_command "usage: satdar <command>" "$SATDAR"
expect_fail unknown_command "unknown command 'fly'" "$SATDAR" fly
expect_fail grad_missing_weights "missing required flag --weights" \
  "$SATDAR" grad --config config.json --tokens tokens.safetensors --out out.safetensors
expect_fail grad_unknown_flag "unknown flag --colour" "$SATDAR" grad --config config.json "${G[@]}" --colour red
expect_fail grad_bad_dtype "flag --dtype must be f32 or f64, got 'f16'" \
  "$SATDAR" grad --config config.json "${G[@]}" --dtype f16
expect_fail config_missing "config_nope.json" "$SATDAR" grad --config config_nope.json "${G[@]}"
expect_fail config_malformed "malformed.json: not valid JSON" "$SATDAR" grad --config malformed.json "${G[@]}"
expect_fail config_unknown_field 'field "dropout" is not a known config field' \
  "$SATDAR" grad --config unknown_field.json "${G[@]}"
expect_fail config_bad_heads 'field "num_attention_heads" must divide hidden_size' \
  "$SATDAR" grad --config bad_heads.json "${G[@]}"
expect_fail weights_truncated "truncated.safetensors: tensor" \
  "$SATDAR" grad --config config.json --weights truncated.safetensors --tokens tokens.safetensors --out out.safetensors
expect_fail weights_misshaped "tensor 'model.norm.weight'" \
  "$SATDAR" grad --config config.json --weights misshaped.safetensors --tokens tokens.safetensors --out out.safetensors
expect_fail weights_extra "tensor 'model.extra.weight' is not a parameter of this config" \
  "$SATDAR" grad --config config.json --weights extra.safetensors --tokens tokens.safetensors --out out.safetensors
expect_fail weights_unknown_dtype "tensor 'model.norm.weight': unknown dtype 'Q7'" \
  "$SATDAR" grad --config config.json --weights unknown_dtype.safetensors --tokens tokens.safetensors --out out.safetensors
expect_fail weights_missing_file "cannot open missing.safetensors" \
  "$SATDAR" grad --config config.json --weights missing.safetensors --tokens tokens.safetensors --out out.safetensors
expect_fail tokens_out_of_vocab "token id 64 at flat index 17 is outside [0, vocab_size=64)" \
  "$SATDAR" grad --config config.json --weights weights.safetensors --tokens tokens_oov.safetensors --out out.safetensors
expect_fail tokens_no_tensor "has no tensor named 'tokens'" \
  "$SATDAR" grad --config config.json --weights weights.safetensors --tokens tokens_named.safetensors --out out.safetensors
expect_fail tokens_1d "tensor 'tokens' has shape [18], expected [B, T+1]" \
  "$SATDAR" grad --config config.json --weights weights.safetensors --tokens tokens_1d.safetensors --out out.safetensors
expect_fail tokens_float "tensor 'tokens' has dtype F32, expected I32 or I64" \
  "$SATDAR" grad --config config.json --weights weights.safetensors --tokens tokens_f32.safetensors --out out.safetensors
expect_fail train_missing_steps "missing required flag --steps" \
  "$SATDAR" train --config config.json --batch-size 2 --seq-len 8 --synthetic-data
expect_fail train_bad_steps "flag --steps must be an integer, got 'ten'" \
  "$SATDAR" train --config config.json --steps ten --batch-size 2 --seq-len 8 --synthetic-data
expect_fail train_two_sources "give exactly one of --data DIR or --synthetic-data" \
  "$SATDAR" train --config config.json --steps 1 --batch-size 2 --seq-len 8 --synthetic-data --data .
expect_fail train_no_source "give exactly one of --data DIR or --synthetic-data" \
  "$SATDAR" train --config config.json --steps 1 --batch-size 2 --seq-len 8
expect_fail train_microbatches "--batch-size 3 is not divisible by --microbatches 2" \
  "$SATDAR" train --config config.json --steps 1 --batch-size 3 --seq-len 8 --synthetic-data --microbatches 2
expect_fail train_seq_too_long "--seq-len 65 exceeds max_position_embeddings 64" \
  "$SATDAR" train --config config.json --steps 1 --batch-size 2 --seq-len 65 --synthetic-data
expect_fail train_no_data_dir "--data: cannot open folder /nonexistent" \
  "$SATDAR" train --config config.json --steps 1 --batch-size 2 --seq-len 8 --data /nonexistent
mkdir -p text && echo "Some plain text, enough for a window or two of bytes." >text/a.txt
expect_fail train_byte_vocab "byte-level text needs vocab_size >= 256" \
  "$SATDAR" train --config config.json --steps 1 --batch-size 2 --seq-len 8 --data text
expect_fail train_cuda "satdar train: error: device cuda: " \
  "$SATDAR" train --config config.json --steps 1 --batch-size 2 --seq-len 8 --synthetic-data --device cuda
expect_fail train_recompute_kind "flag --recompute must be none, selective or full, got 'partial'" \
  "$SATDAR" train --config config.json --steps 1 --batch-size 2 --seq-len 8 --synthetic-data --recompute partial
expect_fail train_gpu_comm_on_cpu "flag --gpu-comm is for --device cuda" \
  "$SATDAR" train --config config.json --steps 1 --batch-size 2 --seq-len 8 --synthetic-data --gpu-comm host
expect_fail train_bf16_on_cpu "flag --dtype must be f32 or f64, got 'bf16'" \
  "$SATDAR" train --config config.json --steps 1 --batch-size 2 --seq-len 8 --synthetic-data --dtype bf16
expect_fail train_cuda_f64 "flag --dtype must be bf16 or f32, got 'f64'" \
  "$SATDAR" train --config config.json --steps 1 --batch-size 2 --seq-len 8 --synthetic-data --device cuda --dtype f64
expect_fail train_gloo_no_rank "--launcher gloo needs --rank, --world-size and --rendezvous" \
  "$SATDAR" train --config config.json --steps 1 --batch-size 2 --seq-len 8 --synthetic-data \
  --launcher gloo
expect_fail train_gloo_world "the world has 3 ranks but --dp x --tp x --pp x --ep = dp=1 tp=2" \
  "$SATDAR" train --config config.json --steps 1 --batch-size 2 --seq-len 8 --synthetic-data \
  --tp 2 --launcher gloo --rank 0 --world-size 3 --rendezvous "$WORK/rdv"
expect_fail train_tp_zero "flag --tp must be >= 1, got 0" \
  "$SATDAR" train --config config.json --steps 1 --batch-size 2 --seq-len 8 --synthetic-data --tp 0
expect_fail train_comm_timeout "flag --comm-timeout must be >= 1, got 0" \
  "$SATDAR" train --config config.json --steps 1 --batch-size 2 --seq-len 8 --synthetic-data \
  --comm-timeout 0
expect_fail export_no_checkpoint "--checkpoint: cannot open $WORK/nope" \
  "$SATDAR" export --config config.json --checkpoint "$WORK/nope" --out "$WORK/w.safetensors"
expect_fail train_resume_no_dir "--resume and --checkpoint-every need --checkpoint-dir" \
  "$SATDAR" train --config config.json --steps 1 --batch-size 2 --seq-len 8 --synthetic-data --resume

# Impossible design combinations are rejected at config load, naming the field.
base='"vocab_size": 64, "hidden_size": 16, "intermediate_size": 32, "num_attention_heads": 2, "max_position_embeddings": 64'
echo "{$base, \"num_hidden_layers\": 2, \"residual\": \"dar\", \"block_size\": 3}" >dar_odd.json
echo "{$base, \"num_hidden_layers\": 2, \"moe\": {\"num_experts\": 2, \"top_k\": 3, \"expert_intermediate_size\": 8}}" >topk.json
echo "{$base, \"num_hidden_layers\": 1, \"value_residual\": \"satformer\"}" >vr_one_layer.json
echo "{$base, \"num_hidden_layers\": 2, \"residual\": \"attnres\", \"block_size\": 5}" >attnres_odd.json
expect_fail dar_odd_block 'field "block_size" must be even and >= 2 for dar' \
  "$SATDAR" train --config dar_odd.json --steps 1 --batch-size 2 --seq-len 8 --synthetic-data
expect_fail moe_top_k 'field "moe.top_k" (3) must not exceed moe.num_experts (2)' \
  "$SATDAR" train --config topk.json --steps 1 --batch-size 2 --seq-len 8 --synthetic-data
expect_fail value_residual_one_layer 'field "value_residual" needs at least 2 layers' \
  "$SATDAR" grad --config vr_one_layer.json "${G[@]}"
expect_fail attnres_odd_block 'field "block_size" must be 1 (full) or even for attnres' \
  "$SATDAR" info --config attnres_odd.json
expect_fail eval_ablation_without_gates 'gates exist only with "satformer"' \
  "$SATDAR" eval --config config.json --weights weights.safetensors --synthetic-data \
  --seq-len 8 --gate-ablation zero
expect_fail eval_bad_ablation "flag --gate-ablation must be none, zero or mean, got 'half'" \
  "$SATDAR" eval --config config.json --weights weights.safetensors --synthetic-data \
  --seq-len 8 --gate-ablation half
echo "{$base, \"num_hidden_layers\": 2, \"residual\": \"dar\"}" >dar_ok.json
"$SATDAR" init --config dar_ok.json --out dar_weights.safetensors
expect_fail eval_weights_of_other_model \
  'dar_weights.safetensors was written for a different model config: field "residual" is "dar" there, "standard" in this config' \
  "$SATDAR" eval --config config.json --weights dar_weights.safetensors \
  --synthetic-data --seq-len 8

# The client commands name their positional argument, when it is missing and in --help.
expect_fail status_no_job "give the job id (usage: satdar status JOB [flags])" "$SATDAR" status --json
expect_fail cancel_no_job "give the job id (usage: satdar cancel JOB [flags])" "$SATDAR" cancel
expect_fail logs_no_job "give the job id (usage: satdar logs JOB [flags])" "$SATDAR" logs --rank 0
expect_fail submit_no_spec "give the job spec file (JOB.json) (usage: satdar submit JOB.json [flags])" \
  "$SATDAR" submit --follow
for c in "status JOB" "cancel JOB" "logs JOB" "submit JOB.json" "jobs" "workers"; do
  if [[ $("$SATDAR" ${c%% *} --help | head -1) == "usage: satdar $c [flags]" ]]; then
    echo "ok   help_${c%% *}"; passed=$((passed + 1))
  else
    echo "FAIL help_${c%% *}: $("$SATDAR" ${c%% *} --help | head -1)"; failed=$((failed + 1))
  fi
done

# And the good path works: grad writes every gradient.
"$SATDAR" grad --config config.json "${G[@]}" || { echo "FAIL good grad"; failed=$((failed + 1)); }
[[ -s out.safetensors ]] && passed=$((passed + 1)) || { echo "FAIL no grad output"; failed=$((failed + 1)); }

# Layer 0's ResFormer lambda2 is never read: weights may omit it, and then get no gradient.
cat >resformer.json <<'JSON'
{"vocab_size": 64, "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 2, "max_position_embeddings": 512,
 "num_attention_heads": 2, "value_residual": "resformer", "resformer_mode": "learnable_plus"}
JSON
"$SATDAR" init --config resformer.json --out resformer.safetensors
python3 - <<'PY'
import json, struct
raw = open("resformer.safetensors", "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
header = json.loads(raw[8:8 + n])
assert "model.layers.0.self_attn.lambda2" in header
del header["model.layers.0.self_attn.lambda2"]
h = json.dumps(header).encode()
h += b" " * ((8 - (8 + len(h)) % 8) % 8)
open("resformer_no_l0.safetensors", "wb").write(struct.pack("<Q", len(h)) + h + raw[8 + n:])
PY
if "$SATDAR" grad --config resformer.json --weights resformer_no_l0.safetensors \
     --tokens tokens.safetensors --out resformer_grad.safetensors &&
   python3 -c "
import json, struct, sys
raw = open('resformer_grad.safetensors', 'rb').read()
names = json.loads(raw[8:8 + struct.unpack('<Q', raw[:8])[0]])
sys.exit(0 if 'grad.model.layers.0.self_attn.lambda2' not in names
         and 'grad.model.layers.1.self_attn.lambda2' in names else 1)"; then
  echo "ok   resformer_unused_lambda2_optional"; passed=$((passed + 1))
else
  echo "FAIL resformer_unused_lambda2_optional"; failed=$((failed + 1))
fi

echo "$passed passed, $failed failed"
[[ $failed -eq 0 ]]
