#!/usr/bin/env bash
# Runs a test binary on N MPI ranks of this machine: run_mpi.sh N BINARY [ARGS...]
set -u
n=$1
shift
# Bazel gives every process the same premature-exit and XML files; ranks must not share them.
unset TEST_PREMATURE_EXIT_FILE XML_OUTPUT_FILE
exec mpirun --allow-run-as-root --oversubscribe -np "$n" --mca btl self,tcp \
  --mca btl_tcp_if_include lo --mca oob_tcp_if_include lo "$@"
