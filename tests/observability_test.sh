#!/usr/bin/env bash
# Observability end to end, as real processes on loopback: a coordinator (--http), two workers
# and a pipeline-parallel DAR + SATFormer + MoE job on a prepared dataset. promtool checks every
# /metrics page during startup, training, a restart (a rank killed with SIGKILL) and shutdown;
# the real Prometheus server discovers the ranks through the coordinator and scrapes them; every
# PromQL expression of the Grafana dashboard and the alert rules parses and returns data; the
# built-in dashboard loads in headless Chromium with its charts drawn, and compares the job with a
# second, short one of another design on a third worker (overlaid curves, designs in the
# legends, the values under the cursor equal to the API's); screenshots are kept in the test
# outputs.
# Usage: observability_test.sh PATH_TO_SATDAR DEPLOY_DIR
set -u
SATDAR=$(realpath "$1")
HERE=$(dirname "$(realpath "$0")")
DEPLOY=$(realpath "$2")
WORK="${TEST_TMPDIR:-/tmp/satdar-test-$$}/observability"
OUT="${TEST_UNDECLARED_OUTPUTS_DIR:-$WORK/outputs}"
rm -rf "$WORK" && mkdir -p "$WORK" "$OUT"
cd "$WORK"
unset TEST_PREMATURE_EXIT_FILE XML_OUTPUT_FILE SATDAR_COORDINATOR SATDAR_TOKEN_FILE
passed=0
failed=0
ok() { echo "ok   $1"; passed=$((passed + 1)); }
fail() { echo "FAIL $1"; failed=$((failed + 1)); }
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null; done; pkill -9 -f "$WORK" 2>/dev/null; }
trap cleanup EXIT
for tool in promtool prometheus chromium curl; do
  command -v "$tool" >/dev/null || { echo "FAIL $tool is not installed (scripts/setup.sh installs it)"; exit 1; }
done
PY=/usr/bin/python3

# check_metrics NAME URL: the page (if one is served) passes promtool; returns 1 when nothing
# answered.
check_metrics() {
  local body="$WORK/scrape.txt" code
  code=$(curl -s -o "$body" -w '%{http_code}' --max-time 5 "$2") || return 1
  [[ $code == 200 ]] || { fail "$1: HTTP $code from $2"; return 0; }
  if out=$(promtool check metrics <"$body" 2>&1) && [[ -z $out ]]; then
    return 0
  fi
  fail "$1: promtool check metrics on $2: $out"
  head -c 2000 "$body"
  return 0
}
targets() { curl -s --max-time 5 "http://$HTTP/prometheus/targets"; }
target_count() { targets | $PY -c "import json,sys; print(len(json.load(sys.stdin)))" 2>/dev/null || echo 0; }
target_urls() {
  targets | $PY -c "import json,sys; [print('http://%s/metrics' % g['targets'][0]) for g in json.load(sys.stdin)]"
}
field() {
  "$SATDAR" status "$1" --coordinator "$ADDR" --json |
    $PY -c "import json,sys; print(json.load(sys.stdin)['$2'])"
}

# ---- a small Brown-layout corpus and its dataset (validation needs a prepared dataset) ----
$PY "$HERE/tiny_brown.py" 40
"$SATDAR" prep --input brown --out ds --vocab-size 300 --val-fraction 0.2 --quiet >prep.log 2>&1 \
  || { cat prep.log; echo "FAIL prep"; exit 1; }
cat >model.json <<'JSON'
{"vocab_size": 300, "hidden_size": 32, "num_hidden_layers": 4, "num_attention_heads": 4,
 "num_key_value_heads": 2, "max_position_embeddings": 64, "residual": "dar", "block_size": 2,
 "value_residual": "satformer",
 "moe": {"num_experts": 4, "top_k": 2, "expert_intermediate_size": 32}}
