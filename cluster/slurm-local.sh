#!/usr/bin/env bash
# Bring up / tear down a real Slurm cluster on this machine: one node, or N nodes.
#
# Target: Debian 12, run as root, no systemd, no GPU (4 fake GPUs per node are declared as GRES).
# Starts munged, MariaDB, slurmdbd, slurmctld and `slurmd -N localhost`; with `--nodes N` (N >= 2)
# one `slurmd -N esnodeK` per network namespace instead, each with its own hostname and address on
# a private bridge. Stops only what it started (pid files and a record of the network objects
# under the state directory) and puts /etc/slurm and /etc/hosts back as it found them.
# See cluster/README.md.
#
# Usage: cluster/slurm-local.sh {up [--nodes N]|down|status|check [--nodes N]}
#
# Environment:
#   ENERGYSWEEP_SLURM_STATE    state directory (pid files, logs, spool, MariaDB data)
#                              [/var/run/energysweep-slurm]
#   ENERGYSWEEP_SLURM_GPU_DIR  where the fake GPU devices nvidia0..3 live [$STATE/gpus]
#   ENERGYSWEEP_SLURM_DB_PORT  MariaDB TCP port on 127.0.0.1 [3306]
#   ENERGYSWEEP_SLURM_TIMEOUT  seconds each wait may take before failing [60]
#   ENERGYSWEEP_SLURM_FORCE=1  overwrite /etc/slurm files this script did not write
set -euo pipefail

SCRIPT_DIR=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)
readonly SCRIPT_DIR
readonly TEMPLATE_DIR="$SCRIPT_DIR/templates"
readonly STATE="${ENERGYSWEEP_SLURM_STATE:-/var/run/energysweep-slurm}"
readonly GPU_DIR="${ENERGYSWEEP_SLURM_GPU_DIR:-$STATE/gpus}"
readonly DB_PORT="${ENERGYSWEEP_SLURM_DB_PORT:-3306}"
readonly TIMEOUT="${ENERGYSWEEP_SLURM_TIMEOUT:-60}"
readonly FORCE="${ENERGYSWEEP_SLURM_FORCE:-0}"
# Fixed: the slurm jobstep plugin unsets SLURM_CONF, so the inner srun only finds /etc/slurm.
readonly CONF_DIR=/etc/slurm
readonly LOG_DIR="$STATE/log"
readonly DB_DIR="$STATE/mysql"
readonly DB_SOCKET="$DB_DIR/mysqld.sock"
readonly CLUSTER=energysweep
readonly ACCOUNT=energysweep
# Multi-node mode: node K is esnodeK at $NET.(10+K) in network namespace esnodeK, its veth
# esvethK on bridge $BRIDGE ($NET.1, the controller's address for the nodes). Nothing routes
# off the bridge: traffic stays on it and on loopback.
readonly NODE_PREFIX=esnode
readonly NET=10.203.0
readonly BRIDGE=esbr0
readonly MAX_NODES=8
readonly HOSTS_BEGIN="# BEGIN energysweep cluster/slurm-local.sh nodes (removed by down)"
readonly HOSTS_END="# END energysweep cluster/slurm-local.sh nodes"
# Number of nodes of the cluster being started (`up --nodes N`) or the one that is up.
NODES=1
readonly MARKER="# Managed by energysweep cluster/slurm-local.sh"
# libpmix-dev: Debian's mpi/pmix plugin dlopens pmix2/lib/libpmix.so (the -dev symlink); without it
# `srun --mpi=pmix` (TensorRT-LLM's multi-node launch) fails with "can not load PMIx library".
# iproute2: `ip` builds the multi-node cluster's bridge, veths and namespaces (not in every base
# image).
readonly PACKAGES=(slurm-wlm munge slurmdbd mariadb-server libpmix-dev iproute2)
readonly BINARIES=(munged mungekey munge unmunge mariadbd mariadb mariadb-install-db slurmdbd
    slurmctld slurmd sinfo squeue scontrol sacctmgr sacct sbatch scancel)
# Start order; `down` stops in reverse.
readonly DAEMONS=(munged mariadbd slurmdbd slurmctld slurmd)
# Set to 1 by every start_* that actually starts something (for the "already up" message).
STARTED=0

log() { printf 'slurm-local: %s\n' "$*" >&2; }
die() {
    log "ERROR: $*"
    exit 1
}

usage() {
    cat >&2 <<EOF
usage: $0 {up [--nodes N]|down|status|check [--nodes N]}
  up      install missing packages, write /etc/slurm, start the daemons, wait for the nodes idle;
          --nodes N (2..$MAX_NODES): N nodes esnode1..N, one slurmd per network namespace
  down    stop the daemons this script started (pid files in $STATE), remove its namespaces,
          bridge and /etc/hosts block, and restore /etc/slurm
  status  print daemon and node state; exit 1 unless the cluster is up
  check   exit 0 if the cluster can be started here, else print why and exit 1
EOF
}

