#!/usr/bin/env python3
"""Converts published evaluation sets to the task JSONL that `satdar eval --task` scores.

  python3 tools/convert_tasks.py DATASET INPUT [INPUT...] --out OUT.jsonl [--limit N]
      [--labels FILE ...]

DATASET is one of hellaswag, piqa, arc, winogrande, lambada, squad, squad_completion,
triviaqa, swde, fda. Prompts follow how lm-evaluation-harness builds each task; docs/EVAL.md
("Converting published sets") lists the input schemas and every choice made here.

Standard library only. Every bad input exits with code 2 and one line naming the file, the
line (JSON lines) or the path inside the document (one JSON document), and the field. OUT is
written whole through a temporary file and a rename, and not at all on failure.
"""

import argparse
import collections
import json
import os
import re
import sys
import tempfile

EXIT_BAD_INPUT = 2


class InputError(Exception):
    """A problem with the input or the command line; main() prints it and exits with 2."""


class Where:
    """Where a record came from: a file, a line (JSON lines) and a path inside the document."""

    def __init__(self, path, line=None, prefix=""):
        self.path = path
        self.line = line
        self.prefix = prefix

    def child(self, name):
        return Where(self.path, self.line, self.field(name))

    def field(self, name):
        if not name or not self.prefix:
            return name or self.prefix
        return self.prefix + ("" if name.startswith("[") else ".") + name

    def __str__(self):
        return self.path if self.line is None else "%s:%d" % (self.path, self.line)

    def error(self, name, problem):
        if name is None and not self.prefix:
            return InputError("%s: %s" % (self, problem))
        return InputError("%s: field '%s': %s" % (self, self.field(name or ""), problem))


# --- Reading JSON and JSON lines -------------------------------------------------------------

def _json_type(value):
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object"


class _DuplicateKey(Exception):
    pass


def _no_duplicates(pairs):
    # A key given twice is an error, as in satdar's own JSON reader: one of them would be lost.
    seen = {}
    for key, value in pairs:
        if key in seen:
            raise _DuplicateKey(key)
        seen[key] = value
    return seen


def _reject_constant(name):
    raise ValueError("%s is not JSON" % name)


def _loads(text):
    return json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_reject_constant)


def _parse(text, where):
    """json.loads with every failure turned into an InputError at `where`."""
    try:
        return _loads(text)
    except _DuplicateKey as e:
        raise where.error(None, "the key '%s' appears twice in one object" % e.args[0])
    except json.JSONDecodeError as e:
        if where.line is None:
            where = Where(where.path, e.lineno)
        raise where.error(None, "not valid JSON: %s (column %d)" % (e.msg, e.colno))
    except ValueError as e:
        raise where.error(None, "not valid JSON: %s" % e)
    except RecursionError:
        raise where.error(None, "JSON nested too deeply")


def read_text(path):
    try:
        with open(path, "rb") as f:
            data = f.read()
    except IsADirectoryError:
        raise InputError("%s: is a directory, not a file" % path)
    except OSError as e:
        raise InputError("%s: cannot read: %s" % (path, e.strerror or e))
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise InputError("%s:%d: not UTF-8 text (byte %d)" % (path, line, e.start))
    return text[1:] if text.startswith("\ufeff") else text


def _lines(text):
    # Only "\n" ends a record: str.splitlines() would also split at U+2028 and friends, which
    # JSON allows raw inside strings.
    for number, line in enumerate(text.split("\n"), 1):
        line = line.rstrip("\r")
        if line.strip():
            yield number, line


def read_jsonl(path):
    """Yields (Where, object) for each non-blank line of a JSON lines file."""
    count = 0
    for number, line in _lines(read_text(path)):
        where = Where(path, number)
        record = _parse(line, where)
        if not isinstance(record, dict):
            raise where.error(None, "expected a JSON object, got %s" % _json_type(record))
        count += 1
        yield where, record
    if count == 0:
        raise InputError("%s: no records" % path)


def read_document_or_jsonl(path, container_key):
    """One JSON document holding `container_key` (SQuAD's "data", TriviaQA's "Data"): returns
    (Where, document). Otherwise the file is JSON lines: returns (None, [(Where, record)...])."""
    text = read_text(path)
    try:
        document = _loads(text)
    except (ValueError, _DuplicateKey, RecursionError):
        document = None
        first = next(_lines(text), None)
        # A document that does not parse, rather than JSON lines: report the document's error.
        if first is None or not _first_line_parses(first[1]):
            _parse(text, Where(path))
    if isinstance(document, dict) and container_key in document:
        return Where(path), document
    return None, list(read_jsonl(path))


