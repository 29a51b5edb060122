#!/usr/bin/env bash
# Stop the devcluster started by up.sh: cancel jobs, then stop slurmd, slurmctld,
# slurmdbd, MariaDB and munged using the pid files in the state dir. Only pids from
# those files (plus job step daemons of this cluster) are signalled. Safe to run when
# nothing is up. Set DEVCLUSTER_PURGE=1 to also delete the state dir.
set -euo pipefail

DIR="${DEVCLUSTER_DIR:-/tmp/launcher-devcluster}"
CONF="$DIR/slurm.conf"
PIDS="$DIR/pids"
MUNGE_DIR="$DIR/munge"

log() { echo "[devcluster] $*" >&2; }

# pid_of PIDFILE COMM: print the pid from PIDFILE if alive and named COMM.
pid_of() {
  local pid
  [[ -s $1 ]] || return 1
  pid=$(tr -dc '0-9' <"$1" 2>/dev/null)
  [[ -n $pid && -r /proc/$pid/comm ]] || return 1
  [[ $(cat "/proc/$pid/comm" 2>/dev/null) == "$2" ]] || return 1
  echo "$pid"
}

# running PID COMM: PID exists, is named COMM and is not a zombie (our daemons are
# reparented to PID 1, which may reap them late).
running() {
  local stat
  stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
  [[ $stat == *"($2) "[!Z]* ]]
}

# stop NAME PIDFILE COMM: SIGTERM, wait up to 15 s, then SIGKILL.
stop() {
  local name=$1 pidfile=$2 comm=$3 pid i
  pid=$(pid_of "$pidfile" "$comm") || { rm -f "$pidfile"; return 0; }
  log "stopping $name (pid $pid)"
  kill -TERM "$pid" 2>/dev/null || true
  for ((i = 0; i < 150; i++)); do
    running "$pid" "$comm" || break
    sleep 0.1
  done
  if running "$pid" "$comm"; then
    log "$name did not exit after SIGTERM; sending SIGKILL"
    kill -KILL "$pid" 2>/dev/null || true
    sleep 0.2
  fi
  rm -f "$pidfile"
}

if [[ ! -d $DIR ]]; then
  log "nothing to stop ($DIR does not exist)"
  exit 0
fi

# 1. Cancel jobs while slurmctld and the slurmds are still there to kill them.
if [[ -f $CONF ]] && pid_of "$PIDS/slurmctld.pid" slurmctld >/dev/null; then
  export SLURM_CONF="$CONF"
  if [[ -n $(squeue -h -u root -o %i 2>/dev/null || true) ]]; then
    log "cancelling jobs"
    scancel --user=root 2>/dev/null || true
    for ((i = 0; i < 100; i++)); do # up to ~20 s (KillWait=5 in slurm.conf)
      [[ -z $(squeue -h -u root -o %i 2>/dev/null || true) ]] && break
      sleep 0.2
    done
    [[ -z $(squeue -h -u root -o %i 2>/dev/null || true) ]] || log "warning: some jobs still listed: $(squeue -h -u root -o '%i:%T' | paste -sd' ')"
  fi
fi

# 2. Daemons, reverse start order.
for f in "$PIDS"/slurmd-*.pid; do
  [[ -e $f ]] || continue
  node=${f##*/slurmd-}
  node=${node%.pid}
  stop "slurmd -N $node" "$f" slurmd
done

# descendants PID: print every descendant pid of PID (children before grandchildren).
descendants() {
  local c
  for c in $(ps -o pid= --ppid "$1" 2>/dev/null); do
    echo "$c"
    descendants "$c"
  done
}

# Job step daemons of this cluster still alive (possible when jobs could not be
# cancelled, e.g. slurmctld was already dead): kill them and their job processes.
# They are recognised by SLURM_CONF=<our slurm.conf> in their environment or an
# open file in our state dir.
for p in /proc/[0-9]*; do
  [[ $(cat "$p/comm" 2>/dev/null) == slurmstepd ]] || continue
  if { tr '\0' '\n' <"$p/environ"; } 2>/dev/null | grep -qx "SLURM_CONF=$CONF" \
    || { ls -l "$p/fd"; } 2>/dev/null | grep -qF "$DIR/"; then
    pid=${p#/proc/}
    kill -STOP "$pid" 2>/dev/null || true # no new children while we collect them
    tree=$(descendants "$pid" | paste -sd' ')
    log "killing leftover slurmstepd $pid and its job processes: ${tree:-none}"
    for c in $tree; do kill -KILL "$c" 2>/dev/null || true; done
    kill -KILL "$pid" 2>/dev/null || true
  fi
done

stop slurmctld "$PIDS/slurmctld.pid" slurmctld
stop slurmdbd "$PIDS/slurmdbd.pid" slurmdbd
stop mariadbd "$PIDS/mariadbd.pid" mariadbd
stop munged "$MUNGE_DIR/munged.pid" munged

if [[ ${DEVCLUSTER_PURGE:-0} == 1 ]]; then
  log "removing $DIR"
  rm -rf "$DIR"
fi
log "down"
