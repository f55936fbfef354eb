#!/usr/bin/env bash
# Rollout benchmark (issue 12): the paper's experiment on one node. A rollout iteration starts
# B environments at once and runs every task to its reward; $ITERS iterations per mode, the
# first on a fresh node (cold: new containerd + snapshotter roots, caches dropped), the next
# ones on the same node. The registry (the workload's storage) sits in a netns behind a $RATE
# HTB-shaped veth + $LATENCY_MS one-way (lib.sh shaped_registry); dynamic assembly's
# wheelhouse is served over the same shaped link (HTTP, same delay).
# Modes (MODES, space-separated, run in this order):
#   bundles        static bundles (bundles/TASK:H, gzip), stock overlayfs: ctr pull + ctr run
#   bundles-lazy   the same bundles converted to weenv (bundles-weenv/TASK:H, from
#                  workload/bundles_weenv.sh): weenv pull (lazy) + ctr run --snapshotter weenv
#   dynamic        dynamic assembly: dynamic/TASK:1 with overlayfs, the harness pip-installed
#                  at init from the wheelhouse over HTTP (ctr run --net-host)
#   plans          composed plans via weenv: `weenv run PLAN` (composed on the node, lazy
#                  pull, at-init patch, run)
#   plans-profile  the same with start-up profiles: before the mode, one cold run per harness
#                  is recorded (`weenv profile`), attached with `weenv-convert prefetch` to an
#                  envs/ image, and its prefetch annotations copied onto the base, harness and
#                  evaluator groups (tags + "-prof"); the plans reference those
#   plans-fixed    plans through the weenv shim (--runtime io.containerd.weenv.v1) with a fixed
#                  quota of $SHIM_CPUS cores and $SHIM_MEM bytes (io.weenv.elastic=false)
#   plans-elastic  the same request, elastic (the shim scales CPU and memory)
# CPU_SAMPLE=1: CPU seconds used on the host during each iteration, by process name
# (cpu_sample.py: the tasks' python, the daemon, containerd, ...), in cpu.tsv and the log.
# Per environment (envs.tsv): init latency (request -> the agent's AGENT_START), task time
# (AGENT_START -> exit), reward vs the task's expected reward (a mismatch makes the script
# exit 1), and for the weenv modes the registry and read bytes of its layers (daemon /status
# per layer: compressed bytes of the frames fetched during the iteration on demand or by the
# start-up prefetch, those the background fill fetched, file bytes read since the iteration
# started; each layer shared equally among the iteration's environments using it). Per iteration (iterations.tsv): wall time, bytes the registry side sent on the link,
# the daemon's registry bytes. meta.tsv: settings and load average. Then the report
# (integration/bench/rollout_report.rs: report.md, init_cdf.png, iterations.png, bytes.png).
# Needs root, the workload (workload/build.sh; bundles-lazy also workload/bundles_weenv.sh),
# containerd, ctr, runc, docker-registry, ip, tc, and the workspace binaries in WEENV_BIN
# (weenv-snapshotter, weenv, weenv-convert for plans-profile, containerd-shim-weenv-v1 for the
# shim modes; release for published numbers).
# REPEAT=1: every iteration runs the first one's environments again, so from the second on
# every mode starts on a warm node (each image already on it: the next task of a rollout on a
# node that holds its image); SETTLE=1: before each iteration after the first, wait until the
# weenv daemon's fill is done and every layer is on its native tree; FILL=false: the daemon's
# background fill off (the weenv modes then read every byte on demand, on FUSE lowers);
# RUN_FLAGS: extra `weenv run` flags for the plans modes (e.g. --timings: each step's time in
# the environment's .err under OUT/logs).
# WAVES="1 1 8": one iteration per number, that many environments in it, each wave starting
# from the first environment (as REPEAT=1): a cold task, the same task again right after on
# the same node (its image present, no settling), then a wave of 8 (overrides B and ITERS).
# BURN=N: N busy loops in other processes for the whole run (a node whose CPUs are busy).
# Per iteration (phases.tsv; weenv modes): what the daemon did, from `weenv metrics` before and
# after (phase_metrics.py: registry requests, MB on demand / prefetch / fill, FUSE requests);
# rollout_phases.py OUT prints the per-iteration table with the ratios to bundles.
# Env: B (8), ITERS (3), MODES (all), RATE (200mbit), LATENCY_MS (5),
#      OUT (/var/tmp/weenv-rollout-DATE: the TSVs, report, PNGs, logs/MODE/ of every env),
#      SHIM_CPUS (0.125), SHIM_MEM (1073741824), CACHE (/var/tmp/weenv-workload).
set -euo pipefail

