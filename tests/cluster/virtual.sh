#!/usr/bin/env bash
# A virtual multi-node SLURM cluster on this machine: each node is a Linux
# network namespace with its own hostname (a UTS namespace), its own address on
# a bridge this script makes, and its own slurmd (Debian's slurm-wlm). One
# slurmctld runs in a namespace of its own; one munged (its own socket) serves
# them all. The file system is shared, as NFS or Lustre is on a real cluster.
# This machine (the bridge's first address) is the login node.
#
#   tests/cluster/virtual.sh start N [CPUS]  N nodes (2-4), CPUS declared per node (default 2)
#   tests/cluster/virtual.sh status          the nodes and their states (exit 0 when all are up)
#   tests/cluster/virtual.sh env             the exports a client needs (eval "$(... env)")
#   tests/cluster/virtual.sh nodes           the node names, one per line
#   tests/cluster/virtual.sh throttle NODE F the node's processes held to F of a core (cgroup
#                                            CPU quota; F = 1 or "off" lifts it)
#   tests/cluster/virtual.sh kill NODE       the node's network down and every process of it
#                                            killed (a node crash)
#   tests/cluster/virtual.sh stop            everything ended by pid, namespaces, bridge,
#                                            cgroups and /etc/netns files removed (the state
#                                            folder stays, with the logs)
#
# Only addresses this script assigns inside its own namespaces are used
# (10.77.0.0/24 on the bridge tfvc0). State (config, spool, logs, pid files)
# lives in $TRAJFLOW_VCLUSTER_DIR (default /tmp/trajflow-vcluster). The
# clients (sbatch, squeue, srun) find this cluster through SLURM_CONF, which
# `env` prints; the single-node SLURM of tests/slurm keeps /etc/slurm.
set -euo pipefail

STATE=${TRAJFLOW_VCLUSTER_DIR:-/tmp/trajflow-vcluster}
CONF=$STATE/slurm.conf
BRIDGE=tfvc0
NET=10.77.0
LOGIN_ADDR=$NET.1
CTL=tfvc-ctl
CTL_ADDR=$NET.2
PARTITION=vc
PREFIX=tfvc          # nodes are tfvc1 .. tfvcN at $NET.11 ..
MUNGE_SOCKET=$STATE/munge/munge.socket
CGROUP_V1=/sys/fs/cgroup/cpu
CGROUP_V2=/sys/fs/cgroup

