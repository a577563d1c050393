#!/usr/bin/env bash
# deploy/ on its own: the Prometheus config and rules load (promtool), every alert's unit test
# passes (promtool test rules), the Grafana dashboard is JSON with a job_id variable and a
# PromQL expression per target, and its legends template only labels their series have.
set -u
cd "$(dirname "$(realpath "$0")")"
[[ -d prometheus ]] || cd "${TEST_SRCDIR:-.}/${TEST_WORKSPACE:-satdar}/deploy"
command -v promtool >/dev/null || { echo "FAIL promtool is not installed (scripts/setup.sh)"; exit 1; }
failed=0
run() { if out=$("$@" 2>&1); then echo "ok   $*"; else echo "FAIL $*"; echo "$out"; failed=1; fi; }
run promtool check config prometheus/prometheus.yml
run promtool check rules prometheus/satdar_alerts.yml
run promtool test rules prometheus/satdar_alerts_test.yml
run /usr/bin/python3 -c "
import json
d = json.load(open('grafana/satdar.json'))
assert any(v['name'] == 'job_id' for v in d['templating']['list'])
targets = [t for p in d['panels'] for t in p.get('targets', [])]
assert targets and all(t['expr'].strip() for t in targets)
titles = ' '.join(p['title'] for p in d['panels']).lower()
for want in ('tokens', 'mfu', 'loss', 'phase', 'memory', 'communication', 'gate', 'depth', 'expert'):
    assert want in titles, want
"
# Every legend of the dashboard is text and {{label}} templates (no stray braces: Grafana
# prints `{{{{rank}}}}` as it stands), and each label is one the series of its expression has:
# the metric's labels as docs/OBSERVABILITY.md lists them (rank metrics also carry job_id, rank
# and the service discovery's worker; every target instance and job), narrowed by the outermost
# aggregation (`by`, `without`, none) and histogram_quantile (drops le).
run /usr/bin/python3 - grafana/satdar.json ../docs/OBSERVABILITY.md <<'PY'
import json, re, sys
dash = json.load(open(sys.argv[1]))
families, section = {}, None
for line in open(sys.argv[2]):
    if line.startswith("## "):
        section = line[3:].strip()
    if not line.startswith("| `satdar_"):
        continue
    cols = [c.strip() for c in line.strip().strip("|").split("|")]
    names, kind = re.findall(r"`(satdar_\w+)`", cols[0]), cols[1]
    labels = set(re.findall(r"`(\w+)`", cols[2])) | {"instance", "job"}
    if section == "Rank metrics":
        labels |= {"job_id", "rank", "worker"}
    for n in names:
        families[n] = labels
        if kind == "histogram":
            families[n + "_bucket"] = labels | {"le"}
            families[n + "_sum"] = families[n + "_count"] = labels
assert "satdar_train_mfu_ratio" in families and "satdar_jobs" in families, sorted(families)
AGG = r"(?:sum|avg|min|max|count|group|stddev|stdvar|topk|bottomk|quantile)"
def close(s, i):  # s[i] == "(": the index of its ")"
    depth = 0
    for j in range(i, len(s)):
        depth += {"(": 1, ")": -1}.get(s[j], 0)
        if depth == 0:
            return j
    raise ValueError("unbalanced: " + s)
def left_operand(s):  # the expression up to its first top-level binary operator
    depth, quoted = 0, False
    for i, c in enumerate(s):
        if c == '"':
            quoted = not quoted
        elif not quoted:
            depth += {"(": 1, "[": 1, "{": 1, ")": -1, "]": -1, "}": -1}.get(c, 0)
            if depth == 0 and c in "/*+-<>=!^%" and i > 0:
                return s[:i].strip()
    return s.strip()
def labels(expr):  # the labels of the series expr returns
    s = left_operand(expr.strip())
    m = re.match(AGG + r"\s*(?:(by|without)\s*\(([^)]*)\))?\s*\(", s)
    if m:
        inner = s[m.end() - 1:close(s, m.end() - 1) + 1]
        rest = s[m.end() - 1 + len(inner):]
        clause, names = m.group(1), m.group(2)
        post = re.match(r"\s*(by|without)\s*\(([^)]*)\)", rest)
        if post:
            clause, names = post.group(1), post.group(2)
        names = {n.strip() for n in (names or "").split(",") if n.strip()}
        if clause == "by":
            return names
        if clause == "without":
            return labels(inner[1:-1]) - names
        return set()
    m = re.match(r"histogram_quantile\s*\(", s)
    if m:
        args = s[m.end():close(s, m.end() - 1)]
        return labels(args.split(",", 1)[1]) - {"le"}
    m = re.match(r"scalar\s*\(", s)
    if m:
        return set()
    m = re.match(r"\w+\s*\(", s)  # rate, increase, ...: the labels of their argument
    if m and not s.startswith("satdar_"):
        return labels(s[m.end():close(s, m.end() - 1)])
    m = re.match(r"(satdar_\w+)", s)
    assert m, "cannot read the series of %r" % expr
    assert m.group(1) in families, "%s is not in docs/OBSERVABILITY.md" % m.group(1)
    return set(families[m.group(1)])
bad = 0
for p in dash["panels"]:
    for t in p.get("targets", []):
        legend = t.get("legendFormat", "")
        used = re.findall(r"\{\{\s*(\w+)\s*\}\}", legend)
        if "{" in re.sub(r"\{\{\s*\w+\s*\}\}", "", legend) or "}" in re.sub(r"\{\{\s*\w+\s*\}\}", "", legend):
            print("legend %r of %r: braces that are not {{label}}" % (legend, p["title"])); bad += 1
        have = labels(t["expr"])
        for name in used:
            if name not in have:
                print("legend %r of %r: %s is not a label of %s (has %s)" %
                      (legend, p["title"], name, t["expr"], sorted(have))); bad += 1
assert not bad, "%d bad legends" % bad
PY
exit $failed