B=${B:-8}
ITERS=${ITERS:-3}
WAVES=${WAVES:-}
if [ -n "$WAVES" ]; then read -r -a WAVE <<<"$WAVES"; ITERS=${#WAVE[@]}; fi
# Environments in iteration $1.
wave_size() { if [ -n "$WAVES" ]; then echo "${WAVE[$(($1 - 1))]}"; else echo "$B"; fi; }
MODES=${MODES:-"bundles bundles-lazy dynamic plans plans-profile plans-fixed plans-elastic"}
RATE=${RATE:-200mbit}
LATENCY_MS=${LATENCY_MS:-5}
SHIM_CPUS=${SHIM_CPUS:-0.125}
SHIM_MEM=${SHIM_MEM:-1073741824}
CACHE=${CACHE:-/var/tmp/weenv-workload}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BIN=${WEENV_BIN:-$ROOT/target/debug}
case $BIN in /*) ;; *) BIN=$ROOT/$BIN ;; esac
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/lib.sh"
bench_need containerd ctr runc docker-registry ip tc bc python3
bench_need_bins weenv-snapshotter weenv
case " $MODES " in *" plans-profile "*) bench_need_bins weenv-convert ;; esac
case " $MODES " in *" plans-fixed "* | *" plans-elastic "*) bench_need_bins containerd-shim-weenv-v1 ;; esac
WL="$CACHE/out/workload.json"
PY="python3 $HERE/workload/workload.py"
[ -f "$WL" ] || { echo "no workload in $CACHE: run integration/bench/workload/build.sh" >&2; exit 2; }
case " $MODES " in *" bundles-lazy "*)
    grep -q bundles_weenv "$WL" || { echo "no weenv bundles: run integration/bench/workload/bundles_weenv.sh" >&2; exit 2; } ;;
esac
export PATH="$BIN:$PATH" # containerd finds containerd-shim-weenv-v1 on its PATH
bench_workdir weenv-rollout
OUT=${OUT:-/var/tmp/weenv-rollout-$(date +%Y%m%d-%H%M%S)}; mkdir -p "$OUT/logs"
UPTIME_BEFORE=$(uptime)

shaped_registry "$RATE" "$LATENCY_MS" "$CACHE/registry"
REG_IP=${REG%:*}
# The wheelhouse over the same shaped link (and the same added delay when LATENCY_MS > 0).
if [ "$LATENCY_MS" = 0 ]; then
    ip netns exec "$NS" python3 -m http.server 8080 --bind "$REG_IP" --directory "$CACHE/out/wheelhouse" >"$W/wheels.log" 2>&1 &
    PIDS+=($!)
else
    ip netns exec "$NS" python3 -m http.server 8081 --bind 127.0.0.1 --directory "$CACHE/out/wheelhouse" >"$W/wheels.log" 2>&1 &
    PIDS+=($!)
    ip netns exec "$NS" python3 "$BENCH_DIR/delay_proxy.py" "$REG_IP:8080" "127.0.0.1:8081" "$LATENCY_MS" >"$W/wheels-proxy.log" 2>&1 &
    PIDS+=($!)
fi
WHEELS="http://$REG_IP:8080"
for _ in $(seq 50); do curl -sf "$WHEELS/harness-v1.txt" >/dev/null 2>&1 && break; sleep 0.2; done
$PY plans "$WL" "$REG" "$W/plans" >/dev/null
log "registry at $REG, wheelhouse at $WHEELS ($RATE, +${LATENCY_MS} ms); plans in $W/plans"
$PY env-layers "$WL" "$REG" plans >"$W/layers-plans"
case " $MODES " in *" bundles-lazy "*) $PY env-layers "$WL" "$REG" bundles-weenv >"$W/layers-bundles-lazy" ;; esac

# The environments of iteration $1: $2 (task, harness) pairs, round-robin over T x H.
pairs() {
    python3 - "$WL" "$1" "$2" <<'EOF'
import json, sys
w = json.load(open(sys.argv[1])); it, b = int(sys.argv[2]), int(sys.argv[3])
ps = [(t["id"], h, t["expected_reward"]) for t in w["tasks"] for h in sorted(w["harnesses"])]
for k in range(b):
    t, h, r = ps[((it - 1) * b + k) % len(ps)]
    print(t, h, r)
EOF
}

# Start-up profiles (plans-profile): one cold run per harness on a fresh stack, recorded with
# `weenv profile`, attached to an envs/ image, copied onto the groups (tags + -prof).
record_profiles() {
    local h t d p refs=()
    for h in v1 v2; do
        t=$(python3 -c 'import json,sys; w=json.load(open(sys.argv[1])); print(w["tasks"][int(sys.argv[2])]["id"])' "$WL" "$([ $h = v1 ] && echo 0 || echo 1)")
        d="$W/prof-$h"; start_stack "$d" true
        "$BIN/weenv" --config "$d/snap.toml" run "$W/plans/$t--$h.toml" --image "$REG/envs/$t:$h" \
            -a "$d/ctd.sock" --plain-http --id "prof-$h" --cache-dir "$d/resolve-cache" >"$W/prof-$h.out" 2>&1 ||
            { cat "$W/prof-$h.out" >&2; exit 1; }
        "$BIN/weenv" --config "$d/snap.toml" profile >"$W/prof-$h.txt"
        stop_stack "$d"
        "$BIN/weenv-convert" --plain-http "$REG" prefetch "$REG/envs/$t:$h" --profile "$W/prof-$h.txt" \
            --to "$REG/envs-prof/$t:$h" >"$W/prefetch-$h.log" 2>&1 || { cat "$W/prefetch-$h.log" >&2; exit 1; }
        refs+=("$REG/envs-prof/$t:$h")
        log "profile $h: $(wc -l <"$W/prof-$h.txt") files ($t:$h)"
    done
    # Base and evaluator: the union of both runs' reads; each harness: its own run's.
    sort -u "$W/prof-v1.txt" "$W/prof-v2.txt" >"$W/prof-union.txt"
    t=${refs[0]##*/envs-prof/}
    "$BIN/weenv-convert" --plain-http "$REG" prefetch "$REG/envs/$t" --profile "$W/prof-union.txt" \
        --to "$REG/envs-prof-union/$t" >"$W/prefetch-union.log" 2>&1 || { cat "$W/prefetch-union.log" >&2; exit 1; }
    $PY profile-groups "$WL" "$REG" -prof "${refs[0]#"$REG/"}=harness:v1" "${refs[1]#"$REG/"}=harness:v2" \
        "envs-prof-union/$t=base,evaluator"
    $PY plans "$WL" "$REG" "$W/plans-prof" --suffix=-prof >/dev/null
}

