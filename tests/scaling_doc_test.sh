#!/usr/bin/env bash
# docs/SCALING.md says what the planner says: its tables and launch commands between the
# "plan tables" markers are exactly docs/scaling_tables.py's output for this build, and every
# flag of those commands (Slurm's `satdar train` flags, the job specs' train and layout
# fields) is one `satdar train` accepts.
# Usage: scaling_doc_test.sh PATH_TO_SATDAR PATH_TO_SCALING_MD PATH_TO_SCALING_TABLES_PY
set -euo pipefail
SATDAR=$(realpath "$1")
DOC=$(realpath "$2")
GEN=$(realpath "$3")
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
# The configs the tables name, where the generator looks for them.
cd "$(dirname "$DOC")/.."
python3 "$GEN" "$SATDAR" >"$WORK/tables.md"
"$SATDAR" train --help >"$WORK/train_help.txt" 2>&1 || true
python3 - "$DOC" "$WORK/tables.md" "$WORK/train_help.txt" <<'PY'
import json, re, sys
doc, tables, help_text = (open(p).read() for p in sys.argv[1:4])
begin = doc.index("\n", doc.index("<!-- plan tables: begin")) + 1
end = doc.index("<!-- plan tables: end -->")
if doc[begin:end] != tables:
    import difflib
    sys.stdout.writelines(difflib.unified_diff(doc[begin:end].splitlines(True),
                                               tables.splitlines(True), "docs/SCALING.md",
                                               "docs/scaling_tables.py output"))
    sys.exit("docs/SCALING.md's tables differ from the planner's: regenerate them with "
             "docs/scaling_tables.py bazel-bin/satdar")
train_flags = set(re.findall(r"^\s*(--[a-z0-9-]+)", help_text, re.M))
assert "--dp" in train_flags and "--virtual-stages" in train_flags, train_flags
commands = specs = 0
for block in re.findall(r"```(json)?\n(.*?)```", tables, re.S):
    kind, text = block
    if kind == "json":
        spec = json.loads(text)
        specs += 1
        for key in spec["train"]:
            flag = "--" + key.replace("_", "-")
            assert flag in train_flags, ("job spec train field", key)
        assert set(spec["layout"]) <= {"dp", "tp", "pp", "ep", "microbatches"}, spec["layout"]
        assert spec["resources"]["device"] == "cuda"
    else:
        commands += 1
        train = text[text.index("train.sbatch") + len("train.sbatch"):]
        for flag in re.findall(r"(?<![\w-])(--[a-z0-9-]+)", train):
            assert flag in train_flags, ("Slurm command flag", flag)
assert commands == specs == 10, (commands, specs)
print("ok   docs/SCALING.md: tables equal the planner's, %d commands and %d job specs use "
      "train's flags" % (commands, specs))
PY
