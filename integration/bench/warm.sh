#!/usr/bin/env bash
# Warm node benchmark (issue 15): the image is already on the node (pulled, background fill
# done), page cache dropped before each measurement. One containerd with three snapshotters,
# measured in the same run, alternating per round:
#   overlayfs    containerd's stock snapshotter, full pull (the reference)
#   weenv-fuse   a weenv daemon with `fill.native = false`: complete layers through FUSE
#                (passthrough for files >= 256 KiB, FUSE reads for the rest)
#   weenv-native a weenv daemon with `fill.native = true` (default): complete layers mounted
#                from their native trees
# The order of the three rotates each round. Workloads (inside a fresh container each): read every file (`find / -xdev -type f | xargs
# cat`), `find / -xdev | wc -l`, and a python start (`ctr run --rm ... python3 -c 'import
# json'`, timed on the host: container creation + start + exit). Reported: medians of $RUNS
# rounds and the speed relative to overlayfs (overlayfs time / weenv time; 1.0 = as fast).
# The registry is local and unshaped (nothing is fetched once the images are warm).
#
# Needs root, containerd, ctr, runc, docker-registry, skopeo, fuse3 and the workspace binaries
# (release for the published numbers):
#   cargo build --release -p weenv-snapshotter -p weenv-converter
#   WEENV_BIN=target/release integration/bench/warm.sh [OCI_LAYOUT:TAG]
# Default image: the cached Debian+python3 test image (integration/src/images.rs).
set -euo pipefail

RUNS=${RUNS:-5}
CMD=${CMD:-"import json, sys; print(json.dumps({'ok': 1}))"}
BIN=${WEENV_BIN:-$(cd "$(dirname "$0")/../.." && pwd)/target/debug}
. "$(dirname "$0")/lib.sh"
IMG=${1:-$(default_image)}
bench_need containerd ctr runc docker-registry skopeo
bench_need_bins weenv-snapshotter weenv weenv-convert
bench_workdir weenv-warm

# ---- registry ---------------------------------------------------------------------------
local_registry
skopeo copy -q --dest-tls-verify=false "oci:$IMG" "docker://$REG/bench:gz"
"$BIN/weenv-convert" --plain-http "$REG" image "$REG/bench:gz" "$REG/bench:weenv" >"$W/convert.log" 2>&1
log "registry $REG; converted: $(tail -1 "$W/convert.log")"

# ---- two weenv daemons (native off / on) and one containerd ------------------------------
start_daemon() { # $1 = name, $2 = native true|false
    local d="$W/$1"
    start_snapshotter "$d" root "quiet_ms = 0
native = $2"
    for _ in $(seq 100); do [ -S "$d/snap.sock" ] && return 0; sleep 0.1; done
    echo "daemon $1 did not start" >&2; exit 1
}
start_daemon fuse false
start_daemon native true
cat > "$W/ctd.toml" <<EOF
version = 2
root = "$W/ctd/root"
state = "$W/ctd/state"
disabled_plugins = ["io.containerd.grpc.v1.cri"]
[grpc]
  address = "$W/ctd.sock"
[ttrpc]
  address = "$W/ctd.sock.ttrpc"
[proxy_plugins.weenvfuse]
  type = "snapshot"
  address = "$W/fuse/snap.sock"
[proxy_plugins.weenvnative]
  type = "snapshot"
  address = "$W/native/snap.sock"
EOF
containerd --config "$W/ctd.toml" >"$W/ctd.log" 2>&1 &
PIDS+=($!)
for _ in $(seq 100); do ctr -a "$W/ctd.sock" version >/dev/null 2>&1 && break; sleep 0.1; done
C="ctr -a $W/ctd.sock"

$C -n ovl images pull -q --plain-http "$REG/bench:gz" >/dev/null
for k in fuse native; do
    "$BIN/weenv" --config "$W/$k/snap.toml" pull -a "$W/ctd.sock" -n "$k" --snapshotter "weenv$k" \
        --plain-http "$REG/bench:weenv" >/dev/null
done
# Warm: every layer filled and checked (and, for the native daemon, switched).
for k in fuse native; do
    for _ in $(seq 1200); do
        s=$("$BIN/weenv" --config "$W/$k/snap.toml" status --json 2>/dev/null || true)
        if ! echo "$s" | grep -q '"fill": *"\(running\|pending\)"'; then
            [ "$k" = fuse ] && break
            python3 -c 'import json,sys; l=json.load(sys.stdin)["layers"]; sys.exit(0 if l and all(x.get("native") for x in l) else 1)' <<<"$s" && break
        fi
        sleep 0.5
    done
    log "$k: $("$BIN/weenv" --config "$W/$k/snap.toml" status | grep '^layers')"
