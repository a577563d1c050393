#!/usr/bin/env bash
# Gradient buckets, reduction roles and the planner's counts come from the parameter table's
# roles and block ranges (model/param_table.h: ParamSpec::role, ParamTable::BlockStarts), not
# from parameter-name strings. Only the table's builders and the designs that bind their own
# parameters may spell the decoder's names: model/decoder.cc, model/branches.{h,cc},
# model/param_layout.h, model/param_table.h and model/variants/.
# Usage: param_names_test.sh FILE... (the sources of cli/, runtime/, agent/, coordinator/, comm/,
# data/, metrics/, parallel/ and model/)
set -uo pipefail
PATTERN='"(model\.embed_tokens\.weight|model\.norm\.weight|lm_head\.weight)"|input_layernorm'
ALLOWED='^model/(decoder\.cc|branches\.(h|cc)|param_layout\.h|param_table\.h|variants/.*)$'
scanned=0
allowed_hits=0
bad=()
for f in "$@"; do
  scanned=$((scanned + 1))
  hits=$(grep -nE "$PATTERN" "$f" || true)
  [[ -z $hits ]] && continue
  if [[ $f =~ $ALLOWED ]]; then
    allowed_hits=$((allowed_hits + 1))
  else
    while IFS= read -r line; do bad+=("$f:$line"); done <<<"$hits"
  fi
done
# The scan must have seen the sources and the pattern must match where the names are defined,
# or this test proves nothing.
if ((scanned < 100)); then
  echo "FAIL: only $scanned files to scan; expected the C++ sources of seven packages"
  exit 1
fi
if ((allowed_hits < 2)); then
  echo "FAIL: the pattern matched in $allowed_hits of the table's builders (model/decoder.cc and"
  echo "model/branches.cc define these names); the pattern or the file list is wrong"
  exit 1
fi
if ((${#bad[@]} > 0)); then
  echo "FAIL: parameter names outside the table's builders (use ParamSpec::role, layer or"
  echo "ParamTable::BlockStarts instead):"
  printf '  %s\n' "${bad[@]}"
  exit 1
fi
echo "ok: $scanned files scanned, parameter names only in the table's builders ($allowed_hits files)"
