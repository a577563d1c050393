#!/usr/bin/python3
"""`satdar prep` against PyTorch-ecosystem preprocessing on a large corpus (issue 28, part 8).

  /usr/bin/python3 bench/prep_bench.py bazel-bin/satdar BROWN_DIR WORK_DIR [--gb 1.0]

Builds WORK_DIR/corpus: JSONL files ({"text": ...} per line, Megatron's input format) of the
Brown corpus's documents (tags stripped), repeated until they hold --gb GB of text. Then runs,
one at a time, each timed, with the peak of the summed RSS of its whole process tree sampled
every 50 ms:

  1. satdar prep, training the tokenizer (BPE, 4096 pieces) on its bounded sample, --threads N;
  2. satdar prep encoding with that tokenizer (--tokenizer), --threads N;
  3. the baseline: python3-sentencepiece encoding the same files with the same tokenizer.model,
     one process per core (multiprocessing.Pool(N).imap over documents, chunksize 25, as
     Megatron-LM's tools/preprocess_data.py does), writing uint16 token ids and document
     offsets (.bin/.idx).

N = the machine's cores. Prints a Markdown table row per run (wall time and MB/s of JSONL
input, CPU seconds of the whole process tree and MB per CPU second, which a shared machine
does not distort, peak RSS) and the token counts, for docs/PERFORMANCE.md.
"""
import argparse
import json
import multiprocessing
import os
import re
import subprocess
import sys
import threading
import time


def build_corpus(brown, out_dir, gb):
    os.makedirs(out_dir, exist_ok=True)
    docs = []
    for name in sorted(os.listdir(brown)):
        if not re.fullmatch(r"c[a-r]\d\d", name):
            continue
        words = [w.rsplit("/", 1)[0] for w in open(os.path.join(brown, name)).read().split()]
        docs.append(json.dumps({"text": " ".join(words)}) + "\n")
    assert docs, "no Brown documents in " + brown
    target = int(gb * 1e9)
    per_file = 64 * 1000 * 1000
    written, k = 0, 0
    while written < target:
        with open(os.path.join(out_dir, "part-%03d.jsonl" % k), "w") as f:
            size = 0
            while size < per_file and written + size < target:
                for d in docs:
                    f.write(d)
                    size += len(d)
        written += size
        k += 1
    return written


def tree_rss(pid):
    """The summed RSS (bytes) of pid and its descendants."""
    children = {}
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % p) as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(p))
        except (OSError, IndexError, ValueError):
            pass
    total, todo = 0, [pid]
    while todo:
        q = todo.pop()
        todo.extend(children.get(q, []))
        try:
            with open("/proc/%d/statm" % q) as f:
                total += int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        except OSError:
            pass
    return total


def measure(cmd):
    t0 = time.time()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL)
    peak = [0]
    done = threading.Event()

    def sample():
        while not done.is_set():
            peak[0] = max(peak[0], tree_rss(proc.pid))
            time.sleep(0.05)

    t = threading.Thread(target=sample, daemon=True)
    t.start()
    _, status, usage = os.wait4(proc.pid, 0)
    done.set()
    t.join()
    if status != 0:
        sys.exit("%s exited with status %d" % (cmd, status))
    # CPU seconds of the process and every child it waited for (the pool's workers).
    return time.time() - t0, peak[0], usage.ru_utime + usage.ru_stime


# ---- the baseline: one process per core, as Megatron-LM's preprocess_data.py --------------
_sp = None


def _init(model):
    global _sp
    import sentencepiece
    _sp = sentencepiece.SentencePieceProcessor(model_file=model)


def _encode(line):
    return _sp.encode(json.loads(line)["text"])


def baseline(model, corpus, out, workers):
    import array
    with open(out + ".bin", "wb") as bin_f, open(out + ".idx", "wb") as idx_f:
        offsets = array.array("q", [0])
        tokens = 0
        with multiprocessing.Pool(workers, initializer=_init, initargs=(model,)) as pool:
            for name in sorted(os.listdir(corpus)):
                with open(os.path.join(corpus, name)) as f:
                    for ids in pool.imap(_encode, f, chunksize=25):
                        array.array("H", ids).tofile(bin_f)
                        tokens += len(ids)
                        offsets.append(tokens)
        offsets.tofile(idx_f)
    print("tokens", tokens)


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--baseline":
        baseline(*sys.argv[2:5], int(sys.argv[5]))
        return
    ap = argparse.ArgumentParser()
    ap.add_argument("satdar")
    ap.add_argument("brown")
    ap.add_argument("work")
    ap.add_argument("--gb", type=float, default=1.0)
    args = ap.parse_args()
    cores = os.cpu_count()
    corpus = os.path.join(args.work, "corpus")
    size = sum(os.path.getsize(os.path.join(corpus, n)) for n in os.listdir(corpus)) \
        if os.path.isdir(corpus) else build_corpus(args.brown, corpus, args.gb)
    mb = size / 1e6
    print("corpus: %.0f MB of JSONL in %d files; %d cores" % (mb, len(os.listdir(corpus)), cores))
    rows = []
    for name, cmd in [
        ("satdar prep, training the tokenizer", [args.satdar, "prep", "--input", corpus,
                                                 "--out", args.work + "/trained",
                                                 "--vocab-size", "4096", "--threads", str(cores),
                                                 "--quiet"]),
        ("satdar prep with that tokenizer", [args.satdar, "prep", "--input", corpus,
                                             "--out", args.work + "/reused", "--tokenizer",
                                             args.work + "/trained/tokenizer.model",
                                             "--threads", str(cores), "--quiet"]),
        ("python3-sentencepiece, %d processes" % cores,
         [sys.executable, os.path.abspath(__file__), "--baseline",
          args.work + "/trained/tokenizer.model", corpus, args.work + "/baseline", str(cores)]),
    ]:
        for d in ("trained", "reused") if name.startswith("satdar prep, training") else ():
            subprocess.run(["rm", "-rf", os.path.join(args.work, d)])
        if "with that tokenizer" in name:
            subprocess.run(["rm", "-rf", os.path.join(args.work, "reused")])
        seconds, peak, cpu = measure(cmd)
        rows.append((name, seconds, peak))
        print("| %s | %.0f s | %.2f MB/s | %.0f CPU s, %.2f MB per CPU s | %.0f MiB |" % (
            name, seconds, mb / seconds, cpu, mb / cpu, peak / 2**20), flush=True)
    for d in ("trained", "reused"):
        m = json.load(open(os.path.join(args.work, d, "manifest.json")))
        print(d, "manifest tokens:", {k: v for k, v in m.items() if "token" in k})
    print("baseline tokens:", os.path.getsize(args.work + "/baseline.bin") // 2)


if __name__ == "__main__":
    main()
