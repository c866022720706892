#!/usr/bin/env bash
# Bring up / tear down a real single-node Slurm cluster on this machine.
#
# Target: Debian 12, run as root, no systemd, no GPU (4 fake GPUs are declared as GRES).
# Starts munged, MariaDB, slurmdbd, slurmctld and `slurmd -N localhost`; stops only what it started
# (pid files under the state directory). See cluster/README.md.
#
# Usage: cluster/slurm-local.sh {up|down|status|check}
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
readonly NODE=localhost
readonly MARKER="# Managed by energysweep cluster/slurm-local.sh"
readonly PACKAGES=(slurm-wlm munge slurmdbd mariadb-server)
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
usage: $0 {up|down|status|check}
  up      install missing packages, write /etc/slurm, start the daemons, wait for node idle
  down    stop the daemons this script started (pid files in $STATE)
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

# Print the pid recorded in $STATE/NAME.pid if that process is alive and is NAME.
our_pid() {
    local name=$1 file="$STATE/$1.pid"
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

# stop_daemon NAME: TERM the process this script started, KILL it after $TIMEOUT s.
stop_daemon() {
    local name=$1 pid deadline
    if ! pid=$(our_pid "$name"); then
        rm -f "$STATE/$name.pid"
        return 0
    fi
    log "stopping $name (pid $pid)"
    kill -TERM "$pid" 2>/dev/null || true
    deadline=$((SECONDS + TIMEOUT))
    # Wait on the process, not its pid file: slurm daemons delete the file before they exit.
    while alive "$pid" "$name"; do
        if ((SECONDS >= deadline)); then
            log "$name (pid $pid) ignored SIGTERM for ${TIMEOUT}s; sending SIGKILL"
            kill -KILL "$pid" 2>/dev/null || true
            break
        fi
        sleep 0.2
    done
    rm -f "$STATE/$name.pid"
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

# render TEMPLATE: print the template with @STATE@, @GPU_DIR@, @DB_PORT@, @DB_PASS@ filled in.
render() {
    local text
    text=$(<"$TEMPLATE_DIR/$1")
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

# Write rendered configs into /etc/slurm. Prints the names of files that changed.
write_configs() {
    local name target tmp
    mkdir -p "$CONF_DIR"
    for name in slurm.conf gres.conf slurmdbd.conf; do
        target="$CONF_DIR/$name"
        tmp=$(mktemp "$CONF_DIR/.$name.XXXXXX")
        render "$name" >"$tmp"
        if [[ -f $target ]] && cmp -s "$tmp" "$target"; then
            rm -f "$tmp"
            continue
        fi
        if [[ -f $target && $FORCE != 1 ]] && ! grep -qF "$MARKER" "$target"; then
            rm -f "$tmp"
            die "$target was not written by this script; move it away or set ENERGYSWEEP_SLURM_FORCE=1"
        fi
        # slurmdbd refuses a slurmdbd.conf readable by others.
        if [[ $name == slurmdbd.conf ]]; then chmod 600 "$tmp"; else chmod 644 "$tmp"; fi
        mv -f "$tmp" "$target"
        printf '%s\n' "$name"
    done
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

node_state() { sinfo -h -N -n "$NODE" -o %T 2>/dev/null | head -n 1; }
node_usable() { [[ $(node_state) =~ ^(idle|mixed|allocated|completing)$ ]]; }
no_jobs() { [[ -z $(squeue -h -o %A 2>/dev/null) ]]; }
ctld_up() { [[ $(scontrol ping 2>/dev/null) == *"is UP"* ]]; }

# Resume the node while it reports a drained/down state (e.g. left over from a bad config).
wait_node_idle() {
    local deadline state
    deadline=$((SECONDS + TIMEOUT))
    until node_usable; do
        state=$(node_state)
        case $state in
            drain* | down | fail* | inval)
                log "node $NODE is $state; resuming it"
                scontrol update nodename="$NODE" state=resume >/dev/null 2>&1 || true
                ;;
        esac
        if ((SECONDS >= deadline)); then
            tail_log "$LOG_DIR/slurmd.log" "$LOG_DIR/slurmctld.log"
            scontrol show node "$NODE" >&2 || true
            die "timed out after ${TIMEOUT}s waiting for node $NODE to be idle (state '${state:-?}')"
        fi
        sleep 0.5
    done
}

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
        echo "missing ${missing[*]} and no apt-get to install slurm-wlm munge slurmdbd mariadb-server"
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
    echo "ok: a local Slurm cluster can be started here"
}

cmd_up() {
    local reason start=$SECONDS
    reason=$(cmd_check) || die "$reason"
    mkdir -p "$STATE" "$LOG_DIR" "$STATE/slurmctld" "$STATE/slurmd"
    install_packages
    make_fake_gpus
    DB_PASS=$(db_password)
    local changed
    changed=$(write_configs)
    if [[ -n $changed ]]; then
        log "wrote $(echo "$changed" | tr '\n' ' ')to $CONF_DIR"
        local name
        for name in slurmd slurmctld slurmdbd; do
            if our_pid "$name" >/dev/null; then
                log "configuration changed: restarting $name"
                stop_daemon "$name"
            fi
        done
    fi
    start_munged
    start_mariadbd
    start_slurm_daemon slurmdbd
    wait_for "slurmdbd to answer sacctmgr" "$LOG_DIR/slurmdbd.log" sacctmgr -n list cluster
    register_cluster
    start_slurm_daemon slurmctld
    wait_for "slurmctld to answer" "$LOG_DIR/slurmctld.log" ctld_up
    # -N localhost: the node name does not depend on this machine's hostname.
    start_slurm_daemon slurmd -N "$NODE"
    wait_node_idle
    register_account
    if ((STARTED == 0)); then
        log "already up: node $NODE $(node_state); state in $STATE"
        return 0
    fi
    log "up in $((SECONDS - start))s: node $NODE $(node_state); account '$ACCOUNT'; state in $STATE"
}

cmd_down() {
    local name i jobs deadline
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
    for ((i = ${#DAEMONS[@]} - 1; i >= 0; i--)); do
        name=${DAEMONS[i]}
        stop_daemon "$name"
    done
    log "down"
}

cmd_status() {
    local name pid up=1
    # Some pid files are root-only; without root judge by what Slurm answers.
    ((EUID == 0)) || echo "not root: daemon pid files not checked"
    for name in "${DAEMONS[@]}"; do
        ((EUID == 0)) || break
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
        node_usable || up=0
    else
        echo "slurmctld not answering"
        up=0
    fi
    if ((up)); then
        echo "cluster is up"
    else
        echo "cluster is not up"
        return 1
    fi
}

main() {
    [[ $# -eq 1 ]] || {
        usage
        exit 2
    }
    case $1 in
        up | down)
            ((EUID == 0)) || die "must run as root"
            "cmd_$1"
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
