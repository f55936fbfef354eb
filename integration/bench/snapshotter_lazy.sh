#!/usr/bin/env bash
# weenv-snapshotter benchmark: cold "pull + first command" with containerd's stock overlayfs
# snapshotter (full pull) vs weenv (lazy), warm read throughput, `find` and the read-everything
# worst case. The registry runs in its own network namespace behind a veth pair shaped with tc
# HTB to $RATE in both directions. netem is not available on this kernel build, so the
# one-way latency $LATENCY_MS (default 5 ms) is added by delay_proxy.py, a TCP proxy in the
# namespace in front of the registry that holds every chunk for that long in each direction
# (LATENCY_MS=0: no proxy).
#
# weenv runs twice on the start-up workload: with the image's start-up profile (recorded once
# with `weenv profile` on a cold node, attached with `weenv-convert prefetch`: the daemon
# prefetches those frames as the layers mount, while containerd creates the container) and
# without one (on-demand reads only).
#
# Every run uses a fresh containerd root and a fresh snapshotter root (cold caches; containerd
# shares blobs across namespaces, so a new namespace would not be cold). Medians of $RUNS runs.
#
# Needs root, containerd, ctr, runc, docker-registry, skopeo, iproute2 (ip, tc), fuse3 and the
# workspace binaries: cargo build -p weenv-snapshotter -p weenv-cli -p weenv-converter --bins
# METRICS_DIR=dir keeps each run's daemon /metrics (dir/run-<kind>-<i>.prom) for profiling;
# SNAP_FILL_EXTRA='check_headers = false' adds lines to the daemon's [fill] section (e.g. to
# measure what the lazy header checks cost: run once with it, once without).
# LOGS_DIR=dir keeps the daemon logs (SNAP_LOG=filter sets their level, e.g. weenv_snapshotter=debug).
# BEFORE_FLAGS='weenv-convert image flags' (default: the framing of before issue 15, 1 MiB shared
# frames for every small-file region) also converts the image with those flags and measures its
# start-up (no profile, fill on and off) in the same runs, for a before/after comparison of the
# converter's framing; BEFORE_FLAGS= (empty) skips it. CONVERT_FLAGS adds flags to the main
# conversion (default: none, the converter's defaults). STARTUP_ONLY=1 skips the warm-read,
# find and read-everything parts.
# Usage: integration/bench/snapshotter_lazy.sh [OCI_LAYOUT:TAG]   (default: the cached
#        Debian+python3 test image from integration/src/images.rs)
set -euo pipefail

RUNS=${RUNS:-5}
RATE=${RATE:-200mbit}
LATENCY_MS=${LATENCY_MS:-5}
CMD=${CMD:-"import json, sys; print(json.dumps({'ok': 1}))"}
CONVERT_FLAGS=${CONVERT_FLAGS:-}
BEFORE_FLAGS=${BEFORE_FLAGS-"--frame-size 1048576 --small-file-threshold 262144 --chunk-size 1048576"}
BIN=${WEENV_BIN:-$(cd "$(dirname "$0")/../.." && pwd)/target/debug}
. "$(dirname "$0")/lib.sh"
IMG=${1:-$(default_image)}
bench_need containerd ctr runc docker-registry skopeo ip tc
bench_need_bins weenv-snapshotter weenv weenv-convert
bench_workdir weenv-bench

# ---- registry in a shaped netns ---------------------------------------------------------
shaped_registry "$RATE" "$LATENCY_MS"
log "registry at $REG (netns $NS, $RATE, one-way latency ${LATENCY_MS} ms)"
skopeo copy -q --dest-tls-verify=false "oci:$IMG" "docker://$REG/bench:gz"
# shellcheck disable=SC2086 # flags are words
"$BIN/weenv-convert" --plain-http "$REG" image $CONVERT_FLAGS "$REG/bench:gz" "$REG/bench:weenv" >"$W/convert.log" 2>&1
log "converted: $(tail -1 "$W/convert.log")"
if [ -n "$BEFORE_FLAGS" ]; then
    # shellcheck disable=SC2086 # flags are words
    "$BIN/weenv-convert" --plain-http "$REG" image $BEFORE_FLAGS "$REG/bench:gz" "$REG/bench:weenv-before" >"$W/convert-before.log" 2>&1
    log "converted with $BEFORE_FLAGS: $(tail -1 "$W/convert-before.log")"
fi

# ---- fresh containerd + snapshotter per run (lib.sh: start_stack, stop_stack) --------------

