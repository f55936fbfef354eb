#!/usr/bin/env bash
# "Background work yields" benchmark (issue 15), registry behind a $RATE HTB-shaped link
# (lib.sh: shaped_registry), a fresh containerd + snapshotter root per run:
#
# (a) warm right after cold: pull + $CMD cold (fill on), then $CMD again at once, while the
#     background fill of the image runs (the second run's bytes are all on the node already),
#     then, after the fill and the native switch are done, $CMD a third time. Ratio =
#     warm-after-fill / warm-right-after-cold (1.0 = the running fill costs nothing). Run twice:
#     with the daemon's defaults (fill work at SCHED_IDLE, paused while FUSE reads come) and
#     with yielding off on the CPU (`cpu_priority = "normal"`, `busy_ms = 0`).
#     Page cache is not dropped between the runs (the second task of a rollout on a node).
#     A third case, `full`, runs the defaults with `fuse.plain_session = false` (every layer on
#     the full FUSE session: overlayfs asks it for xattrs and every file open is a request): the
#     same-run baseline of the plain session.
# (b) profile for a bigger command: the image gets a start-up profile recorded for $BIG
#     (python reading every file under /usr: a prefetch of most of the image); pull + $CMD cold
#     on the image with that profile vs without a profile (fill on). Ratio = without / with
#     (1.0 = the unrelated profile costs the command nothing). Measured twice: wall clock of
#     pull + `ctr run`, and the command's own time since its exec (read in the container from
#     /proc, 10 ms resolution), which leaves out containerd's and runc's work. BIG="$CMD"
#     measures the profile recorded for the command itself (> 1: the profile helps).
#
#     The two cases alternate their order from run to run; each run's ratio and the load
#     average are printed as it ends.
#
# Medians of $RUNS runs; times are wall clock on the host around `weenv pull` + `ctr run --rm`.
# Needs root, containerd, ctr, runc, docker-registry, skopeo, ip, tc, bc, fuse3 and (release
# for the published numbers):
#   cargo build --release -p weenv-snapshotter -p weenv-cli -p weenv-converter
#   WEENV_BIN=target/release integration/bench/yield.sh [OCI_LAYOUT:TAG]
# Env: RUNS (3), RATE (200mbit), LATENCY_MS (5), CMD, BIG, PARTS (ab: which parts to run).
set -euo pipefail