JSON
cat >job.json <<'JSON'
{"name": "observed", "config": "model.json",
 "train": {"steps": 100000, "batch_size": 4, "seq_len": 32, "data": "ds", "lr": 0.002,
           "stats_every": 2, "eval_every": 20, "eval_batches": 1, "log_every": 20,
           "checkpoint_every": 25},
 "layout": {"pp": 2, "microbatches": 2}, "max_restarts": 3}
JSON

# ---- startup ----
mkdir -p state shared
"$SATDAR" coordinator --listen 127.0.0.1:0 --http 127.0.0.1:0 --state-dir state \
  --lease-seconds 15 >coordinator.log 2>&1 &
COORD=$!
PIDS+=("$COORD")
for _ in $(seq 1 100); do [[ -s state/coordinator.json ]] && break; sleep 0.05; done
ADDR=$($PY -c "import json; print(json.load(open('state/coordinator.json'))['grpc'])")
HTTP=$($PY -c "import json; print(json.load(open('state/coordinator.json'))['http'])")
[[ -n $HTTP && $HTTP != None ]] && ok "coordinator.json names the bound HTTP address ($HTTP)" \
  || fail "coordinator.json has no http address"
check_metrics "coordinator at startup" "http://$HTTP/metrics" && ok "coordinator /metrics at startup"
code=$(curl -s -o /dev/null -w '%{http_code}' "http://$HTTP/no/such/page")
[[ $code == 404 ]] && ok "an unknown path is 404" || fail "unknown path gave $code"
code=$(curl -s -o /dev/null -w '%{http_code}' "http://$HTTP/api/jobs/job-nope")
[[ $code == 404 ]] && ok "an unknown job is 404" || fail "unknown job gave $code"
[[ $(targets) == "[]" ]] && ok "no targets before a job runs" || fail "targets before any job: $(targets)"

for w in a b; do
  "$SATDAR" worker --coordinator "$ADDR" --slots 1 --work-dir "work-$w" --shared-dir shared \
    --data-root "$WORK" --name "$w" --stop-grace-seconds 2 >"worker-$w.log" 2>&1 &
  PIDS+=("$!")
done
JOB=$("$SATDAR" submit job.json --coordinator "$ADDR")
[[ $JOB == job-* ]] && ok "submitted $JOB" || { fail "submit: $JOB"; exit 1; }
# Scrape the ranks as soon as they are listed: during the rendezvous and the first steps.
for _ in $(seq 1 300); do [[ $(target_count) == 2 ]] && break; sleep 0.1; done
[[ $(target_count) == 2 ]] && ok "service discovery lists both ranks" || fail "targets: $(targets)"
early=0
for u in $(target_urls); do check_metrics "rank at startup" "$u" && early=$((early + 1)); done
[[ $early == 2 ]] && ok "both ranks serve valid /metrics from the start"
targets | $PY -c "
import json, sys
groups = json.load(sys.stdin)
ranks = sorted(g['labels']['rank'] for g in groups)
assert ranks == ['0', '1'], ranks
assert all(g['labels']['job_id'] == '$JOB' and g['labels']['worker'] for g in groups), groups
" && ok "targets carry job_id, rank and worker" || fail "target labels: $(targets)"

# ---- the real Prometheus: service discovery, scrapes, queries ----
PROM_PORT=$($PY -c "import socket; s=socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])")
mkdir -p prom
sed -e "s/localhost:8080/$HTTP/g" -e "s/scrape_interval: 10s/scrape_interval: 1s/" \
    -e "s/evaluation_interval: 10s/evaluation_interval: 1s/" -e "s/refresh_interval: 10s/refresh_interval: 1s/" \
    "$DEPLOY/prometheus/prometheus.yml" >prom/prometheus.yml
cp "$DEPLOY/prometheus/satdar_alerts.yml" prom/
promtool check config prom/prometheus.yml >prom/check.log 2>&1 && ok "promtool check config" \
  || { fail "promtool check config"; cat prom/check.log; }
