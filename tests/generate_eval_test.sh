#!/usr/bin/env bash
# Generation and task evaluation end to end through the command line (INTERFACES.md v3): prep a
# tagged Brown-format corpus, train a small SATFormer on it, then `satdar generate` (text and ids,
# greedy and seeded sampling, batches of prompts of different lengths, weights and checkpoint
# folders) and `satdar eval --task` (choice, cloze, recall files, the built-in passage recall,
# SATFormer's gate ablation); every bad input exits 2 naming the file, line and field, and
# writes nothing.
# Usage: generate_eval_test.sh PATH_TO_SATDAR
set -u
SATDAR=$(realpath "$1")
HERE=$(dirname "$(realpath "$0")")
WORK="${TEST_TMPDIR:-/tmp/satdar-test-$$}/generate"
rm -rf "$WORK" && mkdir -p "$WORK"
cd "$WORK"
source "$(dirname "$(realpath "$0")")/cli_checks.sh"

python3 "$HERE/tiny_brown.py" 30
cat >sat.json <<'JSON'
{"vocab_size": 320, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 3,
 "num_attention_heads": 4, "num_key_value_heads": 2, "value_residual": "satformer",
 "max_position_embeddings": 64}
JSON
"$SATDAR" prep --input brown --out ds --vocab-size 300 --val-fraction 0.2 --quiet >prep.txt 2>&1 \
  && ok prep || { fail prep; cat prep.txt; }
"$SATDAR" train --config sat.json --data ds --steps 8 --batch-size 4 --seq-len 32 --threads 2 \
  --quiet --checkpoint-dir ck --checkpoint-every 8 >train.txt 2>&1 \
  && cp ck/ckpt_00000008.safetensors w.safetensors && ok train || { fail train; cat train.txt; }
G=(generate --config sat.json --weights w.safetensors --data ds)

# --- satdar generate ---------------------------------------------------------------------------
"$SATDAR" "${G[@]}" --prompt "The jury said" --max-new-tokens 12 >text.txt 2>text.err \
  && grep -q "^The jury said" text.txt && grep -q "tokens/s" text.err \
  && ok generate_text_streams || { fail generate_text_streams; cat text.txt text.err; }

"$SATDAR" "${G[@]}" --prompt "The jury said" --max-new-tokens 12 --json >g1.json 2>/dev/null \
  && "$SATDAR" "${G[@]}" --prompt "The jury said" --max-new-tokens 12 --json >g2.json 2>/dev/null \
  && cmp -s g1.json g2.json && python3 -c "
import json
lines = [json.loads(l) for l in open('g1.json')]
assert len(lines) == 1, lines
o = lines[0]
assert set(o) == {'prompt_ids', 'ids', 'text'}, o
assert o['prompt_ids'] and all(isinstance(i, int) for i in o['prompt_ids']), o
assert 1 <= len(o['ids']) <= 12 and all(0 <= i < 320 for i in o['ids']), o
assert len(o['ids']) == 12 or o['ids'][-1] == 2, o
" && ok generate_greedy_json_deterministic || { fail generate_greedy_json_deterministic; cat g1.json; }

# The same prompt as ids: the same new tokens, and no text without a tokenizer.
ids=$(python3 -c "import json; print(','.join(map(str, json.load(open('g1.json'))['prompt_ids'])))")
"$SATDAR" generate --config sat.json --weights w.safetensors --prompt-ids "$ids" \
  --max-new-tokens 12 --json >g3.json 2>/dev/null && python3 -c "
import json
a, b = json.load(open('g1.json')), json.load(open('g3.json'))
assert 'text' not in b and a['ids'] == b['ids'] and a['prompt_ids'] == b['prompt_ids'], (a, b)
" && ok generate_prompt_ids_equal_text_prompt || { fail generate_prompt_ids_equal_text_prompt; cat g3.json; }

# The checkpoint folder of the same weights decodes the same tokens.
"$SATDAR" generate --config sat.json --checkpoint ck --prompt-ids "$ids" --max-new-tokens 12 \
  --json >g4.json 2>/dev/null && python3 -c "
import json
assert json.load(open('g3.json'))['ids'] == json.load(open('g4.json'))['ids']
" && ok generate_from_checkpoint || { fail generate_from_checkpoint; cat g4.json; }

