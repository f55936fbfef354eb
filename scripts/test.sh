#!/usr/bin/env bash
# What CI runs: formatting, lints, and every test including the privileged end-to-end ones
# (they start their own registry, containerd and weenv daemons on temp dirs and free ports).
# Needs root and the packages from scripts/deps.sh. Every step runs even if an earlier one
# failed (so one report shows everything); the exit status is non-zero if any step failed.
# Extra arguments for the test harness: WEENV_TEST_ARGS (e.g. "--test-threads=1").
set -uo pipefail
cd "$(dirname "$0")/.."
if ! command -v cargo >/dev/null && [ -x "${CARGO_HOME:-$HOME/.cargo}/bin/cargo" ]; then
  export PATH="${CARGO_HOME:-$HOME/.cargo}/bin:$PATH"
fi

failed=()
step() {
  local name=$1; shift
  printf '\n==> %s\n' "$name"
  local t0=$SECONDS
  if "$@"; then
    printf '==> %s: ok (%ss)\n' "$name" $((SECONDS - t0))
  else
    printf '==> %s: FAILED (%ss)\n' "$name" $((SECONDS - t0))
    failed+=("$name")
  fi
}

# The declared rust-version must be what Cargo.lock really needs (highest rust-version of a
# locked dependency); a lock update that needs a newer Rust fails here until it is raised.
step "rust-version covers Cargo.lock" scripts/check_msrv.py
# No declared dependency that nothing uses (cargo machete + the workspace table; ~1 s).
step "no unused dependencies" scripts/check_deps.sh
step "cargo fmt --check" cargo fmt --all -- --check
step "cargo clippy -D warnings" cargo clippy --workspace --all-targets -- -D warnings
# The Python SDK: lint and format (its tests run against a real service in
# integration/tests/envd_python.rs; deps from scripts/python_deps.sh).
step "python ruff" sh -c 'cd python && ruff check . && ruff format --check .'
test_log=$(mktemp)
trap 'rm -f "$test_log"' EXIT
run_tests() {
  # shellcheck disable=SC2086
  cargo test --workspace --no-fail-fast -- --include-ignored ${WEENV_TEST_ARGS:-} 2>&1 | tee "$test_log"
}
step "cargo test (incl. ignored)" run_tests
# The shim's elastic scenarios again on cgroup v2, in the VM of scripts/vm-cgroup2.sh (this
# machine binds cpu/memory to v1): a short subset (CPU burst, memory pressure, persistent OOM,
# admission); the image is built once and cached under /var/tmp (cold build ~2 min). The
# whole v2 suite (+ lifecycle, memory growth, the CRI pod): scripts/vm-shim-tests.sh
# (shim/README.md).
run_vm_tests() {
  WEENV_VM_TESTS=shim_elastic scripts/vm-shim-tests.sh cpu_burst memory_pressure persistent_oom admission 2>&1 |
    tee -a "$test_log"
}
step "shim e2e on cgroup v2 (VM, subset)" run_vm_tests
# Every fuzz target of format/fuzz for a short budget (installs cargo-fuzz if missing).
step "fuzz smoke (20 s per target)" scripts/fuzz.sh 20

# One closing line for the whole run (cargo prints one "test result" per test binary), last.
summary() {
  awk '/^test result:/ { for (i = 1; i <= NF; i++) { if ($(i) ~ /^passed;?$/) p += $(i-1); if ($(i) ~ /^failed;?$/) f += $(i-1) } }
     END { printf "tests: %d passed, %d failed\n", p, f }' "$test_log"
}

if [ -n "${WEENV_TEST_SUMMARY:-}" ]; then summary > "$WEENV_TEST_SUMMARY"; fi
if [ ${#failed[@]} -gt 0 ]; then
  printf '\nFAILED: %s\n' "${failed[*]}"
  summary
  exit 1
fi
printf '\nall checks passed\n'
summary
