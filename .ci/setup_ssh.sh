#!/usr/bin/env bash
# What `ray up -y cluster.yaml` needs on this machine (the local provider always goes through ssh,
# even for 127.0.0.1): openssh-server and rsync, a key that logs in as this user, and an sshd
# listening on 127.0.0.1 only.
#
#   .ci/setup_ssh.sh install   packages (apt-get, like the JDK in .ci/run) and the login key
#   .ci/setup_ssh.sh start     install, then start sshd on 127.0.0.1 (port 22, or 2222.. if 22 is
#                              taken; then ~/.ssh/config gets a `Host 127.0.0.1` block with that
#                              port so `ray up` on the shipped cluster.yaml reaches it); prints
#                              "port=N pid=P pidfile=F" as its last line. The caller stops sshd by
#                              that pid (tests/cluster/test_ray_up.py does, in a finally).
#
# State lives in $ROCKETRAY_SSHD_DIR (default /tmp/rocketray-sshd): host key, sshd_config, pid file.
set -euo pipefail

mode="${1:-start}"
dir="${ROCKETRAY_SSHD_DIR:-/tmp/rocketray-sshd}"
sudo=""
[ "$(id -u)" = 0 ] || sudo="sudo"

install() {
    if [ ! -x /usr/sbin/sshd ] || ! command -v rsync >/dev/null 2>&1 || ! command -v ssh >/dev/null 2>&1 \
            || ! python3 -c 'import ensurepip' >/dev/null 2>&1; then
        $sudo apt-get update -qq
        DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq openssh-server openssh-client rsync \
            python3-venv >/dev/null
    fi
    mkdir -p ~/.ssh && chmod 700 ~/.ssh
    # The default key name, so the shipped cluster.yaml (no ssh_private_key) logs in with it.
    if [ ! -f ~/.ssh/id_ed25519 ]; then
        ssh-keygen -q -t ed25519 -N "" -C "rocketray-local-login" -f ~/.ssh/id_ed25519
    fi
    touch ~/.ssh/authorized_keys && chmod 600 ~/.ssh/authorized_keys
    pub="$(cat ~/.ssh/id_ed25519.pub)"
    grep -qxF "$pub" ~/.ssh/authorized_keys || echo "$pub" >> ~/.ssh/authorized_keys
}

port_taken() {
    python3 - "$1" <<'EOF'
import socket, sys
s = socket.socket()
try:
    s.bind(("127.0.0.1", int(sys.argv[1])))
except OSError:
    sys.exit(0)  # taken
sys.exit(1)
EOF
}

start() {
    mkdir -p "$dir" && chmod 700 "$dir"
    pidfile="$dir/sshd.pid"
    if [ -f "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null; then
        echo "port=$(cat "$dir/port") pid=$(cat "$pidfile") pidfile=$pidfile"
        return
    fi
    port=22
    while port_taken "$port"; do
        if [ "$port" = 22 ]; then port=2222; else port=$((port + 1)); fi
        [ "$port" -lt 2300 ] || { echo "no free port for sshd" >&2; exit 1; }
    done
    [ -f "$dir/host_ed25519" ] || ssh-keygen -q -t ed25519 -N "" -f "$dir/host_ed25519"
    cat > "$dir/sshd_config" <<EOF
ListenAddress 127.0.0.1
Port $port
HostKey $dir/host_ed25519
PidFile $pidfile
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
AuthorizedKeysFile .ssh/authorized_keys
UsePAM no
StrictModes no
Subsystem sftp internal-sftp
EOF
    $sudo mkdir -p /run/sshd
    $sudo /usr/sbin/sshd -f "$dir/sshd_config"
    echo "$port" > "$dir/port"
    # ssh to 127.0.0.1 must find this sshd without options (ray up passes none for the port).
    marker="# rocketray-local-sshd"
    touch ~/.ssh/config && chmod 600 ~/.ssh/config
    python3 - "$port" "$marker" <<'EOF'
import os, sys
port, marker = sys.argv[1], sys.argv[2]
path = os.path.expanduser("~/.ssh/config")
lines = open(path).read().split("\n")
kept, skip = [], False
for line in lines:
    if line.strip() == marker + " begin":
        skip = True
    if not skip:
        kept.append(line)
    if line.strip() == marker + " end":
        skip = False
text = "\n".join(kept).rstrip("\n")
if port != "22":
    block = f"{marker} begin\nHost 127.0.0.1\n  Port {port}\n{marker} end\n"
    text = block + ("\n" + text if text else "")  # first match wins in ssh_config: put it first
open(path, "w").write(text + ("\n" if text and not text.endswith("\n") else ""))
EOF
    for _ in $(seq 100); do
        [ -s "$pidfile" ] && break
        sleep 0.1
    done
    [ -s "$pidfile" ] || { echo "sshd did not write $pidfile" >&2; exit 1; }
    # Accept this host key once, non-interactively (ray up uses StrictHostKeyChecking=no anyway).
    ssh -o StrictHostKeyChecking=accept-new -o BatchMode=yes -o ConnectTimeout=10 "$(id -un)@127.0.0.1" true
    echo "port=$port pid=$(cat "$pidfile") pidfile=$pidfile"
}

case "$mode" in
    install) install ;;
    start) install; start ;;
    *) echo "usage: $0 install|start" >&2; exit 2 ;;
esac