# Sampling is reproducible from --seed (and another seed gives another sample).
S=(--prompt-ids "$ids" --max-new-tokens 16 --temperature 1.5 --top-k 50 --top-p 0.95 --json)
"$SATDAR" generate --config sat.json --weights w.safetensors "${S[@]}" --seed 7 >s1.json 2>/dev/null \
  && "$SATDAR" generate --config sat.json --weights w.safetensors "${S[@]}" --seed 7 >s2.json 2>/dev/null \
  && "$SATDAR" generate --config sat.json --weights w.safetensors "${S[@]}" --seed 8 >s3.json 2>/dev/null \
  && cmp -s s1.json s2.json && ! cmp -s s1.json s3.json \
  && ok generate_sampling_reproducible || { fail generate_sampling_reproducible; cat s1.json s3.json; }

# A batch of prompts of different lengths: each equals that prompt alone.
printf 'The jury said\nIt was a long day in Atlanta for the committee\nHe\n' >prompts.txt
"$SATDAR" "${G[@]}" --prompts prompts.txt --max-new-tokens 8 --json >batch.json 2>/dev/null \
  && ok generate_prompts_file || { fail generate_prompts_file; cat stderr.txt; }
all_alone=1
n=0
while IFS= read -r line; do
  "$SATDAR" "${G[@]}" --prompt "$line" --max-new-tokens 8 --json >alone.json 2>/dev/null || all_alone=0
  python3 -c "
import json, sys
batch = [json.loads(l) for l in open('batch.json')]
alone = json.load(open('alone.json'))
sys.exit(0 if batch[$n] == alone else 1)" || all_alone=0
  n=$((n + 1))
done <prompts.txt
[[ $all_alone == 1 && $n == 3 ]] && ok generate_batch_equals_alone || fail generate_batch_equals_alone

# --- satdar eval --task ------------------------------------------------------------------------
cat >choice.jsonl <<'JSONL'
{"type": "choice", "context": "The jury said", "choices": [" the election", " it was"], "answer": 1}
{"type": "choice", "context": "", "choices": [" The city", " A"], "answer": 0}
{"type": "choice", "context": "It was", "choices": [" a", " a"], "answer": 0}
JSONL
cat >cloze.jsonl <<'JSONL'
{"type": "cloze", "context": "The jury said it did", "target": " not"}
{"type": "cloze", "context": "The grand jury", "target": " said"}
JSONL
cat >recall.jsonl <<'JSONL'
{"type": "recall", "prompt": "Atlanta is a city. The city is", "answers": ["Atlanta", "the"]}
{"type": "recall", "prompt": "Q: What is the capital?\nA:", "answers": ["Paris"]}
JSONL
E=(eval --config sat.json --weights w.safetensors --data ds)
"$SATDAR" "${E[@]}" --task choice.jsonl --task cloze.jsonl --task recall.jsonl --json >eval.json \
  2>eval.err && python3 -c "
import json
r = json.load(open('eval.json'))
t = r['tasks']
assert set(t) == {'choice', 'cloze', 'recall'}, t
assert t['choice']['n'] == 3 and t['cloze']['n'] == 2 and t['recall']['n'] == 2, t
for name, m in t.items():
    assert 0 <= m['acc'] <= 1 and m['acc_stderr'] >= 0, (name, m)
assert 0 <= t['choice']['acc_norm'] <= 1 and t['choice']['acc_norm_stderr'] >= 0
# Identical choices: the first wins, so item 3 always counts as correct.
assert t['choice']['acc'] >= 1 / 3
" && ok eval_tasks_json || { fail eval_tasks_json; cat eval.json eval.err; }

"$SATDAR" "${E[@]}" --task choice.jsonl --task cloze.jsonl >table.txt 2>/dev/null \
  && grep -q "choice" table.txt && grep -q "acc_norm" table.txt && grep -q "cloze" table.txt \
  && ok eval_tasks_table || { fail eval_tasks_table; cat table.txt; }

"$SATDAR" "${E[@]}" --task recall.jsonl --task choice.jsonl --gate-ablation zero --json \
  >ablate.json 2>/dev/null && python3 -c "
import json
t = json.load(open('ablate.json'))['tasks']
assert 'ablated' in t['recall'] and 'acc' in t['recall']['ablated'], t
" && ok eval_tasks_gate_ablation || { fail eval_tasks_gate_ablation; cat ablate.json; }

