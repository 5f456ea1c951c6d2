#!/usr/bin/env bash
# A single-node SLURM on this machine, for the multi-resource tests: a real
# batch system (sbatch, srun) from Debian's slurm-wlm and munge packages.
#
#   tests/slurm/single_node.sh install   apt-get install slurm-wlm munge (root)
#   tests/slurm/single_node.sh start     write the config, start munged, slurmctld, slurmd
#   tests/slurm/single_node.sh status    is the partition up (exit 0) or not (exit 1)
#   tests/slurm/single_node.sh stop      end what `start` started, by the pids it recorded
#
# State (config, spool, logs, pid files) lives in $TRAJFLOW_SLURM_DIR
# (default /tmp/trajflow-slurm). The clients (sbatch, srun, squeue) read
# /etc/slurm/slurm.conf; `start` writes it there only if none exists or the
# one there is ours (it carries the marker line), and `stop` removes it again.
set -euo pipefail

STATE=${TRAJFLOW_SLURM_DIR:-/tmp/trajflow-slurm}
CONF=/etc/slurm/slurm.conf
MARKER="# written by trajflow tests/slurm/single_node.sh"
PARTITION=debug
HOST=$(hostname)
CPUS=$(nproc)
MEM_MB=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 - 1024 ))

die() { echo "single_node.sh: $*" >&2; exit 1; }

need_root() { [ "$(id -u)" = 0 ] || die "must run as root (SlurmUser=root, munge key in /etc/munge)"; }

cmd_install() {
    need_root
    command -v slurmctld >/dev/null && command -v munged >/dev/null && return 0
    command -v apt-get >/dev/null || die "no apt-get: install slurm-wlm and munge by hand"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurm-wlm munge >/dev/null
}

write_conf() {
    mkdir -p "$STATE"/{spool/ctld,spool/d,log,run,munge}
    chown munge:munge "$STATE/munge"   # munged runs as munge and writes its pid file there
    if [ -e "$CONF" ] && ! grep -qF "$MARKER" "$CONF"; then
        die "$CONF exists and is not ours: this script will not overwrite a real SLURM config"
    fi
    mkdir -p /etc/slurm
    cat > "$CONF" <<EOF
$MARKER
ClusterName=trajflow
SlurmctldHost=$HOST
SlurmUser=root
AuthType=auth/munge
StateSaveLocation=$STATE/spool/ctld
SlurmdSpoolDir=$STATE/spool/d
SlurmctldPidFile=$STATE/run/slurmctld.pid
SlurmdPidFile=$STATE/run/slurmd.pid
SlurmctldLogFile=$STATE/log/slurmctld.log
SlurmdLogFile=$STATE/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
MpiDefault=none
ReturnToService=2
SlurmctldTimeout=30
SlurmdTimeout=30
NodeName=$HOST CPUs=$CPUS RealMemory=$MEM_MB State=UNKNOWN
PartitionName=$PARTITION Nodes=$HOST Default=YES MaxTime=INFINITE State=UP
EOF
    # munged may leave a stale socket or pid behind after an unclean stop
    mkdir -p /run/munge && chown munge:munge /run/munge
}

alive() { [ -s "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

cmd_start() {
    need_root
    command -v slurmctld >/dev/null || die "slurm-wlm is not installed: run '$0 install' first"
    if cmd_status >/dev/null 2>&1; then echo "SLURM already up (partition $PARTITION)"; return 0; fi
    write_conf
    if ! alive "$STATE/run/munged.pid"; then
        [ -s /etc/munge/munge.key ] || die "no /etc/munge/munge.key: reinstall munge or run mungekey"
        rm -f "$STATE/munge/munged.pid"
        runuser -u munge -- /usr/sbin/munged --pid-file="$STATE/munge/munged.pid" --force
        for _ in $(seq 50); do [ -s "$STATE/munge/munged.pid" ] && break; sleep 0.1; done
        [ -s "$STATE/munge/munged.pid" ] || die "munged did not start; see /var/log/munge/munged.log"
        cp "$STATE/munge/munged.pid" "$STATE/run/munged.pid"
    fi
    alive "$STATE/run/slurmctld.pid" || /usr/sbin/slurmctld
    alive "$STATE/run/slurmd.pid" || /usr/sbin/slurmd
    for _ in $(seq 60); do
        if cmd_status >/dev/null 2>&1; then
            echo "SLURM up: partition $PARTITION on $HOST with $CPUS cpus (state in $STATE)"
            return 0
        fi
        sleep 0.5
    done
    echo "SLURM did not come up; logs:" >&2
    tail -n 20 "$STATE"/log/*.log >&2 || true
    return 1
}

cmd_status() {
    command -v sinfo >/dev/null || return 1
    local state
    state=$(timeout 5 sinfo -h -p "$PARTITION" -o %T 2>/dev/null | head -n1) || return 1
    echo "node state: ${state:-none}"
    [[ "$state" == idle* || "$state" == mix* || "$state" == alloc* ]]
}

cmd_stop() {
    for name in slurmd slurmctld munged; do
        local pidfile="$STATE/run/$name.pid"
        if alive "$pidfile"; then
            local pid; pid=$(cat "$pidfile")
            kill "$pid"
            for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
            kill -0 "$pid" 2>/dev/null && kill -9 "$pid"
        fi
        rm -f "$pidfile"
    done
    if [ -e "$CONF" ] && grep -qF "$MARKER" "$CONF"; then rm -f "$CONF"; fi
    echo "SLURM stopped"
}

case "${1:-}" in
    install) cmd_install ;;
    start)   cmd_start ;;
    status)  cmd_status ;;
    stop)    cmd_stop ;;
    *) echo "usage: $0 install|start|status|stop" >&2; exit 2 ;;
esac