# Timing helper run inside containers (python3 is in the image).
READ_PY='
import os, sys, time, random
mode = sys.argv[1]
files = []
for d, ds, fs in os.walk("/usr"):
    for f in fs:
        p = os.path.join(d, f)
        if os.path.isfile(p) and not os.path.islink(p): files.append((os.path.getsize(p), p))
files.sort(reverse=True)
big = [p for s, p in files[:20]]
t = time.time(); n = 0
if mode == "seq":
    for p in big:
        with open(p, "rb") as f:
            while True:
                b = f.read(1 << 20)
                if not b: break
                n += len(b)
else:
    random.seed(1)
    for p in big:
        fd = os.open(p, os.O_RDONLY); size = os.fstat(fd).st_size
        for _ in range(2000):
            n += len(os.pread(fd, 4096, random.randrange(0, max(1, size - 4096))))
        os.close(fd)
dt = time.time() - t
print("%.1f" % (n / dt / 1e6))
'
FIND_PY='import subprocess, time; t = time.time(); subprocess.run("find / -xdev | wc -l > /dev/null", shell=True); print("%.3f" % (time.time() - t))'

# ---- start-up profile: record what $CMD reads (cold node, fill off), attach it to the
# manifest as bench:weenv-profiled (only the manifest changes; see weenv-convert prefetch) ----
d="$W/run-record"; start_stack "$d" false; C="ctr -a $d/ctd.sock"
"$BIN/weenv" --config "$d/snap.toml" pull -a "$d/ctd.sock" -n default --plain-http "$REG/bench:weenv" >/dev/null
"$BIN/weenv" --config "$d/snap.toml" profile --reset 2>/dev/null
$C run --rm --snapshotter weenv "$REG/bench:weenv" rec-$$ python3 -c "$CMD" >/dev/null
"$BIN/weenv" --config "$d/snap.toml" profile > "$W/startup.profile"
stop_stack "$d"
"$BIN/weenv-convert" --plain-http "$REG" prefetch "$REG/bench:weenv" --profile "$W/startup.profile" \
    --to "$REG/bench:weenv-profiled" >"$W/prefetch.log" 2>&1
log "profile: $(wc -l < "$W/startup.profile") files; $(tail -1 "$W/prefetch.log")"

# weenv lazy pull + first command of image tag $2 with fill $3; records $1_start/$1_bytes
# (and $1_pull/$1_run).
weenv_start() {
    local key=$1 tag=$2 fill=$3 d b0 t0 tp t1 b1
    d="$W/run-$key-$i"; start_stack "$d" "$fill"
    b0=$(rx); t0=$(now)
    "$BIN/weenv" --config "$d/snap.toml" pull -a "$d/ctd.sock" -n default --plain-http "$REG/bench:$tag" >/dev/null
    tp=$(now)
    ctr -a "$d/ctd.sock" run --rm --snapshotter weenv "$REG/bench:$tag" c1-$$ python3 -c "$CMD" >/dev/null
    t1=$(now); b1=$(rx)
    R[${key}_start]+="$(echo "$t1 - $t0" | bc) "; R[${key}_bytes]+="$((b1 - b0)) "
    R[${key}_pull]+="$(echo "$tp - $t0" | bc) "; R[${key}_run]+="$(echo "$t1 - $tp" | bc) "
    stop_stack "$d"
}