# One environment: $1 mode, $2 run dir, $3 id, $4 task, $5 harness; stdout to $2/env-$3.out.
env_run() {
    local mode=$1 d=$2 id=$3 t=$4 h=$5 C="ctr -a $2/ctd.sock"
    local RUN=("$BIN/weenv" --config "$d/snap.toml" run -a "$d/ctd.sock" --plain-http --id "$id" --cache-dir "$d/resolve-cache" ${RUN_FLAGS:-})
    local SHIM=(--runtime io.containerd.weenv.v1 --cpus "$SHIM_CPUS" --memory-limit "$SHIM_MEM"
        --annotation "io.weenv.ledger.dir=$d/ledger" --annotation "io.weenv.status.dir=$d/shim-status")
    case $mode in
        bundles)
            $C images pull -q --plain-http "$REG/bundles/$t:$h" >/dev/null 2>&1 || true
            $C run --rm "$REG/bundles/$t:$h" "$id" ;;
        bundles-lazy)
            "$BIN/weenv" --config "$d/snap.toml" pull -a "$d/ctd.sock" --plain-http "$REG/bundles-weenv/$t:$h" >/dev/null 2>&1 || true
            $C run --rm --snapshotter weenv "$REG/bundles-weenv/$t:$h" "$id" ;;
        dynamic)
            $C images pull -q --plain-http "$REG/dynamic/$t:1" >/dev/null 2>&1 || true
            $C run --rm --net-host --env "HARNESS=$h" --env "WHEELHOUSE=$WHEELS" --env "PIP_TRUSTED_HOST=$REG_IP" \
                "$REG/dynamic/$t:1" "$id" ;;
        plans)
            "${RUN[@]}" "$W/plans/$t--$h.toml" --image "$REG/envs/$t:$h" ;;
        plans-profile)
            "${RUN[@]}" "$W/plans-prof/$t--$h.toml" --image "$REG/envs/$t:$h" ;;
        plans-fixed)
            "${RUN[@]}" "${SHIM[@]}" --annotation io.weenv.elastic=false "$W/plans/$t--$h.toml" --image "$REG/envs/$t:$h" ;;
        plans-elastic)
            "${RUN[@]}" "${SHIM[@]}" --annotation io.weenv.elastic=true "$W/plans/$t--$h.toml" --image "$REG/envs/$t:$h" ;;
    esac
}

