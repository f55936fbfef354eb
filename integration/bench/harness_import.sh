#!/usr/bin/env bash
# Harness-import benchmark (issue 15): a cold agent-harness start, `import openai, anthropic,
# pydantic` with the python of the workload's harness venv (integration/bench/workload: Debian
# bookworm + gcc base, a repository, the harness venv of real LLM SDKs, the evaluator), on a
# fresh node, registry behind a $RATE HTB-shaped link (lib.sh: shaped_registry; the registry
# serves the workload's storage directly):
#   overlayfs      containerd's stock snapshotter: full pull of the static bundle
#                  (bundles/TASK:HARNESS, gzip) + the import
#   weenv          lazy pull of the composed environment (envs/TASK:HARNESS, the same content as
#                  weenv groups) + the import, background fill off: what the import reads is
#                  all that crosses the link (its working set)
#   weenv, fill on the same with the daemon's default background fill; the import again right
#                  after (no settling: what the first read must come from the node; the
#                  daemon's counts of that phase are printed); then, once the fill is
#                  done and every layer switched to its native tree, the import again (a
#                  second task on the same node, new mounts on native trees)
#   weenv, profile the image with a start-up profile of the import attached (recorded once on
#                  a cold node, `weenv profile`; attached with `weenv-convert prefetch` as
#                  envs/TASK:HARNESS-profiled in a hard-linked copy of the workload registry,
#                  so the workload's own storage is not written), fill off: the daemon
#                  prefetches the profile's frames from the pull on
#   warm (floor)   the same import again on the overlayfs node, image present: page cache hot,
#                  and after dropping the page cache (disk-warm)
# Times are wall clock on the host around `ctr run --rm` (container create + start + exit),
# plus the pull for the cold rows. Bytes = bytes received on the host side of the shaped link.
# Checked bound (issue 15): cold weenv <= warm (page cache hot) + working-set bytes / link rate
# + 1 s. Medians of $RUNS runs, each on a fresh containerd + snapshotter root. Also printed: the
# FUSE requests of the import run again on the fill-off node (per op: count and daemon time,
# from `weenv metrics`), i.e. the per-container metadata round trips a warm FUSE lower costs.
#
# Needs root, the workload (integration/bench/workload/build.sh; CACHE, default
# /var/tmp/weenv-workload), containerd, ctr, runc, docker-registry, ip, tc, fuse3 and
# (release for the published numbers):
#   cargo build --release -p weenv-snapshotter -p weenv-cli -p weenv-converter --bins
#   WEENV_BIN=target/release integration/bench/harness_import.sh
# BURN=N runs N busy loops in other processes for the whole run (a node whose CPUs are busy).
# Env: RUNS (3), RATE (200mbit), LATENCY_MS (5), HARNESS (v2), TASK (first task of the workload),
# CMD and PYTHON (the import and the interpreter that runs it, default /opt/harness/bin/python),
# OVL=0 skips the overlayfs rows (then no floor and no bound), PROFILE=0 the profiled image,
# NATIVE_WAIT (600) how long a run waits for every layer's native tree (the row after it then
# measures what there is, and the count of such runs is printed).
set -euo pipefail

RUNS=${RUNS:-3}
RATE=${RATE:-200mbit}
LATENCY_MS=${LATENCY_MS:-5}
HARNESS=${HARNESS:-v2}
CACHE=${CACHE:-/var/tmp/weenv-workload}
CMD=${CMD:-"import openai, anthropic, pydantic"}
PYTHON=${PYTHON:-/opt/harness/bin/python}
BIN=${WEENV_BIN:-$(cd "$(dirname "$0")/../.." && pwd)/target/debug}
. "$(dirname "$0")/lib.sh"
bench_need containerd ctr runc docker-registry ip tc bc
bench_need_bins weenv-snapshotter weenv weenv-convert
OVL=${OVL:-1}
PROFILE=${PROFILE:-1}
NATIVE_WAIT=${NATIVE_WAIT:-600}
WL="$CACHE/out/workload.json"
[ -f "$WL" ] || { echo "no workload in $CACHE: run integration/bench/workload/build.sh" >&2; exit 2; }
TASK=${TASK:-$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["tasks"][0]["id"])' "$WL")}
bench_workdir weenv-harness

