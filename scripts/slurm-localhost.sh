#!/usr/bin/env bash
# A real single-node SLURM on this machine, for CI and for trying `--executor slurm`.
#
#   scripts/slurm-localhost.sh up      install (root, apt) if missing, write configs, start daemons
#   scripts/slurm-localhost.sh down    stop what `up` started (by pidfile)
#   scripts/slurm-localhost.sh status  daemons and node state
#   scripts/slurm-localhost.sh env     prints `export SLURM_CONF=...` for clients
#
# Everything lives in $AUTOCONFIG_SLURM_DIR (default /tmp/autoconfig-slurm). Clients
# find the config through SLURM_CONF; when /etc/slurm/slurm.conf is absent it is
# linked to ours so plain `sinfo`/`sbatch` work too.
# Why each setting: see ../shared/notes/slurm-on-localhost.md (checked on Debian 12):
# submitit reads job states with sacct, so we run accounting (a private MariaDB on
# 127.0.0.1:3307 + slurmdbd); without it cancelled or killed jobs are never seen as done.
set -euo pipefail

DIR=${AUTOCONFIG_SLURM_DIR:-/tmp/autoconfig-slurm}
CLUSTER=autoconfig
DB_PORT=${AUTOCONFIG_SLURM_DB_PORT:-3307}
PACKAGES=(munge slurm-client slurmctld slurmd slurmdbd mariadb-server)
export SLURM_CONF="$DIR/etc/slurm.conf"
HOST=$(hostname -s)

log() { echo "slurm-localhost: $*" >&2; }
die() { echo "slurm-localhost: error: $*" >&2; exit 1; }

