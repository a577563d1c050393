#!/usr/bin/env bash
# Two satdar binaries on the same CPU shape, interleaved run by run (the VM's speed drifts, so
# back-to-back pairs are the fair comparison): tokens/s and peak RSS per run.
#   bench/side_by_side.sh OLD_BINARY NEW_BINARY [ROUNDS] [DESIGN ...]
# DESIGN names a config in configs/bench/ (default: transformer dar resformer).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
old=$1 new=$2 rounds=${3:-2}
shift $(( $# < 3 ? $# : 3 ))
designs=("$@")
[ ${#designs[@]} -eq 0 ] && designs=(transformer dar resformer)
export OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-Haswell}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "round design binary tokens_per_second peak_rss_mib"
for round in $(seq "$rounds"); do
  for design in "${designs[@]}"; do
    for side in old new; do
      bin=$old
      [ "$side" = new ] && bin=$new
      "$bin" train --config "configs/bench/$design.json" --synthetic-data --steps 20 \
        --batch-size 8 --seq-len 256 --threads 2 --quiet --summary-json "$tmp/s.json"
      python3 -c "import json,sys; j=json.load(open(sys.argv[1])); print(sys.argv[2], sys.argv[3], sys.argv[4], round(j['tokens_per_second']), round(j['peak_rss_bytes']/1048576, 1))" \
        "$tmp/s.json" "$round" "$design" "$side"
    done
  done
done
