#!/usr/bin/env bash
# Runs an independent PyTorch reference driver against `satdar grad`.
# Usage: run_reference.sh PATH_TO_SATDAR DRIVER.py
# Needs Debian's python3-torch (scripts/setup.sh installs it) at /usr/bin/python3.
set -u
SATDAR=$(realpath "$1")
HERE=$(dirname "$(realpath "${BASH_SOURCE[0]}")")
if ! /usr/bin/python3 -c "import torch" 2>/dev/null; then
  echo "torch is not importable by /usr/bin/python3: run scripts/setup.sh (installs python3-torch)"
  exit 1
fi
WORK="${TEST_TMPDIR:-/tmp/satdar-test-$$}/ref"
rm -rf "$WORK" && mkdir -p "$WORK"
exec /usr/bin/python3 "$HERE/$2" --satdar "$SATDAR" --workdir "$WORK" --threads 2
