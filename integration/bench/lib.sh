# Shared set-up of the snapshotter benchmarks (snapshotter_lazy.sh, warm.sh, harness_import.sh):
# sourced after `set -euo pipefail` and BIN=... Provides:
#   bench_workdir PREFIX          W=$(mktemp -d /var/tmp/PREFIX.XXXXXX), PIDS=(), cleanup on EXIT
#                                 (kills PIDS, unmounts below W, removes the netns, rm -rf W)
#   bench_need TOOL...            exit 2 unless every tool is on PATH
#   bench_need_bins NAME...       exit 2 unless every workspace binary is in $BIN
#   default_image                 the cached Debian+python3 test image (integration/src/images.rs)
#   shaped_registry RATE LAT_MS [STORAGE]
#                                 docker-registry in its own netns behind a veth pair shaped with
#                                 tc HTB to RATE both ways; LAT_MS > 0 adds delay_proxy.py in
#                                 front of it (netem is not available on this kernel build).
#                                 Sets REG (host:port), NS, VETH (host side); rx = bytes received
#   local_registry [STORAGE]      unshaped docker-registry on 127.0.0.1 (sets REG)
#   start_stack DIR FILL / stop_stack DIR
#                                 a fresh weenv-snapshotter (fill on/off) + containerd with it as
#                                 proxy plugin `weenv` (sets SNAP_PID, CTD_PID); honours SNAP_LOG,
#                                 SNAP_FILL_EXTRA (lines in [fill]), SNAP_EXTRA (tables appended
#                                 to the daemon's config), LOGS_DIR, METRICS_DIR
#   log, now, median, drop_caches, umount_below, rx
# STORAGE: the registry's filesystem root (default $W/reg/data), e.g. the workload's registry.

BENCH_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
PIDS=()
NS=""
VETH=""