def _first_line_parses(line):
    try:
        _loads(line)
        return True
    except (ValueError, _DuplicateKey, RecursionError):
        return False


def read_labels(path):
    """A published labels file (PIQA's *-labels.lst, WinoGrande's): one label a line."""
    return [(Where(path, number), line.strip()) for number, line in _lines(read_text(path))]


# --- Field access ---------------------------------------------------------------------------

def get(record, key, where, kind, allow_empty=False):
    if key not in record:
        raise where.error(key, "missing")
    value = record[key]
    if kind is str:
        if not isinstance(value, str):
            raise where.error(key, "expected a string, got %s" % _json_type(value))
        if not allow_empty and not value.strip():
            raise where.error(key, "empty")
    elif kind is list:
        if not isinstance(value, list):
            raise where.error(key, "expected an array, got %s" % _json_type(value))
        if not allow_empty and not value:
            raise where.error(key, "empty array")
    elif kind is dict:
        if not isinstance(value, dict):
            raise where.error(key, "expected an object, got %s" % _json_type(value))
    return value


def get_strings(record, key, where, allow_empty_list=False):
    values = get(record, key, where, list, allow_empty=allow_empty_list)
    for i, value in enumerate(values):
        if not isinstance(value, str):
            raise where.error("%s[%d]" % (key, i), "expected a string, got %s" % _json_type(value))
    return values


def get_index(record, key, where, names):
    """A label naming one of `names` (strings): a JSON integer or a string that is one of them;
    returns its position."""
    if key not in record:
        raise where.error(key, "missing (a test split without answers cannot be scored)")
    return label_index(record[key], names, where, key)


def label_index(value, names, where, key):
    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value)
    if not isinstance(value, str):
        raise where.error(key, "expected a label, got %s" % _json_type(value))
    if not value.strip():
        raise where.error(key, "empty (a test split without answers cannot be scored)")
    if value.strip() not in names:
        raise where.error(key, "'%s' is not one of %s" % (value, ", ".join(names)))
    return names.index(value.strip())


def unique(values):
    return list(dict.fromkeys(values))


# --- The converters -------------------------------------------------------------------------
# Each takes (Where, record, stats) and returns one task record, or None to skip the record
# (counted in stats under the reason).

def _hellaswag_clean(text):
    # WikiHow's bracketed artifacts ("[title]", "[step]"), as lm-evaluation-harness removes them.
    text = text.strip().replace(" [title]", ". ")
    text = re.sub(r"\[.*?\]", "", text)
    return text.replace("  ", " ")


def convert_hellaswag(where, rec, stats):
    endings = get_strings(rec, "endings", where)
    answer = get_index(rec, "label", where, [str(i) for i in range(len(endings))])
    context = (get(rec, "activity_label", where, str) + ": " + get(rec, "ctx_a", where, str, True)
               + " " + get(rec, "ctx_b", where, str, True).capitalize())
    return choice_record(where, _hellaswag_clean(context),
                         [" " + _hellaswag_clean(e) for e in endings], answer)


def convert_piqa(where, rec, stats):
    context = "Question: " + get(rec, "goal", where, str) + "\nAnswer:"
    choices = [" " + get(rec, "sol1", where, str), " " + get(rec, "sol2", where, str)]
    return choice_record(where, context, choices, get_index(rec, "label", where, ["0", "1"]))


def convert_arc(where, rec, stats):
    question = rec.get("question")
    if isinstance(question, dict):
        # The published ARC-V1-Feb2018 files: question.stem and question.choices[{text,label}].
        qwhere = where.child("question")
        stem = get(question, "stem", qwhere, str)
        entries = get(question, "choices", qwhere, list)
        texts, labels = [], []
        for i, entry in enumerate(entries):
            ewhere = qwhere.child("choices[%d]" % i)
            if not isinstance(entry, dict):
                raise ewhere.error(None, "expected an object, got %s" % _json_type(entry))
            texts.append(get(entry, "text", ewhere, str, True))
            labels.append(get(entry, "label", ewhere, str).strip())
    else:
        # The Hugging Face export: question is the text, choices.text and choices.label arrays.
        stem = get(rec, "question", where, str)
        cwhere = where.child("choices")
        choices = get(rec, "choices", where, dict)
        texts = get_strings(choices, "text", cwhere)
        labels = [s.strip() for s in get_strings(choices, "label", cwhere)]
        if len(labels) != len(texts):
            raise cwhere.error("label", "%d labels for %d texts" % (len(labels), len(texts)))
    if len(set(labels)) != len(labels):
        raise where.error("choices", "a label appears twice")
    if "answerKey" not in rec:
        raise where.error("answerKey", "missing")
    key = rec["answerKey"]
    # A few ARC questions use 1-4 where the others use A-D; a key in the other style still
    # names its choice by position.
    digits, letters = "12345", "ABCDE"
    if isinstance(key, str) and key.strip() not in labels and len(key.strip()) == 1:
        k = key.strip()
        if k in digits and letters[digits.index(k)] in labels:
            key = letters[digits.index(k)]
        elif k in letters and digits[letters.index(k)] in labels:
            key = digits[letters.index(k)]
    answer = label_index(key, labels, where, "answerKey")
    return choice_record(where, "Question: " + stem + "\nAnswer:",
                         [" " + t for t in texts], answer)