RUNS=${RUNS:-3}
PARTS=${PARTS:-ab}
RATE=${RATE:-200mbit}
LATENCY_MS=${LATENCY_MS:-5}
CMD=${CMD:-"import asyncio, email.mime.multipart, http.client, json, sqlite3, unittest, xml.dom.minidom"}
BIG=${BIG:-"import os
for d, _, fs in os.walk('/usr'):
    for f in fs:
        p = os.path.join(d, f)
        try:
            if os.path.isfile(p) and not os.path.islink(p): open(p, 'rb').read()
        except OSError: pass"}
BIN=${WEENV_BIN:-$(cd "$(dirname "$0")/../.." && pwd)/target/debug}
. "$(dirname "$0")/lib.sh"
IMG=${1:-$(default_image)}
bench_need containerd ctr runc docker-registry skopeo ip tc bc
bench_need_bins weenv-snapshotter weenv weenv-convert
bench_workdir weenv-yield

shaped_registry "$RATE" "$LATENCY_MS"
log "registry at $REG ($RATE, +${LATENCY_MS} ms)"
skopeo copy -q --dest-tls-verify=false "oci:$IMG" "docker://$REG/bench:gz"
"$BIN/weenv-convert" --plain-http "$REG" image "$REG/bench:gz" "$REG/bench:weenv" >"$W/convert.log" 2>&1
log "converted: $(tail -1 "$W/convert.log")"

weenv_() { "$BIN/weenv" --config "$1/snap.toml" "${@:2}"; }
pull() { weenv_ "$1" pull -a "$1/ctd.sock" -n default --plain-http "$2" >/dev/null; }
# Container ids carry the script's pid: runc's state is per host, other benchmarks may run.
run() { ctr -a "$1/ctd.sock" run --rm --snapshotter weenv "$2" "$3" python3 -c "$4" >/dev/null; }
# $CMD, then the seconds since the python process was exec'd (its own start-up included; no
# containerd/runc overhead): a second measure, far less noisy on a loaded machine.
TIMED="$CMD
import os
st = float(open('/proc/self/stat').read().rsplit(')', 1)[1].split()[19]) / os.sysconf('SC_CLK_TCK')
print('ELAPSED', float(open('/proc/uptime').read().split()[0]) - st)"
run_timed() { ctr -a "$1/ctd.sock" run --rm --snapshotter weenv "$2" "$3" python3 -c "$TIMED" | awk '/^ELAPSED/ {print $2}'; }
since() { echo "$(now) - $1" | bc; }
# ---- (b) the profile of a bigger command -------------------------------------------------
d="$W/record"; start_stack "$d" false
pull "$d" "$REG/bench:weenv"
weenv_ "$d" profile --reset >/dev/null
run "$d" "$REG/bench:weenv" "rec-$$" "$BIG"
weenv_ "$d" profile >"$W/big.profile"
stop_stack "$d"
"$BIN/weenv-convert" --plain-http "$REG" prefetch "$REG/bench:weenv" --profile "$W/big.profile" \
    --to "$REG/bench:weenv-big" >"$W/prefetch.log" 2>&1
log "profile of the bigger command: $(wc -l <"$W/big.profile") files; $(tail -1 "$W/prefetch.log")"

declare -A R
for i in $(seq "$RUNS"); do
    # (a) warm right after cold vs warm after the fill, yielding on (defaults) and off
    for k in yield noyield full; do
        [[ $PARTS == *a* ]] || break
        if [ $k = noyield ]; then export SNAP_FILL_EXTRA=$'cpu_priority = "normal"\nbusy_ms = 0'; else unset SNAP_FILL_EXTRA; fi
        if [ $k = full ]; then export SNAP_EXTRA=$'[fuse]\nplain_session = false\nhandover = false'; else unset SNAP_EXTRA; fi
        d="$W/a-$k-$i"; start_stack "$d" true
        t0=$(now); pull "$d" "$REG/bench:weenv"; run "$d" "$REG/bench:weenv" "c1-$$" "$CMD"; R[${k}_cold]+="$(since "$t0") "
        t0=$(now); run "$d" "$REG/bench:weenv" "c2-$$" "$CMD"; R[${k}_early]+="$(since "$t0") "
        wait_fill "$d" # Done comes after the completion check and the native switch
        t0=$(now); run "$d" "$REG/bench:weenv" "c3-$$" "$CMD"; R[${k}_late]+="$(since "$t0") "
        stop_stack "$d"
    done
    unset SNAP_FILL_EXTRA SNAP_EXTRA
    # (b) the command on the image without / with the bigger command's profile
    order="plain big"; [ $((i % 2)) = 0 ] && order="big plain"
    for k in $order; do
        [[ $PARTS == *b* ]] || break
        img="$REG/bench:weenv"; [ $k = big ] && img="$REG/bench:weenv-big"
        d="$W/b-$k-$i"; start_stack "$d" true
        b0=$(rx); t0=$(now); pull "$d" "$img"; e=$(run_timed "$d" "$img" "c1-$$"); R[b_$k]+="$(since "$t0") "
        R[b_${k}_in]+="$e "
        R[b_${k}_bytes]+="$(($(rx) - b0)) "
        stop_stack "$d"
    done
    if [[ $PARTS == *b* ]]; then
        p=$(echo "${R[b_plain]}" | awk '{print $NF}'); b=$(echo "${R[b_big]}" | awk '{print $NF}')
        pi=$(echo "${R[b_plain_in]}" | awk '{print $NF}'); bi=$(echo "${R[b_big_in]}" | awk '{print $NF}')
        log "run $i (b): without $p s, with the profile $b s, ratio $(echo "scale=2; $p / $b" | bc); in the container $pi s / $bi s, ratio $(echo "scale=2; $pi / $bi" | bc); load $(cut -d' ' -f1-3 /proc/loadavg)"
    fi
    log "run $i done"
done

m() { echo "${R[$1]}" | tr ' ' '\n' | grep -v '^$' | median; }
ratio() { echo "scale=2; $1 / $2" | bc; }
printf '\n%s\n' "median of $RUNS, $RATE +${LATENCY_MS} ms, CMD: python3 -c '$CMD'"
[[ $PARTS == *a* ]] && printf '%-48s %8s %8s %8s %8s\n' "(a) warm right after cold (s)" cold early filled ratio
for k in yield noyield full; do
    [[ $PARTS == *a* ]] || break
    case $k in
        yield) what='(defaults)' ;;
        noyield) what='(cpu_priority=normal, busy_ms=0)' ;;
        full) what='(defaults, plain_session=false)' ;;
    esac
    printf '%-48s %8s %8s %8s %8s\n' "  $k $what" \
        "$(m ${k}_cold)" "$(m ${k}_early)" "$(m ${k}_late)" "$(ratio "$(m ${k}_late)" "$(m ${k}_early)")"
done
[[ $PARTS == *a* ]] && echo "  (ratio = warm after fill / warm right after cold; 1.00 = the running fill costs nothing)"
[[ $PARTS == *b* ]] || exit 0
printf '%-48s %8s %8s %8s\n' "(b) pull + command cold (s)" plain big-prof ratio
printf '%-48s %8s %8s %8s\n' "  image without / with the bigger profile" "$(m b_plain)" "$(m b_big)" "$(ratio "$(m b_plain)" "$(m b_big)")"
printf '%-48s %8s %8s %8s\n' "  the command in the container (since exec)" "$(m b_plain_in)" "$(m b_big_in)" "$(ratio "$(m b_plain_in)" "$(m b_big_in)")"
printf '%-48s %8s %8s\n' "  bytes received (MB)" "$(echo "scale=1; $(m b_plain_bytes)/1000000" | bc)" "$(echo "scale=1; $(m b_big_bytes)/1000000" | bc)"
echo "  (ratio = without / with the profile; 1.00 = the unrelated profile costs nothing)"
