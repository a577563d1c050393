#!/usr/bin/env python3
"""The generated section of docs/RESULTS.md, from the small JSON files bench/results.sh keeps.

Usage: bench/results_report.py RESULTS_DIR > section.md

RESULTS_DIR is a results folder as bench/results.sh writes it (out/results, or the committed
copy docs/results):
  meta.json                          the run: date, machine, commit, budget, designs, seeds
  <design>/s<seed>/summary.json      `satdar train --summary-json` (tokens/s, peak RSS)
  <design>/s<seed>/eval.json         `satdar eval --json` (validation loss, "stats"; SATFormer
                                     with --gate-ablation zero: "ablated_loss", "loss_change")
  <design>/s<seed>/recall.json       `satdar eval --task passage-recall --json`
  <design>/s<seed>/recall1.json      the same with --recall-target-tokens 1
  <design>/s<seed>/cka.json          `satdar analyze cka --json` (DAR and mHC runs)
  <design>/s<seed>/rescue.json       `satdar analyze rescue --json` (DAR and mHC runs)
  <design>/s<seed>/*.png             the CKA and rescue plots of a few runs

The output depends on those files only (no clock, no machine), so tests/results_doc_test.sh can
regenerate it from docs/results and compare it with docs/RESULTS.md. Standard library only.
"""

import json
import math
import os
import sys

# Every design of the report, in table order, with its label.
DESIGNS = [
    ("transformer", "Transformer"),
    ("resformer", "ResFormer (learnable_plus)"),
    ("satformer", "SATFormer"),
    ("transparent", "Transparent Attention (full)"),
    ("attnres-full", "AttnRes (full)"),
    ("attnres-block", "AttnRes (block, 4 sublayers)"),
    ("dar-full-cross", "DAR full (cross)"),
    ("dar-full-self_kv", "DAR full (self_kv)"),
    ("dar-full-cross_v", "DAR full (cross_v)"),
    ("dar-full-fixed_kv", "DAR full (fixed_kv)"),
    ("dar-block-cross", "DAR block (cross)"),
    ("dar-block-self_kv", "DAR block (self_kv)"),
    ("dar-block-cross_v", "DAR block (cross_v)"),
    ("dar-block-fixed_kv", "DAR block (fixed_kv)"),
    ("mhc", "mHC (2 streams)"),
    ("denseformer", "DenseFormer"),
    ("muddformer", "MUDDFormer"),
]
LABEL = dict(DESIGNS)
# The runs `satdar analyze cka|rescue` is run on.
ANALYZED = [d for d, _ in DESIGNS if d.startswith("dar-") or d == "mhc"]
# "Close to" on the validation loss: within 1% of the reference's loss. The AttnRes paper's
# ablation puts Block AttnRes 0.5% above Full and the baseline 1.7% above it, so 1% separates
# "recovers most of the gain" from "no gain".
CLOSE_LOSS = 0.01
# A difference of means counts when it exceeds this many standard errors.
Z = 2.0
# Rescue gains are ratios over the corrupted-minus-clean loss gap; below this gap (nats) in any
# run they are ratios of noise and their claims are not decided.
MIN_RESCUE_GAP = 0.05


def load(path):
    with open(path) as f:
        return json.load(f)


class Runs:
    """The per-seed JSON files of one results folder."""

    def __init__(self, root):
        self.root = root
        self.meta = load(os.path.join(root, "meta.json"))
        self.files = {}  # (design, seed) -> {kind: json}
        for design, _ in DESIGNS:
            ddir = os.path.join(root, design)
            if not os.path.isdir(ddir):
                continue
            for sdir in sorted(os.listdir(ddir)):
                if not (sdir.startswith("s") and sdir[1:].isdigit()):
                    continue
                seed = int(sdir[1:])
                got = {}
                for kind in ("summary", "eval", "recall", "recall1", "cka", "rescue"):
                    p = os.path.join(ddir, sdir, kind + ".json")
                    if os.path.isfile(p):
                        got[kind] = load(p)
                self.files[(design, seed)] = got

    def seeds(self, design):
        return sorted(s for d, s in self.files if d == design)

    def designs(self):
        return [d for d, _ in DESIGNS if self.seeds(d)]

    def values(self, design, getter):
        """One value per seed that has it, in seed order."""
        out = []
        for seed in self.seeds(design):
            try:
                v = getter(self.files[(design, seed)])
            except (KeyError, IndexError, TypeError):
                continue
            if v is not None:
                out.append(float(v))
        return out

    def png(self, design, name):
        for seed in self.seeds(design):
            if os.path.isfile(os.path.join(self.root, design, "s%d" % seed, name)):
                return "results/%s/s%d/%s" % (design, seed, name)
        return None