prometheus --config.file=prom/prometheus.yml --storage.tsdb.path=prom/data \
  --web.listen-address="127.0.0.1:$PROM_PORT" >prom/prometheus.log 2>&1 &
PIDS+=("$!")
PROM="http://127.0.0.1:$PROM_PORT"
query() {  # query PROMQL: the result list as JSON, or "error: ..."
  curl -s --max-time 10 "$PROM/api/v1/query" --data-urlencode "query=$1" |
    $PY -c "
import json, sys
r = json.load(sys.stdin)
print(json.dumps(r['data']['result']) if r.get('status') == 'success' else 'error: ' + r.get('error', '?'))" 2>/dev/null
}
up_count() { query 'count(up{job="satdar-ranks"} == 1)' | $PY -c "import json,sys; r=json.load(sys.stdin); print(r[0]['value'][1] if r else 0)" 2>/dev/null; }
for _ in $(seq 1 600); do [[ $(up_count) == 2 ]] && break; sleep 0.1; done
diagnose() {  # the job, its ranks' last lines, the workers' logs
  "$SATDAR" status "$JOB" --coordinator "$ADDR"
  tail -n 5 work-*/jobs/*/attempt-*/rank-*.log worker-*.log 2>/dev/null
}
[[ $(up_count) == 2 ]] && ok "Prometheus discovered and scrapes both ranks" \
  || { fail "Prometheus targets: $(curl -s "$PROM/api/v1/targets" | head -c 2000)"; diagnose; }
