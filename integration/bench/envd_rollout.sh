#!/usr/bin/env bash
# Agentic rollout through the environment service (issue 26): per mode a fresh stack
# (weenv daemon + containerd + weenv-envd with the weenv shim), the registry behind a $RATE
# HTB-shaped link (+$LATENCY_MS), then ITERS iterations of envd_rollout.py: B environments at
# once, each driven from outside by a stand-in policy (T turns with think time
# THINK_LO..THINK_HI s: ls, grep, cat, the harness import, an edit through the files API, the
# tests; session and exec probes every turn), the reward from a second clean environment
# (the candidate diff as its task patch), every reward checked. Iteration 1 is on a cold node
# (new roots, caches dropped); the next ones rerun the first one's environments on the warm
# node. FAULT=1: one more environment exhausts its memory at its top tier (128 MiB).
# IDLE=N: after the iterations, N idle environments measure resident memory per environment.
# Modes (MODES): plans (weenv plans) bundles (static bundles, overlayfs) dynamic (harness
# pip-installed as the first exec, overlayfs). Needs root, the workload (workload/build.sh),
# the Python SDK deps (scripts/python_deps.sh), and weenv-snapshotter, weenv-envd,
# containerd-shim-weenv-v1 in WEENV_BIN. Output: OUT/*.json, OUT/table.md.
# Env: B (8), ITERS (2), T (6), THINK_LO (1), THINK_HI (8), RATE (200mbit), LATENCY_MS (5),
#      FAULT (1), IDLE (0), COMPARE (20: `true` via ctr task exec vs Exec vs a session), OUT (/var/tmp/weenv-envd-rollout-DATE), CACHE (/var/tmp/weenv-workload).
set -euo pipefail
B=${B:-8}; ITERS=${ITERS:-2}; T=${T:-6}; THINK_LO=${THINK_LO:-1}; THINK_HI=${THINK_HI:-8}
MODES=${MODES:-"plans bundles dynamic"}
RATE=${RATE:-200mbit}; LATENCY_MS=${LATENCY_MS:-5}; FAULT=${FAULT:-1}; IDLE=${IDLE:-0}
CACHE=${CACHE:-/var/tmp/weenv-workload}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BIN=${WEENV_BIN:-$ROOT/target/debug}
case $BIN in /*) ;; *) BIN=$ROOT/$BIN ;; esac
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/lib.sh"
bench_need containerd ctr runc docker-registry ip tc python3
bench_need_bins weenv-snapshotter weenv-envd containerd-shim-weenv-v1
WL="$CACHE/out/workload.json"
[ -f "$WL" ] || { echo "no workload in $CACHE: run integration/bench/workload/build.sh" >&2; exit 2; }
export PATH="$BIN:$PATH"
bench_workdir weenv-envd-rollout
OUT=${OUT:-/var/tmp/weenv-envd-rollout-$(date +%Y%m%d-%H%M%S)}; mkdir -p "$OUT"
shaped_registry "$RATE" "$LATENCY_MS" "$CACHE/registry"
python3 "$HERE/workload/workload.py" plans "$WL" "$REG" "$W/plans" >/dev/null
log "registry at $REG ($RATE, +${LATENCY_MS} ms); B=$B T=$T think $THINK_LO..$THINK_HI s"

for mode in $MODES; do
    d="$W/run-$mode"; drop_caches; start_stack "$d" true
    "$BIN/weenv-envd" --socket "$d/envd.sock" --address "$d/ctd.sock" --namespace envd-bench \
        --plain-http "$REG" --state-dir "$d/envd" --shim-status-dir "$d/shim-status" \
        --shim-ledger-dir "$d/shim-ledger" >"$d/envd.log" 2>&1 &
    ENVD_PID=$!; PIDS+=($ENVD_PID)
    for _ in $(seq 100); do [ -S "$d/envd.sock" ] && break; sleep 0.1; done
    for it in $(seq "$ITERS"); do
        extra=()
        [ "$FAULT" = 1 ] && extra+=(--fault)
        [ "$it" = "$ITERS" ] && [ "$IDLE" -gt 0 ] && extra+=(--idle "$IDLE" --pids "$ENVD_PID,$SNAP_PID")
        [ "$it" = "$ITERS" ] && [ "${COMPARE:-20}" -gt 0 ] && extra+=(--compare "${COMPARE:-20}")
        python3 "$HERE/envd_rollout.py" --address "unix://$d/envd.sock" --workload "$WL" --reg "$REG" \
            --plans "$W/plans" --wheelhouse "$CACHE/out/wheelhouse" --mode "$mode" --iteration 1 \
            --b "$B" --turns "$T" --think-lo "$THINK_LO" --think-hi "$THINK_HI" --scratch "$d/scratch" \
            --ctd-sock "$d/ctd.sock" --out "$OUT/$mode-$it.json" "${extra[@]}" | tee -a "$OUT/summary.txt"
    done
    cp "$d/envd.log" "$OUT/envd-$mode.log" 2>/dev/null || true
    kill "$ENVD_PID" 2>/dev/null; wait "$ENVD_PID" 2>/dev/null || true
    stop_stack "$d"
done
python3 "$HERE/envd_rollout_table.py" "$OUT" | tee "$OUT/table.md"