# Metrics: name -> (getter over one run's files, unit text, higher is better).
METRICS = {
    "val_loss": (lambda f: f["eval"]["loss"], "nats/token", False),
    "recall": (lambda f: f["recall"]["tasks"]["passage_recall"]["acc"], "accuracy", True),
    "recall1": (lambda f: f["recall1"]["tasks"]["passage_recall"]["acc"], "accuracy", True),
    "tokens_per_second": (lambda f: f["summary"]["tokens_per_second"], "tokens/s", True),
    "peak_rss_mib": (lambda f: f["summary"]["peak_rss_bytes"] / 1048576.0, "MiB", False),
    "gate_loss_change": (lambda f: f["eval"]["loss_change"], "nats/token", None),
    "recall_ablated": (lambda f: f["recall"]["tasks"]["passage_recall"]["ablated"]["acc"],
                       "accuracy", True),
    "cka_cross": (lambda f: f["cka"]["summary"]["mean_unpaired_cross"], "CKA", None),
    "cka_high": (lambda f: f["cka"]["summary"]["high_cross_fraction"], "fraction", None),
    "rescue_gap": (lambda f: f["rescue"]["corrupted_loss"] - f["rescue"]["clean_loss"], "nats",
                   None),
    "rescue_s0": (lambda f: f["rescue"]["summary"]["mean_gain"]["s0"], "gain", None),
    "rescue_s1": (lambda f: f["rescue"]["summary"]["mean_gain"]["s1"], "gain", None),
    "rescue_min": (lambda f: min(f["rescue"]["summary"]["mean_gain"]["s0"],
                                 f["rescue"]["summary"]["mean_gain"]["s1"]), "gain", None),
    "rescue_asym": (lambda f: f["rescue"]["summary"]["asymmetry"], "asymmetry", None),
    "gate_zero_fraction": (lambda f: mean2d(f["eval"]["stats"]["satformer_gate_zero_fraction"]),
                           "fraction", None),
}


def mean2d(rows):
    flat = [x for row in rows for x in row]
    return sum(flat) / len(flat)


def mean(xs):
    return sum(xs) / len(xs)


def std(xs):
    """Sample standard deviation (n - 1); None below two values."""
    if len(xs) < 2:
        return None
    m = mean(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1))


def se(xs):
    s = std(xs)
    return None if s is None else s / math.sqrt(len(xs))


def fmt(x, digits):
    return "%.*f" % (digits, x)


def mean_std(xs, digits):
    if not xs:
        return "-"
    s = std(xs)
    return fmt(mean(xs), digits) + (" ± " + fmt(s, digits) if s is not None else "")


def diff_se(a, b):
    """Difference of means a - b and its (Welch) standard error; SE None below 2 seeds each."""
    d = mean(a) - mean(b)
    if len(a) < 2 or len(b) < 2:
        return d, None
    return d, math.sqrt(std(a) ** 2 / len(a) + std(b) ** 2 / len(b))


def verdict_less(d, s):
    """Claim "d < 0". Decided by the sign only when |d| > Z standard errors."""
    if s is None or abs(d) <= Z * s:
        return "not separable from noise"
    return "reproduced" if d < 0 else "not reproduced"


def verdict_within(d, s, tol):
    """Claim "|d| <= tol": reproduced when |d| + Z SE <= tol, not reproduced when |d| - Z SE >
    tol, else not separable."""
    if s is None:
        return "not separable from noise"
    if abs(d) + Z * s <= tol:
        return "reproduced"
    if abs(d) - Z * s > tol:
        return "not reproduced"
    return "not separable from noise"


