#!/usr/bin/env bash
# What CI runs: formatting, lints, and every test including the privileged end-to-end ones
# (they start their own registry, containerd and weenv daemons on temp dirs and free ports).
# Needs root and the packages from scripts/deps.sh.
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n==> %s\n' "$*"; }

step "cargo fmt --check"
cargo fmt --all -- --check
step "cargo clippy --workspace --all-targets -- -D warnings"
cargo clippy --workspace --all-targets -- -D warnings
step "cargo test --workspace -- --include-ignored"
cargo test --workspace -- --include-ignored ${WEENV_TEST_ARGS:-}
step "all checks passed"
