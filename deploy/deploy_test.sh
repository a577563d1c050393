#!/usr/bin/env bash
# deploy/ on its own: the Prometheus config and rules load (promtool), every alert's unit test
# passes (promtool test rules), the Grafana dashboard is JSON with a job_id variable and a
# PromQL expression per target.
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
exit $failed
