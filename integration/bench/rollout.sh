#!/usr/bin/env bash
# Rollout benchmark (issue 12, deliverable 3) — skeleton: on one node, a rollout iteration
# starts B environments at once and runs every task to its reward; $ITERS iterations, the
# first on a fresh node (cold), the next ones on the same node (images/layers present);
# registry behind a $RATE HTB-shaped link serving the workload's storage (lib.sh).
# Modes (MODES, space-separated):
#   bundles   static bundles (bundles/TASK:H, gzip), stock overlayfs, full pull (ctr pull + run)
#   dynamic   dynamic assembly: dynamic/TASK:1 with overlayfs, the harness pip-installed at init
#             from the workload's wheelhouse (bind-mounted; a local wheelhouse, not the link)
#   plans     composed plans via weenv: `weenv run PLAN` (compose, lazy pull, at-init patch, run)
# Per environment: init latency (request -> the agent's AGENT_START), task time (AGENT_START ->
# exit), reward vs the task's expected reward (deliverable 4: a mismatch is reported and makes
# the script exit 1); per iteration: wall time and bytes received over the link.
# Output: a markdown report on stdout (and $OUT/report.md with OUT=dir) plus the raw per-
# environment rows ($OUT/envs.tsv).
# Not yet: bundles lazily via weenv (needs the workload built with BUNDLES_WEENV=1), start-up
# profiles, the elastic shim, plots (plotters).
# Needs root, the workload (integration/bench/workload/build.sh), containerd, ctr, runc,
# docker-registry, ip, tc and the workspace binaries (release for published numbers).
# Env: B (8), ITERS (3), MODES ("bundles dynamic plans"), RATE (200mbit), LATENCY_MS (5).
set -euo pipefail

B=${B:-8}
ITERS=${ITERS:-3}
MODES=${MODES:-"bundles dynamic plans"}
RATE=${RATE:-200mbit}
LATENCY_MS=${LATENCY_MS:-5}
CACHE=${CACHE:-/var/tmp/weenv-workload}
BIN=${WEENV_BIN:-$(cd "$(dirname "$0")/../.." && pwd)/target/debug}
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/lib.sh"
bench_need containerd ctr runc docker-registry ip tc bc
bench_need_bins weenv-snapshotter weenv
WL="$CACHE/out/workload.json"
[ -f "$WL" ] || { echo "no workload in $CACHE: run integration/bench/workload/build.sh" >&2; exit 2; }
bench_workdir weenv-rollout
OUT=${OUT:-$W/out}; mkdir -p "$OUT"

shaped_registry "$RATE" "$LATENCY_MS" "$CACHE/registry"
python3 "$HERE/workload/workload.py" plans "$WL" "$REG" "$W/plans" >/dev/null
log "registry at $REG ($RATE, +${LATENCY_MS} ms); plans rendered in $W/plans"

# The environments of iteration $1: B (task, harness) pairs, round-robin over T x H.
pairs() {
    python3 - "$WL" "$1" "$B" <<'EOF'
import json, sys
w = json.load(open(sys.argv[1])); it, b = int(sys.argv[2]), int(sys.argv[3])
ps = [(t["id"], h, t["expected_reward"]) for t in w["tasks"] for h in sorted(w["harnesses"])]
for k in range(b):
    t, h, r = ps[((it - 1) * b + k) % len(ps)]
    print(t, h, r)
EOF
}

# One environment: $1 mode, $2 run dir, $3 id, $4 task, $5 harness; stdout to $2/env-$3.out.
env_run() {
    local mode=$1 d=$2 id=$3 t=$4 h=$5 C="ctr -a $2/ctd.sock"
    case $mode in
        bundles)
            $C images pull -q --plain-http "$REG/bundles/$t:$h" >/dev/null 2>&1 || true
            $C run --rm "$REG/bundles/$t:$h" "$id" ;;
        dynamic)
            $C images pull -q --plain-http "$REG/dynamic/$t:1" >/dev/null 2>&1 || true
            $C run --rm --env "HARNESS=$h" \
                --mount "type=bind,src=$CACHE/out/wheelhouse,dst=/wheelhouse,options=rbind:ro" \
                "$REG/dynamic/$t:1" "$id" ;;
        plans)
            "$BIN/weenv" --config "$d/snap.toml" run "$W/plans/$t--$h.toml" --image "$REG/envs/$t:$h" \
                -a "$d/ctd.sock" --plain-http --id "$id" --cache-dir "$d/resolve-cache" ;;
    esac
}

