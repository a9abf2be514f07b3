#!/bin/bash
# local_slurm.sh — a real one-node Slurm (munged + slurmctld + slurmd) on this
# machine, for testing the batch scripts under apps/slurm/ against Slurm
# itself rather than a mock (../shared/slurm-local.md's configuration).
#
#   local_slurm.sh start DIR   configuration, state, logs and pid files in DIR;
#                              prints "export SLURM_CONF=DIR/slurm.conf" on
#                              success; exit 77 (skip) when Slurm cannot run
#                              here (not root, packages missing, daemons that
#                              do not come up), with the reason on stderr
#   local_slurm.sh stop DIR    stops the daemons it started, by their pids
#
# Nothing is written outside DIR except munge's socket (/run/munge), and only
# when munged was not already running (then it is stopped again by `stop`).
# The node is this host with its real core count and memory; the partition
# "debug" oversubscribes cores 4× (tests run more ranks than this CI has cores).
set -uo pipefail

skip() { echo "local_slurm: skipping: $*" >&2; exit 77; }

cmd=${1:-}
dir=${2:-}
[ -n "$cmd" ] && [ -n "$dir" ] || { echo "usage: $0 start|stop DIR" >&2; exit 2; }

stop() {
  for f in "$dir/slurmd.pid" "$dir/slurmctld.pid" "$dir/munged.pid"; do
    [ -s "$f" ] || continue
    pid=$(cat "$f")
    kill "$pid" 2>/dev/null
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null
    rm -f "$f"
  done
}

if [ "$cmd" = stop ]; then
  stop
  exit 0
fi
[ "$cmd" = start ] || { echo "usage: $0 start|stop DIR" >&2; exit 2; }

[ "$(id -u)" -eq 0 ] || skip "the daemons need root (SlurmUser=root)"
for b in munged slurmctld slurmd sbatch sinfo scontrol; do
  command -v "$b" >/dev/null 2>&1 || skip "$b not found (Debian packages slurm-wlm and munge)"
done
[ -r /etc/munge/munge.key ] || skip "/etc/munge/munge.key missing (package munge)"

mkdir -p "$dir/state" "$dir/spool" "$dir/log"
dir=$(cd "$dir" && pwd)
host=$(hostname -s)
cpus=$(nproc)
mem=$(( $(free -m | awk '/^Mem:/ {print $2}') * 8 / 10 ))

cat > "$dir/slurm.conf" <<EOF
ClusterName=local
SlurmctldHost=$host
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
ReturnToService=2
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.log
MinJobAge=600
NodeName=$host CPUs=$cpus Sockets=1 CoresPerSocket=$cpus ThreadsPerCore=1 RealMemory=$mem State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
EOF
export SLURM_CONF=$dir/slurm.conf

if ! pgrep -x munged >/dev/null; then
  mkdir -p /run/munge && chown munge:munge /run/munge 2>/dev/null
  munged --force --pid-file="$dir/munged.pid" 2>"$dir/log/munged.err" ||
    skip "munged did not start: $(tail -1 "$dir/log/munged.err")"
fi
slurmctld -f "$SLURM_CONF" 2>"$dir/log/slurmctld.err" || { stop; skip "slurmctld did not start: $(tail -1 "$dir/log/slurmctld.err")"; }
slurmd -f "$SLURM_CONF" 2>"$dir/log/slurmd.err" || { stop; skip "slurmd did not start: $(tail -1 "$dir/log/slurmd.err")"; }
for _ in $(seq 60); do
  state=$(sinfo -h -o %T 2>/dev/null | head -1)
  case "$state" in idle|mixed|allocated) echo "export SLURM_CONF=$SLURM_CONF"; exit 0 ;; esac
  sleep 0.5
done
tail -5 "$dir/log/slurmctld.log" "$dir/log/slurmd.log" >&2 2>/dev/null
stop
skip "the node did not become idle in 30 s (state '${state:-none}'; logs in $dir/log)"
