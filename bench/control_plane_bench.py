#!/usr/bin/python3
"""The coordinator under load: simulated workers heartbeating every second and a stream of job
submissions, over gRPC on loopback, as INTERFACES.md's API (stubs from proto/).

  /usr/bin/python3 bench/control_plane_bench.py bazel-bin/satdar [--workers 200] [--rate 50]
      [--seconds 60]

Each simulated worker has 4 slots; it runs what it is assigned by reporting the rank running
at its next heartbeat and its exit (code 0) at the one after. Prints p50/p99 latency per RPC,
the coordinator's CPU time and peak RSS, and checks that every submitted job SUCCEEDED exactly
once (no lost or duplicated job). Not a timed test: numbers go to docs/PERFORMANCE.md.
"""
import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("satdar")
    ap.add_argument("--workers", type=int, default=200)
    ap.add_argument("--rate", type=float, default=50, help="submissions per second")
    ap.add_argument("--seconds", type=float, default=60)
    args = ap.parse_args()
    here = os.path.dirname(os.path.abspath(__file__))
    tmp = tempfile.mkdtemp(prefix="satdar-cp-bench-")
    os.makedirs(tmp + "/py/proto/satdar/v1")
    os.makedirs(tmp + "/state")
    shutil.copy(here + "/../proto/satdar/v1/control.proto", tmp + "/py/proto/satdar/v1/")
    subprocess.check_call(["protoc", "-I.", "--python_out=.", "--grpc_out=.",
                           "--plugin=protoc-gen-grpc=/usr/bin/grpc_python_plugin",
                           "proto/satdar/v1/control.proto"], cwd=tmp + "/py")
    sys.path.insert(0, tmp + "/py")
    import grpc
    from proto.satdar.v1 import control_pb2 as pb, control_pb2_grpc as rpc

    coord = subprocess.Popen([args.satdar, "coordinator", "--listen", "127.0.0.1:0",
                              "--state-dir", tmp + "/state", "--quiet"])
    for _ in range(200):
        if os.path.exists(tmp + "/state/coordinator.json"):
            break
        time.sleep(0.05)
    addr = json.load(open(tmp + "/state/coordinator.json"))["grpc"]
    latencies = {}
    lock = threading.Lock()

    def timed(name, fn, *a, **kw):
        t0 = time.perf_counter()
        r = fn(*a, timeout=30, **kw)
        dt = time.perf_counter() - t0
        with lock:
            latencies.setdefault(name, []).append(dt)
        return r

    channel = grpc.insecure_channel(addr)
    workers_stub = rpc.WorkerServiceStub(channel)
    jobs_stub = rpc.JobServiceStub(channel)
    stop = threading.Event()

    def worker(i):
        ch = grpc.insecure_channel(addr)
        stub = rpc.WorkerServiceStub(ch)
        reg = timed("RegisterWorker", stub.RegisterWorker,
                    pb.RegisterWorkerRequest(name="sim-%d" % i, slots=4, device="cpu"))
        wid = reg.worker_id
        md = [("satdar-worker-session", reg.session)]  # names this worker on every later call
        running, ended = [], []
        time.sleep(random.random())
        while not stop.is_set():
            t0 = time.time()
            for r in ended:  # ended at the last beat: report the exits
                timed("ReportExit", stub.ReportExit,
                      pb.RankExit(worker_id=wid, job_id=r[0], attempt=r[1], rank=r[2], exit_code=0),
                      metadata=md)
            ended = running
            req = pb.HeartbeatRequest(worker_id=wid, ranks=[
                pb.RankStatus(job_id=j, attempt=a, rank=k, pid=1) for j, a, k in running])
            resp = timed("Heartbeat", stub.Heartbeat, req, metadata=md)
            running = [(s.job_id, s.attempt, s.rank) for s in resp.start]
            time.sleep(max(0, 1 - (time.time() - t0)))

    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(args.workers)]
    for t in threads:
        t.start()
    config = json.dumps({"vocab_size": 64, "hidden_size": 16, "intermediate_size": 32,
                         "num_hidden_layers": 2, "num_attention_heads": 2,
                         "max_position_embeddings": 64})
    spec = pb.JobSpec(config_json=config, layout=pb.Layout(dp=2), train=[
        pb.TrainFlag(name=k, value=v) for k, v in
        [("steps", "10"), ("batch_size", "2"), ("seq_len", "8"), ("synthetic_data", "true")]])
    submitted = []
    start = time.time()
    n = 0
    while time.time() - start < args.seconds:
        due = start + n / args.rate
        if time.time() < due:
            time.sleep(due - time.time())
        r = timed("SubmitJob", jobs_stub.SubmitJob,
                  pb.SubmitJobRequest(request_id="bench-%d" % n, spec=spec))
        submitted.append(r.job_id)
        n += 1
    # Let the last jobs finish, then check every one.
    deadline = time.time() + 60
    while time.time() < deadline:
        listed = timed("ListJobs", jobs_stub.ListJobs, pb.ListJobsRequest(limit=100000))
        states = [j.state for j in listed.jobs]
        if len(states) >= len(submitted) and all(s == pb.SUCCEEDED for s in states):
            break
        time.sleep(1)
    stop.set()
    for t in threads:
        t.join(timeout=5)
    with open("/proc/%d/stat" % coord.pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    with open("/proc/%d/status" % coord.pid) as f:
        hwm = [l for l in f if l.startswith("VmHWM")][0].split()[1]
    listed = jobs_stub.ListJobs(pb.ListJobsRequest(limit=100000), timeout=30)
    ids = [j.job_id for j in listed.jobs]
    ok = (len(ids) == len(set(ids)) == len(submitted) and set(ids) == set(submitted) and
          all(j.state == pb.SUCCEEDED and j.attempts == 1 for j in listed.jobs))
    coord.terminate()
    coord.wait()
    print("coordinator under %d simulated workers (4 slots, 1 heartbeat/s) and %.0f submissions/s "
          "for %.0f s" % (args.workers, args.rate, args.seconds))
    print("%-16s %8s %10s %10s %10s" % ("rpc", "calls", "p50 ms", "p99 ms", "max ms"))
    for name, v in sorted(latencies.items()):
        v.sort()
        print("%-16s %8d %10.2f %10.2f %10.2f" % (name, len(v), 1e3 * v[len(v) // 2],
                                               1e3 * v[int(len(v) * 0.99)], 1e3 * v[-1]))
    print("coordinator CPU %.1f s over %.0f s, peak RSS %.1f MB" %
          (cpu, time.time() - start, int(hwm) / 1024))
    print("jobs: %d submitted, %d listed, all SUCCEEDED once: %s" % (len(submitted), len(ids), ok))
    shutil.rmtree(tmp)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