def convert_winogrande(where, rec, stats):
    sentence = get(rec, "sentence", where, str)
    options = [get(rec, "option1", where, str), get(rec, "option2", where, str)]
    answer = get_index(rec, "answer", where, ["1", "2"])
    blank = sentence.find("_")
    if blank < 0:
        raise where.error("sentence", "no '_' blank")
    # One shared context for both choices: the words before the blank. Each choice is the
    # option and the rest of the sentence, so context + choice is the filled-in sentence.
    before = sentence[:blank]
    context = before.rstrip()
    gap = before[len(context):]
    return choice_record(where, context, [gap + o + sentence[blank + 1:] for o in options],
                         answer)


def convert_lambada(where, rec, stats):
    text = get(rec, "text", where, str)
    if " " not in text:
        raise where.error("text", "one word: there is no context to predict the last word from")
    context, last = text.rsplit(" ", 1)
    if not last.strip():
        raise where.error("text", "ends with a space: the last word is empty")
    if not context.strip():
        raise where.error("text", "only one word before the last")
    return {"type": "cloze", "context": context, "target": " " + last}


def convert_squad_question(where, rec, stats, title, context):
    question = get(rec, "question", where, str)
    if rec.get("is_impossible") is True:
        stats["skipped: unanswerable (SQuAD v2)"] += 1
        return None
    answers = rec.get("answers")
    if isinstance(answers, dict):  # the Hugging Face export: answers.text is an array
        texts = get_strings(answers, "text", where.child("answers"), allow_empty_list=True)
    else:
        entries = get(rec, "answers", where, list, allow_empty=True)
        texts = []
        for i, entry in enumerate(entries):
            awhere = where.child("answers[%d]" % i)
            if not isinstance(entry, dict):
                raise awhere.error(None, "expected an object, got %s" % _json_type(entry))
            texts.append(get(entry, "text", awhere, str))
    if not texts:
        stats["skipped: unanswerable (SQuAD v2)"] += 1
        return None
    prompt = ("Title: " + title + "\n\nBackground: " + context + "\n\nQuestion: " + question
              + "\n\nAnswer:")
    return recall_record(where, prompt, unique(texts), "answers")


def squad_records(path, stats):
    """SQuAD v1.1/v2.0 JSON (data[].paragraphs[].qas[]) or its Hugging Face JSON lines export
    ({title, context, question, answers: {text: [...]}})."""
    where, document = read_document_or_jsonl(path, "data")
    if where is None:
        for rwhere, rec in document:
            out = convert_squad_question(rwhere, rec, stats, get(rec, "title", rwhere, str),
                                         get(rec, "context", rwhere, str))
            yield rwhere, out
        return
    for a, article in enumerate(get(document, "data", where, list)):
        awhere = where.child("data[%d]" % a)
        if not isinstance(article, dict):
            raise awhere.error(None, "expected an object, got %s" % _json_type(article))
        title = get(article, "title", awhere, str)
        for p, paragraph in enumerate(get(article, "paragraphs", awhere, list)):
            pwhere = awhere.child("paragraphs[%d]" % p)
            if not isinstance(paragraph, dict):
                raise pwhere.error(None, "expected an object, got %s" % _json_type(paragraph))
            context = get(paragraph, "context", pwhere, str)
            for q, qa in enumerate(get(paragraph, "qas", pwhere, list, allow_empty=True)):
                qwhere = pwhere.child("qas[%d]" % q)
                if not isinstance(qa, dict):
                    raise qwhere.error(None, "expected an object, got %s" % _json_type(qa))
                yield qwhere, convert_squad_question(qwhere, qa, stats, title, context)