class Claims:
    """The claims table: each row a claim, its numbers, the rule and the verdict."""

    def __init__(self, runs):
        self.runs = runs
        self.rows = []
        self.missing = []
        self.last_claim = None

    def get(self, design, metric):
        return self.runs.values(design, METRICS[metric][0])

    def _have(self, claim, *lists):
        self.last_claim = claim
        if all(lists):
            return True
        self.missing.append(claim)
        return False

    def less(self, claim, source, metric, a, b, digits=4):
        """Claim: design a's metric is below design b's."""
        self._compare(claim, source, metric, a, b, digits, -1)

    def greater(self, claim, source, metric, a, b, digits=4):
        """Claim: design a's metric is above design b's."""
        self._compare(claim, source, metric, a, b, digits, +1)

    def _compare(self, claim, source, metric, a, b, digits, sign):
        xa, xb = self.get(a, metric), self.get(b, metric)
        if not self._have(claim, xa, xb):
            return
        d, s = diff_se(xa, xb)
        numbers = "%s %s vs %s %s: diff %s%s" % (
            a, mean_std(xa, digits), b, mean_std(xb, digits), fmt(d, digits),
            " (SE %s)" % fmt(s, digits) if s is not None else " (SE n/a, n < 2)")
        rule = "diff < 0 by > 2 SE" if sign < 0 else "diff > 0 by > 2 SE"
        self.rows.append((claim, source, metric, numbers, rule, verdict_less(-sign * d, s)))

    def close_loss(self, claim, source, a, b):
        """Claim: a's validation loss is within CLOSE_LOSS (relative) of b's."""
        xa, xb = self.get(a, "val_loss"), self.get(b, "val_loss")
        if not self._have(claim, xa, xb):
            return
        d, s = diff_se(xa, xb)
        tol = CLOSE_LOSS * mean(xb)
        numbers = "%s %s vs %s %s: diff %s%s, tolerance %s" % (
            a, mean_std(xa, 4), b, mean_std(xb, 4), fmt(d, 4),
            " (SE %s)" % fmt(s, 4) if s is not None else " (SE n/a, n < 2)", fmt(tol, 4))
        self.rows.append((claim, source, "val_loss", numbers,
                          "abs(diff) + 2 SE <= 1%% of %s's loss" % b, verdict_within(d, s, tol)))

    def throughput_within(self, claim, source, a, b, tol):
        """Claim: a's tokens/s is at least (1 - tol) of b's; the ratio's SE by the delta method."""
        xa, xb = self.get(a, "tokens_per_second"), self.get(b, "tokens_per_second")
        if not self._have(claim, xa, xb):
            return
        r = mean(xa) / mean(xb)
        s = None
        if len(xa) >= 2 and len(xb) >= 2:
            s = r * math.sqrt((se(xa) / mean(xa)) ** 2 + (se(xb) / mean(xb)) ** 2)
        numbers = "%s %s vs %s %s tokens/s: ratio %s%s" % (
            a, mean_std(xa, 0), b, mean_std(xb, 0), fmt(r, 3),
            " (SE %s)" % fmt(s, 3) if s is not None else " (SE n/a, n < 2)")
        # One-sided: the slowdown 1 - r must stay within tol.
        if s is None:
            v = "not separable from noise"
        elif 1 - r + Z * s <= tol:
            v = "reproduced"
        elif 1 - r - Z * s > tol:
            v = "not reproduced"
        else:
            v = "not separable from noise"
        self.rows.append((claim, source, "tokens_per_second", numbers,
                          "slowdown 1 - ratio within %.1f%% by 2 SE" % (100 * tol), v))

    def above(self, claim, source, metric, design, threshold, digits=3):
        """Claim: design's metric is above a constant (one-sample, over seeds)."""
        xs = self.get(design, metric)
        if not self._have(claim, xs):
            return
        d, s = mean(xs) - threshold, se(xs)
        numbers = "%s %s (threshold %s)" % (design, mean_std(xs, digits), fmt(threshold, digits))
        self.rows.append((claim, source, metric, numbers,
                          "mean - %s > 2 SE" % fmt(threshold, digits), verdict_less(-d, s)))

    def paired_above(self, claim, source, metric, design, getter_a, getter_b, digits=3):
        """Claim: per seed, getter_a exceeds getter_b on the same run (a paired difference)."""
        a = self.runs.values(design, getter_a)
        b = self.runs.values(design, getter_b)
        if not self._have(claim, a, b) or len(a) != len(b):
            if a and b and claim not in self.missing:
                self.missing.append(claim)
            return
        diffs = [x - y for x, y in zip(a, b)]
        d, s = mean(diffs), se(diffs)
        numbers = "%s: %s vs %s, paired diff %s%s" % (
            design, mean_std(a, digits), mean_std(b, digits), fmt(d, digits),
            " (SE %s)" % fmt(s, digits) if s is not None else " (SE n/a, n < 2)")
        self.rows.append((claim, source, metric, numbers, "paired diff > 0 by > 2 SE",
                          verdict_less(-d, s)))

    def gap_guard(self, designs):
        """(ok, text): whether every run of the designs has a rescue gap of MIN_RESCUE_GAP."""
        gaps = [g for d in designs for g in self.get(d, "rescue_gap")]
        if not gaps:
            return True, ""
        low = min(gaps)
        return low >= MIN_RESCUE_GAP, "; smallest gap %s nats" % fmt(low, 4)

    def guard_last(self, designs):
        """Undecides the row just added when a rescue gap of its designs is too small."""
        if not self.rows or self.rows[-1][0] != self.last_claim:
            return
        claim, source, metric, numbers, rule, v = self.rows[-1]
        ok, text = self.gap_guard(designs)
        rule += "; every gap >= %s nats" % fmt(MIN_RESCUE_GAP, 2)
        self.rows[-1] = (claim, source, metric, numbers + text, rule,
                         v if ok else "not separable from noise")

    def render(self):
        out = ["| # | claim | source | metric | numbers (mean ± std over seeds) | rule | verdict |",
               "|---|---|---|---|---|---|---|"]
        for i, (claim, source, metric, numbers, rule, v) in enumerate(self.rows, 1):
            out.append("| %d | %s | %s | %s | %s | %s | **%s** |" % (
                i, claim, source, metric, numbers, rule, v))
        return out


