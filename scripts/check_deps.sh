#!/usr/bin/env bash
# Fails when a declared dependency is used by nothing:
# - `cargo machete` over every Cargo.toml below the repo (a crate's [dependencies],
#   [dev-dependencies] and [build-dependencies] that its sources never name; false positives
#   are listed in that crate's [package.metadata.cargo-machete] `ignored`, with the reason);
# - entries of the root [workspace.dependencies] table that no member takes.
# Installs cargo-machete (`cargo install --locked cargo-machete`) if missing. Takes ~1 s.
set -uo pipefail
cd "$(dirname "$0")/.."
if ! command -v cargo >/dev/null && [ -x "${CARGO_HOME:-$HOME/.cargo}/bin/cargo" ]; then
  export PATH="${CARGO_HOME:-$HOME/.cargo}/bin:$PATH"
fi
if ! cargo machete --version >/dev/null 2>&1; then
  echo "cargo-machete not found: installing it" >&2
  cargo install --locked cargo-machete || exit 1
fi
status=0
cargo machete || status=1
members=$(cargo metadata --format-version 1 --no-deps --offline 2>/dev/null \
  | python3 -c 'import json,sys; print("\n".join(p["manifest_path"] for p in json.load(sys.stdin)["packages"]))')
for dep in $(sed -n '/^\[workspace\.dependencies\]/,/^\[/p' Cargo.toml | grep -oE '^[A-Za-z0-9_-]+'); do
  # `dep.workspace = true` or `dep = { workspace = true, ... }` in some member.
  # shellcheck disable=SC2086
  if ! grep -qE "^${dep}(\.workspace| *= *\{[^}]*workspace *= *true)" $members; then
    echo "[workspace.dependencies] declares ${dep}, which no member uses"
    status=1
  fi
done
exit $status