"$SATDAR" "${E[@]}" --task passage-recall --json >pr1.json 2>/dev/null \
  && "$SATDAR" "${E[@]}" --task passage-recall --json >pr2.json 2>/dev/null \
  && cmp -s pr1.json pr2.json && python3 -c "
import json
t = json.load(open('pr1.json'))['tasks']['passage_recall']
assert t['n'] > 0 and 0 <= t['acc'] <= 1, t
" && ok eval_passage_recall_deterministic || { fail eval_passage_recall_deterministic; cat pr1.json; }

# A context longer than the window is cut from the left, and the log says so.
python3 -c "
import json
print(json.dumps({'type': 'choice', 'context': ' '.join(['the jury said'] * 60), 'choices': [' it', ' a'], 'answer': 0}))
" >long.jsonl
"$SATDAR" "${E[@]}" --task long.jsonl --json >long.json 2>long.err \
  && grep -q "truncated from the left" long.err && ok eval_truncates_left \
  || { fail eval_truncates_left; cat long.err; }

# --- bad input: exit 2, naming what is wrong, nothing written ------------------------------------
printf '{"type": "choice", "context": "a", "choices": ["b"], "answer": 0}\nnot json\n' >bad1.jsonl
expect_fail eval_bad_json_line "bad1.jsonl:2" "$SATDAR" "${E[@]}" --task bad1.jsonl --json out.json
[[ ! -e out.json ]] && ok eval_bad_writes_nothing || fail eval_bad_writes_nothing
printf '{"type": "choice", "context": "a", "choices": ["b", "c"], "answer": 2}\n' >bad2.jsonl
expect_fail eval_answer_out_of_range 'bad2.jsonl:1: field "answer"' \
  "$SATDAR" "${E[@]}" --task bad2.jsonl
printf '{"type": "recall", "prompt": "a"}\n' >bad3.jsonl
expect_fail eval_missing_field 'bad3.jsonl:1: field "answers"' "$SATDAR" "${E[@]}" --task bad3.jsonl
printf '{"type": "essay", "prompt": "a"}\n' >bad4.jsonl
expect_fail eval_unknown_type 'bad4.jsonl:1: field "type"' "$SATDAR" "${E[@]}" --task bad4.jsonl
printf '{"type": "cloze", "context": "a", "target": ""}\n' >bad5.jsonl
expect_fail eval_empty_target 'bad5.jsonl:1: field "target"' "$SATDAR" "${E[@]}" --task bad5.jsonl
: >empty.jsonl
expect_fail eval_empty_task_file "empty.jsonl" "$SATDAR" "${E[@]}" --task empty.jsonl
expect_fail eval_missing_task_file "nothere.jsonl" "$SATDAR" "${E[@]}" --task nothere.jsonl
sed 's/"vocab_size": 320/"vocab_size": 200/' sat.json >small_vocab.json
expect_fail tokenizer_mismatch "vocab_size" "$SATDAR" generate --config small_vocab.json \
  --weights w.safetensors --data ds --prompt "The jury" --max-new-tokens 8

expect_fail generate_no_prompt "--prompt" "$SATDAR" "${G[@]}"
expect_fail generate_weights_and_checkpoint "--checkpoint" "$SATDAR" "${G[@]}" --checkpoint ck \
  --prompt "The"
expect_fail generate_text_without_tokenizer "--tokenizer" "$SATDAR" generate --config sat.json \
  --weights w.safetensors --prompt "The jury"
expect_fail generate_id_out_of_range "320" "$SATDAR" generate --config sat.json \
  --weights w.safetensors --prompt-ids 5,320 --max-new-tokens 8
long_ids=$(python3 -c "print(','.join(['5'] * 60))")
expect_fail generate_prompt_too_long "max_position_embeddings" "$SATDAR" generate \
  --config sat.json --weights w.safetensors --prompt-ids "$long_ids" --max-new-tokens 8
printf 'The jury\n\nsaid\n' >blank_line.txt
expect_fail generate_blank_prompt_line "line 2 of blank_line.txt" "$SATDAR" "${G[@]}" --prompts blank_line.txt --max-new-tokens 8
expect_fail generate_bad_temperature "--temperature" "$SATDAR" "${G[@]}" --prompt "The" \
  --temperature -1
expect_fail generate_bad_top_p "--top-p" "$SATDAR" "${G[@]}" --prompt "The" --top-p 1.5
expect_fail generate_negative_top_k "--top-k" "$SATDAR" "${G[@]}" --prompt "The" --top-k -1

finish
