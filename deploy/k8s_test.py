#!/usr/bin/env python3
"""deploy/k8s/ checked offline (no cluster): every manifest is a well-formed object of its kind
(the fields the API server requires, with the right types), the references inside agree
(selectors and labels, Service ports and container ports, volume mounts and volumes, claims,
the StatefulSet's Service, the Secret's keys), every container runs a satdar command with flags
that command accepts (asked of the real binary: `satdar <command> --help`), the ports it
listens on are the ones declared, its token files and folders are on mounted volumes, the
workers reach the coordinator's Service and request as many GPUs as they have slots, and
Prometheus scrapes the coordinator's HTTP port.
Usage: k8s_test.py PATH_TO_SATDAR"""
import os
import re
import subprocess
import sys

import yaml

SATDAR = sys.argv[1]
HERE = os.path.dirname(os.path.realpath(__file__))
K8S = os.path.join(HERE, "k8s")
if not os.path.isdir(K8S):
    K8S = os.path.join(os.environ.get("TEST_SRCDIR", "."), os.environ.get("TEST_WORKSPACE", "satdar"),
                       "deploy", "k8s")
failures = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what)
    if not ok:
        failures.append(what)


docs = []
for name in sorted(os.listdir(K8S)):
    if name.endswith(".yaml") and name != "kustomization.yaml":
        with open(os.path.join(K8S, name)) as f:
            for d in yaml.safe_load_all(f):
                if d is not None:
                    docs.append((name, d))
by_kind = {}
for name, d in docs:
    by_kind.setdefault(d.get("kind"), []).append(d)

# 1. Well-formed objects.
API = {"PersistentVolumeClaim": "v1", "Service": "v1", "Deployment": "apps/v1",
       "StatefulSet": "apps/v1"}
NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
for name, d in docs:
    kind = d.get("kind")
    check(kind in API and d.get("apiVersion") == API[kind], f"{name}: {kind} has apiVersion {API.get(kind)}")
    meta = d.get("metadata", {})
    check(isinstance(meta.get("name"), str) and NAME.match(meta["name"]) and len(meta["name"]) <= 63,
          f"{name}: {kind} has a DNS-1123 metadata.name")
    spec = d.get("spec")
    check(isinstance(spec, dict), f"{name}: {kind} {meta.get('name')} has a spec")
    if kind == "PersistentVolumeClaim":
        check(set(spec.get("accessModes", [])) <= {"ReadWriteOnce", "ReadWriteMany", "ReadOnlyMany",
                                                   "ReadWriteOncePod"} and spec.get("accessModes"),
              f"{meta['name']}: access modes are valid")
        check(re.match(r"^\d+(Ki|Mi|Gi|Ti)$", str(spec["resources"]["requests"]["storage"])) is not None,
              f"{meta['name']}: storage request is a quantity")
    if kind == "Service":
        for p in spec.get("ports", []):
            check(isinstance(p.get("port"), int) and 0 < p["port"] < 65536, f"{meta['name']}: port {p.get('name')} is a port")
    if kind in ("Deployment", "StatefulSet"):
        sel = spec["selector"]["matchLabels"]
        labels = spec["template"]["metadata"]["labels"]
        check(all(labels.get(k) == v for k, v in sel.items()), f"{meta['name']}: selector matches the pod labels")
        check(isinstance(spec.get("replicas"), int) and spec["replicas"] >= 1, f"{meta['name']}: replicas >= 1")

# 2. References.
pods = {d["metadata"]["name"]: d["spec"]["template"] for k in ("Deployment", "StatefulSet")
        for d in by_kind.get(k, [])}
claims = {d["metadata"]["name"] for d in by_kind.get("PersistentVolumeClaim", [])}
services = {d["metadata"]["name"]: d for d in by_kind.get("Service", [])}
for sts in by_kind.get("StatefulSet", []):
    check(sts["spec"]["serviceName"] in services, f"{sts['metadata']['name']}: serviceName is a Service")
for sname, svc in services.items():
    sel = svc["spec"]["selector"]
    matched = [p for p in pods.values() if all(p["metadata"]["labels"].get(k) == v for k, v in sel.items())]
    check(len(matched) == 1, f"Service {sname} selects one workload")
    if matched and svc["spec"].get("clusterIP") != "None":
        names = {cp.get("name") for c in matched[0]["spec"]["containers"] for cp in c.get("ports", [])}
        nums = {cp["containerPort"] for c in matched[0]["spec"]["containers"] for cp in c.get("ports", [])}
        for p in svc["spec"]["ports"]:
            t = p.get("targetPort", p["port"])
            check(t in names or t in nums, f"Service {sname}: targetPort {t} is a container port")
