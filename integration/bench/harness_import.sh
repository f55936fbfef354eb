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
#   weenv, fill on the same with the daemon's default background fill
#   warm (floor)   the same import again on the overlayfs node, image present: page cache hot,
#                  and after dropping the page cache (disk-warm)
# Times are wall clock on the host around `ctr run --rm` (container create + start + exit),
# plus the pull for the cold rows. Bytes = bytes received on the host side of the shaped link.
# Checked bound (issue 15): cold weenv <= warm (page cache hot) + working-set bytes / link rate
# + 1 s. Medians of $RUNS runs, each on a fresh containerd + snapshotter root.
#
# Needs root, the workload (integration/bench/workload/build.sh; CACHE, default
# /var/tmp/weenv-workload), containerd, ctr, runc, docker-registry, ip, tc, fuse3 and
# (release for the published numbers):
#   cargo build --release -p weenv-snapshotter -p weenv-cli -p weenv-converter --bins
#   WEENV_BIN=target/release integration/bench/harness_import.sh
# Env: RUNS (3), RATE (200mbit), LATENCY_MS (5), HARNESS (v2), TASK (first task of the workload).
set -euo pipefail

RUNS=${RUNS:-3}
RATE=${RATE:-200mbit}
LATENCY_MS=${LATENCY_MS:-5}
HARNESS=${HARNESS:-v2}
CACHE=${CACHE:-/var/tmp/weenv-workload}
CMD=${CMD:-"import openai, anthropic, pydantic"}
PYTHON=/opt/harness/bin/python
BIN=${WEENV_BIN:-$(cd "$(dirname "$0")/../.." && pwd)/target/debug}
. "$(dirname "$0")/lib.sh"
bench_need containerd ctr runc docker-registry ip tc bc
bench_need_bins weenv-snapshotter weenv
WL="$CACHE/out/workload.json"
[ -f "$WL" ] || { echo "no workload in $CACHE: run integration/bench/workload/build.sh" >&2; exit 2; }
TASK=${TASK:-$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["tasks"][0]["id"])' "$WL")}
bench_workdir weenv-harness

shaped_registry "$RATE" "$LATENCY_MS" "$CACHE/registry"
GZ="$REG/bundles/$TASK:$HARNESS"
WEENV="$REG/envs/$TASK:$HARNESS"
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
    case $out in *imported*) ;; *) log "the import failed in $4 ($3): $out"; return 1 ;; esac
}

declare -A R
for i in $(seq "$RUNS"); do
    # overlayfs: full pull + import cold, then warm (page cache hot) and disk-warm
    d="$W/run-ovl-$i"; start_stack "$d" true; C="ctr -a $d/ctd.sock"
    b0=$(rx); t0=$(now)
    $C images pull -q --plain-http "$GZ" >/dev/null
    tp=$(now)
    imp "$C" "" "$GZ" c1
    t1=$(now); b1=$(rx)
    R[ovl_cold]+="$(echo "$t1 - $t0" | bc) "; R[ovl_pull]+="$(echo "$tp - $t0" | bc) "; R[ovl_bytes]+="$((b1 - b0)) "
    t0=$(now); imp "$C" "" "$GZ" c2; t1=$(now); R[warm]+="$(echo "$t1 - $t0" | bc) "
    drop_caches; t0=$(now); imp "$C" "" "$GZ" c3; t1=$(now); R[warm_disk]+="$(echo "$t1 - $t0" | bc) "
    stop_stack "$d"

    # weenv, background fill off: lazy pull + import; the bytes are the import's working set
    d="$W/run-weenv-$i"; start_stack "$d" false; C="ctr -a $d/ctd.sock"
    b0=$(rx); t0=$(now)
    "$BIN/weenv" --config "$d/snap.toml" pull -a "$d/ctd.sock" -n default --plain-http "$WEENV" >/dev/null
    tp=$(now)
    imp "$C" "--snapshotter weenv" "$WEENV" c1
    t1=$(now); b1=$(rx)
    R[weenv_cold]+="$(echo "$t1 - $t0" | bc) "; R[weenv_pull]+="$(echo "$tp - $t0" | bc) "; R[weenv_bytes]+="$((b1 - b0)) "
    t0=$(now); imp "$C" "--snapshotter weenv" "$WEENV" c2; t1=$(now); R[weenv_again]+="$(echo "$t1 - $t0" | bc) "
    stop_stack "$d"

    # weenv with the default background fill
    d="$W/run-weenvfill-$i"; start_stack "$d" true; C="ctr -a $d/ctd.sock"
    b0=$(rx); t0=$(now)
    "$BIN/weenv" --config "$d/snap.toml" pull -a "$d/ctd.sock" -n default --plain-http "$WEENV" >/dev/null
    imp "$C" "--snapshotter weenv" "$WEENV" c1
    t1=$(now); b1=$(rx)
    R[fill_cold]+="$(echo "$t1 - $t0" | bc) "; R[fill_bytes]+="$((b1 - b0)) "
    stop_stack "$d"
    log "run $i done"
done

m() { echo "${R[$1]}" | tr ' ' '\n' | grep -v '^$' | median; }
mb() { echo "scale=1; $(m "$1") / 1000000" | bc; }
BPS=$(rate_bps "$RATE")
bound=$(echo "scale=3; $(m warm) + $(m weenv_bytes) / $BPS + 1" | bc)
printf '\nharness import `%s` (%s, %s), median of %s runs, %s, +%s ms one way\n\n' "$CMD" "$TASK" "$HARNESS" "$RUNS" "$RATE" "$LATENCY_MS"
printf '| %-54s | %8s | %8s |\n' "" "time (s)" "MB in"
printf '|%s|%s|%s|\n' "--------------------------------------------------------" "---------:" "---------:"
row() { printf '| %-54s | %8.2f | %8s |\n' "$1" "$2" "$3"; }
row "overlayfs: full pull + import, cold" "$(m ovl_cold)" "$(mb ovl_bytes)"
row "  of which pull" "$(m ovl_pull)" ""
row "weenv: lazy pull + import, cold (fill off)" "$(m weenv_cold)" "$(mb weenv_bytes)"
row "  of which pull" "$(m weenv_pull)" ""
row "weenv: lazy pull + import, cold (fill on)" "$(m fill_cold)" "$(mb fill_bytes)"
row "weenv: the import again (same node, fill off)" "$(m weenv_again)" ""
row "warm floor: overlayfs, image present, page cache hot" "$(m warm)" ""
row "warm: overlayfs, image present, page cache dropped" "$(m warm_disk)" ""
echo
echo "speed-up over a full pull: $(echo "scale=1; $(m ovl_cold) / $(m weenv_cold)" | bc)x (fill off), $(echo "scale=1; $(m ovl_cold) / $(m fill_cold)" | bc)x (fill on)"
ok=$(echo "$(m weenv_cold) <= $bound" | bc)
echo "bound: cold weenv $(m weenv_cold) s <= warm $(m warm) s + $(m weenv_bytes) B / $BPS B/s + 1 s = $bound s: $([ "$ok" = 1 ] && echo met || echo MISSED)"
