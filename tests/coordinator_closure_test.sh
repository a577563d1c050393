#!/usr/bin/env bash
# The coordinator links no kernels (issue 30): the build closure of //coordinator:coordinator
# (the server, the scheduler, the store and job-spec validation) holds no CUDA, no OpenBLAS, no
# model kernels and no model, comm or parallel runtime, and nothing of cli/, runtime/ or agent/
# (the folders do not depend on each other both ways: the command line, cli/, links the
# coordinator). A job spec is checked against the config, the layout rules (model:config,
# model:layout_check) and the training settings (settings:train_settings), which are plain C++.
# Usage: coordinator_closure_test.sh DEPS_FILE (the genquery output: one label per line)
set -uo pipefail
DEPS=$1
[[ -s $DEPS ]] || { echo "FAIL: $DEPS is empty"; exit 1; }
# The closure must be the real one: the coordinator's own libraries and what it is allowed.
for want in //coordinator:coordinator //coordinator:job_spec //model:layout_check \
  //settings:train_settings @system//:grpc @system//:sqlite; do
  grep -qx "$want" "$DEPS" || { echo "FAIL: $want is not in the closure; is $DEPS the coordinator's?"; exit 1; }
done
# What it must not hold: kernels and their libraries, the model, the runtime.
FORBIDDEN='^(@system//:openblas|@local_cuda//.*|//core/ops:.*|//core/cuda.*|//model:(model|layers|cuda_kernels|device_model|memory_estimate|cost_model|layout_search)|//parallel:.*|//(cli|runtime|agent):.*|//comm:(nccl|mpi|gloo|staged).*)$'
bad=$(grep -E "$FORBIDDEN" "$DEPS" || true)
if [[ -n $bad ]]; then
  echo "FAIL: the coordinator's build closure holds kernels, the training runtime, cli/ or agent/:"
  echo "$bad" | sed 's/^/  /'
  echo "(bazel query 'somepath(//coordinator:coordinator, LABEL)' shows which dependency brings it)"
  exit 1
fi
echo "ok: $(wc -l <"$DEPS") targets in the coordinator's closure, no kernels, no model runtime, nothing of cli/, runtime/ or agent/"
