#!/usr/bin/env bash
# weenv demo, from a fresh Debian 12 machine (as root):
#   1. installs the Debian packages (scripts/deps.sh) and builds the workspace (dev profile);
#   2. starts a private registry on 127.0.0.1 and a private containerd (own root, state and
#      socket under a temp dir; the system containerd is not touched);
#   3. builds two real images offline: busybox-static, and Debian bookworm + python3 from the
#      machine's configured apt mirror (cached under /var/tmp/weenv-test-images);
#   4. pushes them, converts them to weenv images registry-to-registry, verifies them, and runs
#      them with STOCK containerd (overlayfs snapshotter, runc): weenv layers are ordinary
#      tar+zstd layers;
#   5. starts weenv-snapshotter, registers it in containerd, pulls the python image lazily
#      (`weenv pull`), runs python in it, and prints how long it took and what was fetched,
#      next to the stock pull+run;
#   6. records what that python start read (`weenv profile`), attaches it to the image as a
#      start-up profile (`weenv-convert prefetch`: only the manifest changes) and pulls + runs
#      the profiled image on a second, cold weenv-snapshotter (a fresh node): the daemon
#      prefetches the profile while containerd creates the container.
# Everything it starts is stopped and everything it mounts is unmounted on exit.
# Env: WEENV_DEMO_LAZY=0 skips step 5; WEENV_DEMO_SKIP_BUILD=1 uses what target/debug has.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
exec </dev/null

say() { printf '\n\033[1m==> %s\033[0m\n' "$*"; }
now() { date +%s.%N; }
secs() { python3 -c "print(f'{$2 - $1:.2f}')"; }
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

[ "$(id -u)" = 0 ] || { echo "demo.sh: run as root (containerd, runc, FUSE)" >&2; exit 1; }

say "1. packages and build"
# shellcheck source=deps.sh
. scripts/deps.sh
weenv_install_deps
if [ "${WEENV_DEMO_SKIP_BUILD:-0}" != 1 ]; then
  cargo build --workspace --bins --examples
fi
BIN=$ROOT/target/debug