def build_claims(runs):
    c = Claims(runs)
    sat = "SATFormer paper (abstract)"
    c.less("SATFormer has a lower validation loss than the Transformer", sat, "val_loss",
           "satformer", "transformer")
    c.less("SATFormer has a lower validation loss than ResFormer", sat, "val_loss",
           "satformer", "resformer")
    c.greater("SATFormer recalls more than ResFormer (retrieval, about +1.5 points)", sat,
              "recall", "satformer", "resformer")
    c.greater("SATFormer recalls more than MUDDFormer (best retrieval average, narrowly)", sat,
              "recall", "satformer", "muddformer")
    c.throughput_within("SATFormer's throughput is close to the Transformer's (within 5%)", sat,
                        "satformer", "transformer", 0.05)
    c.greater("SATFormer is faster than MUDDFormer (1.75-1.82x on GPUs)",
              "SATFormer author post", "tokens_per_second", "satformer", "muddformer", 0)
    c.above("SATFormer's gates are sparse: more closed (ReLU at 0) than the 0.5 of a random "
            "init", "SATFormer paper (gate analyses)", "gate_zero_fraction", "satformer", 0.5)
    c.above("Zeroing SATFormer's gates raises the validation loss",
            "SATFormer paper (intervention)", "gate_loss_change", "satformer", 0.0, 4)
    c.paired_above("Zeroing SATFormer's gates lowers passage recall (live vs zeroed)",
                   "SATFormer paper (intervention)", "recall", "satformer",
                   METRICS["recall"][0], METRICS["recall_ablated"][0])
    res = "ResFormer paper"
    c.less("ResFormer has a lower validation loss than the Transformer", res, "val_loss",
           "resformer", "transformer")
    attn = "AttnRes paper (ablation table)"
    c.less("Full AttnRes has a lower validation loss than the Transformer", attn, "val_loss",
           "attnres-full", "transformer")
    c.less("Block AttnRes has a lower validation loss than the Transformer", attn, "val_loss",
           "attnres-block", "transformer")
    c.close_loss("Block AttnRes is close to Full AttnRes", attn, "attnres-block", "attnres-full")
    # "x% more training time" is a throughput ratio of 1 / (1 + x).
    c.throughput_within("Block AttnRes costs little throughput (< 4% training overhead)",
                        "AttnRes paper", "attnres-block", "transformer", 1 - 1 / 1.04)
    dar = "DAR paper (abstract)"
    c.less("Full DAR has a lower validation loss than the Transformer", dar, "val_loss",
           "dar-full-cross", "transformer")
    c.less("Block DAR has a lower validation loss than the Transformer", dar, "val_loss",
           "dar-block-cross", "transformer")
    c.less("Full DAR has a lower validation loss than Full AttnRes", dar, "val_loss",
           "dar-full-cross", "attnres-full")
    c.less("Block DAR has a lower validation loss than Block AttnRes", dar, "val_loss",
           "dar-block-cross", "attnres-block")
    c.less("Full DAR has a lower validation loss than Transparent Attention (static depth "
           "weights)", dar, "val_loss", "dar-full-cross", "transparent")
    c.less("Full AttnRes (input-dependent depth weights) beats Transparent Attention (static)",
           "DAR paper (retrieval baseline)", "val_loss", "attnres-full", "transparent")
    c.close_loss("Block DAR is close to Full DAR", "DAR paper (block form)",
                 "dar-block-cross", "dar-full-cross")
    abl = "DAR paper (routing ablations)"
    for kind in ("full", "block"):
        for variant in ("self_kv", "cross_v", "fixed_kv"):
            c.less("%s DAR (cross) has a lower validation loss than DAR-%s" % (
                kind.capitalize(), variant), abl, "val_loss", "dar-%s-cross" % kind,
                "dar-%s-%s" % (kind, variant))
    c.throughput_within("Block DAR costs at most 17.5% throughput", "DAR (seed summary)",
                        "dar-block-cross", "transformer", 0.175)
    cka = "issue (DAR analysis)"
    for kind in ("full", "block"):
        c.less("%s DAR's unpaired cross-stream CKA is lower than DAR-SelfKV's" % kind.capitalize(),
               cka, "cka_cross", "dar-%s-cross" % kind, "dar-%s-self_kv" % kind, 3)
    c.less("Full DAR's unpaired cross-stream CKA is lower than mHC's", cka, "cka_cross",
           "dar-full-cross", "mhc", 3)
    for kind in ("full", "block"):
        cross = "dar-%s-cross" % kind
        c.above("%s DAR rescue: either stream alone recovers much more than neither (gain > "
                "0.5)" % kind.capitalize(), cka, "rescue_min", cross, 0.5)
        c.guard_last([cross])
        for variant in ("self_kv", "cross_v", "fixed_kv"):
            other = "dar-%s-%s" % (kind, variant)
            c.less("%s DAR's rescue is more symmetric than DAR-%s's" % (kind.capitalize(),
                                                                         variant),
                   cka, "rescue_asym", cross, other, 3)
            c.guard_last([cross, other])
    c.less("mHC has a lower validation loss than the Transformer", "mHC paper", "val_loss",
           "mhc", "transformer")
    c.throughput_within("mHC costs little throughput (+6.7% training time at n = 4; here n = 2)",
                        "mHC paper", "mhc", "transformer", 1 - 1 / 1.067)
    c.less("DenseFormer has a lower validation loss than the Transformer", "DenseFormer paper",
           "val_loss", "denseformer", "transformer")
    c.less("MUDDFormer has a lower validation loss than the Transformer", "MUDDFormer paper",
           "val_loss", "muddformer", "transformer")
    return c