def convert_triviaqa_question(question, answer_where, answer, keys):
    """keys: the (value, aliases) field names, "Value"/"Aliases" in the published JSON."""
    if not isinstance(answer, dict):
        raise answer_where.error(None, "expected an object, got %s" % _json_type(answer))
    value_key, aliases_key = keys
    aliases = get_strings(answer, aliases_key, answer_where, allow_empty_list=True)
    answers = [a for a in aliases if a.strip()]
    if not answers:
        answers = [get(answer, value_key, answer_where, str)]
    return recall_record(answer_where, "Question: " + question + "?\nAnswer:", unique(answers),
                         aliases_key)


def triviaqa_records(path, stats):
    """TriviaQA's published JSON (Data[].Question, Data[].Answer.Aliases) or its Hugging Face
    JSON lines export ({question, answer: {value, aliases, normalized_aliases}})."""
    where, document = read_document_or_jsonl(path, "Data")
    if where is None:
        for rwhere, rec in document:
            if "answer" not in rec:
                raise rwhere.error("answer", "missing (a test split without answers cannot be "
                                   "scored)")
            yield rwhere, convert_triviaqa_question(
                get(rec, "question", rwhere, str), rwhere.child("answer"), rec["answer"],
                ("value", "aliases"))
        return
    for i, rec in enumerate(get(document, "Data", where, list)):
        rwhere = where.child("Data[%d]" % i)
        if not isinstance(rec, dict):
            raise rwhere.error(None, "expected an object, got %s" % _json_type(rec))
        if "Answer" not in rec:
            raise rwhere.error("Answer", "missing (a test split without answers cannot be "
                               "scored)")
        yield rwhere, convert_triviaqa_question(
            get(rec, "Question", rwhere, str), rwhere.child("Answer"), rec["Answer"],
            ("Value", "Aliases"))


def convert_based(where, rec, stats):
    # The hazyresearch releases (based-swde, based-fda, based-squad): `text` ends where the
    # value should follow; surrounding whitespace is stripped from both fields.
    prompt = get(rec, "text", where, str).strip()
    value = get(rec, "value", where, str).strip()
    return recall_record(where, prompt, [value], "value")


# --- Output records -------------------------------------------------------------------------

def choice_record(where, context, choices, answer):
    if len(choices) < 2:
        raise where.error(None, "%d choice: a choice task needs at least 2" % len(choices))
    for i, choice in enumerate(choices):
        if not choice:
            raise where.error(None, "choice %d is empty after conversion" % i)
    return {"type": "choice", "context": context, "choices": choices, "answer": answer}


def recall_record(where, prompt, answers, field):
    if not prompt:
        raise where.error(None, "the prompt is empty")
    if not answers or not all(a.strip() for a in answers):
        raise where.error(field, "no non-empty answer")
    return {"type": "recall", "prompt": prompt, "answers": answers}


def check_encodable(where, out):
    # JSON allows lone surrogates ("\ud800"), UTF-8 does not: find them before writing.
    for key, value in out.items():
        for i, s in enumerate(value if isinstance(value, list) else [value]):
            if isinstance(s, str):
                try:
                    s.encode("utf-8")
                except UnicodeEncodeError:
                    name = key if not isinstance(value, list) else "%s[%d]" % (key, i)
                    raise where.error(None, "the output's %s holds a lone UTF-16 surrogate "
                                      "(\\ud800-\\udfff)" % name)


# --- Driving --------------------------------------------------------------------------------

LABELS_DATASETS = {"piqa": "label", "winogrande": "answer"}

PER_RECORD = {
    "hellaswag": convert_hellaswag,
    "piqa": convert_piqa,
    "arc": convert_arc,
    "winogrande": convert_winogrande,
    "lambada": convert_lambada,
    "swde": convert_based,
    "fda": convert_based,
    "squad_completion": convert_based,
}

PER_FILE = {"squad": squad_records, "triviaqa": triviaqa_records}

DATASETS = sorted(list(PER_RECORD) + list(PER_FILE))


def lambada_records(path):
    """The OpenAI JSON lines ({"text": ...}); a .txt file is the original release's plain text,
    one passage a line."""
    if not path.endswith(".txt"):
        yield from read_jsonl(path)
        return
    lines = list(_lines(read_text(path)))
    if not lines:
        raise InputError("%s: no records" % path)
    for number, line in lines:
        yield Where(path, number), {"text": line.strip()}


