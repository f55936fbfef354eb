#!/usr/bin/env bash
# The shim's end-to-end tests on cgroup v2: builds the shim and the test binaries on this
# machine, runs them as root inside the cgroup-v2-only VM of scripts/vm-cgroup2.sh (private
# containerd 1.6 + runc 1.1 from Debian, busybox image built offline), prints their output
# and exits with their status.
#
#   scripts/vm-shim-tests.sh [TEST-FILTER...]
#
# Env:
#   WEENV_VM_TESTS        test targets of weenv-integration (default "shim_elastic shim_lifecycle
#                         shim_cri"; empty: none, e.g. with WEENV_VM_COST=1 for the cost alone)
#   WEENV_VM_CGROUP       v2 (default) or v1: the same VM booted with the v1 controllers
#   WEENV_VM_SHIM_PROFILE debug (default) or release: which build of the shim runs in the VM
#   WEENV_VM_COST=1       also run the monitoring-cost benchmark (shim/tests/monitor_cost.rs;
#                         WEENV_VM_COST_OPT=2 builds it at opt-level 2 in target/opt2 as
#                         integration/bench/shim_elastic.sh does, default: the debug build)
#   WEENV_TEST_INTERVAL_MS  the shim's sampling interval in the tests (default 200)
#   WEENV_TEST_BURST_ITERS  busy-loop iterations of the CPU burst (default 60000 here: the
#                         emulated CPU runs the host's 300000 in ~50 s, these in ~10 s)
#   WEENV_VM_OUT          directory for the guest's test logs (default: a temp dir, removed)
#   WEENV_VM_TIMEOUT      seconds before the VM is stopped (default 1500)
set -euo pipefail
cd "$(dirname "$0")/.."
tests=${WEENV_VM_TESTS-shim_elastic shim_lifecycle shim_cri}
profile=${WEENV_VM_SHIM_PROFILE:-debug}
mode=${WEENV_VM_CGROUP:-v2}
target=${CARGO_TARGET_DIR:-target}
work=$(mktemp -d "${TMPDIR:-/tmp}/weenv-vm-tests.XXXXXX")
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/bin"

# Executables of `cargo test --no-run` for the given cargo arguments (one per line).
test_exes() {
  cargo test "$@" --no-run --message-format=json 2>/dev/null | python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["profile"]["test"]:
        print(m["target"]["name"], m["executable"])'
}

if [ "$profile" = release ]; then
  cargo build -q --release -p weenv-shim --bin containerd-shim-weenv-v1
else
  cargo build -q -p weenv-shim --bin containerd-shim-weenv-v1
fi
cp "$target/$profile/containerd-shim-weenv-v1" "$work/bin/"
targs=()
for t in $tests; do targs+=(--test "$t"); done
: >"$work/exes"
if [ ${#targs[@]} -gt 0 ]; then
  cargo build -q -p weenv-integration "${targs[@]}" 2>&1 | tail -5 || true
  test_exes -p weenv-integration "${targs[@]}" >"$work/exes"
fi
if [ "${WEENV_VM_COST:-0}" = 1 ]; then
  if [ "${WEENV_VM_COST_OPT:-0}" = 2 ]; then
    CARGO_TARGET_DIR="$target/opt2" CARGO_PROFILE_DEV_OPT_LEVEL=2 test_exes -p weenv-shim --test monitor_cost >>"$work/exes"
  else
    test_exes -p weenv-shim --test monitor_cost >>"$work/exes"
  fi
fi
[ -s "$work/exes" ] || { echo "vm-shim-tests: no test executable built" >&2; exit 2; }
while read -r name exe; do cp "$exe" "$work/bin/$name"; done <"$work/exes"

filter=""
[ $# -gt 0 ] && filter=$(printf '%q ' "$@")
{
  echo 'export WEENV_SHIM_DIR=/payload/bin TMPDIR=/tmp RUST_BACKTRACE=1'
  # The CRI plugin copies the host's /etc/hosts and /etc/resolv.conf into host-network pods
  # (shim_cri); the minimal image has neither.
  echo '[ -e /etc/hosts ] || echo "127.0.0.1 localhost" > /etc/hosts; [ -e /etc/resolv.conf ] || : > /etc/resolv.conf'
  echo "export WEENV_TEST_INTERVAL_MS=${WEENV_TEST_INTERVAL_MS:-200} WEENV_TEST_BURST_ITERS=${WEENV_TEST_BURST_ITERS:-60000}"
  echo 'rc=0'
  while read -r name _; do
    case $name in
      monitor_cost) args="--ignored --nocapture" ;;
      *) args="--include-ignored --test-threads=1 --nocapture $filter" ;;
    esac
    echo "echo '==> $name'"
    echo "t0=\$(cut -d' ' -f1 /proc/uptime)"
    echo "/payload/bin/$name $args 2>&1 | tee out/$name.log; s=\$(tail -n 3 out/$name.log | grep -c '^test result: ok')"
    echo "[ \"\$s\" = 1 ] || rc=1"
    echo "echo \"==> $name: \$( [ \"\$s\" = 1 ] && echo ok || echo FAILED ) (\$(awk -v a=\$t0 '{printf \"%.0f\", \$1 - a}' /proc/uptime) s of VM time)\""
  done <"$work/exes"
  echo 'exit $rc'
} >"$work/run-tests.sh"

out_args=()
[ -n "${WEENV_VM_OUT:-}" ] && out_args=(--out "$WEENV_VM_OUT")
scripts/vm-cgroup2.sh run --cgroup "$mode" --timeout "${WEENV_VM_TIMEOUT:-1500}" "${out_args[@]}" \
  --copy "$work/bin:bin" --copy "$work/run-tests.sh" -- sh /payload/run-tests.sh