# --- processes -------------------------------------------------------------------------------

# alive PID NAME: true if PID is a live (not zombie) process whose command name is NAME.
alive() {
    local stat
    [[ $(cat "/proc/$1/comm" 2>/dev/null) == "$2" ]] || return 1
    stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
    stat=${stat##*) } # the field after "(comm) " is the state letter
    [[ ${stat:0:1} != Z ]]
}

# our_pid NAME [COMM]: print the pid recorded in $STATE/NAME.pid if that process is alive and its
# command name is COMM (default NAME; one slurmd per node writes slurmd-esnodeK.pid).
our_pid() {
    local name=${2:-$1} file="$STATE/$1.pid"
    pid_file_names "$file" "$name" || return 1
    tr -dc '0-9' <"$file"
    echo
}

# pid_file_names FILE NAME: true if FILE holds the pid of a live process named NAME.
pid_file_names() {
    local pid
    pid=$(tr -dc '0-9' 2>/dev/null <"$1") || return 1
    [[ -n $pid ]] && alive "$pid" "$2"
}

# Print the pids of all live processes whose command name is NAME (no procps needed).
pids_named() {
    local name=$1 dir
    for dir in /proc/[0-9]*; do
        alive "${dir#/proc/}" "$name" && printf '%s\n' "${dir#/proc/}"
    done
    return 0
}

# Fail if NAME runs but was not started by this script (it would hold our ports).
refuse_foreign() {
    local name=$1 foreign
    foreign=$(pids_named "$name" | tr '\n' ' ')
    [[ -z $foreign ]] || die "$name is already running (pid ${foreign% }) but was not started" \
        "by this script; stop it first, or it will hold the ports this cluster needs"
}

# tail_log FILE...: show the end of daemon logs when something fails.
tail_log() {
    local file
    for file in "$@"; do
        [[ -f $file ]] || continue
        printf -- '----- last lines of %s -----\n' "$file" >&2
        tail -n 30 "$file" >&2 || true
    done
}

# wait_for DESCRIPTION LOGFILE COMMAND...: poll COMMAND until it succeeds, at most $TIMEOUT s.
wait_for() {
    local what=$1 logfile=$2 deadline
    shift 2
    deadline=$((SECONDS + TIMEOUT))
    until "$@" >/dev/null 2>&1; do
        if ((SECONDS >= deadline)); then
            tail_log "$logfile"
            die "timed out after ${TIMEOUT}s waiting for $what"
        fi
        sleep 0.5
    done
}

# stop_daemon NAME [COMM]: TERM the process this script started, KILL it after $TIMEOUT s.
stop_daemon() {
    local name=${2:-$1} pid deadline
    if ! pid=$(our_pid "$1" "$name"); then
        rm -f "$STATE/$1.pid"
        return 0
    fi
    log "stopping $1 (pid $pid)"
    kill -TERM "$pid" 2>/dev/null || true
    deadline=$((SECONDS + TIMEOUT))
    # Wait on the process, not its pid file: slurm daemons delete the file before they exit.
    while alive "$pid" "$name"; do
        if ((SECONDS >= deadline)); then
            log "$1 (pid $pid) ignored SIGTERM for ${TIMEOUT}s; sending SIGKILL"
            kill -KILL "$pid" 2>/dev/null || true
            break
        fi
        sleep 0.2
    done
    rm -f "$STATE/$1.pid"
}

# The pid files of the slurmd processes this script started (one per node).
slurmd_pid_names() {
    local file
    for file in "$STATE"/slurmd.pid "$STATE"/slurmd-*.pid; do
        [[ -e $file ]] || continue
        file=${file##*/}
        printf '%s\n' "${file%.pid}"
    done
}

# --- packages and configuration --------------------------------------------------------------

missing_packages() {
    local pkg
    for pkg in "${PACKAGES[@]}"; do
        [[ $(dpkg-query -W -f='${db:Status-Status}' "$pkg" 2>/dev/null || true) == installed ]] ||
            printf '%s\n' "$pkg"
    done
}

install_packages() {
    local missing
    mapfile -t missing < <(missing_packages)
    ((${#missing[@]} > 0)) || return 0
    command -v apt-get >/dev/null || die "packages missing (${missing[*]}) and no apt-get"
    log "installing ${missing[*]} (apt-get update first)"
    # Keep the packages' init scripts from starting daemons this script would not track.
    local policy=/usr/sbin/policy-rc.d made_policy=0
    if [[ ! -e $policy ]]; then
        printf '#!/bin/sh\nexit 101\n' >"$policy"
        chmod 755 "$policy"
        made_policy=1
    fi
    local rc=0
    {
        timeout 300 apt-get update -q &&
            DEBIAN_FRONTEND=noninteractive timeout 600 apt-get install -y -q \
                --no-install-recommends "${missing[@]}"
    } >"$STATE/apt.log" 2>&1 || rc=$?
    ((made_policy == 0)) || rm -f "$policy"
    if ((rc != 0)); then
        tail_log "$STATE/apt.log"
        die "apt-get failed (rc $rc); full log in $STATE/apt.log"
    fi
}

# node_names: the nodes of a cluster of $NODES nodes, one per line.
node_names() {
    local k
    if ((NODES == 1)); then
        echo localhost
        return 0
    fi
    for ((k = 1; k <= NODES; k++)); do echo "$NODE_PREFIX$k"; done
}

node_addr() { echo "$NET.$((10 + ${1#"$NODE_PREFIX"}))"; }

# render TEMPLATE: print the template with its @NAME@ placeholders filled in.
render() {
    local text ctld tag set lines="" node tmpfs
    if ((NODES == 1)); then
        ctld=localhost tag="" set=localhost tmpfs=/tmp
        lines="NodeName=localhost CPUs=8 RealMemory=16000 Gres=gpu:4 State=UNKNOWN"
    else
        ctld="localhost($NET.1)" tag="-%n" set="$NODE_PREFIX[1-$NODES]" tmpfs="$STATE/tmp-%n"
        while read -r node; do
            lines+="NodeName=$node NodeAddr=$(node_addr "$node") NodeHostname=$node CPUs=4"
            lines+=" RealMemory=8000 Gres=gpu:4 State=UNKNOWN"$'\n'
        done < <(node_names)
        lines=${lines%$'\n'}
    fi
    text=$(<"$TEMPLATE_DIR/$1")
    text=${text//@CTLD_HOST@/$ctld}
    text=${text//@SLURMD_TAG@/$tag}
    text=${text//@NODE_SET@/$set}
    text=${text//@NODE_LINES@/$lines}
    text=${text//@TMPFS@/$tmpfs}
    text=${text//@STATE@/$STATE}
    text=${text//@GPU_DIR@/$GPU_DIR}
    text=${text//@DB_PORT@/$DB_PORT}
    text=${text//@DB_PASS@/$DB_PASS}
    printf '%s\n' "$text"
}

# Reuse the MariaDB password already in slurmdbd.conf so re-rendering changes nothing.
db_password() {
    local pass=""
    if [[ -f $CONF_DIR/slurmdbd.conf ]]; then
        pass=$(sed -n 's/^StoragePass=//p' "$CONF_DIR/slurmdbd.conf" | head -n 1)
    fi
    [[ -n $pass && $pass != "@DB_PASS@" ]] || pass=$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')
    printf '%s\n' "$pass"
}

readonly CONF_FILES=(slurm.conf gres.conf slurmdbd.conf)
readonly CONF_BACKUP="$STATE/etc-slurm-backup"

# Write rendered configs into /etc/slurm. Prints the names of files that changed.
# A file this script did not write (only with ENERGYSWEEP_SLURM_FORCE=1) is kept in
# $CONF_BACKUP and put back by `down`.
write_configs() {
    local name target tmp
    mkdir -p "$CONF_DIR" "$CONF_BACKUP"
    for name in "${CONF_FILES[@]}"; do
        target="$CONF_DIR/$name"
        tmp=$(mktemp "$CONF_DIR/.$name.XXXXXX")
        render "$name" >"$tmp"
        if [[ -f $target ]] && cmp -s "$tmp" "$target"; then
            rm -f "$tmp"
            continue
        fi
        if [[ -f $target ]] && ! grep -qF "$MARKER" "$target"; then
            if [[ $FORCE != 1 ]]; then
                rm -f "$tmp"
                die "$target was not written by this script; move it away or set ENERGYSWEEP_SLURM_FORCE=1"
            fi
            [[ -e $CONF_BACKUP/$name ]] || cp -p "$target" "$CONF_BACKUP/$name"
        fi
        # slurmdbd refuses a slurmdbd.conf readable by others.
        if [[ $name == slurmdbd.conf ]]; then chmod 600 "$tmp"; else chmod 644 "$tmp"; fi
        mv -f "$tmp" "$target"
        printf '%s\n' "$name"
    done
}

# Put /etc/slurm back as `up` found it: our files removed, files we replaced restored.
restore_configs() {
    local name target
    for name in "${CONF_FILES[@]}"; do
        target="$CONF_DIR/$name"
        if [[ -e $CONF_BACKUP/$name ]]; then
            cp -p "$CONF_BACKUP/$name" "$target"
            rm -f "$CONF_BACKUP/$name"
        elif [[ -f $target ]] && grep -qF "$MARKER" "$target"; then
            rm -f "$target"
        fi
    done
    rmdir "$CONF_BACKUP" 2>/dev/null || true
}

make_fake_gpus() {
    local i dev
    mkdir -p "$GPU_DIR"
    for i in 0 1 2 3; do
        dev="$GPU_DIR/nvidia$i"
        [[ -c $dev ]] && continue
        rm -f "$dev"
        # Same major/minor as /dev/null: harmless if anything opens it.
        mknod -m 666 "$dev" c 1 3
    done
}

# --- daemons ---------------------------------------------------------------------------------

munge_works() { { munge -n </dev/null | unmunge; } >/dev/null 2>&1; }

start_munged() {
    if our_pid munged >/dev/null || munge_works; then
        return 0 # ours, or a munged someone else runs (kept; `down` leaves it alone)
    fi
    refuse_foreign munged
    if [[ ! -s /etc/munge/munge.key ]]; then
        log "creating /etc/munge/munge.key"
        mungekey --create --keyfile=/etc/munge/munge.key
    fi
    chown munge:munge /etc/munge/munge.key
    chmod 400 /etc/munge/munge.key
    install -d -o munge -g munge -m 755 /run/munge
    install -d -o munge -g munge -m 700 /var/lib/munge /var/log/munge
    rm -f /run/munge/munged.pid
    log "starting munged"
    STARTED=1
    setsid runuser -u munge -- munged </dev/null >>"$LOG_DIR/munged.out" 2>&1 ||
        { tail_log "$LOG_DIR/munged.out" /var/log/munge/munged.log; die "munged failed to start"; }
    wait_for "munged pid file" /var/log/munge/munged.log pid_file_names /run/munge/munged.pid munged
    cp /run/munge/munged.pid "$STATE/munged.pid"
    wait_for "munge to answer" /var/log/munge/munged.log munge_works
}

db_port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$DB_PORT") 2>/dev/null; }
db_sql() { mariadb --no-defaults --socket="$DB_SOCKET" -u root -e "$1"; }

start_mariadbd() {
    # The server writes its own pid file in our data directory: a live one there is ours.
    if ! our_pid mariadbd >/dev/null && pid_file_names "$DB_DIR/mariadbd.pid" mariadbd; then
        cp "$DB_DIR/mariadbd.pid" "$STATE/mariadbd.pid"
    fi
    if ! our_pid mariadbd >/dev/null; then
        ! db_port_open || die "port $DB_PORT is in use by another program; set" \
            "ENERGYSWEEP_SLURM_DB_PORT to a free port"
        install -d -o mysql -g mysql -m 750 "$DB_DIR" "$DB_DIR/data"
        if [[ ! -d $DB_DIR/data/mysql ]]; then
            log "initialising MariaDB data directory $DB_DIR/data"
            mariadb-install-db --no-defaults --user=mysql --datadir="$DB_DIR/data" \
                --auth-root-authentication-method=socket --skip-test-db \
                >>"$LOG_DIR/mariadb-install.log" 2>&1 ||
                { tail_log "$LOG_DIR/mariadb-install.log"; die "mariadb-install-db failed"; }
        fi
        log "starting MariaDB on 127.0.0.1:$DB_PORT"
        STARTED=1
        # A pid file left by a killed server (e.g. the machine restarted) would be copied as ours.
        rm -f "$DB_DIR/mariadbd.pid" "$STATE/mariadbd.pid"
        # Small InnoDB sizes: the data directory may be on tmpfs and the machine is small.
        setsid mariadbd --no-defaults --user=mysql --datadir="$DB_DIR/data" \
            --socket="$DB_SOCKET" --pid-file="$DB_DIR/mariadbd.pid" \
            --bind-address=127.0.0.1 --port="$DB_PORT" --log-error="$DB_DIR/mariadb.log" \
            --innodb-buffer-pool-size=64M --innodb-log-file-size=16M \
            </dev/null >>"$LOG_DIR/mariadb.out" 2>&1 &
        wait_for "MariaDB pid file" "$DB_DIR/mariadb.log" pid_file_names "$DB_DIR/mariadbd.pid" mariadbd
        cp "$DB_DIR/mariadbd.pid" "$STATE/mariadbd.pid"
    fi
    wait_for "MariaDB to answer" "$DB_DIR/mariadb.log" db_sql "SELECT 1"
    local pass
    pass=$(sed -n 's/^StoragePass=//p' "$CONF_DIR/slurmdbd.conf" | head -n 1)
    # Both hosts: slurmdbd connects over TCP to 127.0.0.1.
    db_sql "CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY '$pass';
        CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY '$pass';
        ALTER USER 'slurm'@'localhost' IDENTIFIED BY '$pass';
        ALTER USER 'slurm'@'127.0.0.1' IDENTIFIED BY '$pass';
        GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost';
        GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';"
}

# start_slurm_daemon NAME ARGS...: start a self-daemonising slurm daemon unless ours runs.
start_slurm_daemon() {
    local name=$1
    shift
    our_pid "$name" >/dev/null && return 0
    refuse_foreign "$name"
    log "starting $name"
    STARTED=1
    setsid "$name" "$@" </dev/null >>"$LOG_DIR/$name.out" 2>&1 ||
        { tail_log "$LOG_DIR/$name.out" "$LOG_DIR/$name.log"; die "$name failed to start"; }
    wait_for "$name pid file" "$LOG_DIR/$name.log" our_pid "$name"
}

sacctmgr_lists() { sacctmgr -nP list "$@" 2>/dev/null || true; }

# Output is captured before grep so that `grep -q` cannot SIGPIPE sacctmgr under pipefail.
register_cluster() {
    local clusters
    clusters=$(sacctmgr_lists cluster format=cluster)
    grep -qx "$CLUSTER" <<<"$clusters" || sacctmgr -i add cluster "$CLUSTER" >/dev/null
}

register_account() {
    local accounts user
    accounts=$(sacctmgr_lists account format=account)
    grep -qx "$ACCOUNT" <<<"$accounts" ||
        sacctmgr -i add account "$ACCOUNT" cluster="$CLUSTER" \
            description="energysweep test jobs" organization=energysweep >/dev/null
    user=$(id -un)
    [[ -n $(sacctmgr_lists assoc user="$user" account="$ACCOUNT" format=user) ]] ||
        sacctmgr -i add user "$user" account="$ACCOUNT" cluster="$CLUSTER" >/dev/null
}

node_state() { sinfo -h -N -n "$1" -o %T 2>/dev/null | head -n 1; }
node_usable() { [[ $(node_state "$1") =~ ^(idle|mixed|allocated|completing)$ ]]; }
nodes_usable() {
    local node
    while read -r node; do node_usable "$node" || return 1; done < <(node_names)
}
nodes_summary() { sinfo -h -N -o '%N %T' 2>/dev/null | sort -u | tr '\n' ' '; }
no_jobs() { [[ -z $(squeue -h -o %A 2>/dev/null) ]]; }
ctld_up() { [[ $(scontrol ping 2>/dev/null) == *"is UP"* ]]; }

# Resume a node while it reports a drained/down state (e.g. left over from a bad config).
wait_node_idle() {
    local node=$1 deadline state logfile="$LOG_DIR/slurmd.log"
    ((NODES == 1)) || logfile="$LOG_DIR/slurmd-$node.log"
    deadline=$((SECONDS + TIMEOUT))
    until node_usable "$node"; do
        state=$(node_state "$node")
        case $state in
            drain* | down | fail* | inval)
                log "node $node is $state; resuming it"
                scontrol update nodename="$node" state=resume >/dev/null 2>&1 || true
                ;;
        esac
        if ((SECONDS >= deadline)); then
            tail_log "$logfile" "$LOG_DIR/slurmctld.log"
            scontrol show node "$node" >&2 || true
            die "timed out after ${TIMEOUT}s waiting for node $node to be idle (state '${state:-?}')"
        fi
        sleep 0.5
    done
}

# --- multi-node: namespaces, bridge, names ---------------------------------------------------
# Every network object `up` creates is listed in $NET_RECORD; `down` deletes exactly those.

readonly NET_RECORD="$STATE/net-created"

record_net() { printf '%s\n' "$1" >>"$NET_RECORD"; }
net_recorded() { [[ -f $NET_RECORD ]] && grep -qx "$1" "$NET_RECORD"; }

net_up() {
    local node k
    # `ip netns add` creates /run/netns and bind-mounts it on itself; `down` undoes that if so.
    [[ -e /run/netns ]] || net_recorded "dir /run/netns" || record_net "dir /run/netns"
    if ! ip link show "$BRIDGE" >/dev/null 2>&1; then
        ip link add "$BRIDGE" type bridge
        record_net "link $BRIDGE"
    elif ! net_recorded "link $BRIDGE"; then
        die "bridge $BRIDGE exists but was not made by this script; remove it first"
    fi
    # No IPv6 (no router advertisements or link-local chatter); forwarding is left as found (off).
    sysctl -qw "net.ipv6.conf.$BRIDGE.disable_ipv6=1" >/dev/null 2>&1 || true
    ip addr replace "$NET.1/24" dev "$BRIDGE"
    ip link set "$BRIDGE" up
    while read -r node; do
        k=${node#"$NODE_PREFIX"}
        if [[ ! -e /run/netns/$node ]]; then
            ip netns add "$node"
            record_net "netns $node"
        elif ! net_recorded "netns $node"; then
            die "network namespace $node exists but was not made by this script; remove it first"
        fi
        if ! ip link show "esveth$k" >/dev/null 2>&1; then
            ip link add "esveth$k" type veth peer name "esvpeer$k"
            ip link set "esvpeer$k" netns "$node"
            ip -n "$node" link set "esvpeer$k" name eth0
        fi
        ip link set "esveth$k" master "$BRIDGE" up
        ip netns exec "$node" sysctl -qw net.ipv6.conf.all.disable_ipv6=1 >/dev/null 2>&1 || true
        ip -n "$node" addr replace "$(node_addr "$node")/24" dev eth0
        ip -n "$node" link set lo up
        ip -n "$node" link set eth0 up
    done < <(node_names)
}

# Delete the namespaces (their veth pairs go with them) and the bridge this script made.
net_down() {
    [[ -f $NET_RECORD ]] || return 0
    local kind name
    while read -r kind name; do
        [[ $kind == netns ]] || continue
        log "removing network namespace $name"
        ip netns del "$name" 2>/dev/null || true
    done <"$NET_RECORD"
    while read -r kind name; do
        [[ $kind == link ]] || continue
        log "removing bridge $name"
        ip link del "$name" 2>/dev/null || true
    done <"$NET_RECORD"
    if net_recorded "dir /run/netns" && [[ -z $(ls -A /run/netns 2>/dev/null) ]]; then
        while mountpoint -q /run/netns; do umount /run/netns || break; done
        rmdir /run/netns 2>/dev/null || true
    fi
    rm -f "$NET_RECORD"
}

# The node names, for /etc/hosts: never looked up in DNS (the resolver is outside the machine).
hosts_lines() {
    local node
    while read -r node; do printf '%s %s\n' "$(node_addr "$node")" "$node"; done < <(node_names)
}

# Add the marked block of node names to /etc/hosts (in place: it may be a bind mount).
hosts_add() {
    hosts_remove
    cp -p /etc/hosts "$STATE/hosts.orig"
    { printf '%s\n' "$HOSTS_BEGIN"; hosts_lines; printf '%s\n' "$HOSTS_END"; } >>/etc/hosts
}

# Remove the marked block; the file is then byte-identical to what `up` found.
hosts_remove() {
    grep -qxF "$HOSTS_BEGIN" /etc/hosts 2>/dev/null || { rm -f "$STATE/hosts.orig"; return 0; }
    local kept
    kept=$(mktemp)
    awk -v b="$HOSTS_BEGIN" -v e="$HOSTS_END" '$0 == b { skip = 1 } !skip { print } $0 == e { skip = 0 }' \
        /etc/hosts >"$kept"
    # The original may lack a final newline, which awk adds back: prefer the saved original.
    if [[ -f $STATE/hosts.orig ]] && cmp -s <(cat "$STATE/hosts.orig"; [[ -z $(tail -c1 "$STATE/hosts.orig") ]] || echo) "$kept"; then
        cat "$STATE/hosts.orig" >/etc/hosts
    else
        cat "$kept" >/etc/hosts
    fi
    rm -f "$kept" "$STATE/hosts.orig"
}

# Files bind-mounted over /etc inside node K's mount namespace: names from files only.
write_node_files() {
    local node=$1 dir="$STATE/nodes/$1"
    mkdir -p "$dir"
    {
        echo "127.0.0.1 localhost"
        echo "$NET.1 escontroller"
        hosts_lines
    } >"$dir/hosts"
    : >"$dir/resolv.conf"
    # Users and groups as the machine has them; hosts from the file above only.
    sed -E 's/^hosts:.*/hosts: files/' /etc/nsswitch.conf >"$dir/nsswitch.conf"
    grep -q '^hosts:' "$dir/nsswitch.conf" || echo "hosts: files" >>"$dir/nsswitch.conf"
}

# start_node NODE: slurmd -N NODE in the node's network namespace, with its own mount and UTS
# namespaces (hostname, /etc/hosts). Not `ip netns exec`: it remounts /sys, hiding the cgroup fs,
# and slurmd dies. Job processes inherit all three namespaces.
start_node() {
    local node=$1 dir="$STATE/nodes/$1"
    our_pid "slurmd-$node" slurmd >/dev/null && return 0
    write_node_files "$node"
    # Its spool (slurmd does not create it) and its scratch (TmpFS=$STATE/tmp-%n).
    mkdir -p "$STATE/slurmd-$node" "$STATE/tmp-$node"
    chmod 1777 "$STATE/tmp-$node"
    log "starting slurmd $node ($(node_addr "$node"), network namespace $node)"
    STARTED=1
    # shellcheck disable=SC2016  # expanded by the inner shell, from its arguments
    nsenter --net="/run/netns/$node" -- unshare --mount --uts --propagation slave -- sh -c '
        mount --bind "$1/hosts" /etc/hosts &&
        mount --bind "$1/nsswitch.conf" /etc/nsswitch.conf &&
        { [ ! -e /etc/resolv.conf ] || mount --bind "$1/resolv.conf" /etc/resolv.conf; } &&
        hostname "$2" && exec setsid slurmd -N "$2"' sh "$dir" "$node" \
        </dev/null >>"$LOG_DIR/slurmd-$node.out" 2>&1 ||
        { tail_log "$LOG_DIR/slurmd-$node.out" "$LOG_DIR/slurmd-$node.log"; die "slurmd $node failed to start"; }
    wait_for "slurmd $node pid file" "$LOG_DIR/slurmd-$node.log" our_pid "slurmd-$node" slurmd
}

# A slurmd running without a pid file of ours would answer for our nodes: refuse.
refuse_foreign_slurmd() {
    local pid name ours=" "
    while read -r name; do
        pid=$(our_pid "$name" slurmd) && ours+="$pid "
    done < <(slurmd_pid_names)
    for pid in $(pids_named slurmd); do
        [[ $ours == *" $pid "* ]] || die "slurmd is already running (pid $pid) but was not" \
            "started by this script; stop it first"
    done
}

# The number of nodes of the cluster whose state is in $STATE (1 if none recorded).
recorded_nodes() { if [[ -s $STATE/nodes.count ]]; then tr -dc "0-9" <"$STATE/nodes.count"; else echo 1; fi; }

# --- subcommands -----------------------------------------------------------------------------

cmd_check() {
    if ((EUID != 0)); then
        echo "needs root (starts system daemons and writes /etc/slurm)"
        return 1
    fi
    local bin missing=()
    for bin in "${BINARIES[@]}"; do
        command -v "$bin" >/dev/null 2>&1 || missing+=("$bin")
    done
    if ((${#missing[@]} > 0)) && ! command -v apt-get >/dev/null 2>&1; then
        echo "missing ${missing[*]} and no apt-get to install ${PACKAGES[*]}"
        return 1
    fi
    local probe
    probe=$(mktemp -d)
    if ! mknod "$probe/gpu" c 1 3 2>/dev/null; then
        rm -rf "$probe"
        echo "cannot mknod character devices here (needed for the fake GPUs)"
        return 1
    fi
    rm -rf "$probe"
    if ((NODES > 1)); then
        for bin in nsenter unshare; do
            command -v "$bin" >/dev/null 2>&1 || {
                echo "--nodes needs $bin (util-linux)"
                return 1
            }
        done
        # `ip` comes with iproute2, which `up` installs when apt-get is there.
        local probe_cmd=(ip link add estest0 type bridge)
        if ! command -v ip >/dev/null 2>&1; then
            command -v apt-get >/dev/null 2>&1 || {
                echo "--nodes needs ip (iproute2) and there is no apt-get to install it"
                return 1
            }
            probe_cmd=(true)
        fi
        # CAP_SYS_ADMIN + CAP_NET_ADMIN: a container needs --privileged.
        if ! unshare --net --mount --uts -- "${probe_cmd[@]}" 2>/dev/null; then
            echo "cannot create network namespaces and bridges here (needs CAP_SYS_ADMIN and" \
                "CAP_NET_ADMIN; a container needs --privileged)"
            return 1
        fi
        echo "ok: a local Slurm cluster of $NODES nodes can be started here"
        return 0
    fi
    echo "ok: a local Slurm cluster can be started here"
}

cmd_up() {
    local reason start=$SECONDS node running
    reason=$(cmd_check) || die "$reason"
    mkdir -p "$STATE" "$LOG_DIR" "$STATE/slurmctld" "$STATE/slurmd"
    # One cluster at a time: both use /etc/slurm and ports 6817-6819.
    running=$(recorded_nodes)
    if [[ -n $(slurmd_pid_names) ]] && ((running != NODES)); then
        local alive=0 name
        while read -r name; do our_pid "$name" slurmd >/dev/null && alive=1; done < <(slurmd_pid_names)
        ((alive == 0)) || die "a cluster of $running node(s) is up; run '$0 down' first, then" \
            "'$0 up --nodes $NODES'"
    fi
    echo "$NODES" >"$STATE/nodes.count"
    install_packages
    make_fake_gpus
    DB_PASS=$(db_password)
    local changed
    changed=$(write_configs)
    if [[ -n $changed ]]; then
        log "wrote $(echo "$changed" | tr '\n' ' ')to $CONF_DIR"
        local name
        for name in $(slurmd_pid_names) slurmctld slurmdbd; do
            if our_pid "$name" "${name%%-*}" >/dev/null; then
                log "configuration changed: restarting $name"
                stop_daemon "$name" "${name%%-*}"
            fi
        done
    fi
    start_munged
    start_mariadbd
    start_slurm_daemon slurmdbd
    wait_for "slurmdbd to answer sacctmgr" "$LOG_DIR/slurmdbd.log" sacctmgr -n list cluster
    register_cluster
    if ((NODES > 1)); then
        net_up
        grep -qxF "$HOSTS_BEGIN" /etc/hosts || hosts_add
    fi
    start_slurm_daemon slurmctld
    wait_for "slurmctld to answer" "$LOG_DIR/slurmctld.log" ctld_up
    if ((NODES == 1)); then
        # -N localhost: the node name does not depend on this machine's hostname.
        start_slurm_daemon slurmd -N localhost
    else
        refuse_foreign_slurmd
        while read -r node; do start_node "$node"; done < <(node_names)
    fi
    while read -r node; do wait_node_idle "$node"; done < <(node_names)
    register_account
    if ((STARTED == 0)); then
        log "already up: $(nodes_summary); state in $STATE"
        return 0
    fi
    log "up in $((SECONDS - start))s: $(nodes_summary); account '$ACCOUNT'; state in $STATE"
}

cmd_down() {
    local name i jobs deadline
    NODES=$(recorded_nodes)
    # Jobs would outlive slurmd as orphaned slurmstepd processes: cancel them first.
    if our_pid slurmctld >/dev/null && ctld_up; then
        jobs=$(squeue -h -o %A 2>/dev/null | tr '\n' ' ')
        if [[ -n ${jobs// /} ]]; then
            log "cancelling jobs $jobs"
            # shellcheck disable=SC2086  # word splitting wanted: one argument per job id
            scancel $jobs 2>/dev/null || true
            deadline=$((SECONDS + TIMEOUT))
            until no_jobs; do
                if ((SECONDS >= deadline)); then
                    log "jobs still listed ${TIMEOUT}s after scancel; stopping daemons anyway"
                    break
                fi
                sleep 0.5
            done
        fi
    fi
    for name in $(slurmd_pid_names); do stop_daemon "$name" slurmd; done
    for ((i = ${#DAEMONS[@]} - 1; i >= 0; i--)); do
        name=${DAEMONS[i]}
        [[ $name == slurmd ]] || stop_daemon "$name"
    done
    net_down
    hosts_remove
    restore_configs
    rm -f "$STATE/nodes.count"
    log "down"
}

cmd_status() {
    local name pid up=1 node
    NODES=$(recorded_nodes)
    # Some pid files are root-only; without root judge by what Slurm answers.
    ((EUID == 0)) || echo "not root: daemon pid files not checked"
    for name in "${DAEMONS[@]}"; do
        ((EUID == 0)) || break
        if [[ $name == slurmd ]] && ((NODES > 1)); then
            while read -r node; do
                if pid=$(our_pid "slurmd-$node" slurmd); then
                    printf '%-10s running (pid %s, node %s)\n' slurmd "$pid" "$node"
                else
                    printf '%-10s not running (node %s)\n' slurmd "$node"
                    up=0
                fi
            done < <(node_names)
            continue
        fi
        if pid=$(our_pid "$name"); then
            printf '%-10s running (pid %s)\n' "$name" "$pid"
        elif [[ -n $(pids_named "$name") ]]; then
            printf '%-10s running, not started by this script (pid %s)\n' "$name" \
                "$(pids_named "$name" | tr '\n' ' ')"
            [[ $name == munged ]] || up=0
        else
            printf '%-10s not running\n' "$name"
            up=0
        fi
    done
    if command -v sinfo >/dev/null && ctld_up; then
        sinfo
        nodes_usable || up=0
    else
        echo "slurmctld not answering"
        up=0
    fi
    if ((up)); then
        echo "cluster is up ($NODES node(s))"
    else
        echo "cluster is not up"
        return 1
    fi
}

main() {
    local cmd=${1:-}
    (($# >= 1)) && shift
    while (($# > 0)); do
        case $1 in
            --nodes)
                [[ ${2:-} =~ ^[0-9]+$ ]] && ((${2} >= 1 && ${2} <= MAX_NODES)) ||
                    die "--nodes needs a number from 1 to $MAX_NODES, got '${2:-}'"
                NODES=$2
                shift 2
                ;;
            --nodes=*)
                set -- --nodes "${1#--nodes=}" "${@:2}"
                ;;
            *)
                usage
                exit 2
                ;;
        esac
    done
    case $cmd in
        up | down)
            ((EUID == 0)) || die "must run as root"
            "cmd_$cmd"
            ;;
        status) cmd_status ;;
        check) cmd_check ;;
        -h | --help) usage ;;
        *)
            usage
            exit 2
            ;;
    esac
}

main "$@"