def with_labels(records, labels_path, key):
    """Sets field `key` of each record from the labels file's line in the same position."""
    records = list(records)
    labels = read_labels(labels_path)
    if len(labels) != len(records):
        raise InputError("%s: %d labels for %d records in %s" % (
            labels_path, len(labels), len(records), records[0][0].path))
    out = []
    for (where, rec), (lwhere, label) in zip(records, labels):
        if key in rec and str(rec[key]).strip() not in ("", label):
            raise where.error(key, "'%s' disagrees with %s's '%s'" % (rec[key], lwhere, label))
        rec = dict(rec)
        rec[key] = label
        out.append((where, rec))
    return out


def convert(dataset, inputs, labels, limit):
    """Returns (records, stats)."""
    if labels and dataset not in LABELS_DATASETS:
        raise InputError("--labels applies to %s only" % " and ".join(sorted(LABELS_DATASETS)))
    if labels and len(labels) != len(inputs):
        raise InputError("%d --labels files for %d inputs: give one labels file per input, in "
                         "the same order" % (len(labels), len(inputs)))
    out = []
    stats = collections.Counter()
    for i, path in enumerate(inputs):
        if dataset in PER_FILE:
            pairs = PER_FILE[dataset](path, stats)
        else:
            records = lambada_records(path) if dataset == "lambada" else read_jsonl(path)
            if labels:
                records = with_labels(records, labels[i], LABELS_DATASETS[dataset])
            pairs = ((w, PER_RECORD[dataset](w, r, stats)) for w, r in records)
        for where, record in pairs:
            if record is None:
                continue
            check_encodable(where, record)
            out.append(record)
            if limit is not None and len(out) >= limit:
                return out, stats
    if not out:
        raise InputError("no records to write: every input record was skipped (%s)" %
                         ", ".join("%s %d" % kv for kv in sorted(stats.items())))
    return out, stats


def write_atomically(path, records):
    directory = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise InputError("--out %s: is a directory" % path)
    if not os.path.isdir(directory):
        raise InputError("--out %s: the folder %s does not exist" % (path, directory))
    try:
        fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(path) + ".", suffix=".tmp",
                                   dir=directory)
    except OSError as e:
        raise InputError("--out %s: cannot write in %s: %s" % (path, directory, e.strerror))
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as f:
            for record in records:
                f.write(json.dumps(record, ensure_ascii=False) + "\n")
            f.flush()
            os.fsync(f.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp's 0600 would hide the file from other users
        os.replace(tmp, path)
    except OSError as e:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise InputError("--out %s: cannot write: %s" % (path, e.strerror or e))


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        self.print_usage(sys.stderr)
        sys.stderr.write("convert_tasks: error: %s\n" % message)
        sys.exit(EXIT_BAD_INPUT)


def parse_args(argv):
    parser = _Parser(
        prog="convert_tasks.py",
        description="Convert a published evaluation set to `satdar eval --task` JSON lines.")
    parser.add_argument("dataset", choices=DATASETS, metavar="DATASET",
                        help="one of " + ", ".join(DATASETS))
    parser.add_argument("inputs", nargs="+", metavar="INPUT",
                        help="the published files (records are concatenated in order)")
    parser.add_argument("--out", required=True, help="the task JSON lines to write")
    parser.add_argument("--limit", type=int, help="write the first N records only")
    parser.add_argument("--labels", action="append", default=[], metavar="FILE",
                        help="PIQA/WinoGrande labels file (*-labels.lst), one per INPUT")
    args = parser.parse_args(argv)
    if args.limit is not None and args.limit < 1:
        parser.error("--limit must be at least 1, got %d" % args.limit)
    return args


def main(argv):
    args = parse_args(argv)
    try:
        records, stats = convert(args.dataset, args.inputs, args.labels, args.limit)
        write_atomically(args.out, records)
    except InputError as e:
        sys.stderr.write("convert_tasks: error: %s\n" % e)
        return EXIT_BAD_INPUT
    kinds = collections.Counter(r["type"] for r in records)
    summary = ", ".join("%d %s" % (n, t) for t, n in sorted(kinds.items()))
    skipped = "".join("; %s %d" % kv for kv in sorted(stats.items()))
    limited = " (--limit %d)" % args.limit if args.limit and len(records) == args.limit else ""
    print("%s: wrote %d records (%s) to %s%s%s" % (args.dataset, len(records), summary,
                                                   args.out, limited, skipped))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
