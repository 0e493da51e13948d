#!/usr/bin/env bash
# Make a Docker-API container engine available for the engine tests: Podman's API service on a unix socket.
# Idempotent: installs only what is missing, imports the busybox image only if absent, starts the service only if
# the socket does not answer. On success the last line on stdout is `export ONEPLUS_DOCKER_URL=...` (so a caller may
# `eval "$(.ci/container-engine.sh)"`), and the same line is written to $ONEPLUS_ENGINE_ENV_FILE.
# On failure it exits non-zero with a message on stderr; the caller decides whether the engine tests are required.
set -euo pipefail

SOCK="${ONEPLUS_PODMAN_SOCKET:-/run/oneplus-podman.sock}"
URL="unix://${SOCK}"
ENV_FILE="${ONEPLUS_ENGINE_ENV_FILE:-/tmp/oneplus-engine.env}"
LOG_FILE="${ONEPLUS_PODMAN_LOG:-/tmp/oneplus-podman.log}"
IMAGE="localhost/busybox:latest"

say() { echo "container-engine: $*" >&2; }
fail() { say "ERROR: $*"; exit 1; }

need_install=()
command -v podman >/dev/null 2>&1 || need_install+=(podman)
command -v runc >/dev/null 2>&1 || need_install+=(runc)
[ -x /bin/busybox ] || need_install+=(busybox-static)

if [ "${#need_install[@]}" -gt 0 ]; then
    [ "$(id -u)" = 0 ] || fail "missing ${need_install[*]} and not root: cannot apt-get install them"
    command -v apt-get >/dev/null 2>&1 || fail "missing ${need_install[*]} and apt-get is not available"
    say "installing ${need_install[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt_log="${ONEPLUS_APT_LOG:-/tmp/oneplus-apt.log}"
    apt-get update >"$apt_log" 2>&1 || { tail -5 "$apt_log" >&2; fail "apt-get update failed (no package mirror reachable?); log: $apt_log"; }
    apt-get install -y "${need_install[@]}" >>"$apt_log" 2>&1 || { tail -5 "$apt_log" >&2; fail "apt-get install ${need_install[*]} failed; log: $apt_log"; }
fi

# No systemd, hybrid cgroups, and no permission to set RLIMIT_NOFILE in this kind of sandbox.
conf_dir=/etc/containers/containers.conf.d
if [ -w /etc/containers ] || [ "$(id -u)" = 0 ]; then
    mkdir -p "$conf_dir"
    cat > "$conf_dir/oneplus.conf" <<'CONF'
[containers]
default_ulimits = []

[engine]
cgroup_manager = "cgroupfs"
events_logger = "file"
runtime = "runc"
CONF
else
    say "cannot write $conf_dir; using the engine's own configuration"
fi

# An image that needs no registry: the static busybox as a root filesystem.
if ! podman image exists "$IMAGE" >/dev/null 2>&1; then
    say "importing $IMAGE from /bin/busybox"
    rootfs=$(mktemp -d)
    trap 'rm -rf "$rootfs"' EXIT
    mkdir -p "$rootfs/bin" "$rootfs/tmp"
    cp /bin/busybox "$rootfs/bin/"
    for c in sh sleep echo cat env kill touch ls stat date true false test; do ln -sf busybox "$rootfs/bin/$c"; done
    tar -C "$rootfs" -c . | podman import - "$IMAGE" >&2 || fail "podman import of $IMAGE failed"
fi

answers() { curl -sf --max-time 2 --unix-socket "$SOCK" http://d/_ping >/dev/null 2>&1; }

# A service whose working directory was deleted (started from a clone since removed) still answers pings, but
# every container it starts fails ("conmon: Failed to get working directory", "write child: broken pipe").
for pid in $(pgrep -f "podman system service --time=0 $URL" || true); do
    if [ "$(readlink "/proc/$pid/cwd" 2>/dev/null)" != "/" ]; then
        say "restarting podman system service $pid (its working directory is not /)"
        kill "$pid" 2>/dev/null || true
        for _ in $(seq 1 20); do kill -0 "$pid" 2>/dev/null || break; sleep 0.25; done
    fi
done

if ! answers; then
    say "starting podman system service on $URL (log: $LOG_FILE)"
    rm -f "$SOCK"
    # From /: the service and every conmon it starts keep this working directory.
    (cd / && exec setsid nohup podman system service --time=0 "$URL" >"$LOG_FILE" 2>&1 < /dev/null) &
    for _ in $(seq 1 60); do
        answers && break
        sleep 0.5
    done
    answers || fail "podman system service did not answer on $SOCK within 30 s; see $LOG_FILE"
fi

line="export ONEPLUS_DOCKER_URL=$URL"
echo "$line" > "$ENV_FILE"
say "engine ready at $URL (also written to $ENV_FILE)"
echo "$line"
