#!/usr/bin/env bash
# satdar under a real Slurm (Debian's slurm-wlm with munge: slurmctld and slurmd started here
# as a one-node cluster with a private slurm.conf, ../shared/notes/slurm-local.md): a two-task
# job of deploy/slurm/train.sbatch (direct mode, --launcher slurm) logs the same losses as the
# same run under mpirun; a job requeued after its first checkpoint (as after a node failure)
# resumes from it and logs the uninterrupted run's losses; scancel leaves no rank behind; and
# deploy/slurm/cluster.sbatch (a coordinator and a worker under srun) runs a job spec to the end.
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
T=(--config "$WORK/dar.json" --synthetic-data --seq-len 16 --batch-size 4 --dtype f64 --threads 1
   --quiet --stats-every 0 --dp 2 --seed 3)
job_of() { sed -n 's/^Submitted batch job //p' "$1"; }
losses() { python3 -c "import json,sys; print(' '.join('%.15g' % json.loads(l)['loss'] for l in open(sys.argv[1])))" "$1"; }

# 1. Two tasks under srun equal two ranks under mpirun.
"${MPIRUN[@]}" -np 2 "$SATDAR" train "${T[@]}" --steps 6 --log-jsonl "$WORK/mpi.jsonl" >mpi.txt 2>&1
sbatch --wait -n 2 -o "$WORK/job1.out" "$ROOT/deploy/slurm/train.sbatch" "${T[@]}" --steps 6 \
  --checkpoint-every 3 --log-jsonl log.jsonl >submit1.txt 2>&1
j1=$(job_of submit1.txt)
if [[ -n $j1 && -f "$SATDAR_SHARED/jobs/$j1/log.jsonl" ]] &&
    [[ $(losses "$SATDAR_SHARED/jobs/$j1/log.jsonl") == $(losses mpi.jsonl) ]]; then
  ok "a 2-task Slurm job logs the losses of the same run under mpirun"
else
  fail "slurm vs mpirun"; cat submit1.txt "$WORK/job1.out" mpi.txt
fi

# 2. Requeued after its first checkpoint: resumes from it, same losses as uninterrupted.
sbatch -n 2 -o "$WORK/job2.out" "$ROOT/deploy/slurm/train.sbatch" "${T[@]}" --steps 40 \
  --checkpoint-every 2 --log-jsonl log.jsonl >submit2.txt 2>&1
j2=$(job_of submit2.txt)
d2=$SATDAR_SHARED/jobs/$j2
for _ in $(seq 1 600); do ls "$d2"/checkpoints/ckpt_* >/dev/null 2>&1 && break; sleep 0.1; done
scontrol requeue "$j2"
# Slurm holds a requeued job back for a while (its begin time): release it now.
for _ in $(seq 1 50); do scontrol update JobId="$j2" StartTime=now 2>/dev/null && break; sleep 0.2; done
for _ in $(seq 1 1200); do
  [[ $(squeue -h -j "$j2" 2>/dev/null | wc -l) -eq 0 ]] && break; sleep 0.25
done
"${MPIRUN[@]}" -np 2 "$SATDAR" train "${T[@]}" --steps 40 --log-jsonl "$WORK/mpi40.jsonl" >/dev/null 2>&1
if python3 - "$d2/log.jsonl" mpi40.jsonl "$WORK/job2.out" <<'PY'
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
PY
then ok "a requeued job resumes from its newest checkpoint with the uninterrupted losses"
else fail "requeue"; cat "$WORK/job2.out"; fi

# 3. scancel: no rank survives.
sbatch -n 2 -o "$WORK/job3.out" "$ROOT/deploy/slurm/train.sbatch" "${T[@]}" --steps 100000 \
  --log-jsonl log.jsonl >submit3.txt 2>&1
j3=$(job_of submit3.txt)
for _ in $(seq 1 600); do [[ -s "$SATDAR_SHARED/jobs/$j3/log.jsonl" ]] && break; sleep 0.1; done
[[ $(pgrep -fc "jobs/$j3/rendezvous") -ge 2 ]] && ok "both ranks run" || fail "ranks of job 3 not running"
scancel "$j3"
for _ in $(seq 1 150); do [[ $(pgrep -fc "jobs/$j3/rendezvous") -eq 0 ]] && break; sleep 0.1; done
[[ $(pgrep -fc "jobs/$j3/rendezvous") -eq 0 ]] && ok "scancel leaves no rank behind" ||
  { fail "ranks survived scancel"; pgrep -fa "jobs/$j3/rendezvous"; }

# 4. Control-plane mode: a coordinator and a worker under srun run a job spec to the end.
python3 - "$WORK" <<'PY'
import json, sys
w = sys.argv[1]
json.dump({"name": "slurm-demo", "config": json.load(open(w + "/baseline.json")),
           "layout": {"dp": 2},
           "train": {"synthetic_data": True, "steps": 4, "batch_size": 2, "seq_len": 16}},
          open(w + "/job.json", "w"))
PY
SATDAR_SLOTS=2 SATDAR_DEVICE=cpu sbatch --wait -N 1 -n 1 -o "$WORK/job4.out" \
  "$ROOT/deploy/slurm/cluster.sbatch" "$WORK/job.json" >submit4.txt 2>&1
code=$?
[[ $code -eq 0 ]] && grep -q "SUCCEEDED" "$WORK/job4.out" &&
  ok "cluster.sbatch: coordinator and worker under srun ran the job (SUCCEEDED)" ||
  { fail "cluster.sbatch (exit $code)"; cat submit4.txt "$WORK/job4.out"; }

echo "$passed passed, $failed failed"
[[ $failed -eq 0 ]]
