#!/usr/bin/env bash
# A "cluster" reached over SSH on this machine, for the remote-run tests: Debian's
# OpenSSH server on a loopback port, a cluster account and a workstation account.
#
#   tests/ssh/cluster.sh install   apt-get install openssh-server rsync (root)
#   tests/ssh/cluster.sh start     accounts, keys, trajflow's virtualenv, sshd
#   tests/ssh/cluster.sh status    does sshd answer (exit 0) or not (exit 1)
#   tests/ssh/cluster.sh stop      end the sshd `start` started, by its recorded pid
#
# Accounts: $CLUSTER_USER (home mode 700: it holds the trajectories) may log in
# with the key of $WORK_USER, who cannot read that home. trajflow is installed
# (not editable: a copy, as on a cluster) into $VENV, which both can run; the
# venv is made once, trajflow itself reinstalled at every start. State (sshd's
# config, host key, pid, log) lives in $TRAJFLOW_SSHD_DIR (default /tmp/trajflow-sshd).
set -euo pipefail

STATE=${TRAJFLOW_SSHD_DIR:-/tmp/trajflow-sshd}
PORT=${TRAJFLOW_SSHD_PORT:-2222}
CLUSTER_USER=tfcluster
WORK_USER=tfwork
VENV=${TRAJFLOW_REMOTE_VENV:-/opt/trajflow-remote-venv}
REPO=$(cd "$(dirname "$0")/../.." && pwd)

die() { echo "cluster.sh: $*" >&2; exit 1; }
need_root() { [ "$(id -u)" = 0 ] || die "must run as root (accounts, sshd)"; }

cmd_install() {
    need_root
    [ -x /usr/sbin/sshd ] && command -v rsync >/dev/null && /usr/bin/python3 -m venv -h >/dev/null \
        && return 0
    command -v apt-get >/dev/null || die "no apt-get: install openssh-server and rsync by hand"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openssh-server rsync python3-venv >/dev/null
}

account() {  # name
    id "$1" >/dev/null 2>&1 || useradd --create-home --shell /bin/bash "$1"
    usermod -p "*" "$1"  # no password, yet not locked: sshd refuses a locked account's keys
    chmod 700 "/home/$1"
    install -d -m 700 -o "$1" -g "$1" "/home/$1/.ssh"
}

cmd_start() {
    need_root
    [ -x /usr/sbin/sshd ] || die "openssh-server is not installed: run '$0 install' first"
    account "$CLUSTER_USER"
    account "$WORK_USER"
    local key=/home/$WORK_USER/.ssh/id_ed25519
    [ -f "$key" ] || runuser -u "$WORK_USER" -- ssh-keygen -q -t ed25519 -N "" -f "$key"
    install -m 600 -o "$CLUSTER_USER" -g "$CLUSTER_USER" "$key.pub" \
        "/home/$CLUSTER_USER/.ssh/authorized_keys"
    mkdir -p "$STATE" /run/sshd
    [ -f "$STATE/host_key" ] || ssh-keygen -q -t ed25519 -N "" -f "$STATE/host_key"
    echo "[127.0.0.1]:$PORT $(cut -d' ' -f1,2 "$STATE/host_key.pub")" > "/home/$WORK_USER/.ssh/known_hosts"
    chown "$WORK_USER:$WORK_USER" "/home/$WORK_USER/.ssh/known_hosts"
    cat > "$STATE/sshd_config" <<EOF
Port $PORT
ListenAddress 127.0.0.1
HostKey $STATE/host_key
PidFile $STATE/sshd.pid
AllowUsers $CLUSTER_USER
PasswordAuthentication no
KbdInteractiveAuthentication no
PubkeyAuthentication yes
UsePAM no
MaxSessions 50
MaxStartups 50
EOF
    # installed from a copy of the source: pip's build would leave build/ in the clone
    local src; src=$(mktemp -d)
    tar -C "$REPO" --exclude=./.venv --exclude=./.git --exclude=./build -cf - . | tar -C "$src" -xf -
    if [ ! -x "$VENV/bin/python" ]; then
        # the system's Python: another account cannot run root's own (pyenv under /root)
        /usr/bin/python3 -m venv "$VENV"
        "$VENV/bin/pip" install -q --upgrade pip
    fi
    # with the demo's data (MDAnalysisTests): campaigns on the dataset "adk" are planned
    # on the workstation account's side from this virtualenv
    if "$VENV/bin/python" -c "import MDAnalysisTests" 2>/dev/null; then
        "$VENV/bin/pip" install -q --no-deps --force-reinstall "$src"
    else
        "$VENV/bin/pip" install -q -c "$REPO/constraints.txt" "$src[demo]"
    fi
    rm -rf "$src"
    chmod -R a+rX "$VENV"
    cmd_status >/dev/null 2>&1 && return 0
    /usr/sbin/sshd -f "$STATE/sshd_config" -E "$STATE/sshd.log"
    for _ in $(seq 50); do cmd_status >/dev/null 2>&1 && return 0; sleep 0.1; done
    die "sshd did not answer on 127.0.0.1:$PORT; see $STATE/sshd.log"
}

cmd_status() {
    [ -s "$STATE/sshd.pid" ] && kill -0 "$(cat "$STATE/sshd.pid")" 2>/dev/null || return 1
    runuser -u "$WORK_USER" -- ssh -o BatchMode=yes -p "$PORT" "$CLUSTER_USER@127.0.0.1" true
}

cmd_stop() {
    [ -s "$STATE/sshd.pid" ] || return 0
    local pid; pid=$(cat "$STATE/sshd.pid")
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    rm -f "$STATE/sshd.pid"
}

case "${1:-}" in
    install) cmd_install ;;
    start) cmd_start ;;
    status) cmd_status ;;
    stop) cmd_stop ;;
    *) die "usage: $0 install|start|status|stop" ;;
esac