# A hard-linked copy of the workload's storage: the registry writes only new files (the profiled
# image's manifest and tag), never into the workload's own.
cp -al "$CACHE/registry" "$W/registry"
shaped_registry "$RATE" "$LATENCY_MS" "$W/registry"
GZ="$REG/bundles/$TASK:$HARNESS"
WEENV="$REG/envs/$TASK:$HARNESS"
PROF="$REG/envs/$TASK:$HARNESS-profiled"
log "registry at $REG ($RATE, +${LATENCY_MS} ms), images $GZ and $WEENV"

rate_bps() { # tc rate (e.g. 200mbit) -> bytes per second
    local n=${1%%[a-zA-Z]*} u=${1##*[0-9]}
    case $u in
        kbit) echo "$n * 1000 / 8" | bc ;; mbit) echo "$n * 1000000 / 8" | bc ;;
        gbit) echo "$n * 1000000000 / 8" | bc ;; bit|"") echo "$n / 8" | bc ;;
        *) echo "unknown rate unit $u" >&2; exit 2 ;;
    esac
}
imp() { # $1 = ctr, $2 = snapshotter args, $3 = image, $4 = id: the import, checked
    local out
    # shellcheck disable=SC2086
    out=$($1 run --rm $2 "$3" "$4" $PYTHON -c "$CMD; print('imported')" 2>&1) || true
    case $out in
        *imported*) IMP_OK=1 ;;
        *) IMP_OK=0; FAILS=$((FAILS + 1)); log "the import failed in $4 ($3), sample dropped: $out" ;;
    esac
}
IMP_OK=0
FAILS=0
rec() { # $1 = key, $2 = value: recorded only if the last import succeeded
    if [ "$IMP_OK" = 1 ]; then R[$1]+="$2 "; fi
}

fuse_ops() { # $1 = run dir: "op count micros" per FUSE op, from the daemon's metrics
    "$BIN/weenv" --config "$1/snap.toml" metrics | python3 -c '
import re, sys
c, t = {}, {}
for l in sys.stdin:
    m = re.match(r"weenv_fuse_(ops|op_microseconds)_total\{op=\"(\w+)\"\} (\S+)", l)
    if m:
        (c if m.group(1) == "ops" else t)[m.group(2)] = int(float(m.group(3)))
for op in c:
    print(op, c[op], t.get(op, 0))'
}
wait_native() { # $1 = run dir: until the fill is done and every layer is on its native tree
    local s
    for _ in $(seq $((NATIVE_WAIT * 2))); do
        s=$("$BIN/weenv" --config "$1/snap.toml" status --json 2>/dev/null || true)
        python3 -c 'import json,sys; l=json.load(sys.stdin)["layers"]; sys.exit(0 if l and all(x.get("native") for x in l) else 1)' <<<"$s" 2>/dev/null && return 0
        sleep 0.5
    done
    log "layers did not all switch to native trees within $NATIVE_WAIT s"
    NATIVE_LATE=$((NATIVE_LATE + 1))
}
NATIVE_LATE=0

declare -A R
if [ "${BURN:-0}" -gt 0 ]; then
    for _ in $(seq "$BURN"); do sh -c 'while :; do :; done' & PIDS+=($!); done
    log "$BURN busy loops running"
fi
if [ "$PROFILE" = 1 ]; then
    # The import's start-up profile: recorded once on a cold node (fill off), then attached.
    d="$W/run-record"; start_stack "$d" false; C="ctr -a $d/ctd.sock"
    "$BIN/weenv" --config "$d/snap.toml" pull -a "$d/ctd.sock" -n default --plain-http "$WEENV" >/dev/null
    "$BIN/weenv" --config "$d/snap.toml" profile --reset 2>/dev/null
    imp "$C" "--snapshotter weenv" "$WEENV" rec
    "$BIN/weenv" --config "$d/snap.toml" profile > "$W/import.profile"
    stop_stack "$d"
    "$BIN/weenv-convert" --plain-http "$REG" prefetch "$WEENV" --profile "$W/import.profile" \
        --to "$PROF" >"$W/prefetch.log" 2>&1
    log "profile: $(wc -l < "$W/import.profile") files; $(tail -1 "$W/prefetch.log")"
    if [ -n "${LOGS_DIR:-}" ]; then cp "$W/import.profile" "$LOGS_DIR/"; fi