tokens() { query "satdar_train_tokens_total{job_id=\"$JOB\"}" | $PY -c "
import json, sys
print(' '.join('%s=%s' % (r['metric']['rank'], r['value'][1]) for r in sorted(json.load(sys.stdin), key=lambda r: r['metric']['rank'])))"; }
sleep 3
first=$(tokens)
# Enough history for rate() over the dashboard's windows, statistics, an evaluation.
sleep 12
second=$(tokens)
$PY -c "
a = dict(x.split('=') for x in '$first'.split()); b = dict(x.split('=') for x in '$second'.split())
assert sorted(b) == ['0', '1'], b
assert all(float(b[r]) > float(a.get(r, 0)) for r in b), (a, b)
" && ok "every rank's tokens counter increased ($first -> $second)" || fail "tokens: $first -> $second"
gates=$(query "count(satdar_satformer_gate_mean{job_id=\"$JOB\"})")
[[ $gates == *'"value"'* ]] && ok "the gate metrics exist in Prometheus" || fail "gate metrics: $gates"

# Every expression of the Grafana dashboard (job_id set) parses and returns data; the GPU
# memory panel has nothing to show for a CPU job.
$PY - "$DEPLOY/grafana/satdar.json" "$JOB" "$PROM" >grafana.log 2>&1 <<'PYEOF'
import json, sys, urllib.parse, urllib.request
dash, job, prom = json.load(open(sys.argv[1])), sys.argv[2], sys.argv[3]
names = {v["name"] for v in dash["templating"]["list"]}
assert {"job_id", "datasource"} <= names, names
bad = 0
for p in dash["panels"]:
    for t in p.get("targets", []):
        expr = t["expr"].replace("$job_id", job)
        url = prom + "/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        r = json.load(urllib.request.urlopen(url, timeout=10))
        if r.get("status") != "success":
            print("does not parse:", p["title"], expr, r.get("error")); bad += 1
        elif not r["data"]["result"] and p["title"] != "GPU memory per rank":
            print("no data:", p["title"], expr); bad += 1
print("checked", sum(len(p.get("targets", [])) for p in dash["panels"]), "expressions")
sys.exit(1 if bad else 0)
PYEOF
[[ $? == 0 ]] && ok "every Grafana expression parses and returns data ($(tail -1 grafana.log))" \
  || { fail "Grafana expressions"; cat grafana.log; }
# Every alert rule's expression parses, and every metric it reads has series.
$PY - "$PROM" >alerts.log 2>&1 <<'PYEOF'
import json, re, sys, urllib.parse, urllib.request
prom = sys.argv[1]
groups = json.load(urllib.request.urlopen(prom + "/api/v1/rules", timeout=10))["data"]["groups"]
rules = [r for g in groups for r in g["rules"]]
assert len(rules) >= 6, rules
bad = 0
def q(expr):
    url = prom + "/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    return json.load(urllib.request.urlopen(url, timeout=10))
for r in rules:
    res = q(r["query"])
    if res.get("status") != "success":
        print("does not parse:", r["name"], res.get("error")); bad += 1
    if r.get("health") not in ("ok", "unknown"):
        print("unhealthy:", r["name"], r.get("lastError")); bad += 1
    for metric in sorted(set(re.findall(r"satdar_[a-z_]+", r["query"]))):
        if not q(metric)["data"]["result"]:
            print("no data for", metric, "in", r["name"]); bad += 1
print("checked", len(rules), "alert rules")
sys.exit(1 if bad else 0)
PYEOF
[[ $? == 0 ]] && ok "every alert expression parses and its metrics have data ($(tail -1 alerts.log))" \
  || { fail "alert expressions"; cat alerts.log; }

# ---- the built-in dashboard in headless Chromium ----
# A second job to compare with: another design (Full DAR with self_kv routing, a dense MLP, no
# value residual), short, on a third worker, finished before the pages load (so its ranks have
# left the Prometheus targets again before the restart below).
cat >model2.json <<'JSON'
{"vocab_size": 300, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
 "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 64,
 "residual": "dar", "dar_variant": "self_kv"}
JSON
cat >job2.json <<'JSON'
{"name": "compared", "config": "model2.json",
 "train": {"steps": 40, "batch_size": 4, "seq_len": 32, "data": "ds", "lr": 0.002,
           "eval_every": 10, "eval_batches": 1, "log_every": 20}}
JSON
"$SATDAR" worker --coordinator "$ADDR" --slots 1 --work-dir work-c --shared-dir shared \
  --data-root "$WORK" --name c --stop-grace-seconds 2 >worker-c.log 2>&1 &
PIDS+=("$!")
JOB2=$("$SATDAR" submit job2.json --coordinator "$ADDR")
state2="not submitted"
for _ in $(seq 1 600); do  # at most about 2 min
  [[ $JOB2 == job-* ]] || break
  state2=$(field "$JOB2" state)
  [[ $state2 == SUCCEEDED || $state2 == FAILED || $state2 == CANCELLED ]] && break
  sleep 0.2
done
[[ $state2 == SUCCEEDED ]] && ok "a second job of another design ran to the end ($JOB2)" \
  || { fail "second job: '$JOB2' is $state2"; tail -n 5 worker-c.log work-c/jobs/*/attempt-*/rank-*.log; }

chrome() { timeout 60 chromium --headless=new --no-sandbox --disable-gpu --disable-dev-shm-usage \
             --user-data-dir="$WORK/chrome" --virtual-time-budget=5000 "$@" 2>>chrome.log; }
chrome --dump-dom "http://$HTTP/" >jobs.html
grep -q "data-job-id=\"$JOB\"" jobs.html && ok "the dashboard's jobs table lists $JOB" \
  || { fail "jobs table"; head -c 3000 jobs.html; }
chrome --dump-dom "http://$HTTP/#job=$JOB" >job.html
$PY - job.html <<'PYEOF' && ok "the job's charts and heatmaps have data" || fail "job page charts"
import re, sys
html = open(sys.argv[1]).read()
drawn = dict(re.findall(r'id="((?:chart|heat)-[a-z]+)"[^>]*data-(?:points|cells)="(\d+)"', html))
want = ["chart-loss", "chart-tps", "chart-mfu", "chart-phases", "heat-gates", "heat-depth", "heat-experts"]
missing = [w for w in want if int(drawn.get(w, 0)) == 0]
print("drawn:", drawn)
sys.exit(1 if missing else 0)
PYEOF
chrome --window-size=1300,1500 --screenshot="$OUT/dashboard.png" "http://$HTTP/#job=$JOB" >/dev/null
[[ -s $OUT/dashboard.png ]] && ok "screenshot kept ($OUT/dashboard.png)" || fail "no screenshot"

# The comparison of runs: a checkbox per job in the table; #compare= overlays both jobs' loss,
# validation loss and tokens/s, each legend names the jobs with their designs, and &hover=0.5
# moves the cursor to the middle of every chart: the tooltip's values are the API's at the
# steps it names. The running job's series may be thinned between the API reads and the page's,
# so its values are looked up in a read from before the page and one from after.
$PY - jobs.html "$JOB" "$JOB2" <<'PYEOF' && ok "the jobs table has a compare checkbox per job" || fail "compare checkboxes"
import sys
from html.parser import HTMLParser
boxes, button = set(), False
class Page(HTMLParser):
    def handle_starttag(self, tag, attrs):
        global button
        a = dict(attrs)
        if tag == "input" and "compare-pick" in (a.get("class") or "").split() and a.get("type") == "checkbox":
            boxes.add(a.get("data-job"))
        button = button or (tag == "button" and a.get("id") == "compare-button")
Page().feed(open(sys.argv[1]).read())
print("checkboxes for", sorted(boxes), "button:", button)
sys.exit(0 if button and set(sys.argv[2:]) <= boxes else 1)
PYEOF
curl -s "http://$HTTP/api/jobs/$JOB" >api-a-before.json
curl -s "http://$HTTP/api/jobs/$JOB2" >api-b.json
chrome --dump-dom "http://$HTTP/#compare=$JOB,$JOB2&hover=0.5" >compare.html
curl -s "http://$HTTP/api/jobs/$JOB" >api-a-after.json
$PY - compare.html "$JOB" "$JOB2" api-a-before.json api-a-after.json api-b.json >compare.log 2>&1 <<'PYEOF'
import json, sys
from html.parser import HTMLParser
page, a, b = sys.argv[1:4]
apis = {a: [json.load(open(sys.argv[4])), json.load(open(sys.argv[5]))], b: [json.load(open(sys.argv[6]))]}
FIELDS = {"loss": "loss", "val": "val_loss", "tps": "tokens_per_second"}
charts, legend, rows, drawn = [], {}, {}, {}
class Page(HTMLParser):
    key = li = None
    def handle_starttag(self, tag, attrs):
        d = dict(attrs)
        cls = (d.get("class") or "").split()
        if tag == "figure" and "compare-chart" in cls:
            self.key = d["id"][len("cmp-"):]
            charts.append(self.key)
            legend[self.key], rows[self.key] = {}, {}
        elif self.key and tag == "canvas":
            drawn[self.key] = (int(d.get("data-points") or 0), int(d.get("data-jobs") or 0))
        elif self.key and tag == "li" and "data-job" in d:
            self.li = d["data-job"]
            legend[self.key][self.li] = [d.get("data-design", ""), int(d.get("data-points") or 0), ""]
        elif self.key and tag == "div" and "tip-row" in cls:
            rows[self.key][d["data-job"]] = (d.get("data-step"), d.get("data-value"))
    def handle_endtag(self, tag):
        if tag == "li": self.li = None
        if tag == "figure": self.key = None
    def handle_data(self, text):
        if self.li: legend[self.key][self.li][2] += text
Page().feed(open(page).read())
bad = []
def check(cond, what):
    if not cond: bad.append(what)
check(charts == ["loss", "val", "tps"], "the three charts: %s" % charts)
design = {j: apis[j][0]["job"].get("design_detail", "") for j in (a, b)}
check(all(design.values()) and design[a] != design[b], "two different designs: %s" % design)
for key, field in FIELDS.items():
    check(drawn.get(key, (0, 0))[1] == 2 and drawn[key][0] > 0, "%s chart drew both jobs: %s" % (key, drawn.get(key)))
    for j in (a, b):
        d, n, text = legend.get(key, {}).get(j, ("", 0, ""))
        check(d == design[j] and text.strip() == "%s - %s" % (j, design[j]) and n > 0,
              "%s legend for %s: %r (design %r, %d points)" % (key, j, text, d, n))
        step, value = rows.get(key, {}).get(j, (None, None))
        if step is None or value is None:
            check(False, "%s tooltip has no value for %s" % (key, j))
            continue
        seen = []
        for api in apis[j]:
            s = api["series"]
            col = s["fields"].index(field)
            seen += [p[col] for p in s["points"] if p[0] == float(step)]
        check(seen and all(v is not None and v == float(value) for v in seen),
              "%s of %s at step %s: page %s, API %s" % (field, j, step, value, seen))
        print("%s: %s at step %s = %s (API %s)" % (key, j, step, value, seen[:1]))
print("\n".join("FAIL: " + x for x in bad) or "compare view OK")
sys.exit(1 if bad else 0)
PYEOF
[[ $? == 0 ]] && ok "the compare view overlays both jobs with their designs; the values under the cursor are the API's ($(grep -c ' at step ' compare.log) checked)" \
  || { fail "compare view"; cat compare.log; head -c 3000 compare.html; }
chrome --window-size=1200,900 --screenshot="$OUT/compare.png" "http://$HTTP/#compare=$JOB,$JOB2&hover=0.5" >/dev/null
[[ -s $OUT/compare.png ]] && ok "compare screenshot kept ($OUT/compare.png)" || fail "no compare screenshot"

# ---- a restart: rank 1 killed with SIGKILL; every page stays valid while the job recovers ----
victim=$(pgrep -f -- " train --config work-[ab]/jobs/$JOB/.*--rank 1 --world-size 2" | head -1)
if [[ -n $victim ]]; then
  kill -9 "$victim"
  bad=0
  for _ in $(seq 1 80); do  # scrape through the failure, the backoff and the new attempt
    check_metrics "coordinator during a restart" "http://$HTTP/metrics" || bad=1
    for u in $(target_urls); do check_metrics "rank during a restart" "$u"; done
    [[ $(field "$JOB" attempts) -ge 2 && $(target_count) == 2 ]] && break
    sleep 0.1
  done
  [[ $(field "$JOB" attempts) -ge 2 ]] && ok "the job restarted (attempt $(field "$JOB" attempts))" \
    || fail "no restart: $(field "$JOB" state)"
  for _ in $(seq 1 200); do [[ $(target_count) == 2 ]] && break; sleep 0.1; done
  for u in $(target_urls); do check_metrics "rank after the restart" "$u"; done
  restarts=$(curl -s "http://$HTTP/metrics" | awk '$1 == "satdar_job_restarts_total" {print $2}')
  [[ $restarts == 1 ]] && ok "satdar_job_restarts_total counts the restart" || fail "restarts_total: '$restarts'"
else
  fail "cannot find rank 1's process"
fi

# ---- shutdown: cancel the job and stop the coordinator, scraping all the while ----
urls=$(target_urls)
"$SATDAR" cancel "$JOB" --coordinator "$ADDR" >/dev/null
for _ in $(seq 1 30); do
  for u in $urls; do check_metrics "rank while it stops" "$u"; done
  sleep 0.1
done
kill -TERM "$COORD"
for _ in $(seq 1 30); do check_metrics "coordinator while it stops" "http://$HTTP/metrics" || break; done
wait "$COORD" 2>/dev/null
ok "pages scraped during shutdown were all valid (or refused)"

echo "$passed passed, $failed failed"
[[ $failed == 0 ]]
