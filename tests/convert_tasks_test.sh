#!/usr/bin/env bash
# tools/convert_tasks.py turns each published evaluation set (hand-written records in each
# set's own schema, tests/testdata/tasks/<set>/) into exactly the task JSON lines in
# expected.jsonl beside them; and every bad input exits with code 2, names the file, line and
# field, and leaves no output file (an existing one stays as it was).
# Usage: convert_tasks_test.sh [PATH_TO_CONVERT_TASKS_PY]   (from anywhere; bazel passes it)
set -u
HERE=$(dirname "$(realpath "$0")")
TOOL=$(realpath "${1:-$HERE/../tools/convert_tasks.py}")
DATA="$HERE/testdata/tasks"
WORK="${TEST_TMPDIR:-/tmp/satdar-test-$$}/convert_tasks"
rm -rf "$WORK" && mkdir -p "$WORK"
cd "$WORK"
passed=0
failed=0
ok() { echo "ok   $1"; passed=$((passed + 1)); }
fail() { echo "FAIL $1"; failed=$((failed + 1)); }
convert() { python3 "$TOOL" "$@"; }

# expect_converts NAME DATASET ARGS...: converts into out.jsonl and compares with expected.jsonl.
expect_converts() {
  local name=$1 dataset=$2
  shift 2
  rm -f out.jsonl
  if ! convert "$dataset" "$@" --out out.jsonl >stdout.txt 2>stderr.txt; then
    fail "$name: exit code $?"; cat stderr.txt; return
  fi
  if ! diff -u "$DATA/$dataset/expected.jsonl" out.jsonl; then fail "$name: output differs"; return; fi
  local n
  n=$(wc -l <"$DATA/$dataset/expected.jsonl")
  if ! grep -qF "$dataset: wrote $n records" stdout.txt; then
    fail "$name: summary"; cat stdout.txt; return
  fi
  ok "$name"
}

# expect_fail NAME MESSAGE ARGS...: exit code 2, MESSAGE on stderr, out.jsonl untouched.
expect_fail() {
  local name=$1 message=$2
  shift 2
  echo "previous contents" >out.jsonl
  convert "$@" >stdout.txt 2>stderr.txt
  local code=$?
  if [[ $code -ne 2 ]]; then fail "$name: exit code $code, want 2"; cat stderr.txt; return; fi
  if ! grep -qF -- "$message" stderr.txt; then
    fail "$name: stderr lacks '$message'"; cat stderr.txt; return
  fi
  if [[ "$(cat out.jsonl)" != "previous contents" ]] || compgen -G ".out.jsonl.*" >/dev/null; then
    fail "$name: touched out.jsonl or left a temporary file"; ls -la; return
  fi
  ok "$name"
}

D=$DATA
expect_converts hellaswag hellaswag "$D/hellaswag/hellaswag_val.jsonl"
expect_converts piqa piqa "$D/piqa/valid.jsonl" --labels "$D/piqa/valid-labels.lst"
expect_converts arc_published_and_hf arc "$D/arc/ARC-Challenge-Dev.jsonl" "$D/arc/arc_easy_hf.jsonl"
expect_converts winogrande winogrande "$D/winogrande/dev.jsonl"
expect_converts lambada lambada "$D/lambada/lambada_test.jsonl"
expect_converts squad_v2_and_hf squad "$D/squad/dev-v2.0.json" "$D/squad/train-v1.1-hf.jsonl"
grep -qF "skipped: unanswerable (SQuAD v2) 1" stdout.txt && ok squad_counts_unanswerable \
  || { fail squad_counts_unanswerable; cat stdout.txt; }
expect_converts triviaqa_published_and_hf triviaqa "$D/triviaqa/verified-web-dev.json" \
  "$D/triviaqa/rc_nocontext_validation.jsonl"
expect_converts swde swde "$D/swde/based_swde_validation.jsonl"
expect_converts fda fda "$D/fda/based_fda_validation.jsonl"

# The original LAMBADA release's plain text (one passage a line) reads like the OpenAI JSON.
python3 -c "
import json, sys
for line in open(sys.argv[1]):
    print(json.loads(line)['text'].replace('\n', ' '))