SECRET_KEYS = {"client", "worker"}  # kubectl create secret generic satdar-tokens (README.md)
for wname, pod in pods.items():
    vols = {v["name"]: v for v in pod["spec"]["volumes"]}
    for c in pod["spec"]["containers"]:
        for m in c.get("volumeMounts", []):
            check(m["name"] in vols, f"{wname}: mount {m['name']} is a volume")
    for v in vols.values():
        if "persistentVolumeClaim" in v:
            check(v["persistentVolumeClaim"]["claimName"] in claims, f"{wname}: claim {v['persistentVolumeClaim']['claimName']} exists")
        if "secret" in v:
            check(v["secret"]["secretName"] == "satdar-tokens", f"{wname}: the tokens come from satdar-tokens")

# 3. Containers against the binary.
def help_flags(command):
    out = subprocess.run([SATDAR, command, "--help"], capture_output=True, text=True)
    return set(re.findall(r"(--[a-z][a-z0-9-]*)", out.stdout + out.stderr))


def flag_values(args):
    values = {}
    for a in args[1:]:
        m = re.match(r"^(--[a-z][a-z0-9-]*)(?:=(.*))?$", a.split("  #")[0].strip())
        check(m is not None, f"argument {a!r} is --flag=value")
        if m:
            values[m.group(1)] = m.group(2)
    return values


def mounted(pod, container, path):
    return any(path == m["mountPath"] or path.startswith(m["mountPath"].rstrip("/") + "/")
               for m in container.get("volumeMounts", []))


images = set()
coordinator = None
for wname, pod in pods.items():
    for c in pod["spec"]["containers"]:
        images.add(c["image"])
        command = c["args"][0]
        known = help_flags(command)
        check(bool(known), f"{wname}: satdar {command} is a command")
        values = flag_values(c["args"])
        for flag in values:
            check(flag in known, f"{wname}: satdar {command} accepts {flag}")
        ports = {p["containerPort"] for p in c.get("ports", [])}
        for flag in ("--listen", "--http"):
            if flag in values:
                port = int(values[flag].rsplit(":", 1)[1])
                check(port in ports, f"{wname}: {flag} port {port} is declared")
        for flag in ("--token-file", "--worker-token-file", "--state-dir", "--work-dir", "--shared-dir",
                     "--data-root"):
            if flag in values:
                check(mounted(pod, c, values[flag]), f"{wname}: {flag} {values[flag]} is on a mounted volume")
        for flag in ("--token-file", "--worker-token-file"):
            if flag in values:
                check(os.path.basename(values[flag]) in SECRET_KEYS, f"{wname}: {flag} is a key of satdar-tokens")
        env = {e["name"] for e in c.get("env", [])}
        for ref in re.findall(r"\$\((\w+)\)", " ".join(c["args"])):
            check(ref in env, f"{wname}: $({ref}) is set in env")
        if command == "coordinator":
            coordinator = (wname, values)
            ann = pod["metadata"].get("annotations", {})
            check(ann.get("prometheus.io/scrape") == "true" and
                  ann.get("prometheus.io/port") == values["--http"].rsplit(":", 1)[1],
                  f"{wname}: Prometheus scrapes the --http port")
        if command == "worker":
            gpus = c["resources"]["limits"].get("nvidia.com/gpu")
            check(values.get("--device") == "cuda" and str(gpus) == values.get("--slots"),
                  f"{wname}: one GPU per slot ({gpus} GPUs, --slots {values.get('--slots')})")
            host, port = values["--coordinator"].rsplit(":", 1)
            svc = services.get(host)
            check(svc is not None and int(port) in {p["port"] for p in svc["spec"]["ports"]},
                  f"{wname}: --coordinator {values['--coordinator']} is the coordinator's Service")
            check(values.get("--host", "").startswith("$("), f"{wname}: --host is the pod's address")
            check({"NCCL_SOCKET_IFNAME", "SATDAR_GLOO_IFACE"} <= env, f"{wname}: NCCL's and Gloo's interface are set")
check(len(images) == 1, f"one image for every container ({sorted(images)})")
check(coordinator is not None, "a coordinator runs")
with open(os.path.join(K8S, "kustomization.yaml")) as f:
    kz = yaml.safe_load(f)
check(all(os.path.exists(os.path.join(K8S, r)) for r in kz["resources"]), "kustomization lists files that exist")
print(f"{len(failures)} failed")
sys.exit(1 if failures else 0)
