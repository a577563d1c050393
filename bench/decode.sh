#!/usr/bin/env bash
# Greedy decode speed of `satdar generate` next to PyTorch 1.13 (eager, fp32, its own KV cache:
# bench/pytorch_decode.py) on the same weights (`satdar init`), at 1 and 2 threads, and checks
# that both emit the same token ids. Prints a markdown table for docs/PERFORMANCE.md.
# Builds nothing: needs bazel-bin/satdar (or $SATDAR) with the generate command.
# Usage: bench/decode.sh [CONFIG...]            (default: configs/demo.json)
#   env: NEW_TOKENS (128), THREADS ("1 2"), PROMPT_IDS (8 fixed ids < 256, valid for every config), SEED (0),
#        SATDAR (bazel-bin/satdar), PYTHON (/usr/bin/python3), GENERATE_FLAGS (extra flags)
# Random-init weights make greedy output degenerate (a token repeated), which is fine for speed.
# Ids must match; float32 rounding (different GEMM shapes) may flip a near-tie late in the run,
# so a later divergence is reported with its position, and only a differing first token fails.
# satdar's tokens/s is the one it prints; if none is found, new tokens / wall time of the whole
# command (weights loading included) is shown, marked "(wall)".
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
SATDAR=${SATDAR:-bazel-bin/satdar}
PYTHON=${PYTHON:-/usr/bin/python3}
NEW_TOKENS=${NEW_TOKENS:-128}
THREADS=${THREADS:-1 2}
PROMPT_IDS=${PROMPT_IDS:-5,17,42,99,7,200,101,12}
SEED=${SEED:-0}
GENERATE_FLAGS=${GENERATE_FLAGS:-}
if [[ $# -eq 0 ]]; then set -- configs/demo.json; fi

if [[ ! -x $SATDAR ]]; then
  echo "decode.sh: $SATDAR not found; build it first (bazel build //:satdar)" >&2
  exit 2
fi
if ! "$SATDAR" generate --help >/dev/null 2>&1; then
  echo "decode.sh: $SATDAR has no working 'generate' command; rebuild it" >&2
  exit 2
fi
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT

# One result line per run in $OUT/results.jsonl: config, threads, both outputs, satdar wall time.
for config in "$@"; do
  name=$(basename "$config" .json)
  weights="$OUT/$name.safetensors"
  "$SATDAR" init --config "$config" --out "$weights" --seed "$SEED" >/dev/null
  for t in $THREADS; do
    echo "$name, $t thread(s): satdar generate ..." >&2
    start=$(date +%s.%N)
    # shellcheck disable=SC2086  # GENERATE_FLAGS is a list of flags
    "$SATDAR" generate --config "$config" --weights "$weights" --prompt-ids "$PROMPT_IDS" \
      --max-new-tokens "$NEW_TOKENS" --threads "$t" --json $GENERATE_FLAGS \
      >"$OUT/satdar.out" 2>"$OUT/satdar.err" || {
        echo "decode.sh: satdar generate failed:" >&2; cat "$OUT/satdar.err" >&2; exit 1; }
    end=$(date +%s.%N)
    echo "$name, $t thread(s): pytorch ..." >&2
    "$PYTHON" bench/pytorch_decode.py --config "$config" --weights "$weights" \
      --prompt-ids "$PROMPT_IDS" --max-new-tokens "$NEW_TOKENS" --threads "$t" --json \
      >"$OUT/torch.out" || {
        echo "decode.sh: pytorch_decode.py failed (status 1: its cached and uncached" \
          "decodes differ at the first token)" >&2; cat "$OUT/torch.out" >&2; exit 1; }
    "$PYTHON" - "$OUT" "$config" "$t" "$start" "$end" >>"$OUT/results.jsonl" <<'PY'
import json, sys
out, config, threads, start, end = sys.argv[1:]
def lines(path):
    with open(path) as f:
        return f.read().splitlines()
record = {'config': config, 'threads': int(threads), 'wall': float(end) - float(start),
          'satdar_out': lines(out + '/satdar.out'), 'satdar_err': lines(out + '/satdar.err'),
          'torch': json.loads(lines(out + '/torch.out')[-1])}
print(json.dumps(record))
PY
  done
done

"$PYTHON" - "$OUT/results.jsonl" "$PROMPT_IDS" "$NEW_TOKENS" <<'PY'
import json, os, re, subprocess, sys, time

def design(config_path):
    with open(config_path) as f:
        c = json.load(f)
    parts = [] if c.get('residual', 'standard') == 'standard' else [c['residual']]
    if c.get('value_residual', 'none') != 'none':
        parts.append(c['value_residual'])
    if c.get('moe'):
        parts.append('moe')
    name = config_path.rsplit('/', 1)[-1][:-len('.json')]
    return f"{name} ({'+'.join(parts) or 'transformer'})"

def satdar_ids(lines):
    for line in lines:
        line = line.strip()
        if line.startswith('{'):
            try:
                obj = json.loads(line)
            except ValueError:
                continue
            if isinstance(obj, dict) and isinstance(obj.get('ids'), list):
                return obj['ids']
    return None

RATE = [re.compile(r'tok(?:en)?s?[ _]*(?:/|per[ _]*)s(?:ec(?:ond)?)?\W{0,3}\s*([0-9][0-9.eE+]*)',
                   re.I),
        re.compile(r'([0-9][0-9.eE+]*)\s*(?:new\s+)?tok(?:en)?s?\s*/\s*s', re.I)]

def satdar_rate(lines):
    """The tokens/s satdar printed (a JSON field or a 'N tokens/s' text); None if none."""
    for line in reversed(lines):
        s = line.strip()
        if s.startswith('{'):
            try:
                obj = json.loads(s)
            except ValueError:
                obj = None
            if isinstance(obj, dict):
                for key, value in obj.items():
                    if re.search(r'tok.*(per_s|_s$|/s)', key) and isinstance(value, (int, float)):
                        return float(value)
                continue
        for pattern in RATE:
            m = pattern.search(s)
            if m:
                try:
                    return float(m.group(1))
                except ValueError:
                    pass
    return None

def divergence(a, b):
    for i in range(max(len(a), len(b))):
        if i >= len(a) or i >= len(b) or a[i] != b[i]:
            return i
    return None

cpu = subprocess.run(['lscpu'], capture_output=True, text=True).stdout
model = next((l.split(':', 1)[1].strip() for l in cpu.splitlines()
              if l.startswith('Model name:')), 'unknown CPU')
print(f"{time.strftime('%Y-%m-%d', time.gmtime())}, {model}, {os.cpu_count()} cores; "
      f"greedy, prompt {sys.argv[2]}, {sys.argv[3]} new tokens, fp32, `satdar init` weights\n")
print('| design | threads | satdar tok/s | PyTorch tok/s (KV cache) | PyTorch, no cache | '
      'satdar / PyTorch | same ids |')
print('|---|---|---|---|---|---|---|')
failed = False
with open(sys.argv[1]) as f:
    records = [json.loads(l) for l in f]
for r in records:
    torch_result = r['torch']
    ids = satdar_ids(r['satdar_out'] + r['satdar_err'])
    if ids is None:
        print(f"decode.sh: no JSON line with ids in satdar's output for {r['config']}",
              file=sys.stderr)
        failed = True
        continue
    rate = satdar_rate(r['satdar_err'] + r['satdar_out'])
    shown = f'{rate:.0f}' if rate is not None else f"{len(ids) / r['wall']:.0f} (wall)"
    rate = rate if rate is not None else len(ids) / r['wall']
    first = divergence(ids, torch_result['ids'])
    if first is None:
        same = f'yes ({len(ids)})'
    else:
        same = f'from token {first} on'
        if first == 0:
            failed = True
    if first is not None:
        print(f"decode.sh: {r['config']} threads {r['threads']}: ids differ at {first}\n"
              f"  satdar  {ids}\n  pytorch {torch_result['ids']}", file=sys.stderr)
    if torch_result.get('match') is False:
        print(f"decode.sh: pytorch cached/uncached ids differ at "
              f"{torch_result['first_divergence']}", file=sys.stderr)
    nocache = torch_result.get('nocache_tokens_per_s')
    print(f"| {design(r['config'])} | {r['threads']} | {shown} | "
          f"{torch_result['tokens_per_s']:.0f} | "
          f"{'-' if nocache is None else f'{nocache:.0f}'} | "
          f"{rate / torch_result['tokens_per_s']:.2f}x | {same} |")
sys.exit(1 if failed else 0)
PY