def metric_table(runs, metric, digits, title, note=""):
    getter, unit, _ = METRICS[metric]
    out = ["#### %s (%s)%s" % (title, unit, note), "",
           "| design | mean ± std | n | vs Transformer (diff ± SE) |", "|---|---|---|---|"]
    base = runs.values("transformer", getter)
    for d in runs.designs():
        xs = runs.values(d, getter)
        if not xs:
            out.append("| %s | - | 0 | - |" % LABEL[d])
            continue
        vs = "-"
        if base and d != "transformer":
            diff, s = diff_se(xs, base)
            vs = "%+.*f" % (digits, diff) + (" ± %.*f" % (digits, s) if s is not None else "")
        out.append("| %s | %s | %d | %s |" % (LABEL[d], mean_std(xs, digits), len(xs), vs))
    return out + [""]


def header(runs):
    m = runs.meta
    b = m["budget"]
    out = []
    if m.get("quick"):
        seeds = len(m["seeds"])
        out += ["> **Placeholder: these are the numbers of a `bench/results.sh --quick` smoke run "
                "(%d seed%s, %d steps, %d designs), not results.** Run `bash bench/results.sh` "
                "(about 40 minutes on 2 cores) to replace them." % (
                    seeds, "" if seeds == 1 else "s", b["steps"], len(m["designs"])), ""]
    out += [
        "| run | |",
        "|---|---|",
        "| date (UTC) | %s |" % m["date"],
        "| machine | %s cores, %s, %s threads per run |" % (m["machine"]["nproc"],
                                                        m["machine"]["cpu"], b["threads"]),
        "| commit | `%s` |" % m["commit"],
        "| data | %s (%s) |" % (m["data"]["name"], m["data"]["note"]),
        "| budget per run | %d steps x %d sequences x %d tokens = %s tokens; AdamW lr %s, "
        "warmup %d, cosine to 0.1 x lr |" % (b["steps"], b["batch_size"], b["seq_len"],
                                             "{:,}".format(b["tokens"]), b["lr"], b["warmup"]),
        "| evaluation | validation loss over %s; passage recall: %d items |" % (
            b["eval_note"], b["recall_items"]),
        "| seeds | %s |" % ", ".join(str(s) for s in m["seeds"]),
        "| wall time | %s |" % (("%.1f min" % (m["wall_seconds"] / 60.0))
                                if "wall_seconds" in m else "-"),
        "",
    ]
    return out