alive() {  # alive PIDFILE
    [ -s "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null
}

node_idle() {
    sinfo -h -N -o '%t' 2>/dev/null | grep -Eq '^(idle|mix|alloc)'
}

munge_works() {
    munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1
}

all_up() {
    munge_works || return 1
    for d in mariadbd slurmdbd slurmctld slurmd; do
        alive "$DIR/run/$d.pid" || return 1
    done
    node_idle
}

install_packages() {
    local missing=()
    for p in "${PACKAGES[@]}"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
    done
    [ ${#missing[@]} -eq 0 ] && return 0
    [ "$(id -u)" -eq 0 ] || die "needs root to install ${missing[*]} (or install them yourself)"
    command -v apt-get >/dev/null || die "apt-get not found: install ${missing[*]} yourself"
    log "installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    # The package scripts do not start daemons here (policy-rc.d); we start our own.
    apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null 2>&1 || {
        apt-get update -q >/dev/null 2>&1
        apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null
    }
}

write_configs() {
    mkdir -p "$DIR"/{etc,run,log,state,spool,db}
    local cpus mem_mb
    cpus=$(nproc)
    # More memory than real drains the node: advertise 90% of MemTotal.
    mem_mb=$(awk '/MemTotal/ {printf "%d", $2 / 1024 * 0.9}' /proc/meminfo)
    cat >"$DIR/etc/slurm.conf" <<EOF
# Written by scripts/slurm-localhost.sh; see ../shared/notes/slurm-on-localhost.md
ClusterName=$CLUSTER
SlurmctldHost=$HOST(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool
SlurmctldPidFile=$DIR/run/slurmctld.pid
SlurmdPidFile=$DIR/run/slurmd.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd.log
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
ReturnToService=2
MailProg=/bin/true
KillWait=5
MinJobAge=600
InactiveLimit=0
# Submit-to-start ~0.1 s instead of ~2 s (an empty SchedulerParameters= is fatal).
SchedulerParameters=batch_sched_delay=0
# Let the node advertise more CPUs than it has, so small jobs run side by side.
SlurmdParameters=config_overrides
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
JobAcctGatherType=jobacct_gather/linux
JobAcctGatherFrequency=30
NodeName=$HOST NodeAddr=127.0.0.1 CPUs=$((cpus * 4)) RealMemory=$mem_mb State=UNKNOWN
PartitionName=debug Nodes=$HOST Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
EOF
    cat >"$DIR/etc/slurmdbd.conf" <<EOF
AuthType=auth/munge
DbdHost=localhost
DbdAddr=127.0.0.1
SlurmUser=root
PidFile=$DIR/run/slurmdbd.pid
LogFile=$DIR/log/slurmdbd.log
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$DB_PORT
StorageUser=slurm
StoragePass=slurm
StorageLoc=slurm_acct_db
EOF
    chmod 600 "$DIR/etc/slurmdbd.conf"
    cat >"$DIR/etc/my.cnf" <<EOF
[mysqld]
datadir=$DIR/db
socket=$DIR/run/mysqld.sock
pid-file=$DIR/run/mariadbd.pid
port=$DB_PORT
bind-address=127.0.0.1
user=root
innodb_buffer_pool_size=1024M
innodb_lock_wait_timeout=900
log-error=$DIR/log/mariadb.log
EOF
    if [ ! -e /etc/slurm/slurm.conf ] || [ "$(readlink /etc/slurm/slurm.conf)" = "$SLURM_CONF" ]; then
        mkdir -p /etc/slurm 2>/dev/null && ln -sfn "$SLURM_CONF" /etc/slurm/slurm.conf 2>/dev/null || true
    fi
}

wait_for() {  # wait_for SECONDS DESCRIPTION COMMAND...
    local limit=$1 what=$2; shift 2
    local end=$((SECONDS + limit))
    until "$@" >/dev/null 2>&1; do
        [ $SECONDS -lt $end ] || die "$what did not come up in ${limit}s (logs: $DIR/log)"
        sleep 0.2
    done
}

start_munge() {
    # Reuse a munged that already serves the default socket (ours or the
    # system's); only one we start gets our pidfile, so `down` stops only ours.
    munge_works && return 0
    mkdir -p /run/munge /var/log/munge /var/lib/munge
    [ -s /etc/munge/munge.key ] || mungekey --create --keyfile=/etc/munge/munge.key
    chown -R munge:munge /run/munge /var/log/munge /var/lib/munge /etc/munge 2>/dev/null || true
    chmod 600 /etc/munge/munge.key
    runuser -u munge -- /usr/sbin/munged --pid-file=/run/munge/munged.pid </dev/null
    wait_for 10 munged munge_works
    cp /run/munge/munged.pid "$DIR/run/munged.pid"
}

start_mariadb() {
    alive "$DIR/run/mariadbd.pid" && return 0
    if [ ! -d "$DIR/db/mysql" ]; then
        mariadb-install-db --defaults-file="$DIR/etc/my.cnf" --auth-root-authentication-method=socket \
            >"$DIR/log/mariadb-install.log" 2>&1 || die "mariadb-install-db failed (see $DIR/log)"
    fi
    # setsid + stdin from /dev/null: a CI log pipe must not keep it attached.
    setsid mariadbd --defaults-file="$DIR/etc/my.cnf" </dev/null >>"$DIR/log/mariadb.log" 2>&1 &
    wait_for 60 mariadb mariadb --socket="$DIR/run/mysqld.sock" -e 'select 1'
    mariadb --socket="$DIR/run/mysqld.sock" -e "
        CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY 'slurm';
        CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY 'slurm';
        GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';
        GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost';"
}

start_slurm() {
    if ! alive "$DIR/run/slurmdbd.pid"; then
        slurmdbd </dev/null
        wait_for 60 slurmdbd sh -c 'sacctmgr -n list cluster'
    fi
    sacctmgr -n list cluster format=cluster 2>/dev/null | grep -qw "$CLUSTER" \
        || sacctmgr -i add cluster "$CLUSTER" >/dev/null
    if ! alive "$DIR/run/slurmctld.pid"; then
        slurmctld </dev/null
        wait_for 60 slurmctld scontrol ping
    fi
    if ! alive "$DIR/run/slurmd.pid"; then
        slurmd </dev/null
    fi
    local end=$((SECONDS + 60))
    until node_idle; do
        if sinfo -h -N -o '%t' 2>/dev/null | grep -Eq 'drain|down'; then
            scontrol update nodename="$HOST" state=resume >/dev/null 2>&1 || true
        fi
        [ $SECONDS -lt $end ] || die "node $HOST is not idle: $(sinfo -h -N -o '%t %E' 2>&1) (logs: $DIR/log)"
        sleep 0.3
    done
}

cmd_up() {
    install_packages
    mkdir -p "$DIR/run"
    if all_up; then log "already up ($DIR)"; return 0; fi
    write_configs
    start_munge
    start_mariadb
    start_slurm
    log "up: cluster $CLUSTER, node $HOST idle; export SLURM_CONF=$SLURM_CONF"
}

stop_pidfile() {  # stop_pidfile NAME
    local f="$DIR/run/$1.pid"
    if alive "$f"; then
        local pid; pid=$(cat "$f")
        kill "$pid" 2>/dev/null || true
        for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
        kill -0 "$pid" 2>/dev/null && kill -9 "$pid" 2>/dev/null || true
    fi
    rm -f "$f"
}

cmd_down() {
    for d in slurmd slurmctld slurmdbd mariadbd munged; do stop_pidfile "$d"; done
    log "down"
}

cmd_status() {
    local rc=0
    if munge_works; then echo "munged: running"; else echo "munged: stopped"; rc=1; fi
    for d in mariadbd slurmdbd slurmctld slurmd; do
        if alive "$DIR/run/$d.pid"; then echo "$d: running (pid $(cat "$DIR/run/$d.pid"))"
        else echo "$d: stopped"; rc=1; fi
    done
    sinfo -N 2>/dev/null || rc=1
    return $rc
}

case "${1:-}" in
    up) cmd_up ;;
    down) cmd_down ;;
    status) cmd_status ;;
    env) echo "export SLURM_CONF=$SLURM_CONF" ;;
    *) echo "usage: $0 up|down|status|env" >&2; exit 2 ;;
esac
