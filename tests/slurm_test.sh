#!/usr/bin/env bash
# satdar under a real Slurm (Debian's slurm-wlm with munge: slurmctld and slurmd started here
# as a one-node cluster with a private slurm.conf, ../shared/notes/slurm-local.md), with the
# commands deploy/slurm/README.md, the scripts' headers and docs/SCALING.md document, typed as
# written in a submit folder laid out like a checkout (configs/, deploy/slurm/), adapted only in
# sizes (one node, CPU ranks, a small model, a few steps; no --gpus-per-node, --device cuda or
# --dtype bf16):
# 1. train.sbatch (direct mode, --launcher slurm) with a relative --config and the dataset under
#    $SATDAR_SHARED/data logs the same losses as the same run under mpirun, its relative
#    --log-jsonl in the job's folder;
# 2. a job requeued after its first checkpoint (as after a node failure) resumes from it and logs
#    the uninterrupted run's losses (--flag=value forms, a relative --summary-json);
# 3. scancel leaves no rank behind;
# 4. cluster.sbatch (a coordinator and a worker under srun) runs a job spec with a relative
#    config and "data": "pile" ($SATDAR_SHARED/data, the workers' --data-root) to the end, and
#    exits 2 naming SATDAR_DATA_ROOT when that is not a folder.
# Usage: slurm_test.sh PATH_TO_SATDAR
set -u
SATDAR=$(realpath "$1")
HERE=$(dirname "$(realpath "$0")")
ROOT=$(dirname "$HERE")
source "$HERE/parallel_testlib.sh"
enter_workdir slurm
ok() { echo "ok   $1"; passed=$((passed + 1)); }
fail() { echo "FAIL $1"; failed=$((failed + 1)); }
for tool in slurmctld slurmd sbatch squeue scancel scontrol munged; do
  command -v "$tool" >/dev/null || { echo "FAIL $tool is not installed (scripts/setup.sh)"; exit 1; }
done

# --- a one-node Slurm cluster, private to this test ---
free_port() { python3 -c "import socket; s = socket.socket(); s.bind(('', 0)); print(s.getsockname()[1])"; }
host=$(hostname -s)
# The daemons' folders: short paths (slurmd's Unix sockets live in its spool folder and may
# not exceed 108 bytes, a test's temporary folder can be longer).
SD=$(mktemp -d /tmp/satdar-slurm.XXXXXX)
mkdir -p "$SD/state" "$SD/spool" "$SD/log"
export SLURM_CONF=$SD/slurm.conf
cat >"$SLURM_CONF" <<CONF
ClusterName=satdartest
SlurmctldHost=$host
SlurmUser=root
SlurmctldPort=$(free_port)
SlurmdPort=$(free_port)
AuthType=auth/munge
StateSaveLocation=$SD/state
SlurmdSpoolDir=$SD/spool
SlurmctldPidFile=$SD/slurmctld.pid
SlurmdPidFile=$SD/slurmd.pid
SlurmctldLogFile=$SD/log/slurmctld.log
SlurmdLogFile=$SD/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
SelectType=select/cons_tres
MpiDefault=none
ReturnToService=2
KillWait=5
NodeName=$host CPUs=$(nproc) RealMemory=16000 State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
CONF
# munge: its key owned by munge, its own socket folder and pid (never the system's daemon), in
# a folder the munge user can reach (a test's temporary folder may sit under root's home).
MUNGE_DIR=$(mktemp -d /tmp/satdar-munge.XXXXXX)
MUNGE_SOCKET=$MUNGE_DIR/munge.socket
chown munge:munge "$MUNGE_DIR"
[[ -f /etc/munge/munge.key ]] || { mungekey -c 2>/dev/null || create-munge-key -f; }
chown munge:munge /etc/munge/munge.key && chmod 400 /etc/munge/munge.key
runuser -u munge -- munged --socket="$MUNGE_SOCKET" --pid-file="$MUNGE_DIR/munged.pid" \
  --log-file="$MUNGE_DIR/munged.log" --seed-file="$MUNGE_DIR/seed" --force
