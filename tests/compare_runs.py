"""Two training runs agree: per-step losses (--log-jsonl files) and weights (safetensors files:
checkpoints, whose optimizer.* tensors are skipped, or exported weights) within a relative
tolerance. Used by the parallel equivalence tests.

usage: compare_runs.py LOG_A LOG_B WEIGHTS_A WEIGHTS_B [STEPS] [TOLERANCE]
"""
import json
import struct
import sys


def losses(path):
    return [json.loads(line)["loss"] for line in open(path)]


def weights(path):
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    data = raw[8 + n:]
    out = {}
    for k, v in header.items():
        if k == "__metadata__" or k.startswith("optimizer."):
            continue
        assert v["dtype"] == "F64", (k, v["dtype"])
        b, e = v["data_offsets"]
        out[k] = struct.unpack("<%dd" % ((e - b) // 8), data[b:e])
    return out


def main():
    log_a, log_b, w_a, w_b = sys.argv[1:5]
    steps = int(sys.argv[5]) if len(sys.argv) > 5 else 5
    tol = float(sys.argv[6]) if len(sys.argv) > 6 else 1e-9
    a, b = losses(log_a), losses(log_b)
    assert len(a) == len(b) == steps, (a, b)
    worst = max(abs(x - y) / abs(x) for x, y in zip(a, b))
    wa, wb = weights(w_a), weights(w_b)
    assert wa.keys() == wb.keys(), set(wa) ^ set(wb)
    wworst = max(abs(x - y) / max(1e-30, max(abs(z) for z in wa[k]))
                 for k in wa for x, y in zip(wa[k], wb[k]))
    print("  losses rel err %.2e, weights rel err %.2e" % (worst, wworst))
    sys.exit(0 if worst <= tol and wworst <= tol else 1)


if __name__ == "__main__":
    main()