fi
for i in $(seq "$RUNS"); do
    if [ "$OVL" = 1 ]; then
    # overlayfs: full pull + import cold, then warm (page cache hot) and disk-warm
    d="$W/run-ovl-$i"; start_stack "$d" true; C="ctr -a $d/ctd.sock"
    b0=$(rx); t0=$(now)
    $C images pull -q --plain-http "$GZ" >/dev/null
    tp=$(now)
    imp "$C" "" "$GZ" c1
    t1=$(now); b1=$(rx)
    rec ovl_cold "$(echo "$t1 - $t0" | bc)"; rec ovl_pull "$(echo "$tp - $t0" | bc)"; rec ovl_bytes "$((b1 - b0))"
    t0=$(now); imp "$C" "" "$GZ" c2; t1=$(now); rec warm "$(echo "$t1 - $t0" | bc)"
    drop_caches; t0=$(now); imp "$C" "" "$GZ" c3; t1=$(now); rec warm_disk "$(echo "$t1 - $t0" | bc)"
    stop_stack "$d"
    fi

    # weenv, background fill off: lazy pull + import; the bytes are the import's working set
    d="$W/run-weenv-$i"; start_stack "$d" false; C="ctr -a $d/ctd.sock"
    b0=$(rx); t0=$(now)
    "$BIN/weenv" --config "$d/snap.toml" pull -a "$d/ctd.sock" -n default --plain-http "$WEENV" >/dev/null
    tp=$(now)
    imp "$C" "--snapshotter weenv" "$WEENV" c1
    t1=$(now); b1=$(rx)
    rec weenv_cold "$(echo "$t1 - $t0" | bc)"; rec weenv_pull "$(echo "$tp - $t0" | bc)"; rec weenv_bytes "$((b1 - b0))"
    fuse_ops "$d" | sort > "$W/ops-before"
    t0=$(now); imp "$C" "--snapshotter weenv" "$WEENV" c2; t1=$(now); rec weenv_again "$(echo "$t1 - $t0" | bc)"
    fuse_ops "$d" | sort > "$W/ops-after"
    # The FUSE requests of the second import (the last run's are printed).
    join "$W/ops-before" "$W/ops-after" | awk '$4 > $2 {print $1, $4 - $2, $5 - $3}' > "$W/ops-again"
    stop_stack "$d"

    # weenv with the default background fill
    d="$W/run-weenvfill-$i"; start_stack "$d" true; C="ctr -a $d/ctd.sock"
    b0=$(rx); t0=$(now)
    "$BIN/weenv" --config "$d/snap.toml" pull -a "$d/ctd.sock" -n default --plain-http "$WEENV" >/dev/null
    imp "$C" "--snapshotter weenv" "$WEENV" c1
    t1=$(now); b1=$(rx)
    rec fill_cold "$(echo "$t1 - $t0" | bc)"; rec fill_bytes "$((b1 - b0))"
    # A second task right after the first (no settling: the fill is still running or paused):
    # what the first one read must be served locally (the daemon's demand bytes, last run's
    # printed).
    "$BIN/weenv" --config "$d/snap.toml" metrics >"$W/m-next-before" 2>/dev/null || true
    b0=$(rx); t0=$(now); imp "$C" "--snapshotter weenv" "$WEENV" c1b; t1=$(now); b1=$(rx)
    "$BIN/weenv" --config "$d/snap.toml" metrics >"$W/m-next-after" 2>/dev/null || true
    rec fill_next "$(echo "$t1 - $t0" | bc)"; rec fill_next_bytes "$((b1 - b0))"
    python3 "$BENCH_DIR/phase_metrics.py" "$W/m-next-before" "$W/m-next-after" >"$W/next-phase" || true
    # A second task on the same node once the fill is done: new mounts on native trees.
    wait_native "$d"
    t0=$(now); imp "$C" "--snapshotter weenv" "$WEENV" c2; t1=$(now); rec native_again "$(echo "$t1 - $t0" | bc)"
    stop_stack "$d"

    if [ "$PROFILE" = 1 ]; then
        # weenv, the image with the import's start-up profile, fill off
        d="$W/run-weenvprof-$i"; start_stack "$d" false; C="ctr -a $d/ctd.sock"
        b0=$(rx); t0=$(now)
        "$BIN/weenv" --config "$d/snap.toml" pull -a "$d/ctd.sock" -n default --plain-http "$PROF" >/dev/null
        imp "$C" "--snapshotter weenv" "$PROF" c1
        t1=$(now); b1=$(rx)
        rec prof_cold "$(echo "$t1 - $t0" | bc)"; rec prof_bytes "$((b1 - b0))"
        # How the import's reads met the prefetch: taken just ahead of it (no quiet time) or
        # not (each starts the prefetch's quiet time); the last run's are printed.
        "$BIN/weenv" --config "$d/snap.toml" metrics \
            | grep -E '^weenv_fetch_(link_|bytes_prefetch|bytes_on_demand)' > "$W/link-prof" || true
        stop_stack "$d"
    fi
    log "run $i done"