cleanup() {
  scancel --full --quiet $(squeue -h -o %i 2>/dev/null) 2>/dev/null
  for f in "$SD/slurmd.pid" "$SD/slurmctld.pid" "$MUNGE_DIR/munged.pid"; do
    [[ -f "$f" ]] && kill "$(cat "$f")" 2>/dev/null
  done
  sleep 1
  pkill -f "rendezvous $WORK" 2>/dev/null
  cp -r "$SD/log" "$WORK/slurm-log" 2>/dev/null
  rm -rf "$MUNGE_DIR" "$SD"
}
trap cleanup EXIT
# Slurm's daemons reach munge through this socket (the AuthInfo option).
echo "AuthInfo=socket=$MUNGE_SOCKET" >>"$SLURM_CONF"
slurmctld -f "$SLURM_CONF" && slurmd -f "$SLURM_CONF" || { echo "FAIL slurm daemons"; cat "$SD"/log/*; exit 1; }
for _ in $(seq 1 100); do sinfo -h -o %t 2>/dev/null | grep -q idle && break; sleep 0.2; done
sinfo -h -o %t | grep -q idle && ok "a one-node Slurm cluster is up" ||
  { fail "slurm did not come up"; sinfo; cat "$SD"/log/*; exit 1; }

write_small_configs
export SATDAR_SHARED=$WORK/shared SATDAR=$SATDAR OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-Haswell}
mkdir -p "$SATDAR_SHARED"
# The submit folder: a user's checkout (configs/, deploy/slurm/), plus the small test configs.
SUB=$WORK/submit
mkdir -p "$SUB/deploy" "$SUB/small"
cp -r "$ROOT/configs" "$SUB/configs" && cp -r "$ROOT/deploy/slurm" "$SUB/deploy/slurm"
cp base.json baseline.json dar.json "$SUB/small/"
# The dataset where docs/SCALING.md puts it ($SATDAR_SHARED/data/pile): a folder of text, read
# as byte-level tokens (the CPU configs' vocabulary is 256).
mkdir -p "$SATDAR_SHARED/data/pile"
python3 - "$SATDAR_SHARED/data/pile" <<'PY'
import random, sys
r = random.Random(7)
words = ("the of and to in a is that for it as was with be by on not he this are or his from at "
         "which but have an they you were their one all we can her has there been if more").split()
for i in range(4):
    with open("%s/part-%d.txt" % (sys.argv[1], i), "w") as f:
        for _ in range(300):
            f.write(" ".join(r.choice(words) for _ in range(r.randint(5, 15))).capitalize() + ".\n")
PY
cd "$SUB" || exit 1
T=(--config small/dar.json --synthetic-data --seq-len 16 --batch-size 4 --dtype f64 --threads 1
   --quiet --stats-every 0 --dp 2 --seed 3)
job_of() { sed -n 's/^Submitted batch job //p' "$1"; }
losses() { python3 -c "import json,sys; print(' '.join('%.15g' % json.loads(l)['loss'] for l in open(sys.argv[1])))" "$1"; }

# 1. docs/SCALING.md's one-node direct-mode command (deploy/slurm/README.md's, on one node):
#    two tasks under srun equal two ranks under mpirun; --config is relative to the submit
#    folder, --log-jsonl lands in the job's folder.
sbatch --wait --nodes=1 --ntasks-per-node=2 -o "$WORK/job1.out" \
    deploy/slurm/train.sbatch --config configs/cpu/dar-moe.json \
    --dp 2 --tp 1 --pp 1 --ep 1 --microbatches 2 --zero 1 --batch-size 4 --seq-len 16 \
    --data "$SATDAR_SHARED/data/pile" --steps 6 --checkpoint-every 3 --log-jsonl log.jsonl \
    >"$WORK/submit1.txt" 2>&1
"${MPIRUN[@]}" -np 2 "$SATDAR" train --config configs/cpu/dar-moe.json \
    --dp 2 --tp 1 --pp 1 --ep 1 --microbatches 2 --zero 1 --batch-size 4 --seq-len 16 \
    --data "$SATDAR_SHARED/data/pile" --steps 6 --log-jsonl "$WORK/mpi.jsonl" >"$WORK/mpi.txt" 2>&1
j1=$(job_of "$WORK/submit1.txt")
if [[ -n $j1 && -f "$SATDAR_SHARED/jobs/$j1/log.jsonl" && -s "$WORK/mpi.jsonl" ]] &&
    [[ $(losses "$SATDAR_SHARED/jobs/$j1/log.jsonl") == $(losses "$WORK/mpi.jsonl") ]]; then
  ok "the documented train.sbatch command (relative --config, data under \$SATDAR_SHARED/data) logs the losses of the same run under mpirun"
else
  fail "the documented train.sbatch command vs mpirun"; cat "$WORK/submit1.txt" "$WORK/job1.out" "$WORK/mpi.txt"
fi
ls "$SATDAR_SHARED/jobs/$j1"/checkpoints/ckpt_* >/dev/null 2>&1 && [[ ! -e log.jsonl ]] &&
  ok "its checkpoints and log are in the job's folder, nothing in the submit folder" ||
  fail "job 1's outputs are not in its folder"

# 2. Requeued after its first checkpoint: resumes from it, same losses as uninterrupted
#    (--flag=value forms: the relative --log-jsonl and --summary-json land in the job's folder).
sbatch -n 2 -o "$WORK/job2.out" deploy/slurm/train.sbatch "${T[@]}" --steps 40 \
  --checkpoint-every 2 --log-jsonl=log.jsonl --summary-json=summary.json >"$WORK/submit2.txt" 2>&1
j2=$(job_of "$WORK/submit2.txt")
d2=$SATDAR_SHARED/jobs/$j2
for _ in $(seq 1 600); do ls "$d2"/checkpoints/ckpt_* >/dev/null 2>&1 && break; sleep 0.1; done
scontrol requeue "$j2"
# Slurm holds a requeued job back for a while (its begin time): release it now.
for _ in $(seq 1 50); do scontrol update JobId="$j2" StartTime=now 2>/dev/null && break; sleep 0.2; done
for _ in $(seq 1 1200); do
  [[ $(squeue -h -j "$j2" 2>/dev/null | wc -l) -eq 0 ]] && break; sleep 0.25
done
"${MPIRUN[@]}" -np 2 "$SATDAR" train "${T[@]}" --steps 40 --log-jsonl "$WORK/mpi40.jsonl" >/dev/null 2>&1
if python3 - "$d2/log.jsonl" "$WORK/mpi40.jsonl" "$WORK/job2.out" "$d2/summary.json" <<'PY'
import json, sys
run = [json.loads(l) for l in open(sys.argv[1])]
full = {j["step"]: j["loss"] for j in map(json.loads, open(sys.argv[2]))}
out = open(sys.argv[3]).read()
assert "run 2" in out, "the job did not run a second time"
steps = [r["step"] for r in run]
assert sorted(set(steps)) == list(range(1, 41)), steps
assert all(abs(r["loss"] - full[r["step"]]) <= 1e-12 * abs(full[r["step"]]) for r in run), "losses differ"
# Run 1 logged at least to its first checkpoint; had run 2 started over, step 1 would appear
# twice. It appends from the newest checkpoint's next step (a step after that checkpoint may
# appear twice: run 1 logged it, run 2 did it again).
assert steps.count(1) == 1, ("the requeued run started over", steps)
json.load(open(sys.argv[4]))  # the summary, in the job's folder
PY
then ok "a requeued job resumes from its newest checkpoint with the uninterrupted losses"
else fail "requeue"; cat "$WORK/job2.out"; fi

# 3. scancel: no rank survives.
sbatch -n 2 -o "$WORK/job3.out" deploy/slurm/train.sbatch "${T[@]}" --steps 100000 \
  --log-jsonl log.jsonl >"$WORK/submit3.txt" 2>&1
j3=$(job_of "$WORK/submit3.txt")
for _ in $(seq 1 600); do [[ -s "$SATDAR_SHARED/jobs/$j3/log.jsonl" ]] && break; sleep 0.1; done
[[ $(pgrep -fc "jobs/$j3/rendezvous") -ge 2 ]] && ok "both ranks run" || fail "ranks of job 3 not running"
scancel "$j3"
for _ in $(seq 1 150); do [[ $(pgrep -fc "jobs/$j3/rendezvous") -eq 0 ]] && break; sleep 0.1; done
[[ $(pgrep -fc "jobs/$j3/rendezvous") -eq 0 ]] && ok "scancel leaves no rank behind" ||
  { fail "ranks survived scancel"; pgrep -fa "jobs/$j3/rendezvous"; }

# 4. Control-plane mode, deploy/slurm/README.md's command on one node: a coordinator and a
#    worker under srun run a job spec shaped like docs/SCALING.md's (a relative config, "data":
#    "pile", which is $SATDAR_SHARED/data/pile) to the end.
cat >job.json <<'JSON'
{"name": "slurm-demo", "config": "configs/cpu/dar-moe.json", "train": {"steps": 4, "batch_size": 2, "seq_len": 16, "data": "pile", "checkpoint_every": 2, "log_every": 1}, "layout": {"dp": 2}, "resources": {"device": "cpu"}, "max_restarts": 3}
JSON
SATDAR_SLOTS=2 SATDAR_DEVICE=cpu sbatch --wait --nodes=1 --ntasks-per-node=1 --exclusive \
  -o "$WORK/job4.out" deploy/slurm/cluster.sbatch job.json >"$WORK/submit4.txt" 2>&1
code=$?
j4=$(job_of "$WORK/submit4.txt")
job4=$(cat "$SATDAR_SHARED/cluster-$j4/job_id" 2>/dev/null)
log4=$SATDAR_SHARED/cluster-$j4/shared/jobs/$job4/log.jsonl
if [[ $code -eq 0 && -n $job4 && $(wc -l <"$log4" 2>/dev/null) -ge 4 ]] && grep -q "SUCCEEDED" "$WORK/job4.out"; then
  ok "cluster.sbatch: coordinator and worker under srun ran the job on \$SATDAR_SHARED/data/pile (SUCCEEDED)"
else
  fail "cluster.sbatch (exit $code)"; cat "$WORK/submit4.txt" "$WORK/job4.out"
  tail -n 5 "$SATDAR_SHARED/cluster-$j4"/shared/jobs/*/*.log 2>/dev/null
fi
[[ -n $j4 ]] && rm -rf "/tmp/satdar-work-$j4"  # the worker's --work-dir (cluster.sbatch's)
# A data root that is not a folder: the script exits 2 naming it.
SATDAR_DATA_ROOT=$WORK/no-such-data SATDAR_SLOTS=2 SATDAR_DEVICE=cpu sbatch --wait --nodes=1 \
  --ntasks-per-node=1 -o "$WORK/job5.out" deploy/slurm/cluster.sbatch job.json >"$WORK/submit5.txt" 2>&1
code=$?
if [[ $code -ne 0 ]] && grep -q "SATDAR_DATA_ROOT: .*no-such-data is not a folder" "$WORK/job5.out" &&
    scontrol show job "$(job_of "$WORK/submit5.txt")" 2>/dev/null | grep -q "ExitCode=2:"; then
  ok "cluster.sbatch with a missing SATDAR_DATA_ROOT exits 2 naming it"
else
  fail "missing SATDAR_DATA_ROOT (exit $code)"; cat "$WORK/job5.out"
fi

echo "$passed passed, $failed failed"
[[ $failed -eq 0 ]]
