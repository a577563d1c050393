#!/usr/bin/env python3
"""Writes the planned layouts of docs/SCALING.md from `satdar plan`'s search.

Usage: docs/scaling_tables.py SATDAR > tables.md
(tests/scaling_doc_test.sh checks that docs/SCALING.md holds exactly this output between its
"plan tables" markers, so the document stays what the planner says.)

For the 7B DAR-MoE and Block DAR 1.3B on 1, 2, 4, 8 and 16 nodes of 8 H200: the three fastest
layouts that fit (memory per GPU by kind, bytes per step by group, predicted step time,
tokens/s and MFU), then the exact Slurm and Kubernetes launch of the fastest.
"""
import json
import subprocess
import sys

SATDAR = sys.argv[1]
NODES = (1, 2, 4, 8, 16)
MODELS = (
    # config, what it is, global batch (sequences of 4096 tokens), dataset folder
    ("configs/dar-moe-7b.json", "DAR-MoE 7B (Block DAR, 64 experts, top 8)", 512, "pile"),
    ("configs/dar-1.3b.json", "Block DAR 1.3B", 256, "pile"),
)
SEQ = 4096
STEPS = 20000


def gib(b):
    return "%.1f" % (b / 2**30)


def plan(config, nodes, batch):
    out = subprocess.run([SATDAR, "plan", "--config", config, "--nodes", str(nodes),
                          "--gpus-per-node", "8", "--gpu", "h200", "--global-batch-size",
                          str(batch), "--seq-len", str(SEQ), "--top", "3", "--json"],
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def flags(l):
    f = ["--dp", l["dp"], "--tp", l["tp"], "--pp", l["pp"], "--ep", l["ep"],
         "--microbatches", l["microbatches"]]
    if l["virtual_stages"] > 1:
        f += ["--virtual-stages", l["virtual_stages"]]
    if l["sequence_parallel"]:
        f += ["--sequence-parallel"]
    if l["zero"]:
        f += ["--zero", l["zero"]]
    if l["recompute"] != "none":
        f += ["--recompute", l["recompute"]]
    return " ".join(str(x) for x in f)


def job_spec(config, data, nodes, l):
    train = {"steps": STEPS, "batch_size": l["batch_size"], "seq_len": SEQ, "data": data,
             "dtype": "bf16", "checkpoint_every": 500, "log_every": 10}
    if l["virtual_stages"] > 1:
        train["virtual_stages"] = l["virtual_stages"]
    if l["sequence_parallel"]:
        train["sequence_parallel"] = True
    if l["zero"]:
        train["zero"] = l["zero"]
    if l["recompute"] != "none":
        train["recompute"] = l["recompute"]
    layout = {k: l[k] for k in ("dp", "tp", "pp", "ep", "microbatches")}
    name = config.split("/")[-1].replace(".json", "") + "-%dn" % nodes
    return json.dumps({"name": name, "config": config, "train": train, "layout": layout,
                       "resources": {"device": "cuda"}, "max_restarts": 3})


def main():
    for config, title, batch, data in MODELS:
        print("### %s: global batch %d x %d tokens\n" % (title, batch, SEQ))
        print("| nodes | dp,tp,pp,ep | M | V | SP | ZeRO | recompute | memory/GPU GiB (weights+grads+optimizer+activations) "
              "| bytes/step GiB (data; tp; pp; ep) | step | tokens/s | MFU |")
        print("|---|---|---|---|---|---|---|---|---|---|---|---|")
        best = {}
        for nodes in NODES:
            p = plan(config, nodes, batch)
            for i, c in enumerate(p["layouts"]):
                l, m, b = c["layout"], c["memory_bytes"], c["comm_bytes"]
                if i == 0:
                    best[nodes] = c
                mem = "%s (%s+%s+%s+%s)" % (gib(m["total"]), gib(m["weights"]), gib(m["gradients"]),
                                            gib(m["optimizer"]), gib(m["activations"]))
                comm = "; ".join(gib(b[g]) if g in b else "-" for g in ("data", "tp", "pp", "ep"))
                print("| %s | %d,%d,%d,%d | %d | %d | %s | %d | %s | %s | %s | %.2f s | %s | %.1f%% |" % (
                    nodes if i == 0 else "", l["dp"], l["tp"], l["pp"], l["ep"], l["microbatches"],
                    l["virtual_stages"], "on" if l["sequence_parallel"] else "off", l["zero"],
                    l["recompute"], mem, comm, c["step_seconds"], format(int(round(c["tokens_per_second"])), ","),
                    100 * c["mfu"]))
        print()
        print("Launch the fastest layout of each size (`SATDAR_SHARED` a folder every node reaches, "
              "the dataset under `$SATDAR_SHARED/data/%s`):\n" % data)
        for nodes in NODES:
            l = best[nodes]["layout"]
            print("%d node%s, Slurm (direct mode):\n" % (nodes, "" if nodes == 1 else "s"))
            print("```")
            print("SATDAR_SHARED=/shared sbatch --nodes=%d --ntasks-per-node=8 --gpus-per-node=8 \\" % nodes)
            print("    deploy/slurm/train.sbatch --config %s --device cuda --dtype bf16 \\" % config)
            print("    %s --batch-size %d --seq-len %d \\" % (flags(l), l["batch_size"], SEQ))
            print("    --data /shared/data/%s --steps %d --checkpoint-every 500 --log-jsonl log.jsonl" % (
                data, STEPS))
            print("```\n")
            print("Kubernetes (`kubectl scale statefulset satdar-worker --replicas=%d`, then "
                  "`satdar submit job.json --follow`), job.json:\n" % nodes)
            print("```json")
            print(job_spec(config, data, nodes, l))
            print("```\n")


if __name__ == "__main__":
    main()