wait_native() { # $1 = run dir: until the fill is done and every layer is on its native tree
    for _ in $(seq 1200); do
        python3 -c 'import json,sys; l=json.load(sys.stdin).get("layers", []); sys.exit(0 if l and all(x.get("native") for x in l) else 1)' \
            < <(status_json "$1") 2>/dev/null && return 0
        sleep 0.5
    done
    log "layers did not all switch to native trees"
}
weenv_mode() { case $1 in bundles | dynamic) return 1 ;; *) return 0 ;; esac; }
layers_of() { case $1 in bundles-lazy) echo "$W/layers-bundles-lazy" ;; *) echo "$W/layers-plans" ;; esac; }
status_json() { "$BIN/weenv" --config "$1/snap.toml" status --json 2>/dev/null || echo '{}'; }
registry_total() { python3 -c 'import json,sys; print(json.load(open(sys.argv[1])).get("tiers", {}).get("registry", 0))' "$1" 2>/dev/null || echo 0; }

printf 'mode\titer\tenv\ttask\tharness\tinit_s\ttask_s\treward\texpected\tfetched_bytes\tfill_bytes\tread_bytes\n' >"$OUT/envs.tsv"
printf 'mode\titer\twall_s\tlink_bytes\tregistry_bytes\n' >"$OUT/iterations.tsv"
printf 'mode\titer\tenvs\t%s\n' "$(python3 "$BENCH_DIR/phase_metrics.py" --keys | paste -sd '\t')" >"$OUT/phases.tsv"
if [ "${BURN:-0}" -gt 0 ]; then
    for _ in $(seq "$BURN"); do sh -c 'while :; do :; done' & PIDS+=($!); done
    log "$BURN busy loops running"