" "$D/lambada/lambada_test.jsonl" >plain.txt
convert lambada plain.txt --out plain.jsonl >/dev/null && [[ $(wc -l <plain.jsonl) -eq 2 ]] \
  && grep -qF '"target": " pocket"' plain.jsonl && ok lambada_plain_text || fail lambada_plain_text

# --limit keeps the first N; a pretty-printed SQuAD document reads like a one-line one.
convert arc "$D/arc/ARC-Challenge-Dev.jsonl" --limit 1 --out limit.jsonl >stdout.txt \
  && [[ "$(cat limit.jsonl)" == "$(head -1 "$D/arc/expected.jsonl")" ]] \
  && grep -qF "(--limit 1)" stdout.txt && ok limit || fail limit
python3 -c "import json,sys; json.dump(json.load(open(sys.argv[1])), open('pretty.json','w'), indent=2)" \
  "$D/squad/dev-v2.0.json"
convert squad pretty.json --out pretty.jsonl >/dev/null \
  && [[ "$(cat pretty.jsonl)" == "$(head -1 "$D/squad/expected.jsonl")" ]] \
  && ok squad_pretty_printed || fail squad_pretty_printed

# Bad inputs.
hs="$D/hellaswag/hellaswag_val.jsonl"
{ head -1 "$hs"; echo '{"activity_label": "x", "ctx_a": '; } >broken.jsonl
expect_fail bad_json_line "broken.jsonl:2: not valid JSON" hellaswag broken.jsonl --out out.jsonl
head -1 "$hs" | sed 's/"endings": \["throws the bucket over the fence and walks away."/"endings": [7/' \
  >number.jsonl
expect_fail ending_not_string "number.jsonl:1: field 'endings[0]': expected a string, got a number" \
  hellaswag number.jsonl --out out.jsonl
head -1 "$hs" | sed 's/"label": 2/"label": 4/' >range.jsonl
expect_fail hellaswag_label_range "range.jsonl:1: field 'label': '4' is not one of 0, 1, 2, 3" \
  hellaswag range.jsonl --out out.jsonl
head -1 "$hs" | sed 's/"label": 2, //' >test_split.jsonl
expect_fail hellaswag_test_split "test_split.jsonl:1: field 'label': missing (a test split" \
  hellaswag test_split.jsonl --out out.jsonl
head -1 "$hs" | sed 's/"label": 2/"label": 2, "label": 1/' >twice.jsonl
expect_fail duplicate_key "twice.jsonl:1: the key 'label' appears twice" \
  hellaswag twice.jsonl --out out.jsonl
head -1 "$hs" | sed 's/"label": 2/"label": NaN/' >nan.jsonl
expect_fail nan_label "nan.jsonl:1: not valid JSON: NaN is not JSON" hellaswag nan.jsonl --out out.jsonl
printf '{"goal": "a", "sol1": "b", "sol2": "c\xff"}\n' >latin1.jsonl
expect_fail not_utf8 "latin1.jsonl:1: not UTF-8 text" piqa latin1.jsonl --out out.jsonl
echo '{"text": "an ending \ud800 here"}' >surrogate.jsonl
expect_fail lone_surrogate "surrogate.jsonl:1: the output's context holds a lone UTF-16 surrogate" \
  lambada surrogate.jsonl --out out.jsonl
printf '\n  \n' >empty.jsonl
expect_fail empty_input "empty.jsonl: no records" lambada empty.jsonl --out out.jsonl
expect_fail missing_input "nowhere.jsonl: cannot read" lambada nowhere.jsonl --out out.jsonl
expect_fail input_is_directory "is a directory" lambada . --out out.jsonl

sed 's/"sol2": "Brush the slices with warm milk."//; s/, }/}/' "$D/piqa/valid.jsonl" >nosol.jsonl
expect_fail piqa_missing_field "nosol.jsonl:1: field 'sol2': missing" \
  piqa nosol.jsonl --labels "$D/piqa/valid-labels.lst" --out out.jsonl
expect_fail piqa_without_labels "valid.jsonl:1: field 'label': missing" \
  piqa "$D/piqa/valid.jsonl" --out out.jsonl
echo 0 >one-label.lst
expect_fail piqa_label_count "one-label.lst: 1 labels for 2 records" \
  piqa "$D/piqa/valid.jsonl" --labels one-label.lst --out out.jsonl