def gate_section(runs):
    if not runs.seeds("satformer"):
        return []
    out = ["### SATFormer's gates", ""]
    stats = [runs.files[("satformer", s)].get("eval", {}).get("stats", {})
             for s in runs.seeds("satformer")]
    stats = [s for s in stats if "satformer_gate_mean" in s]
    if stats:
        out += ["Mean gate alpha and the fraction of tokens whose gate is closed (ReLU at 0), "
                "per layer and KV head over the validation tokens (mean ± std over seeds):", "",
                "| layer | KV head | mean gate | closed fraction |", "|---|---|---|---|"]
        layers = len(stats[0]["satformer_gate_mean"])
        heads = len(stats[0]["satformer_gate_mean"][0])
        for l in range(layers):
            for h in range(heads):
                g = [s["satformer_gate_mean"][l][h] for s in stats]
                z = [s["satformer_gate_zero_fraction"][l][h] for s in stats]
                out.append("| %d | %d | %s | %s |" % (l + 2, h, mean_std(g, 3), mean_std(z, 3)))
        out.append("")
    live = runs.values("satformer", METRICS["val_loss"][0])
    abl = runs.values("satformer", lambda f: f["eval"]["ablated_loss"])
    chg = runs.values("satformer", METRICS["gate_loss_change"][0])
    rl = runs.values("satformer", METRICS["recall"][0])
    ra = runs.values("satformer", METRICS["recall_ablated"][0])
    if abl:
        out += ["Gate ablation (`satdar eval --gate-ablation zero`: every gate set to 0):", "",
                "| | gates live | gates zeroed | change |", "|---|---|---|---|",
                "| validation loss | %s | %s | %s |" % (mean_std(live, 4), mean_std(abl, 4),
                                                       mean_std(chg, 4))]
        if ra:
            out.append("| passage recall | %s | %s | %s |" % (
                mean_std(rl, 3), mean_std(ra, 3),
                mean_std([a - b for a, b in zip(ra, rl)], 3)))
        out.append("")
    return out


