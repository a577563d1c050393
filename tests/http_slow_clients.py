# Slow clients against an HTTP server while /healthz is probed: HOST:PORT SLOW_CLIENTS.
# Prints "<ok> ok, <bad> timed out, slowest <s> s" for 40 probes with a 1 s timeout.
import socket, sys, threading, time, urllib.request
host, port = sys.argv[1].split(":"); port = int(port)
slow = int(sys.argv[2]); stop = time.time() + 12
def slow_client():
    while time.time() < stop:   # slowloris: a header byte a second, reconnecting when cut
        try:
            s = socket.create_connection((host, port), timeout=3)
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
            while time.time() < stop:
                s.sendall(b"X"); time.sleep(1)
        except OSError:
            time.sleep(0.1)
ts = [threading.Thread(target=slow_client, daemon=True) for _ in range(slow)]
for t in ts: t.start()
time.sleep(1)
ok = bad = 0; worst = 0
for _ in range(40):
    t0 = time.time()
    try:
        urllib.request.urlopen(f"http://{host}:{port}/healthz", timeout=1).read(); ok += 1
    except Exception:
        bad += 1
    worst = max(worst, time.time() - t0); time.sleep(0.25)
print(f"{ok} ok, {bad} timed out, slowest {worst:.2f} s")
