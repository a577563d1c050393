#!/usr/bin/env bash
# docs/RESULTS.md says what its runs measured: the section between its "results" markers is
# exactly bench/results_report.py's output on the committed run outputs (docs/results/), every
# design of the report has at least 3 seeds there, and every row of the claims table has one of
# the three verdicts. Nothing is trained: the report is regenerated from the JSON files alone.
# Usage: results_doc_test.sh PATH_TO_RESULTS_MD PATH_TO_REPORT_PY PATH_TO_RESULTS_DIR
set -euo pipefail
DOC=$(realpath "$1")
GEN=$(realpath "$2")
DIR=$(realpath "$3")
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
if ! python3 "$GEN" "$DIR" >"$WORK/section.md"; then
  echo "FAIL bench/results_report.py failed on $DIR"
  exit 1
fi
python3 - "$DOC" "$WORK/section.md" "$DIR" "$GEN" <<'PY'
import difflib, importlib.util, json, os, re, sys
doc_path, section_path, results, gen = sys.argv[1:5]
doc, section = open(doc_path).read(), open(section_path).read()
failed = []
if "<!-- results: begin" not in doc or "<!-- results: end -->" not in doc:
    sys.exit("FAIL docs/RESULTS.md has no <!-- results: begin ... --> / <!-- results: end --> markers")
begin = doc.index("\n", doc.index("<!-- results: begin")) + 1
end = doc.index("<!-- results: end -->")
if doc[begin:end] != section:
    sys.stdout.writelines(difflib.unified_diff(doc[begin:end].splitlines(True),
                                               section.splitlines(True), "docs/RESULTS.md",
                                               "bench/results_report.py docs/results"))
    failed.append("docs/RESULTS.md's section differs from bench/results_report.py's output on "
                  "docs/results: rerun bench/results.sh (or, for a hand edit of the report "
                  "script, splice its output in)")
else:
    print("PASS docs/RESULTS.md's section equals bench/results_report.py docs/results")

# Every design of the report's list, with >= 3 seeds whose train and eval outputs are there.
spec = importlib.util.spec_from_file_location("results_report", gen)
report = importlib.util.module_from_spec(spec)
spec.loader.exec_module(report)
meta = json.load(open(os.path.join(results, "meta.json")))
short = []
for design, _ in report.DESIGNS:
    seeds = []
    ddir = os.path.join(results, design)
    for s in (sorted(os.listdir(ddir)) if os.path.isdir(ddir) else []):
        files = [os.path.join(ddir, s, f) for f in ("summary.json", "eval.json", "recall.json")]
        if all(os.path.isfile(f) for f in files):
            seeds.append(s)
    if len(seeds) < 3:
        short.append("%s (%d)" % (design, len(seeds)))
if not short:
    print("PASS every one of the %d designs has >= 3 seeds in docs/results" % len(report.DESIGNS))
elif meta.get("quick"):
    # The committed outputs are still the --quick smoke run's (marked so in the report's
    # header): the seed check applies once bench/results.sh's full run is committed.
    print("SKIP docs/results is a --quick placeholder (meta.json \"quick\": true): fewer than 3 "
          "seeds for %s" % ", ".join(short))
else:
    failed.append("fewer than 3 seeds in docs/results for: " + ", ".join(short))

# Every claims row ends in one of the three verdicts.
claims = section[section.index("### Claims"):] if "### Claims" in section else ""
rows = [l for l in claims.splitlines() if re.match(r"\| \d+ \|", l)]
verdicts = ("reproduced", "not reproduced", "not separable from noise")
bad = [l for l in rows if not any(l.rstrip().endswith("| **%s** |" % v) for v in verdicts)]
if not rows:
    failed.append("the report has no claims table")
elif bad:
    failed.append("claim rows without a verdict: " + "; ".join(bad))
else:
    print("PASS all %d claim rows have a verdict" % len(rows))

for f in failed:
    print("FAIL " + f)
sys.exit(1 if failed else 0)
PY
