#!/bin/sh
# A study on a real single-node Slurm (Debian's slurm-wlm and munge, started here on localhost):
# `mantis lamp sweep --emit-slurm` writes the submit script, the array tasks run the shards, the
# dependent job merges, and the merged result set equals the unsharded run's bit for bit (timings
# aside). Usage: run_slurm.sh SOURCE_ROOT MANTIS_BIN. Exit 77 (SKIP) without Slurm, munge or root.
set -eu
root=$1
bin=$2
for p in slurmctld slurmd munged sbatch squeue sinfo scontrol; do
  command -v "$p" >/dev/null 2>&1 || PATH="$PATH:/usr/sbin"
  command -v "$p" >/dev/null 2>&1 || { echo "SKIP: $p not installed (apt-get install slurm-wlm munge)"; exit 77; }
done
[ "$(id -u)" = 0 ] || { echo "SKIP: the test starts slurmd, which needs root"; exit 77; }

d=$(mktemp -d /tmp/mantis-slurm-XXXXXX)
mkdir -p "$d/state" "$d/spool" "$d/munge" "$d/logs"
cleanup() {
  [ -f "$d/slurmctld.pid" ] && kill "$(cat "$d/slurmctld.pid")" 2>/dev/null || true
  [ -f "$d/slurmd.pid" ] && kill "$(cat "$d/slurmd.pid")" 2>/dev/null || true
  [ -f "$d/munge/pid" ] && kill "$(cat "$d/munge/pid")" 2>/dev/null || true
  sleep 1
  rm -rf "$d"
}
trap cleanup EXIT

# munge with its own key and socket (nothing of the machine's is touched)
dd if=/dev/urandom of="$d/munge/key" bs=1024 count=1 2>/dev/null
chmod 600 "$d/munge/key"
munged --key-file="$d/munge/key" --socket="$d/munge/sock" --pid-file="$d/munge/pid" --log-file="$d/munge/log" \
  --seed-file="$d/munge/seed" --force

host=$(hostname -s)
port=$((20000 + $$ % 20000))
mem=$(awk '/MemTotal/ { print int($2 / 2048) }' /proc/meminfo)
cat >"$d/slurm.conf" <<EOF
ClusterName=mantis-test
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$port
SlurmdPort=$((port + 1))
AuthType=auth/munge
AuthInfo=socket=$d/munge/sock
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$d/state
SlurmdSpoolDir=$d/spool
SlurmctldPidFile=$d/slurmctld.pid
SlurmdPidFile=$d/slurmd.pid
SlurmctldLogFile=$d/slurmctld.log
SlurmdLogFile=$d/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
ReturnToService=2
JobCompType=jobcomp/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MinJobAge=600
NodeName=$host NodeAddr=127.0.0.1 CPUs=$(nproc) RealMemory=$mem State=UNKNOWN
PartitionName=mantis Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
export SLURM_CONF="$d/slurm.conf"
slurmctld -f "$SLURM_CONF"
slurmd -f "$SLURM_CONF"
up=0
for _ in $(seq 60); do
  if sinfo -h -o %T 2>/dev/null | grep -q idle; then up=1; break; fi
  sleep 1
done
[ $up = 1 ] || { echo "FAIL: the Slurm node did not come up"; cat "$d/slurmctld.log" "$d/slurmd.log"; exit 1; }

cd "$root"
cfg=tests/data/lamp-small.toml
"$bin" lamp sweep "$cfg" --out "$d/whole" --quiet -j 1 >/dev/null

# the script: 3 array tasks (cells i = k mod 3), then the merge
"$bin" lamp sweep "$cfg" --out "$d/sharded" --quiet --emit-slurm "$d/submit.sh" --slurm-shards 3 \
  --slurm-cpus 1 --slurm-mem 1G --slurm-time 10 --slurm-logs "$d/logs" --slurm-job-name mantis-test
grep -q -- '--array=0-2' "$d/submit.sh" || { echo "FAIL: no 3-task array in the script"; cat "$d/submit.sh"; exit 1; }
out=$(bash "$d/submit.sh")
echo "$out"
merge=$(echo "$out" | sed -n 's/.*merge job \([0-9]*\).*/\1/p')
[ -n "$merge" ] || { echo "FAIL: no merge job id"; exit 1; }
for _ in $(seq 600); do
  [ -z "$(squeue -h)" ] && break
  sleep 1
done
[ -z "$(squeue -h)" ] || { echo "FAIL: jobs still queued after 600 s"; squeue; exit 1; }
state=$(scontrol show job "$merge" | sed -n 's/.*JobState=\([A-Z_]*\).*/\1/p')
[ "$state" = COMPLETED ] || { echo "FAIL: merge job $merge is $state"; cat "$d"/logs/*; exit 1; }
for k in 0 1 2; do
  grep -q "shard $k/3" "$d/logs/mantis-test-shard-$k.log" || { echo "FAIL: shard $k did not run"; cat "$d"/logs/*; exit 1; }
done

# the merged result set equals the unsharded one (every number; timings and the command aside)
python3 - "$d/whole" "$d/sharded" <<'PY'
import json, os, sys
a, b = sys.argv[1:]
def strip(j):
    if isinstance(j, dict):
        return {k: strip(v) for k, v in j.items() if k not in ("seconds", "elapsed_s")}
    if isinstance(j, list):
        return [strip(v) for v in j]
    return j
ra, rb = (json.load(open(os.path.join(x, "results.json"))) for x in (a, b))
assert strip(ra) == strip(rb), "results.json differ"
listed = [sorted(os.listdir(os.path.join(x, "cells"))) for x in (a, b)]
assert listed[0] == listed[1], "cell sets differ"
cells = [c for c in listed[0] if c.endswith(".json")]
assert len(cells) > 3 and listed[0] == sorted(cells + [c + ".sha256" for c in cells]), "not every cell has its hash"
for c in cells:
    ca, cb = (json.load(open(os.path.join(x, "cells", c))) for x in (a, b))
    assert strip(ca) == strip(cb), f"cell {c} differs"
m = json.load(open(os.path.join(b, "manifest.json")))
assert not m.get("partial", False), "the merged set is partial"
print(f"OK: {len(cells)} cells over 3 Slurm shards merge to the unsharded result set")
PY
