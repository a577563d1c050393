# tests/parallel_testlib.sh: sourced by the multi-rank test scripts.
# MPIRUN: mpirun as root over loopback TCP, more ranks than cores allowed.
MPIRUN=(mpirun --allow-run-as-root --oversubscribe --mca btl self,tcp --mca btl_tcp_if_include lo
        --mca oob_tcp_if_include lo)

# write_small_configs: base.json (vocab 64, d=32, L=2, 4 heads, 2 KV heads) and the four designs
# every parallel layout is checked with: baseline, satformer, dar (Block DAR, S=4), dar_moe.
write_small_configs() {
  cat >base.json <<'JSON'
{"vocab_size": 64, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "max_position_embeddings": 512,
 "num_attention_heads": 4, "num_key_value_heads": 2}
JSON
  python3 - <<'PY'
import json
base = json.load(open("base.json"))
json.dump(base, open("baseline.json", "w"))
json.dump(dict(base, value_residual="satformer"), open("satformer.json", "w"))
json.dump(dict(base, residual="dar", block_size=4), open("dar.json", "w"))
json.dump(dict(base, residual="dar", block_size=4, moe={"num_experts": 4, "top_k": 2,
          "expert_intermediate_size": 16}), open("dar_moe.json", "w"))
PY
}

# enter_workdir NAME: a fresh $WORK under the test's temporary folder, made the current folder,
# Bazel's premature-exit and XML files unset for the processes the test starts, and the
# pass/fail counters at zero.
enter_workdir() {
  WORK="${TEST_TMPDIR:-/tmp/satdar-test-$$}/$1"
  rm -rf "$WORK" && mkdir -p "$WORK" && cd "$WORK" || exit 1
  unset TEST_PREMATURE_EXIT_FILE XML_OUTPUT_FILE
  passed=0
  failed=0
}