declare -A R
for i in $(seq "$RUNS"); do
    # (a) overlayfs: full pull + first command
    d="$W/run-ovl-$i"; start_stack "$d" true; C="ctr -a $d/ctd.sock"
    b0=$(rx); t0=$(now)
    $C images pull -q --plain-http "$REG/bench:gz" >/dev/null
    tp=$(now)
    $C run --rm "$REG/bench:gz" c1-$$ python3 -c "$CMD" >/dev/null
    t1=$(now); b1=$(rx)
    R[ovl_start]+="$(echo "$t1 - $t0" | bc) "; R[ovl_bytes]+="$((b1 - b0)) "
    R[ovl_pull]+="$(echo "$tp - $t0" | bc) "; R[ovl_run]+="$(echo "$t1 - $tp" | bc) "
    # warm reads + find on native overlayfs
    drop_caches; R[ovl_seq]+="$($C run --rm "$REG/bench:gz" c2-$$ python3 -c "$READ_PY" seq) "
    drop_caches; R[ovl_rand]+="$($C run --rm "$REG/bench:gz" c3-$$ python3 -c "$READ_PY" rand) "
    drop_caches; R[ovl_find]+="$($C run --rm "$REG/bench:gz" c4-$$ python3 -c "$FIND_PY") "
    stop_stack "$d"

    # (b) weenv, image with its start-up profile: lazy pull + first command
    d="$W/run-weenvprof-$i"; start_stack "$d" true; C="ctr -a $d/ctd.sock"
    b0=$(rx); t0=$(now)
    "$BIN/weenv" --config "$d/snap.toml" pull -a "$d/ctd.sock" -n default --plain-http "$REG/bench:weenv-profiled" >/dev/null
    tp=$(now)
    $C run --rm --snapshotter weenv "$REG/bench:weenv-profiled" c1-$$ python3 -c "$CMD" >/dev/null
    t1=$(now); b1=$(rx)
    R[prof_start]+="$(echo "$t1 - $t0" | bc) "; R[prof_bytes]+="$((b1 - b0)) "
    R[prof_pull]+="$(echo "$tp - $t0" | bc) "; R[prof_run]+="$(echo "$t1 - $tp" | bc) "
    stop_stack "$d"

    # (b2) weenv, no profile: lazy pull + first command
    d="$W/run-weenv-$i"; start_stack "$d" true; C="ctr -a $d/ctd.sock"
    b0=$(rx); t0=$(now)
    "$BIN/weenv" --config "$d/snap.toml" pull -a "$d/ctd.sock" -n default --plain-http "$REG/bench:weenv" >/dev/null
    $C run --rm --snapshotter weenv "$REG/bench:weenv" c1-$$ python3 -c "$CMD" >/dev/null
    t1=$(now); b1=$(rx)
    R[weenv_start]+="$(echo "$t1 - $t0" | bc) "; R[weenv_bytes]+="$((b1 - b0)) "
    if [ "${STARTUP_ONLY:-0}" = 1 ]; then
        stop_stack "$d"
    else
    # wait for the background fill, then warm reads (passthrough) + find
    wait_fill "$d"
    drop_caches; R[weenv_seq]+="$($C run --rm --snapshotter weenv "$REG/bench:weenv" c2-$$ python3 -c "$READ_PY" seq) "
    drop_caches; R[weenv_rand]+="$($C run --rm --snapshotter weenv "$REG/bench:weenv" c3-$$ python3 -c "$READ_PY" rand) "
    drop_caches; R[weenv_find]+="$($C run --rm --snapshotter weenv "$REG/bench:weenv" c4-$$ python3 -c "$FIND_PY") "
    stop_stack "$d"
    fi

    # (b') weenv with background fill off: the start-up workload alone on the link
    d="$W/run-weenvnofill-$i"; start_stack "$d" false; C="ctr -a $d/ctd.sock"
    b0=$(rx); t0=$(now)
    "$BIN/weenv" --config "$d/snap.toml" pull -a "$d/ctd.sock" -n default --plain-http "$REG/bench:weenv" >/dev/null
    tp=$(now)
    $C run --rm --snapshotter weenv "$REG/bench:weenv" c1-$$ python3 -c "$CMD" >/dev/null
    t1=$(now); b1=$(rx)
    R[nofill_start]+="$(echo "$t1 - $t0" | bc) "; R[nofill_bytes]+="$((b1 - b0)) "
    R[nofill_pull]+="$(echo "$tp - $t0" | bc) "; R[nofill_run]+="$(echo "$t1 - $tp" | bc) "
    stop_stack "$d"

    # (b'') the image converted with $BEFORE_FLAGS: no profile, fill on and off
    if [ -n "$BEFORE_FLAGS" ]; then
        weenv_start before weenv-before true
        weenv_start beforenofill weenv-before false
    fi

    if [ "${STARTUP_ONLY:-0}" = 1 ]; then log "run $i done"; continue; fi
    # (c) worst case, cold: pull + read every file
    ALL='find / -xdev -type f -print0 | xargs -0 cat > /dev/null'
    d="$W/run-ovlall-$i"; start_stack "$d" true; C="ctr -a $d/ctd.sock"
    t0=$(now); $C images pull -q --plain-http "$REG/bench:gz" >/dev/null
    $C run --rm "$REG/bench:gz" c5-$$ sh -c "$ALL"; t1=$(now)
    R[ovl_all]+="$(echo "$t1 - $t0" | bc) "; stop_stack "$d"
    d="$W/run-weenvall-$i"; start_stack "$d" true; C="ctr -a $d/ctd.sock"
    t0=$(now)
    "$BIN/weenv" --config "$d/snap.toml" pull -a "$d/ctd.sock" -n default --plain-http "$REG/bench:weenv" >/dev/null
    $C run --rm --snapshotter weenv "$REG/bench:weenv" c5-$$ sh -c "$ALL"; t1=$(now)
    R[weenv_all]+="$(echo "$t1 - $t0" | bc) "; stop_stack "$d"
    log "run $i done"
