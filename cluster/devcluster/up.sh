#!/usr/bin/env bash
# Start a real single-machine SLURM cluster (munge + MariaDB + slurmdbd + slurmctld
# + N fake slurmd nodes) for development and tests. Idempotent: re-running it on a
# healthy cluster returns quickly. See README.md in this directory.
set -euo pipefail

DIR="${DEVCLUSTER_DIR:-/tmp/launcher-devcluster}"
NODES="${DEVCLUSTER_NODES:-2}"
CPUS="${DEVCLUSTER_CPUS:-$(nproc)}"
MEM_MB="${DEVCLUSTER_MEM_MB:-4096}"
CLUSTER="${DEVCLUSTER_NAME:-devcluster}"
PORT_BASE="${DEVCLUSTER_PORT_BASE:-6817}"   # slurmctld=base, slurmdbd=base+2, nodeK=base+10+K
DB_PORT="${DEVCLUSTER_DB_PORT:-3316}"
WAIT_S="${DEVCLUSTER_WAIT_S:-60}"

CTLD_PORT=$PORT_BASE
DBD_PORT=$((PORT_BASE + 2))
PKGS=(munge mariadb-server slurmctld slurmd slurm-client slurmdbd)

log() { echo "[devcluster] $*" >&2; }
die() { echo "[devcluster] ERROR: $*" >&2; exit 1; }
tail_log() { # file...
  local f
  for f in "$@"; do
    [[ -f $f ]] || continue
    echo "----- last lines of $f -----" >&2
    tail -n 25 "$f" >&2 || true
  done
}
fail() { # message logfile...
  local msg=$1; shift
  tail_log "$@"
  die "$msg"
}