def analysis_sections(runs):
    m = runs.meta
    out = ["### DAR and mHC: cross-stream CKA and rescue", ""]
    if not m.get("analyze_available", False):
        return out + ["Not measured in this run: this binary has no `satdar analyze` (`satdar "
                      "analyze --help` failed), so `bench/results.sh` skipped the CKA and rescue "
                      "analyses and their claims are listed below as not evaluated.", ""]
    designs = [d for d in ANALYZED if runs.seeds(d)]
    failures = m.get("analyze_failures", [])
    out += ["Linear CKA between the streams' states across depths (`satdar analyze cka`): the "
            "mean unpaired cross-stream CKA and the fraction of cross-stream pairs above the "
            "threshold (the command's `summary`).", "",
            "| design | mean unpaired cross-stream CKA | high-similarity fraction | threshold | n |",
            "|---|---|---|---|---|"]
    for d in designs:
        xs = runs.values(d, METRICS["cka_cross"][0])
        hs = runs.values(d, METRICS["cka_high"][0])
        th = runs.values(d, lambda f: f["cka"]["summary"]["threshold"])
        out.append("| %s | %s | %s | %s | %d |" % (LABEL[d], mean_std(xs, 3), mean_std(hs, 3),
                                                   fmt(th[0], 2) if th else "-", len(xs)))
    out += ["", "Rescue (`satdar analyze rescue`): the mean gain over depths of restoring stream "
            "s0 or s1 alone after a corruption, on the scale where restoring both streams is 1 "
            "and neither 0, and the asymmetry between the two (the command's `summary`; mHC-2's "
            "two streams, as in the DAR paper's comparison). A gain "
            "means something only where the corrupted loss is clearly above the clean one "
            "(docs/ANALYSIS.md).", "",
            "| design | gain s0 | gain s1 | asymmetry | clean loss | corrupted loss | gap | n |",
            "|---|---|---|---|---|---|---|---|"]
    for d in designs:
        g0 = runs.values(d, METRICS["rescue_s0"][0])
        g1 = runs.values(d, METRICS["rescue_s1"][0])
        a = runs.values(d, METRICS["rescue_asym"][0])
        cl = runs.values(d, lambda f: f["rescue"]["clean_loss"])
        co = runs.values(d, lambda f: f["rescue"]["corrupted_loss"])
        gap = runs.values(d, METRICS["rescue_gap"][0])
        out.append("| %s | %s | %s | %s | %s | %s | %s | %d |" % (
            LABEL[d], mean_std(g0, 3), mean_std(g1, 3), mean_std(a, 3), mean_std(cl, 4),
            mean_std(co, 4), mean_std(gap, 4), len(g0)))
    out.append("")
    pics = []
    for d in ("dar-full-cross", "dar-full-self_kv", "mhc"):
        for kind in ("cka", "rescue"):
            p = runs.png(d, kind + ".png")
            if p:
                pics.append("[%s %s](%s)" % (LABEL[d], kind, p))
    if pics:
        out += ["Plots (seed %d): " % runs.meta["seeds"][0] + ", ".join(pics) + ".", ""]
    if failures:
        out += ["Analyses that failed (the command's last line): " +
                "; ".join("%s: %s" % (f["run"], f["message"]) for f in failures), ""]
    return out


def report(root):
    runs = Runs(root)
    out = header(runs)
    out += ["### Per design", ""]
    out += metric_table(runs, "val_loss", 4, "Validation loss")
    out += metric_table(runs, "recall", 3, "Passage recall",
                        " (`satdar eval --task passage-recall`)")
    out += metric_table(runs, "recall1", 3, "Passage recall of one removed token",
                        " (`--recall-target-tokens 1`: more sensitive at this scale)")
    out += metric_table(runs, "tokens_per_second", 0, "Training throughput")
    out += metric_table(runs, "peak_rss_mib", 0, "Peak memory (peak RSS of the training process)")
    out += gate_section(runs)
    out += analysis_sections(runs)
    claims = build_claims(runs)
    out += ["### Claims", "",
            "Each qualitative claim of the seed papers, decided by one rule: with the means and "
            "sample standard deviations over seeds, the standard error of a difference of two "
            "designs is sqrt(s_a^2/n_a + s_b^2/n_b) (Welch); a claim is **reproduced** or **not "
            "reproduced** by the sign of the difference only when it exceeds 2 standard errors, "
            "else it is **not separable from noise** (always so with fewer than 2 seeds). "
            "\"Close to\" claims need abs(diff) + 2 SE within the tolerance (reproduced) or "
            "abs(diff) - 2 SE beyond it (not reproduced). Rescue claims are decided only when "
            "every run compared has a corrupted-minus-clean loss gap of at least %s nats." % (
                fmt(MIN_RESCUE_GAP, 2)), ""]
    out += claims.render()
    out.append("")
    if claims.missing:
        out += ["Not evaluated in this run (no data for a design they compare):", ""]
        out += ["- " + m for m in claims.missing]
        out.append("")
    counts = {}
    for row in claims.rows:
        counts[row[5]] = counts.get(row[5], 0) + 1
    out += ["Verdicts: %s." % ", ".join("%d %s" % (counts.get(v, 0), v) for v in
                                        ("reproduced", "not reproduced",
                                         "not separable from noise")), ""]
    return "\n".join(out)


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: results_report.py RESULTS_DIR")
    sys.stdout.write(report(sys.argv[1]))


if __name__ == "__main__":
    main()
