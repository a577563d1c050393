#!/usr/bin/env bash
# The GPU path on the CUDA simulator (docs/GPU.md, "The CUDA simulator build"): every
# gpu-tagged test, built with --repo_env=SATDAR_CUDA=sim, so the real .cu kernels, cuBLASLt and
# NCCL calls run on the CPU against the CPU reference (the simulator's own tests are plain C++
# and run in scripts/test.sh's build). .ci/run runs it after scripts/test.sh. Other arguments
# go to `bazel test`; the last line counts the tests as scripts/test.sh does.
exec bash "$(dirname "${BASH_SOURCE[0]}")/test.sh" --repo_env=SATDAR_CUDA=sim \
  --test_tag_filters=gpu --build_tests_only "$@"