[[ $(id -u) -eq 0 ]] || die "must run as root (daemons run as root/munge)"
[[ $NODES =~ ^[1-9][0-9]*$ ]] || die "DEVCLUSTER_NODES must be a positive integer, got '$NODES'"
[[ $CPUS =~ ^[1-9][0-9]*$ ]] || die "DEVCLUSTER_CPUS must be a positive integer, got '$CPUS'"
[[ $DIR = /* ]] || die "DEVCLUSTER_DIR must be an absolute path, got '$DIR'"

CONF="$DIR/slurm.conf"
DBD_CONF="$DIR/slurmdbd.conf"
MUNGE_DIR="$DIR/munge"
MUNGE_SOCK="$MUNGE_DIR/munge.socket.2"
DB_DIR="$DIR/mariadb"
DB_SOCK="$DB_DIR/mariadb.sock"
LOG_DIR="$DIR/log"
PIDS="$DIR/pids"
NODE_NAMES=()
for ((k = 1; k <= NODES; k++)); do NODE_NAMES+=("node$k"); done
NODELIST="node[1-$NODES]"
[[ $NODES -eq 1 ]] && NODELIST=node1

export SLURM_CONF="$CONF"

# ---------------------------------------------------------------- helpers
# pid_alive PIDFILE COMM: the pid in PIDFILE is alive and its command name is COMM.
pid_alive() {
  local pid
  [[ -s $1 ]] || return 1
  pid=$(tr -dc '0-9' <"$1")
  [[ -n $pid ]] || return 1
  [[ -r /proc/$pid/comm ]] || return 1
  [[ $(cat "/proc/$pid/comm" 2>/dev/null) == "$2" ]]
}

# wait_for SECONDS CMD...: retry CMD every 0.2 s until it succeeds.
wait_for() {
  local deadline=$((SECONDS + $1)); shift
  until "$@" >/dev/null 2>&1; do
    ((SECONDS < deadline)) || return 1
    sleep 0.2
  done
}

# port_free PORT NAME: fail unless nothing listens on 127.0.0.1:PORT.
port_free() {
  if (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; then
    die "port $1 (for $2) is already in use -- another devcluster or service? Set DEVCLUSTER_PORT_BASE / DEVCLUSTER_DB_PORT, or run down.sh for that DEVCLUSTER_DIR"
  fi
}

any_daemon_up() {
  local n
  pid_alive "$MUNGE_DIR/munged.pid" munged && return 0
  pid_alive "$PIDS/mariadbd.pid" mariadbd && return 0
  pid_alive "$PIDS/slurmdbd.pid" slurmdbd && return 0
  pid_alive "$PIDS/slurmctld.pid" slurmctld && return 0
  for n in "$PIDS"/slurmd-*.pid; do
    pid_alive "$n" slurmd && return 0
  done
  return 1
}

# nodes_ready: every configured node is known to slurmctld, responding, and usable.
nodes_ready() {
  local out n state
  out=$(sinfo -h -N -p debug -o '%N %t' 2>/dev/null) || return 1
  for n in "${NODE_NAMES[@]}"; do
    state=$(awk -v n="$n" '$1 == n {print $2; exit}' <<<"$out")
    case $state in
      idle | mix | alloc | comp) ;;
      *) return 1 ;;
    esac
  done
}

# ---------------------------------------------------------------- packages
missing=()
installed=$(dpkg-query -W -f='${Package} ${db:Status-Abbrev}\n' "${PKGS[@]}" 2>/dev/null || true)
for p in "${PKGS[@]}"; do
  grep -qE "^$p ii" <<<"$installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  log "installing Debian packages: ${missing[*]}"
  apt_log=$(mktemp)
  if ! { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
    --no-install-recommends "${missing[@]}"; } >"$apt_log" 2>&1; then
    tail -n 30 "$apt_log" >&2
    die "apt-get install failed (log: $apt_log)"
  fi
  rm -f "$apt_log"
fi
for b in munged mariadbd mariadb-install-db mariadb slurmctld slurmd slurmdbd sinfo sacctmgr runuser setsid; do
  command -v "$b" >/dev/null || die "required program '$b' not found after installing packages"
done

# ---------------------------------------------------------------- /etc/hosts
unresolved=()
for n in "${NODE_NAMES[@]}"; do
  getent hosts "$n" >/dev/null || unresolved+=("$n")
done
if ((${#unresolved[@]})); then
  log "adding '127.0.0.1 ${unresolved[*]}' to /etc/hosts"
  echo "127.0.0.1 ${unresolved[*]}  # launcher devcluster" >>/etc/hosts
fi
getent hosts "$(hostname -s)" >/dev/null || die "this host's name '$(hostname -s)' does not resolve; add it to /etc/hosts"

# ---------------------------------------------------------------- state dir
mkdir -p "$DIR" "$LOG_DIR" "$PIDS" "$DIR/ctld-state"
chmod 755 "$DIR"
for n in "${NODE_NAMES[@]}"; do mkdir -p "$DIR/slurmd-$n"; done
mkdir -p "$MUNGE_DIR"
chown munge:munge "$MUNGE_DIR"
chmod 711 "$MUNGE_DIR" # socket must be reachable by all; the key stays 0400
if [[ ! -s $MUNGE_DIR/munge.key ]]; then
  dd if=/dev/urandom of="$MUNGE_DIR/munge.key" bs=1024 count=1 status=none
fi
chown munge:munge "$MUNGE_DIR/munge.key"
chmod 400 "$MUNGE_DIR/munge.key"
if [[ ! -s $DIR/.db-password ]]; then
  (umask 077 && head -c 24 /dev/urandom | base64 | tr -dc 'A-Za-z0-9' >"$DIR/.db-password")
fi
DB_PASS=$(cat "$DIR/.db-password")

# ---------------------------------------------------------------- configs
CTLD_HOST=$(hostname -s)
new_conf=$(mktemp)
new_dbd=$(mktemp)
trap 'rm -f "$new_conf" "$new_dbd"' EXIT
{
  cat <<EOF
# Generated by cluster/devcluster/up.sh -- edits are overwritten.
ClusterName=$CLUSTER
SlurmctldHost=$CTLD_HOST(127.0.0.1)
SlurmctldPort=$CTLD_PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$MUNGE_SOCK,cred_expire=10
StateSaveLocation=$DIR/ctld-state
SlurmctldPidFile=$PIDS/slurmctld.pid
SlurmctldLogFile=$LOG_DIR/slurmctld.log
SlurmdSpoolDir=$DIR/slurmd-%n
SlurmdPidFile=$PIDS/slurmd-%n.pid
SlurmdLogFile=$LOG_DIR/slurmd-%n.log
# Fake nodes all share this machine's cores: use the configured CPUs/RealMemory,
# not what slurmd detects, so nodes are never drained for "low CPU/memory".
SlurmdParameters=config_overrides
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SwitchType=switch/none
LaunchType=launch/slurm
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=2,bf_interval=5
ReturnToService=2
JobRequeue=1
KillWait=5
InactiveLimit=0
MinJobAge=300
SlurmctldTimeout=30
SlurmdTimeout=60
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
AccountingStoragePort=$DBD_PORT
# For accounting_storage/slurmdbd this is the munge socket used to reach slurmdbd.
AccountingStoragePass=$MUNGE_SOCK
JobAcctGatherType=jobacct_gather/linux
JobAcctGatherFrequency=30
JobCompType=jobcomp/none
MailProg=/bin/true
SlurmctldDebug=info
SlurmdDebug=info
EOF
  for ((k = 1; k <= NODES; k++)); do
    echo "NodeName=node$k NodeHostname=localhost NodeAddr=127.0.0.1 Port=$((PORT_BASE + 10 + k)) CPUs=$CPUS RealMemory=$MEM_MB State=UNKNOWN"
  done
  echo "PartitionName=debug Nodes=$NODELIST Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO"
} >"$new_conf"
cat >"$new_dbd" <<EOF
# Generated by cluster/devcluster/up.sh -- edits are overwritten.
AuthType=auth/munge
AuthInfo=socket=$MUNGE_SOCK
DbdHost=localhost
DbdAddr=127.0.0.1
DbdPort=$DBD_PORT
SlurmUser=root
PidFile=$PIDS/slurmdbd.pid
LogFile=$LOG_DIR/slurmdbd.log
DebugLevel=info
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$DB_PORT
StorageUser=slurm
StoragePass=$DB_PASS
StorageLoc=slurm_acct_db
EOF

if [[ -f $CONF && -f $DBD_CONF ]] && cmp -s "$new_conf" "$CONF" && cmp -s "$new_dbd" "$DBD_CONF"; then
  :
else
  if any_daemon_up; then
    diff "$CONF" "$new_conf" >&2 || true
    diff <(grep -v '^StoragePass=' "$DBD_CONF" 2>/dev/null) <(grep -v '^StoragePass=' "$new_dbd") >&2 || true
    die "the generated config differs from the running cluster's $CONF (changed DEVCLUSTER_* settings?); run down.sh first"
  fi
  install -m 644 "$new_conf" "$CONF"
  install -m 600 "$new_dbd" "$DBD_CONF"
fi
chmod 600 "$DBD_CONF"
cat >"$DIR/env.sh" <<EOF
# Source this to use the devcluster: . $DIR/env.sh
export SLURM_CONF=$CONF
EOF

# ---------------------------------------------------------------- fast path
if [[ -f $CONF ]] && pid_alive "$MUNGE_DIR/munged.pid" munged && pid_alive "$PIDS/mariadbd.pid" mariadbd \
  && pid_alive "$PIDS/slurmdbd.pid" slurmdbd && pid_alive "$PIDS/slurmctld.pid" slurmctld; then
  all_slurmd=1
  for n in "${NODE_NAMES[@]}"; do
    pid_alive "$PIDS/slurmd-$n.pid" slurmd || all_slurmd=0
  done
  if ((all_slurmd)) && nodes_ready; then
    log "already up and healthy ($DIR)"
    echo "export SLURM_CONF=$CONF"
    exit 0
  fi
fi

# Cold start: none of our slurmds is alive, so no job process of this cluster is
# either. Any job slurmctld recovers from its state dir was left by an unclean
# shutdown (down.sh cancels everything): as "running" it would hold CPUs forever, as
# "pending" (requeued) it would run again in a later session. Cancel them below.
cold_start=1
for n in "${NODE_NAMES[@]}"; do
  pid_alive "$PIDS/slurmd-$n.pid" slurmd && cold_start=0
done

# ---------------------------------------------------------------- munged
if ! pid_alive "$MUNGE_DIR/munged.pid" munged; then
  log "starting munged"
  touch "$LOG_DIR/munged.log"
  chown munge:munge "$LOG_DIR/munged.log"
  chmod 755 "$LOG_DIR" # munged refuses a group/world-writable log dir
  runuser -u munge -- munged --force --key-file="$MUNGE_DIR/munge.key" --socket="$MUNGE_SOCK" \
    --pid-file="$MUNGE_DIR/munged.pid" --log-file="$LOG_DIR/munged.log" \
    --seed-file="$MUNGE_DIR/munged.seed" </dev/null >>"$LOG_DIR/munged.log" 2>&1 \
    || fail "munged failed to start" "$LOG_DIR/munged.log"
  wait_for 10 bash -c "munge -S '$MUNGE_SOCK' -n | unmunge -S '$MUNGE_SOCK'" \
    || fail "munged does not answer on $MUNGE_SOCK" "$LOG_DIR/munged.log"
fi

# ---------------------------------------------------------------- MariaDB
db() { mariadb --no-defaults --protocol=socket -S "$DB_SOCK" -u root "$@"; }
if ! pid_alive "$PIDS/mariadbd.pid" mariadbd; then
  if [[ ! -d $DB_DIR/data/mysql ]]; then
    log "initialising MariaDB datadir"
    mkdir -p "$DB_DIR/data"
    mariadb-install-db --no-defaults --user=root --datadir="$DB_DIR/data" \
      --auth-root-authentication-method=socket --skip-test-db >"$LOG_DIR/mariadb-install.log" 2>&1 \
      || fail "mariadb-install-db failed" "$LOG_DIR/mariadb-install.log"
  fi
  log "starting mariadbd on 127.0.0.1:$DB_PORT"
  port_free "$DB_PORT" mariadbd
  rm -f "$DB_SOCK"
  setsid -f mariadbd --no-defaults --user=root --datadir="$DB_DIR/data" --socket="$DB_SOCK" \
    --pid-file="$PIDS/mariadbd.pid" --bind-address=127.0.0.1 --port="$DB_PORT" \
    --log-error="$LOG_DIR/mariadb.log" --innodb-buffer-pool-size=256M \
    --innodb-lock-wait-timeout=900 --skip-name-resolve </dev/null >>"$LOG_DIR/mariadb.log" 2>&1
  wait_for 30 db -e 'SELECT 1' || fail "MariaDB did not come up" "$LOG_DIR/mariadb.log"
  wait_for 5 pid_alive "$PIDS/mariadbd.pid" mariadbd || fail "MariaDB wrote no pid file" "$LOG_DIR/mariadb.log"
  db --batch <<EOF || fail "could not create the slurm database user" "$LOG_DIR/mariadb.log"
CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY '$DB_PASS';
ALTER USER 'slurm'@'127.0.0.1' IDENTIFIED BY '$DB_PASS';
CREATE DATABASE IF NOT EXISTS slurm_acct_db;
GRANT ALL PRIVILEGES ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';
EOF
fi

# ---------------------------------------------------------------- slurmdbd
if ! pid_alive "$PIDS/slurmdbd.pid" slurmdbd; then
  log "starting slurmdbd"
  port_free "$DBD_PORT" slurmdbd
  slurmdbd </dev/null >>"$LOG_DIR/slurmdbd.log" 2>&1 || fail "slurmdbd failed to start" "$LOG_DIR/slurmdbd.log"
  wait_for 30 sacctmgr -n -P show cluster || fail "slurmdbd does not answer" "$LOG_DIR/slurmdbd.log"
fi
accounting_ok() {
  sacctmgr -n -P show cluster format=cluster | grep -qx "$CLUSTER" \
    && sacctmgr -n -P show user root format=user,defaultaccount | grep -qx 'root|root'
}
if ! accounting_ok; then
  log "registering cluster '$CLUSTER', account root, user root in accounting"
  sacctmgr -n -P show cluster format=cluster | grep -qx "$CLUSTER" \
    || sacctmgr -i add cluster "$CLUSTER" >/dev/null
  sacctmgr -n -P show account root format=account | grep -qx root \
    || sacctmgr -i add account root cluster="$CLUSTER" description=devcluster organization=devcluster >/dev/null
  sacctmgr -n -P show assoc where user=root cluster="$CLUSTER" format=user | grep -qx root \
    || sacctmgr -i add user root account=root defaultaccount=root cluster="$CLUSTER" >/dev/null
  accounting_ok || fail "accounting registration failed" "$LOG_DIR/slurmdbd.log"
fi

# ---------------------------------------------------------------- slurmctld
if ! pid_alive "$PIDS/slurmctld.pid" slurmctld; then
  log "starting slurmctld"
  port_free "$CTLD_PORT" slurmctld
  slurmctld </dev/null >>"$LOG_DIR/slurmctld.log" 2>&1 || fail "slurmctld failed to start" "$LOG_DIR/slurmctld.log"
  wait_for 30 bash -c 'scontrol ping | grep -q UP' || fail "slurmctld does not answer" "$LOG_DIR/slurmctld.log"
fi

# ---------------------------------------------------------------- slurmd per fake node
for n in "${NODE_NAMES[@]}"; do
  if ! pid_alive "$PIDS/slurmd-$n.pid" slurmd; then
    log "starting slurmd -N $n"
    port_free "$((PORT_BASE + 10 + ${n#node}))" "slurmd -N $n"
    slurmd -N "$n" </dev/null >>"$LOG_DIR/slurmd-$n.log" 2>&1 || fail "slurmd -N $n failed to start" "$LOG_DIR/slurmd-$n.log"
  fi
done

ghosts=""
if ((cold_start)); then
  ghosts=$(squeue -h -o %i 2>/dev/null | paste -sd' ' || true)
  if [[ -n $ghosts ]]; then
    log "cancelling jobs left over from an earlier, unclean shutdown: $ghosts"
    # shellcheck disable=SC2086
    scancel $ghosts 2>/dev/null || true
  fi
fi
ghosts_gone() {
  [[ -z $ghosts ]] && return 0
  [[ -z $(squeue -h -j "${ghosts// /,}" -o %i 2>/dev/null) ]]
}

# ---------------------------------------------------------------- wait for idle nodes
deadline=$((SECONDS + WAIT_S))
resumed=0
until nodes_ready && ghosts_gone; do
  if ((SECONDS >= deadline)); then
    sinfo -N -l >&2 || true
    logs=("$LOG_DIR/slurmctld.log")
    for n in "${NODE_NAMES[@]}"; do logs+=("$LOG_DIR/slurmd-$n.log"); done
    fail "nodes not ready after ${WAIT_S}s" "${logs[@]}"
  fi
  # A node left DOWN/DRAINED by an earlier run: resume it once its slurmd answers.
  if ((!resumed && SECONDS + WAIT_S - deadline > 5)); then
    bad=$(sinfo -h -N -p debug -t down,drain,drng,fail -o '%N' 2>/dev/null | sort -u | paste -sd, || true)
    if [[ -n $bad ]]; then
      log "resuming nodes $bad"
      scontrol update NodeName="$bad" State=RESUME >/dev/null 2>&1 || true
    fi
    resumed=1
  fi
  sleep 0.5
done

log "up: $(sinfo -h -o '%P %D nodes %t' | paste -sd';') (state dir $DIR)"
echo "export SLURM_CONF=$CONF"