printf 'mode\titer\tenv\ttask\tharness\tinit_s\ttask_s\treward\texpected\n' >"$OUT/envs.tsv"
declare -A WALL BYTES
fail=0
for mode in $MODES; do
    d="$W/run-$mode"; start_stack "$d" true
    for it in $(seq "$ITERS"); do
        pairs "$it" >"$d/pairs-$it"
        b0=$(rx); t0=$(now); k=0; EP=()
        while read -r t h exp; do
            k=$((k + 1))
            ( tr=$(now); env_run "$mode" "$d" "e$it-$k" "$t" "$h" >"$d/env-$it-$k.out" 2>"$d/env-$it-$k.err" || true
              echo "$tr $(now) $t $h $exp" >"$d/env-$it-$k.meta" ) &
            EP+=($!)
        done <"$d/pairs-$it"
        wait "${EP[@]}"   # not a bare wait: the daemon, containerd and registry are children too
        t1=$(now); b1=$(rx)
        WALL[$mode-$it]=$(echo "$t1 - $t0" | bc); BYTES[$mode-$it]=$((b1 - b0))
        for k in $(seq "$B"); do
            read -r tr te t h exp <"$d/env-$it-$k.meta"
            st=$(awk '/^AGENT_START/{print $2}' "$d/env-$it-$k.out")
            rw=$(awk '/^AGENT_REWARD/{print $2}' "$d/env-$it-$k.out")
            init=$([ -n "$st" ] && echo "$st - $tr" | bc || echo NA)
            task=$([ -n "$st" ] && echo "$te - $st" | bc || echo NA)
            [ "${rw:-x}" = "$exp" ] || { fail=1; log "$mode iteration $it env $k ($t $h): reward ${rw:-none}, expected $exp (see $d/env-$it-$k.err)"; }
            printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$mode" "$it" "$k" "$t" "$h" "$init" "$task" "${rw:-none}" "$exp" >>"$OUT/envs.tsv"
        done
        log "$mode iteration $it: ${WALL[$mode-$it]} s, $((BYTES[$mode-$it] / 1000000)) MB"
    done
    stop_stack "$d"
done

# ---- report ---------------------------------------------------------------------------------
{
    echo "# Rollout benchmark (skeleton)"
    echo
    echo "B = $B environments per iteration, $ITERS iterations (the first cold), $RATE + ${LATENCY_MS} ms, $(nproc) cores."
    echo
    echo "| mode | init median (s) | init p90 (s) | task median (s) | rewards as expected | $(for i in $(seq "$ITERS"); do printf 'iter %s (s) | ' "$i"; done)MB iter 1 |"
    echo "|---|---:|---:|---:|---:|$(for i in $(seq "$ITERS"); do printf -- '---:|'; done)---:|"
    for mode in $MODES; do
        col() { awk -F'\t' -v m="$mode" -v c="$1" '$1==m && $c!="NA" {print $c}' "$OUT/envs.tsv"; }
        med=$(col 6 | median)
        p90=$(col 6 | sort -g | awk '{a[NR]=$1} END {i=int(NR*0.9+0.999); if (i<1) i=1; print a[i]}')
        tmed=$(col 7 | median)
        ok=$(awk -F'\t' -v m="$mode" '$1==m && $8==$9' "$OUT/envs.tsv" | wc -l)
        all=$(awk -F'\t' -v m="$mode" '$1==m' "$OUT/envs.tsv" | wc -l)
        printf '| %s | %.2f | %.2f | %.2f | %s/%s | ' "$mode" "$med" "$p90" "$tmed" "$ok" "$all"
        for i in $(seq "$ITERS"); do printf '%.1f | ' "${WALL[$mode-$i]}"; done
        printf '%s |\n' "$((BYTES[$mode-1] / 1000000))"
    done
} | tee "$OUT/report.md"
exit $fail