die() { echo "virtual.sh: $*" >&2; exit 1; }
need_root() { [ "$(id -u)" = 0 ] || die "must run as root (namespaces, a bridge, SlurmUser=root)"; }
alive() { [ -s "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }
node_addr() { echo "$NET.$((10 + ${1#"$PREFIX"}))"; }
nodes() { [ -s "$STATE/nodes" ] && cat "$STATE/nodes" || true; }
is_node() { nodes | grep -qx "$1"; }

# One namespace: a veth pair, the inner end named like the bridge (so
# RADICAL_DEFAULT_IFACE=tfvc0 names the cluster's network on every host), its
# /etc/hosts in /etc/netns/NAME/hosts (where `ip netns exec` looks for it too).
make_namespace() {
    local name=$1 addr=$2
    ip netns add "$name"
    ip link add "$name-h" type veth peer name "$BRIDGE" netns "$name"
    ip link set "$name-h" master "$BRIDGE" up
    ip -n "$name" addr add "$addr/24" dev "$BRIDGE"
    ip -n "$name" link set "$BRIDGE" up
    ip -n "$name" link set lo up
    mkdir -p "/etc/netns/$name"
    cp "$STATE/hosts" "/etc/netns/$name/hosts"
}

# Run a daemon inside a node's namespaces: its network, its hostname, its
# /etc/hosts (bound over the shared one in a private mount namespace; unlike
# `ip netns exec` this keeps /sys and so the cgroup file systems slurmd needs).
in_node() {
    local name=$1; shift
    nsenter --net="/run/netns/$name" -- unshare --uts --mount -- /bin/sh -c \
        'hostname "$0" && mount --bind "/etc/netns/$0/hosts" /etc/hosts && exec "$@"' "$name" "$@"
}

write_conf() {
    local n=$1 cpus=$2 mem=$3
    {
        echo "# written by trajflow tests/cluster/virtual.sh"
        echo "ClusterName=trajflow-virtual"
        echo "SlurmctldHost=$CTL($CTL_ADDR)"
        echo "SlurmUser=root"
        echo "AuthType=auth/munge"
        echo "AuthInfo=socket=$MUNGE_SOCKET"
        echo "StateSaveLocation=$STATE/spool/ctld"
        echo "SlurmdSpoolDir=$STATE/spool/%n"
        echo "SlurmctldPidFile=$STATE/run/slurmctld.pid"
        echo "SlurmdPidFile=$STATE/run/slurmd.%n.pid"
        echo "SlurmctldLogFile=$STATE/log/slurmctld.log"
        echo "SlurmdLogFile=$STATE/log/slurmd.%n.log"
        echo "ProctrackType=proctrack/linuxproc"
        echo "TaskPlugin=task/none"
        echo "SelectType=select/cons_tres"
        echo "SelectTypeParameters=CR_Core"
        echo "SchedulerType=sched/backfill"
        echo "SlurmdParameters=config_overrides"
        echo "MpiDefault=none"
        echo "ReturnToService=2"
        # a crashed node is declared DOWN after SlurmdTimeout (the controller pings
        # every SlurmdTimeout/3): short, so the dead-node tests see it within seconds
        echo "SlurmctldTimeout=30"
        echo "SlurmdTimeout=10"
        echo "KillWait=5"
        echo "InactiveLimit=0"
        for i in $(seq 1 "$n"); do
            echo "NodeName=$PREFIX$i NodeHostname=$PREFIX$i NodeAddr=$(node_addr "$PREFIX$i") CPUs=$cpus RealMemory=$mem State=UNKNOWN"
        done
        echo "PartitionName=$PARTITION Nodes=$PREFIX[1-$n] Default=YES MaxTime=INFINITE State=UP"
    } > "$CONF"
}

cmd_start() {
    need_root
    local n=${1:-3} cpus=${2:-2}
    [[ "$n" =~ ^[2-4]$ ]] || die "N must be 2, 3 or 4 (got '$n')"
    [[ "$cpus" =~ ^[1-9][0-9]*$ ]] || die "CPUS must be a positive number (got '$cpus')"
    command -v slurmctld >/dev/null && command -v munged >/dev/null \
        || die "slurm-wlm and munge are not installed: run 'tests/slurm/single_node.sh install' first"
    command -v ip >/dev/null || die "iproute2's ip is not installed"
    if ip link show "$BRIDGE" >/dev/null 2>&1 || [ -s "$STATE/nodes" ]; then
        die "a virtual cluster is already up (or was not stopped): run '$0 stop' first"
    fi
    [ -s /etc/munge/munge.key ] || die "no /etc/munge/munge.key: reinstall munge or run mungekey"
    ip netns add tfvc-probe 2>/dev/null && ip netns del tfvc-probe \
        || die "network namespaces cannot be made here (ip netns add failed)"

    if [ -e "$STATE" ] && ! grep -qs "written by trajflow tests/cluster/virtual.sh" "$CONF"; then
        die "$STATE exists and is not a virtual cluster's state folder: set TRAJFLOW_VCLUSTER_DIR"
    fi
    # from here on a failed start takes down what it made
    trap 'rc=$?; [ "$rc" = 0 ] || { echo "virtual.sh: start failed; removing what it made" >&2; cmd_stop >/dev/null 2>&1 || true; }' EXIT
    rm -rf "$STATE"
    mkdir -p "$STATE"/{spool/ctld,log,run,munge}
    for i in $(seq 1 "$n"); do mkdir -p "$STATE/spool/$PREFIX$i"; done
    chown munge:munge "$STATE/munge"
    for i in $(seq 1 "$n"); do echo "$PREFIX$i"; done > "$STATE/nodes"
    {
        echo "127.0.0.1 localhost"
        echo "$LOGIN_ADDR tfvc-login"
        echo "$CTL_ADDR $CTL"
        for i in $(seq 1 "$n"); do echo "$(node_addr "$PREFIX$i") $PREFIX$i"; done
    } > "$STATE/hosts"
    write_conf "$n" "$cpus" 2048

    ip link add "$BRIDGE" type bridge
    ip addr add "$LOGIN_ADDR/24" dev "$BRIDGE"
    ip link set "$BRIDGE" up
    make_namespace "$CTL" "$CTL_ADDR"
    for node in $(nodes); do make_namespace "$node" "$(node_addr "$node")"; done

    runuser -u munge -- /usr/sbin/munged --socket="$MUNGE_SOCKET" \
        --pid-file="$STATE/munge/munged.pid" --force
    for _ in $(seq 50); do [ -s "$STATE/munge/munged.pid" ] && break; sleep 0.1; done
    [ -s "$STATE/munge/munged.pid" ] || die "munged did not start; see /var/log/munge/munged.log"
    cp "$STATE/munge/munged.pid" "$STATE/run/munged.pid"

    in_node "$CTL" /usr/sbin/slurmctld -f "$CONF"
    for node in $(nodes); do in_node "$node" /usr/sbin/slurmd -f "$CONF"; done
    for _ in $(seq 80); do
        if cmd_status >/dev/null 2>&1; then
            trap - EXIT
            echo "virtual cluster up: $n nodes ($(nodes | paste -sd, -)), $cpus cpus each, partition $PARTITION"
            echo "clients: eval \"\$($0 env)\""
            return 0
        fi
        sleep 0.5
    done
    echo "the virtual cluster did not come up; logs:" >&2
    tail -n 20 "$STATE"/log/*.log >&2 || true
    return 1
}

cmd_env() {
    echo "export SLURM_CONF=$CONF"
    echo "export RADICAL_DEFAULT_IFACE=$BRIDGE"
}

cmd_status() {
    [ -s "$CONF" ] || { echo "no virtual cluster (no $CONF)"; return 1; }
    local states
    states=$(SLURM_CONF=$CONF timeout 5 sinfo -h -N -p "$PARTITION" -o '%N %T' 2>/dev/null) || return 1
    echo "$states"
    [ -n "$states" ] || return 1
    ! echo "$states" | awk '{print $2}' | grep -qvE '^(idle|mixed|allocated|completing)$'
}

# cgroup CPU quota for a node: v1 (cpu controller) or v2 (cpu.max)
node_cgroup() {
    if [ -d "$CGROUP_V1" ]; then echo "$CGROUP_V1/trajflow-vc-$1"; else echo "$CGROUP_V2/trajflow-vc-$1"; fi
}

cmd_throttle() {
    need_root
    local node=${1:-} fraction=${2:-}
    is_node "$node" || die "no node '$node' (nodes: $(nodes | paste -sd' ' -))"
    local cg; cg=$(node_cgroup "$node")
    if [ "$fraction" = off ] || [ "$fraction" = 1 ]; then
        unthrottle "$node"; echo "$node: no CPU limit"; return 0
    fi
    [[ "$fraction" =~ ^0?\.[0-9]+$ ]] && awk -v f="$fraction" 'BEGIN {exit !(f > 0)}' \
        || die "FRACTION must be between 0 and 1, like 0.25 (got '$fraction')"
    local quota; quota=$(awk -v f="$fraction" 'BEGIN {q = int(f * 100000); if (q < 1000) q = 1000; print q}')
    mkdir -p "$cg"
    if [ -d "$CGROUP_V1" ]; then
        echo 100000 > "$cg/cpu.cfs_period_us"
        echo "$quota" > "$cg/cpu.cfs_quota_us"
    else
        echo "+cpu" > "$CGROUP_V2/cgroup.subtree_control" 2>/dev/null || true
        [ -e "$cg/cpu.max" ] || { rmdir "$cg"; die "the cgroup cpu controller is not available here: no CPU quota"; }
        echo "$quota 100000" > "$cg/cpu.max"
    fi
    # every process of the node now, and (through slurmd) every one it starts later
    local pid
    for pid in $(ip netns pids "$node"); do echo "$pid" > "$cg/cgroup.procs" 2>/dev/null || true; done
    echo "$node: held to $fraction of a core ($cg)"
}

unthrottle() {
    local cg; cg=$(node_cgroup "$1")
    [ -d "$cg" ] || return 0
    local root=$CGROUP_V1; [ -d "$CGROUP_V1" ] || root=$CGROUP_V2
    local pid
    for pid in $(cat "$cg/cgroup.procs" 2>/dev/null); do echo "$pid" > "$root/cgroup.procs" 2>/dev/null || true; done
    rmdir "$cg" 2>/dev/null || true
}

kill_namespace() {
    local name=$1 pids
    ip netns list 2>/dev/null | grep -qw "^$name" || return 0
    pids=$(ip netns pids "$name" 2>/dev/null || true)
    [ -n "$pids" ] && kill -9 $pids 2>/dev/null || true
    for _ in $(seq 50); do [ -z "$(ip netns pids "$name" 2>/dev/null)" ] && return 0; sleep 0.1; done
}

cmd_kill() {
    need_root
    local node=${1:-}
    is_node "$node" || die "no node '$node' (nodes: $(nodes | paste -sd' ' -))"
    # silent, as a crashed node is: its link down (else the others' connections to it
    # would be refused at once), then every process of it killed
    ip link set "$node-h" down 2>/dev/null || true
    kill_namespace "$node"
    rm -f "$STATE/run/slurmd.$node.pid"
    echo "$node: every process killed, its network down (a node crash)"
}

stop_pidfile() {
    local pidfile=$1
    if alive "$pidfile"; then
        local pid; pid=$(cat "$pidfile")
        kill "$pid" 2>/dev/null || true
        for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -0 "$pid" 2>/dev/null && kill -9 "$pid" 2>/dev/null || true
    fi
    rm -f "$pidfile"
}

cmd_stop() {
    need_root
    local node
    for node in $(nodes); do stop_pidfile "$STATE/run/slurmd.$node.pid"; done
    stop_pidfile "$STATE/run/slurmctld.pid"
    stop_pidfile "$STATE/run/munged.pid"
    # whatever jobs left on the nodes (a pilot's agent, ranks) end with them
    for node in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^($PREFIX[0-9]+|$CTL)\$"); do
        kill_namespace "$node"
        unthrottle "$node" 2>/dev/null || true
        ip netns del "$node" 2>/dev/null || true
        ip link del "$node-h" 2>/dev/null || true
        rm -rf "/etc/netns/$node"
    done
    ip link del "$BRIDGE" 2>/dev/null || true
    rmdir /etc/netns 2>/dev/null || true  # only when empty: made for these nodes
    rm -f "$STATE/nodes"
    echo "virtual cluster stopped"
}

case "${1:-}" in
    start)    shift; cmd_start "$@" ;;
    status)   cmd_status ;;
    env)      cmd_env ;;
    nodes)    nodes ;;
    throttle) shift; cmd_throttle "$@" ;;
    kill)     shift; cmd_kill "$@" ;;
    stop)     cmd_stop ;;
    *) echo "usage: $0 start N [CPUS] | status | env | nodes | throttle NODE FRACTION | kill NODE | stop" >&2; exit 2 ;;
esac