done

ALL_PY='import subprocess, time; t = time.time(); subprocess.run("find / -xdev -type f -print0 | xargs -0 cat > /dev/null", shell=True); print("%.3f" % (time.time() - t))'
FIND_PY='import subprocess, time; t = time.time(); subprocess.run("find / -xdev | wc -l > /dev/null", shell=True); print("%.3f" % (time.time() - t))'

run_in() { # $1 = kind, $2 = id, rest = command
    local k=$1 id=$2; shift 2
    case $k in
        ovl) $C -n ovl run --rm "$REG/bench:gz" "$id" "$@" ;;
        *) $C -n "$k" run --rm --snapshotter "weenv$k" "$REG/bench:weenv" "$id" "$@" ;;
    esac
}

declare -A R
KINDS=(ovl fuse native)
for i in $(seq "$RUNS"); do
    # Rotated each round, so no kind always runs first (or right after another's).
    for j in 0 1 2; do
        k=${KINDS[$(((i + j) % 3))]}
        drop_caches; R[${k}_all]+="$(run_in $k "a$i" python3 -c "$ALL_PY") "
        drop_caches; R[${k}_find]+="$(run_in $k "f$i" python3 -c "$FIND_PY") "
        drop_caches; t0=$(now); run_in $k "p$i" python3 -c "$CMD" >/dev/null; t1=$(now)
        R[${k}_py]+="$(echo "$t1 - $t0" | bc) "
    done
    log "round $i done"
done
# Proof that the native daemon's containers mounted native trees, the other's FUSE dirs.
$C -n native run -d --snapshotter weenvnative "$REG/bench:weenv" probe-n sleep 30 >/dev/null
$C -n fuse run -d --snapshotter weenvfuse "$REG/bench:weenv" probe-f sleep 30 >/dev/null
nat=$(grep "/probe-n/rootfs " /proc/mounts | grep -o 'lowerdir=[^,]*' | tr ':' '\n' | grep -c '/cache/native/' || true)
fus=$(grep "/probe-f/rootfs " /proc/mounts | grep -o 'lowerdir=[^,]*' | tr ':' '\n' | grep -cE "$W/fuse/root/mnt(-plain)?/" || true)
log "lowerdirs: weenv-native container: $nat native trees; weenv-fuse container: $fus FUSE dirs"
for c in n f; do $C -n "$([ $c = n ] && echo native || echo fuse)" task kill -s KILL "probe-$c" >/dev/null 2>&1 || true; done
sleep 1
for c in n f; do ns=$([ $c = n ] && echo native || echo fuse); $C -n $ns task rm -f "probe-$c" >/dev/null 2>&1 || true; $C -n $ns c rm "probe-$c" >/dev/null 2>&1 || true; done
errs=$(cat "$W"/fuse/snap.log "$W"/native/snap.log | grep -c "Failed to send FUSE reply" || true)

 # HOLD=seconds: keep the stacks up for manual inspection before printing and cleaning up.
if [ -n "${HOLD:-}" ]; then log "holding $W for $HOLD s"; sleep "$HOLD" || true; fi

m() { echo "${R[$1]}" | tr ' ' '\n' | grep -v '^$' | median; }
ratio() { echo "scale=2; $1 / $2" | bc; }
printf '\n%-34s %10s %10s %10s %10s %10s\n' "warm, median of $RUNS (s)" overlayfs weenv-fuse ratio weenv-nat ratio
for w in all:"read every file" find:"find / -xdev | wc -l" py:"python3 start (ctr run)"; do
    key=${w%%:*} name=${w#*:}
    o=$(m ovl_$key) f=$(m fuse_$key) n=$(m native_$key)
    printf '%-34s %10s %10s %10s %10s %10s\n' "$name" "$o" "$f" "$(ratio "$o" "$f")" "$n" "$(ratio "$o" "$n")"
done
for k in ovl fuse native; do echo "python3 start samples, $k (s, round order): ${R[${k}_py]}"; done
echo "(ratio = overlayfs time / weenv time: 1.00 = as fast as overlayfs; 'Failed to send FUSE reply' lines in the daemon logs: $errs)"