done

m() { echo "${R[$1]:-}" | tr ' ' '\n' | grep -v '^$' | median; }
mb() { echo "scale=1; $(m "$1") / 1000000" | bc; }
BPS=$(rate_bps "$RATE")
printf '\nharness import `%s` (%s, %s), median of %s runs, %s, +%s ms one way\n\n' "$CMD" "$TASK" "$HARNESS" "$RUNS" "$RATE" "$LATENCY_MS"
printf '| %-62s | %8s | %8s |\n' "" "time (s)" "MB in"
printf '|%s|%s|%s|\n' "$(printf -- "-%.0s" $(seq 64))" "---------:" "---------:"
row() { printf '| %-62s | %8.2f | %8s |\n' "$1" "$2" "$3"; }
if [ "$OVL" = 1 ]; then
    row "overlayfs: full pull + import, cold" "$(m ovl_cold)" "$(mb ovl_bytes)"
    row "  of which pull" "$(m ovl_pull)" ""
fi
row "weenv: lazy pull + import, cold (fill off)" "$(m weenv_cold)" "$(mb weenv_bytes)"
row "  of which pull" "$(m weenv_pull)" ""
row "weenv: lazy pull + import, cold (fill on)" "$(m fill_cold)" "$(mb fill_bytes)"
[ "$PROFILE" = 1 ] && row "weenv: lazy pull + import, cold, start-up profile (fill off)" "$(m prof_cold)" "$(mb prof_bytes)"
row "weenv: the import again right after (fill on, not settled)" "$(m fill_next)" "$(mb fill_next_bytes)"
row "weenv: the import again (same node, fill off: FUSE lowers)" "$(m weenv_again)" ""
row "weenv: the import again after the fill (native trees)" "$(m native_again)" ""
if [ "$OVL" = 1 ]; then
    row "warm floor: overlayfs, image present, page cache hot" "$(m warm)" ""
    row "warm: overlayfs, image present, page cache dropped" "$(m warm_disk)" ""
fi
echo
[ "$NATIVE_LATE" = 0 ] || echo "$NATIVE_LATE run(s): not every layer on its native tree after $NATIVE_WAIT s (the row 'after the fill' measured what there was)"
[ "$FAILS" = 0 ] || echo "$FAILS import(s) failed: their samples were dropped (see the log above)"
[ -s "$W/next-phase" ] && echo "the daemon during the import right after (fill on, last run): $(cat "$W/next-phase")"
echo "FUSE requests of the import run again on the fill-off node (last run; op, count, daemon ms):"
awk '{printf "  %s %d (%.0f ms)", $1, $2, $3 / 1000} END {print ""}' "$W/ops-again"
if [ -s "$W/link-prof" ]; then
    echo "the profiled import's demand requests vs the prefetch (last run):"
    sed 's/^/  /' "$W/link-prof"
fi
[ "$OVL" = 1 ] || exit 0
echo "speed-up over a full pull: $(echo "scale=1; $(m ovl_cold) / $(m weenv_cold)" | bc)x (fill off), $(echo "scale=1; $(m ovl_cold) / $(m fill_cold)" | bc)x (fill on)"
bound() { # $1 = key of the cold time, $2 = key of its bytes
    local b ok
    b=$(echo "scale=3; $(m warm) + $(m "$2") / $BPS + 1" | bc)
    ok=$(echo "$(m "$1") <= $b" | bc)
    echo "bound ($1): cold $(m "$1") s <= warm $(m warm) s + $(m "$2") B / $BPS B/s + 1 s = $b s: $([ "$ok" = 1 ] && echo met || echo MISSED)"
}
bound weenv_cold weenv_bytes
[ "$PROFILE" = 1 ] && bound prof_cold prof_bytes
true
