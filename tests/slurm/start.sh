#!/usr/bin/env bash
# A real one-node SLURM on this machine, for the tier-2 SLURM tests (tests/integration/test_slurm.py) and for trying
# the launcher and the batch script by hand: `bash tests/slurm/start.sh DIR` writes DIR/slurm.conf (slurmctld and
# slurmd on localhost, one node with this machine's CPUs, one partition `debug`; proctrack/linuxproc and task/none,
# since a test machine or container has no cgroups for SLURM), a munge key of its own, and starts munged, slurmctld
# and slurmd with every state file, socket, log and pid under DIR; it returns once `sinfo` shows the node idle.
# Commands reach this cluster with SLURM_CONF=DIR/slurm.conf (DIR/env holds the line to source).
# `bash tests/slurm/stop.sh DIR` stops exactly the daemons this started (by their pid files).
# Needs Debian's slurm-wlm and munge (`apt-get install -y slurm-wlm munge`) and root (slurmd runs jobs as their user).
set -euo pipefail
dir=$(mkdir -p "${1:?usage: start.sh DIR}" && cd "$1" && pwd)
for cmd in munged slurmctld slurmd sinfo; do
    command -v "$cmd" >/dev/null || { echo "start.sh: $cmd not found: apt-get install -y slurm-wlm munge" >&2; exit 3; }
done
mkdir -p "$dir/ctld" "$dir/spool" "$dir/munge"
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("", 0)); print(s.getsockname()[1])'; }
ctld_port=$(free_port)
slurmd_port=$(free_port)

# munge: a key of our own and a socket under DIR, so a machine's own munged (if any) is left alone
key="$dir/munge/munge.key"
[ -f "$key" ] || { head -c 1024 /dev/urandom >"$key"; chmod 400 "$key"; }
munged --force --key-file="$key" --socket="$dir/munge/munge.sock" --pid-file="$dir/munge/munged.pid" \
    --log-file="$dir/munge/munged.log" --seed-file="$dir/munge/munged.seed"

: >"$dir/plugstack.conf"  # no SPANK plugins (the machine's pyxis or others are not part of this cluster)
cat >"$dir/slurm.conf" <<CONF
ClusterName=rlfttest
SlurmctldHost=localhost
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$dir/munge/munge.sock
CredType=cred/munge
StateSaveLocation=$dir/ctld
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.log
PlugStackConfig=$dir/plugstack.conf
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
KillWait=15
MinJobAge=600
NodeName=localhost NodeAddr=127.0.0.1 CPUs=$(nproc) State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP
CONF
echo "export SLURM_CONF=$dir/slurm.conf" >"$dir/env"
export SLURM_CONF="$dir/slurm.conf"

slurmctld -f "$SLURM_CONF"
slurmd -f "$SLURM_CONF" -N localhost
for _ in $(seq 120); do
    if [ "$(sinfo -h -n localhost -o %T 2>/dev/null)" = "idle" ]; then
        echo "slurm up: SLURM_CONF=$SLURM_CONF"
        exit 0
    fi
    sleep 0.5
done
echo "start.sh: the node did not become idle in 60 s; sinfo says: $(sinfo -h -o '%T %E' 2>&1)" >&2
tail -n 20 "$dir/slurmctld.log" "$dir/slurmd.log" >&2 || true
exit 1
