#!/usr/bin/env bash
# Stop the one-node SLURM that tests/slurm/start.sh DIR started: its jobs cancelled, then slurmd, slurmctld and
# munged, each by the pid file start.sh had it write under DIR (never by name: other daemons here are left alone).
set -uo pipefail
dir=${1:?usage: stop.sh DIR}
[ -f "$dir/slurm.conf" ] && SLURM_CONF="$dir/slurm.conf" scancel --full --signal=KILL --user="$(id -un)" 2>/dev/null
stop() {  # pid file, then wait up to 15 s for the process to go
    local pid
    pid=$(cat "$1" 2>/dev/null) || return 0
    kill "$pid" 2>/dev/null || return 0
    for _ in $(seq 30); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.5; done
    kill -KILL "$pid" 2>/dev/null
}
stop "$dir/slurmd.pid"
stop "$dir/slurmctld.pid"
stop "$dir/munge/munged.pid"