printf '0\n2\n' >bad-labels.lst
expect_fail piqa_bad_label "valid.jsonl:2: field 'label': '2' is not one of 0, 1" \
  piqa "$D/piqa/valid.jsonl" --labels bad-labels.lst --out out.jsonl
expect_fail labels_elsewhere "--labels applies to piqa and winogrande only" \
  arc "$D/arc/arc_easy_hf.jsonl" --labels one-label.lst --out out.jsonl
printf '2\n1\n2\n' >wino-labels.lst
expect_fail winogrande_labels_disagree \
  "dev.jsonl:1: field 'answer': '1' disagrees with wino-labels.lst:1's '2'" \
  winogrande "$D/winogrande/dev.jsonl" --labels wino-labels.lst --out out.jsonl

sed 's/"answerKey": "B"/"answerKey": "E"/' "$D/arc/arc_easy_hf.jsonl" >key.jsonl
expect_fail arc_unknown_key "key.jsonl:1: field 'answerKey': 'E' is not one of A, B, C" \
  arc key.jsonl --out out.jsonl
sed 's/"label": "C"}/"label": "C"}, 9/' "$D/arc/ARC-Challenge-Dev.jsonl" >choice.jsonl
expect_fail arc_choice_not_object \
  "choice.jsonl:1: field 'question.choices[3]': expected an object, got a number" \
  arc choice.jsonl --out out.jsonl
sed 's/_ was/it was/' "$D/winogrande/dev.jsonl" >noblank.jsonl
expect_fail winogrande_no_blank "noblank.jsonl:1: field 'sentence': no '_' blank" \
  winogrande noblank.jsonl --out out.jsonl
echo '{"text": "Alone"}' >oneword.jsonl
expect_fail lambada_one_word "oneword.jsonl:1: field 'text': one word" lambada oneword.jsonl --out out.jsonl

sed 's/"question": "What did keepers burn in early lighthouses?"/"question": 5/' \
  "$D/squad/dev-v2.0.json" >qnum.json
expect_fail squad_question_type \
  "qnum.json: field 'data[0].paragraphs[0].qas[0].question': expected a string, got a number" \
  squad qnum.json --out out.jsonl
python3 - <<'PY'
text = open("pretty.json").read()
open("badpretty.json", "w").write(text.replace('"title": "Lighthouse_keeping"', '"title" "x"'))
PY
expect_fail squad_document_syntax "badpretty.json:5: not valid JSON" squad badpretty.json --out out.jsonl
python3 - "$D/squad/dev-v2.0.json" <<'PY'
import json, sys
doc = json.load(open(sys.argv[1]))
doc["data"][0]["paragraphs"][0]["qas"] = doc["data"][0]["paragraphs"][0]["qas"][1:]
json.dump(doc, open("unanswerable.json", "w"))
PY
expect_fail squad_all_unanswerable "no records to write: every input record was skipped" \
  squad unanswerable.json --out out.jsonl
python3 - "$D/triviaqa/verified-web-dev.json" <<'PY'
import json, sys
doc = json.load(open(sys.argv[1]))
del doc["Data"][1]["Answer"]
json.dump(doc, open("tqa-test.json", "w"))
PY
expect_fail triviaqa_test_split "tqa-test.json: field 'Data[1].Answer': missing" \
  triviaqa tqa-test.json --out out.jsonl
sed 's/"value": "555-0100"/"value": "  "/' "$D/swde/based_swde_validation.jsonl" >blank.jsonl
expect_fail swde_blank_value "blank.jsonl:2: field 'value': empty" swde blank.jsonl --out out.jsonl
sed 's/"text": /"txt": /' "$D/fda/based_fda_validation.jsonl" >notext.jsonl
expect_fail fda_missing_text "notext.jsonl:1: field 'text': missing" fda notext.jsonl --out out.jsonl

# The command line.
expect_fail unknown_dataset "invalid choice: 'mmlu'" mmlu "$hs" --out out.jsonl
expect_fail zero_limit "--limit must be at least 1" hellaswag "$hs" --limit 0 --out out.jsonl
expect_fail missing_out "the following arguments are required: --out" hellaswag "$hs"
expect_fail out_folder_missing "the folder" hellaswag "$hs" --out no/such/out.jsonl
[[ ! -e no ]] && ok out_folder_not_created || fail out_folder_not_created

echo "passed $passed, failed $failed"
[[ $failed -eq 0 ]]