done

m() { echo "${R[$1]}" | tr ' ' '\n' | grep -v '^$' | median; }
printf '\n%-44s %12s %12s %8s\n' "metric (median of $RUNS, $RATE, +${LATENCY_MS} ms)" overlayfs weenv ratio
row() { printf '%-44s %12s %12s %8s\n' "$1" "$2" "$3" "$(echo "scale=2; $4" | bc)"; }
row "pull + '$CMD' cold, start-up profile (s)" "$(m ovl_start)" "$(m prof_start)" "$(m ovl_start) / $(m prof_start)"
row "  bytes received for that (MB)" "$(echo "scale=1; $(m ovl_bytes)/1000000" | bc)" "$(echo "scale=1; $(m prof_bytes)/1000000" | bc)" "$(m prof_bytes) / $(m ovl_bytes)"
row "  of which pull (s)" "$(m ovl_pull)" "$(m prof_pull)" "$(m ovl_pull) / $(m prof_pull)"
row "  of which first command (s)" "$(m ovl_run)" "$(m prof_run)" "$(m ovl_run) / $(m prof_run)"
row "same, image without a profile (s)" "$(m ovl_start)" "$(m weenv_start)" "$(m ovl_start) / $(m weenv_start)"
row "  bytes received for that (MB)" "$(echo "scale=1; $(m ovl_bytes)/1000000" | bc)" "$(echo "scale=1; $(m weenv_bytes)/1000000" | bc)" "$(m weenv_bytes) / $(m ovl_bytes)"
row "  same, weenv with background fill off (s)" "$(m ovl_start)" "$(m nofill_start)" "$(m ovl_start) / $(m nofill_start)"
row "  bytes received, fill off (MB)" "$(echo "scale=1; $(m ovl_bytes)/1000000" | bc)" "$(echo "scale=1; $(m nofill_bytes)/1000000" | bc)" "$(m nofill_bytes) / $(m ovl_bytes)"
row "  of which pull (s)" "$(m ovl_pull)" "$(m nofill_pull)" "$(m ovl_pull) / $(m nofill_pull)"
row "  of which first command (s)" "$(m ovl_run)" "$(m nofill_run)" "$(m ovl_run) / $(m nofill_run)"
if [ -n "$BEFORE_FLAGS" ]; then
    mb() { echo "scale=2; $(m "$1")/1000000" | bc; }
    printf '\n%-44s %12s %12s %8s\n' "no profile: before ($BEFORE_FLAGS)" before after ratio
    row "  bytes received, fill on (MB)" "$(mb before_bytes)" "$(mb weenv_bytes)" "$(m weenv_bytes) / $(m before_bytes)"
    row "  bytes received, fill off (MB)" "$(mb beforenofill_bytes)" "$(mb nofill_bytes)" "$(m nofill_bytes) / $(m beforenofill_bytes)"
    row "  pull + first command, fill on (s)" "$(m before_start)" "$(m weenv_start)" "$(m weenv_start) / $(m before_start)"
    row "  pull + first command, fill off (s)" "$(m beforenofill_start)" "$(m nofill_start)" "$(m nofill_start) / $(m beforenofill_start)"
    echo "(ratio: after / before)"
fi
if [ "${STARTUP_ONLY:-0}" = 1 ]; then exit 0; fi
row "warm sequential read (MB/s)" "$(m ovl_seq)" "$(m weenv_seq)" "$(m weenv_seq) / $(m ovl_seq)"
row "warm random 4K read (MB/s)" "$(m ovl_rand)" "$(m weenv_rand)" "$(m weenv_rand) / $(m ovl_rand)"
row "find / -xdev | wc -l (s)" "$(m ovl_find)" "$(m weenv_find)" "$(m weenv_find) / $(m ovl_find)"
row "pull + read every file, cold (s)" "$(m ovl_all)" "$(m weenv_all)" "$(m weenv_all) / $(m ovl_all)"
echo "(ratio: start-up = speed-up of weenv; others = weenv / overlayfs)"