fi
[ "${CPU_SAMPLE:-0}" = 1 ] && printf 'mode\titer\tprocess\tcpu_s\n' >"$OUT/cpu.tsv"
fail=0
for mode in $MODES; do
    [ "$mode" = plans-profile ] && [ ! -d "$W/plans-prof" ] && record_profiles
    d="$W/run-$mode"; drop_caches; start_stack "$d" "${FILL:-true}"
    for it in $(seq "$ITERS"); do
        n=$(wave_size "$it")
        pairs "$([ "${REPEAT:-0}" = 1 ] || [ -n "$WAVES" ] && echo 1 || echo "$it")" "$n" >"$d/pairs-$it"
        if [ "${SETTLE:-0}" = 1 ] && [ "$it" -gt 1 ] && weenv_mode "$mode"; then wait_native "$d"; fi
        if weenv_mode "$mode"; then
            "$BIN/weenv" --config "$d/snap.toml" profile --reset >/dev/null 2>&1 || true
            status_json "$d" >"$d/status-$it-before.json"
            "$BIN/weenv" --config "$d/snap.toml" metrics >"$d/metrics-$it-before.prom" 2>/dev/null || true
        fi
        if [ "${CPU_SAMPLE:-0}" = 1 ]; then
            rm -f "$d/cpu-stop"; python3 "$BENCH_DIR/cpu_sample.py" "$d/cpu-stop" >"$d/cpu-$it.tsv" & CPU_PID=$!
        fi
        b0=$(rx); t0=$(now); k=0; EP=()
        while read -r t h exp; do
            k=$((k + 1))
            ( tr=$(now); env_run "$mode" "$d" "e$it-$k" "$t" "$h" >"$d/env-$it-$k.out" 2>"$d/env-$it-$k.err" || true
              echo "$tr $(now) $t $h $exp" >"$d/env-$it-$k.meta" ) &
            EP+=($!)
        done <"$d/pairs-$it"
        wait "${EP[@]}"   # not a bare wait: the daemon, containerd and registry are children too
        t1=$(now); b1=$(rx)
        if [ "${CPU_SAMPLE:-0}" = 1 ]; then
            touch "$d/cpu-stop"; wait "$CPU_PID" || true
            awk -v m="$mode" -v i="$it" -F'\t' '{printf "%s\t%s\t%s\t%s\n", m, i, $1, $2}' "$d/cpu-$it.tsv" >>"$OUT/cpu.tsv"
            log "$mode iteration $it CPU s: $(head -4 "$d/cpu-$it.tsv" | tr '\t\n' '= ')"
        fi
        wall=$(echo "$t1 - $t0" | bc); reg_bytes=NA
        if weenv_mode "$mode"; then
            status_json "$d" >"$d/status-$it-after.json"
            "$BIN/weenv" --config "$d/snap.toml" metrics >"$d/metrics-$it-after.prom" 2>/dev/null || true
            printf '%s\t%s\t%s\t%s\n' "$mode" "$it" "$n" \
                "$(python3 "$BENCH_DIR/phase_metrics.py" --tsv "$d/metrics-$it-before.prom" "$d/metrics-$it-after.prom" | cut -f2 | paste -sd '\t')" >>"$OUT/phases.tsv"
            reg_bytes=$(( $(registry_total "$d/status-$it-after.json") - $(registry_total "$d/status-$it-before.json") ))
            $PY env-bytes "$(layers_of "$mode")" "$d/pairs-$it" "$d/status-$it-before.json" "$d/status-$it-after.json" >"$d/bytes-$it"
        else
            for _ in $(seq "$n"); do echo NA NA NA; done >"$d/bytes-$it"
        fi
        printf '%s\t%s\t%s\t%s\t%s\n' "$mode" "$it" "$wall" "$((b1 - b0))" "$reg_bytes" >>"$OUT/iterations.tsv"
        for k in $(seq "$n"); do
            read -r tr te t h exp <"$d/env-$it-$k.meta"
            read -r fb fl rb < <(sed -n "${k}p" "$d/bytes-$it")
            st=$(awk '/^AGENT_START/{print $2}' "$d/env-$it-$k.out")
            rw=$(awk '/^AGENT_REWARD/{print $2}' "$d/env-$it-$k.out")
            init=$([ -n "$st" ] && echo "$st - $tr" | bc || echo NA)
            task=$([ -n "$st" ] && echo "$te - $st" | bc || echo NA)
            [ "${rw:-x}" = "$exp" ] || { fail=1; log "$mode iteration $it env $k ($t $h): reward ${rw:-none}, expected $exp"; sed 's/^/    /' "$d/env-$it-$k.err" | tail -5 >&2; }
            printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$mode" "$it" "$k" "$t" "$h" "$init" "$task" "${rw:-none}" "$exp" "$fb" "$fl" "$rb" >>"$OUT/envs.tsv"
        done
        log "$mode iteration $it: $wall s, $(((b1 - b0) / 1000000)) MB on the link"
    done
    mkdir -p "$OUT/logs/$mode"; cp "$d"/env-* "$d"/status-* "$d/snap.log" "$OUT/logs/$mode/" 2>/dev/null || true
    stop_stack "$d"
done

# ---- report ---------------------------------------------------------------------------------
{
    printf 'B\t%s\nITERS\t%s\nRATE\t%s\nLATENCY_MS\t%s\ncores\t%s\n' "$B" "$ITERS" "$RATE" "$LATENCY_MS" "$(nproc)"
    printf 'bins\t%s\ndate\t%s\n' "$(basename "$BIN")" "$(date -u '+%Y-%m-%d %H:%M UTC')"
    printf 'uptime_before\t%s\nuptime_after\t%s\n' "${UPTIME_BEFORE##*load average: }" "$(uptime | sed 's/.*load average: //')"
    printf 'command\tB=%s ITERS=%s WAVES="%s" BURN=%s MODES="%s" REPEAT=%s SETTLE=%s FILL=%s WEENV_BIN=%s integration/bench/rollout.sh\n' "$B" "$ITERS" "$WAVES" "${BURN:-0}" "$MODES" "${REPEAT:-0}" "${SETTLE:-0}" "${FILL:-true}" "${WEENV_BIN:-target/debug}"
} >"$OUT/meta.tsv"
[ -f "$CACHE/out/table1.md" ] && cp "$CACHE/out/table1.md" "$OUT/table1.md"
if [ -x "$BIN/examples/rollout_report" ]; then
    "$BIN/examples/rollout_report" "$OUT" || fail=1
else
    (cd "$ROOT" && cargo run -q -p weenv-integration --example rollout_report -- "$OUT") || fail=1
fi
python3 "$BENCH_DIR/rollout_phases.py" "$OUT" | tee "$OUT/phases.md" || fail=1
log "report: $OUT/report.md, per iteration: $OUT/phases.md"
exit $fail