log() { echo "[$(date +%T)] $*" >&2; }
now() { date +%s.%N; }
median() { sort -g | awk '{a[NR]=$1} END {print (NR%2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }
drop_caches() { sync; echo 3 > /proc/sys/vm/drop_caches; }
umount_below() { { grep -o " $1[^ ]*" /proc/self/mounts || true; } | sort -r | while read -r m; do umount -l "$m" || true; done; }
rx() { cat "/sys/class/net/$VETH/statistics/rx_bytes"; }

bench_cleanup() {
    set +e
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done
    sleep 1
    umount_below "$W"
    if [ -n "$NS" ]; then
        ip netns pids "$NS" 2>/dev/null | xargs -r kill
        ip netns del "$NS" 2>/dev/null
        ip link del "$VETH" 2>/dev/null
    fi
    rm -rf "$W"
}

bench_workdir() {
    W=$(mktemp -d "/var/tmp/$1.XXXXXX")
    trap bench_cleanup EXIT
}

bench_need() {
    local b
    for b in "$@"; do command -v "$b" >/dev/null || { echo "missing $b" >&2; exit 2; }; done
}

bench_need_bins() {
    local b
    for b in "$@"; do [ -x "$BIN/$b" ] || { echo "missing $BIN/$b (cargo build)" >&2; exit 2; }; done
}

default_image() {
    local layout
    layout=$(ls -d /var/tmp/weenv-test-images/python-v*/oci 2>/dev/null | sort -V | tail -1)
    [ -n "$layout" ] || { echo "no cached python image: run the snapshotter_python test once" >&2; exit 2; }
    echo "$layout:python"
}

registry_config() { # $1 = listen address, $2 = storage root
    mkdir -p "$W/reg"
    cat > "$W/reg/config.yml" <<EOF
version: 0.1
log: {level: error}
storage: {filesystem: {rootdirectory: $2}}
http: {addr: $1}
EOF
}

wait_registry() { # $1 = host:port
    for _ in $(seq 50); do curl -s "http://$1/v2/" >/dev/null 2>&1 && break; sleep 0.2; done
}

shaped_registry() { # $1 = rate (tc syntax), $2 = one-way latency in ms, $3 = storage root
    local rate=$1 lat=$2 storage=${3:-$W/reg/data}
    local host_ip=10.231.$((RANDOM % 200)).1
    local reg_ip=${host_ip%.1}.2 port=5000
    NS=weenvbench$$
    VETH="wv$$"
    ip netns add "$NS"
    ip link add "$VETH" type veth peer name "wr$$"
    ip link set "wr$$" netns "$NS"
    ip addr add "$host_ip/24" dev "$VETH"; ip link set "$VETH" up
    ip netns exec "$NS" ip addr add "$reg_ip/24" dev "wr$$"
    ip netns exec "$NS" ip link set "wr$$" up
    ip netns exec "$NS" ip link set lo up
    # Download direction: registry egress.
    ip netns exec "$NS" tc qdisc add dev "wr$$" root handle 1: htb default 10
    ip netns exec "$NS" tc class add dev "wr$$" parent 1: classid 1:10 htb rate "$rate" ceil "$rate"
    # Upload direction too (requests), same rate.
    tc qdisc add dev "$VETH" root handle 1: htb default 10
    tc class add dev "$VETH" parent 1: classid 1:10 htb rate "$rate" ceil "$rate"
    registry_config "$([ "$lat" = 0 ] && echo "$reg_ip:$port" || echo "127.0.0.1:$port")" "$storage"
    ip netns exec "$NS" docker-registry serve "$W/reg/config.yml" >"$W/reg/log" 2>&1 &
    PIDS+=($!)
    if [ "$lat" != 0 ]; then
        ip netns exec "$NS" python3 "$BENCH_DIR/delay_proxy.py" "$reg_ip:$port" "127.0.0.1:$port" "$lat" >"$W/reg/proxy.log" 2>&1 &
        PIDS+=($!)
    fi
    wait_registry "$reg_ip:$port"
    REG="$reg_ip:$port"
}

local_registry() { # $1 = storage root
    local port
    port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
    REG="127.0.0.1:$port"
    registry_config "$REG" "${1:-$W/reg/data}"
    docker-registry serve "$W/reg/config.yml" >"$W/reg/log" 2>&1 &
    PIDS+=($!)
    wait_registry "$REG"
}

# A weenv daemon of a bench run in dir $1: its config ($1/snap.toml, state under $1/$2, the
# lines $3 in its [fill] section, $SNAP_EXTRA appended, and `[fuse] handover = false` unless
# $SNAP_EXTRA has a [fuse] section: no keeper outlives a run), started in the background (SNAP_PID;
# log $1/snap.log). Its socket is $1/snap.sock (the caller waits for it).
start_snapshotter() {
    local d=$1 fuse=$'[fuse]\nhandover = false'
    [[ "${SNAP_EXTRA:-}" == *'[fuse]'* ]] && fuse=
    mkdir -p "$d"
    cat > "$d/snap.toml" <<EOF
version = 1
root_dir = "$d/$2"
socket = "$d/snap.sock"
log_level = "${SNAP_LOG:-warn}"
[registry]
plain_http = ["$REG"]
hosts_dir = "$d/none"
[cache]
disk_bytes = 8589934592
[fill]
$3
[observability]
listen = "unix:$d/status.sock"
${SNAP_EXTRA:-}
$fuse
EOF
    "$BIN/weenv-snapshotter" --config "$d/snap.toml" >"$d/snap.log" 2>&1 &
    SNAP_PID=$!; PIDS+=($SNAP_PID)
}

start_stack() { # $1 = run dir; $2 = fill true|false
    local d=$1
    start_snapshotter "$d" snap "enabled = $2
${SNAP_FILL_EXTRA:-}"
    cat > "$d/ctd.toml" <<EOF
version = 2
root = "$d/ctd/root"
state = "$d/ctd/state"
disabled_plugins = ["io.containerd.grpc.v1.cri"]
[grpc]
  address = "$d/ctd.sock"
[ttrpc]
  address = "$d/ctd.sock.ttrpc"
[proxy_plugins.weenv]
  type = "snapshot"
  address = "$d/snap.sock"
EOF
    containerd --config "$d/ctd.toml" >"$d/ctd.log" 2>&1 &
    CTD_PID=$!; PIDS+=($CTD_PID)
    for _ in $(seq $((${STACK_WAIT:-30} * 10))); do [ -S "$d/snap.sock" ] && ctr -a "$d/ctd.sock" version >/dev/null 2>&1 && return 0; sleep 0.1; done
    echo "stack did not start in $d" >&2; exit 1
}

stop_stack() { # $1 = run dir
    if [ -n "${LOGS_DIR:-}" ]; then mkdir -p "$LOGS_DIR"; cp "$1/snap.log" "$LOGS_DIR/$(basename "$1").log"; fi
    if [ -n "${METRICS_DIR:-}" ]; then # keep the daemon's metrics of each run for profiling
        mkdir -p "$METRICS_DIR"
        "$BIN/weenv" --config "$1/snap.toml" metrics >"$METRICS_DIR/$(basename "$1").prom" 2>/dev/null || true
    fi
    kill "$CTD_PID" 2>/dev/null; wait "$CTD_PID" 2>/dev/null || true
    umount_below "$1/ctd"
    kill "$SNAP_PID" 2>/dev/null
    # A daemon that does not stop in 30 s (seen: FUSE workers blocked on a lazily unmounted
    # session) is killed, so that the benchmark goes on.
    for _ in $(seq 300); do kill -0 "$SNAP_PID" 2>/dev/null || break; sleep 0.1; done
    kill -0 "$SNAP_PID" 2>/dev/null && { log "daemon $SNAP_PID did not stop in 30 s: SIGKILL"; kill -9 "$SNAP_PID"; }
    wait "$SNAP_PID" 2>/dev/null || true
    umount_below "$1"
    rm -rf "$1"
}

# Waits until the daemon of $1 (a start_stack dir) has no layer left to fill.
wait_fill() {
    local s
    for _ in $(seq 600); do
        s=$("$BIN/weenv" --config "$1/snap.toml" status --json 2>/dev/null || true)
        echo "$s" | grep -q '"fill": "\(running\|pending\)"' || break; sleep 0.5
    done
}