W=$(mktemp -d /tmp/weenv-demo.XXXXXX)
PIDS=()
cleanup() {
  local rc=$? pid
  set +e
  # Shims of our containerd (they outlive it) are found by our socket path in their argv.
  for pid in $(ls /proc | grep -E '^[0-9]+$'); do
    grep -qF "$W/" "/proc/$pid/cmdline" 2>/dev/null && [ "$pid" != $$ ] && PIDS+=("$pid")
  done
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null; done
  sleep 1
  for pid in "${PIDS[@]}"; do kill -9 "$pid" 2>/dev/null; done
  # Unmount in reverse mount order (container overlays before the FUSE mount below them).
  awk -v p="$W" 'index($5, p) == 1 {print $5}' /proc/self/mountinfo | tac | while read -r m; do
    umount "$m" 2>/dev/null || umount -l "$m"
  done
  rm -rf "$W"
  exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM

say "2. private registry and containerd"
REG_PORT=$(free_port); HOST=127.0.0.1:$REG_PORT
mkdir -p "$W/registry"
cat > "$W/registry/config.yml" <<EOF2
version: 0.1
log: {level: warn}
storage: {filesystem: {rootdirectory: $W/registry/data}}
http: {addr: $HOST}
EOF2
docker-registry serve "$W/registry/config.yml" >"$W/registry/log" 2>&1 &
PIDS+=($!)
mkdir -p "$W/ctd"
SNAP_SOCK=$W/snap/snapshotter.sock
cat > "$W/ctd/config.toml" <<EOF2
version = 2
root = "$W/ctd/root"
state = "$W/ctd/state"
disabled_plugins = ["io.containerd.grpc.v1.cri"]
[grpc]
  address = "$W/ctd/containerd.sock"
[ttrpc]
  address = "$W/ctd/containerd.sock.ttrpc"
[proxy_plugins]
  [proxy_plugins.weenv]
    type = "snapshot"
    address = "$SNAP_SOCK"
  [proxy_plugins.weenvcold]
    type = "snapshot"
    address = "$W/snap2/snapshotter.sock"
EOF2
# weenv-snapshotter first, as the systemd unit orders it: containerd dials a proxy plugin
# lazily and backs off for seconds after a failed dial to a socket that is not there yet.
# Two daemons: "weenv" (step 5) and "weenvcold", a second node's cold cache (step 6).
start_snapshotter() { # $1 = dir, $2 = observability port
  mkdir -p "$1"
  cat > "$1/config.toml" <<EOF2
version = 1
root_dir = "$1/root"
socket = "$1/snapshotter.sock"
log_level = "info"
[registry]
plain_http = ["$HOST"]
[observability]
listen = "127.0.0.1:$2"
# Off for the demo, so the numbers below are what the container itself needed.
[fill]
enabled = false
EOF2
  "$BIN/weenv-snapshotter" --config "$1/config.toml" >"$1/log" 2>&1 &
  PIDS+=($!)
  for _ in $(seq 100); do [ -S "$1/snapshotter.sock" ] && break; sleep 0.2; done
  [ -S "$1/snapshotter.sock" ] || { echo "weenv-snapshotter did not start:"; cat "$1/log"; exit 1; }
}
OBS_PORT=$(free_port); OBS_PORT2=$(free_port)
start_snapshotter "$W/snap" "$OBS_PORT"
start_snapshotter "$W/snap2" "$OBS_PORT2"
PATH="$BIN:$PATH" containerd --config "$W/ctd/config.toml" >"$W/ctd/log" 2>&1 &
PIDS+=($!)
CTR=(ctr -a "$W/ctd/containerd.sock")
for _ in $(seq 150); do "${CTR[@]}" version >/dev/null 2>&1 && curl -s "http://$HOST/v2/" >/dev/null 2>&1 && break; sleep 0.2; done
"${CTR[@]}" version >/dev/null || { cat "$W/ctd/log"; exit 1; }
echo "registry http://$HOST, containerd $W/ctd/containerd.sock"

say "3. test images, built offline"
t0=$(now)
BUSYBOX=$(cargo run -q -p weenv-integration --example test_image -- busybox)
PYTHON=$(cargo run -q -p weenv-integration --example test_image -- python)
echo "busybox: $BUSYBOX"; echo "python:  $PYTHON  ($(secs "$t0" "$(now)")s incl. cache)"

say "4. push, convert, verify, run with stock containerd"
skopeo copy --quiet --dest-tls-verify=false "$BUSYBOX" "docker://$HOST/busybox:1"
skopeo copy --quiet --dest-tls-verify=false "$PYTHON" "docker://$HOST/python:3"
"$BIN/weenv-convert" --plain-http "$HOST" image "$HOST/busybox:1" "$HOST/busybox:1-weenv"
"$BIN/weenv-convert" --plain-http "$HOST" image "$HOST/python:3" "$HOST/python:3-weenv" | tee "$W/convert-python.txt"
"$BIN/weenv-convert" --plain-http "$HOST" verify "$HOST/python:3-weenv"
"$BIN/weenv-convert" --plain-http "$HOST" inspect "$HOST/python:3-weenv"
"${CTR[@]}" -n stock images pull --plain-http "$HOST/busybox:1-weenv" >/dev/null
"${CTR[@]}" -n stock run --rm "$HOST/busybox:1-weenv" demo-bb /bin/sh -c 'echo "busybox says: $(cat /etc/weenv)"'
t0=$(now)
"${CTR[@]}" -n stock images pull --plain-http "$HOST/python:3-weenv" >/dev/null
t1=$(now)
"${CTR[@]}" -n stock run --rm "$HOST/python:3-weenv" demo-py python3 -c 'import sys, json, email, http.client; print("python", sys.version.split()[0], "runs on stock containerd")'
t2=$(now)
STOCK_PULL=$(secs "$t0" "$t1"); STOCK_RUN=$(secs "$t1" "$t2")
PY_SIZE=$(python3 -c "import json,subprocess,sys; print(sum(l['size'] for l in json.loads(subprocess.check_output(['$BIN/weenv-convert','--plain-http','$HOST','--json','inspect','$HOST/python:3-weenv']))))")

if [ "${WEENV_DEMO_LAZY:-1}" = 0 ]; then
  say "done (lazy part skipped: WEENV_DEMO_LAZY=0)"
  exit 0
fi

say "5. lazy pull and run with weenv-snapshotter"
WEENV=("$BIN/weenv" --config "$W/snap/config.toml")
t0=$(now)
"${WEENV[@]}" pull --plain-http -a "$W/ctd/containerd.sock" -n lazy "$HOST/python:3-weenv"
t1=$(now)
"${CTR[@]}" -n lazy run --rm --snapshotter weenv "$HOST/python:3-weenv" demo-lazy python3 -c 'import sys, json, email, http.client; print("python", sys.version.split()[0], "runs lazily on weenv")'
t2=$(now)
LAZY_PULL=$(secs "$t0" "$t1"); LAZY_RUN=$(secs "$t1" "$t2")
"${WEENV[@]}" status | tee "$W/status.txt"
metric() { curl -s "http://127.0.0.1:${2:-$OBS_PORT}/metrics" | awk -v m="$1" '$1 == m || index($1, m "{") == 1 {s += $2} END {print s + 0}'; }
FETCHED=$(metric weenv_fetch_bytes_on_demand_total)
REQUESTS=$(metric weenv_fetch_range_requests_total)

say "6. start-up profile: record, attach, pull + run on a cold node"
"${WEENV[@]}" profile > "$W/startup.profile"
echo "python's start read $(wc -l < "$W/startup.profile") files, e.g.:"; head -3 "$W/startup.profile"
"$BIN/weenv-convert" --plain-http "$HOST" prefetch "$HOST/python:3-weenv" \
  --profile "$W/startup.profile" --to "$HOST/python:3-weenv-profiled"
WEENV2=("$BIN/weenv" --config "$W/snap2/config.toml")
t0=$(now)
"${WEENV2[@]}" pull --plain-http --snapshotter weenvcold -a "$W/ctd/containerd.sock" -n cold "$HOST/python:3-weenv-profiled"
t1=$(now)
"${CTR[@]}" -n cold run --rm --snapshotter weenvcold "$HOST/python:3-weenv-profiled" demo-prof python3 -c 'import sys, json, email, http.client; print("python", sys.version.split()[0], "runs lazily on weenv, profile prefetched")'
t2=$(now)
PROF_PULL=$(secs "$t0" "$t1"); PROF_RUN=$(secs "$t1" "$t2")
"${WEENV2[@]}" status
PREFETCHED=$(metric weenv_fetch_bytes_prefetch_total "$OBS_PORT2")
FETCHED2=$(metric weenv_fetch_bytes_on_demand_total "$OBS_PORT2")

say "summary: python image ($(python3 -c "print(f'{$PY_SIZE/1e6:.1f}')") MB of weenv layers)"
printf '%-34s %10s %10s %10s\n' "" "pull (s)" "run (s)" "total (s)"
printf '%-34s %10s %10s %10s\n' "stock containerd (overlayfs)" "$STOCK_PULL" "$STOCK_RUN" "$(python3 -c "print(f'{$STOCK_PULL + $STOCK_RUN:.2f}')")"
printf '%-34s %10s %10s %10s\n' "weenv-snapshotter (lazy)" "$LAZY_PULL" "$LAZY_RUN" "$(python3 -c "print(f'{$LAZY_PULL + $LAZY_RUN:.2f}')")"
printf '%-34s %10s %10s %10s\n' "weenv, image with start-up profile" "$PROF_PULL" "$PROF_RUN" "$(python3 -c "print(f'{$PROF_PULL + $PROF_RUN:.2f}')")"
echo "lazy: fetched $(python3 -c "print(f'{$FETCHED/1e6:.1f}')") MB on demand in $REQUESTS range requests (stock pulled all $(python3 -c "print(f'{$PY_SIZE/1e6:.1f}')") MB)"
echo "with profile: prefetched $(python3 -c "print(f'{$PREFETCHED/1e6:.1f}')") MB at mount, then $(python3 -c "print(f'{$FETCHED2/1e6:.1f}')") MB on demand"
echo "(loopback registry, no shaping: the start-up gap grows with link latency and shrinks with bandwidth; integration/bench/snapshotter_lazy.sh measures at 200 Mbit)"
