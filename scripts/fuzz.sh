#!/usr/bin/env bash
# Build and run every fuzz target of format/fuzz for a time budget each (default 30 s), seeded
# with small GNU tar archives (ustar, gnu, pax) for the tar targets. Exits non-zero
# if any target crashes (the input is left in format/fuzz/artifacts/<target>/). Prints one line
# per target: executions, exec/s, result.
# usage: scripts/fuzz.sh [SECONDS] [TARGET...]
# Needs cargo-fuzz (installed with `cargo install --locked cargo-fuzz` if missing) and a
# nightly compiler or RUSTC_BOOTSTRAP=1 on stable (set here unless already set).
set -uo pipefail
cd "$(dirname "$0")/.."
if ! command -v cargo >/dev/null && [ -x "${CARGO_HOME:-$HOME/.cargo}/bin/cargo" ]; then
  export PATH="${CARGO_HOME:-$HOME/.cargo}/bin:$PATH"
fi
secs=${1:-30}
shift || true
export RUSTC_BOOTSTRAP=${RUSTC_BOOTSTRAP:-1}
if ! cargo fuzz --version >/dev/null 2>&1; then
  echo "cargo-fuzz not found: installing it" >&2
  cargo install --locked cargo-fuzz || exit 1
fi
cd format
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  mapfile -t targets < <(cargo fuzz list)
fi
for t in "${targets[@]}"; do
  if ! cargo fuzz build "$t" >/dev/null 2>&1; then
    echo "fuzz target $t does not build: cd format && cargo fuzz build $t" >&2
    exit 1
  fi
done

# Seeds: tiny trees archived by GNU tar in three dialects (skipped if tar is missing).
seeds=$(mktemp -d)
trap 'rm -rf "$seeds"' EXIT
if command -v tar >/dev/null; then
  tree=$seeds/tree
  mkdir -p "$tree/d/sub" "$tree/$(printf 'n%.0s' {1..120})"
  printf 'alpha' >"$tree/d/a"
  head -c 3000 /dev/zero | tr '\0' 'b' >"$tree/d/sub/b"
  ln -s a "$tree/d/s"
  ln "$tree/d/a" "$tree/d/h"
  chmod 4755 "$tree/d/sub/b"
  for fmt in ustar gnu pax; do
    tar --format=$fmt --owner=0 --group=0 -C "$tree" -cf "$seeds/$fmt.tar" . 2>/dev/null ||
      tar --format=$fmt -C "$tree" -cf "$seeds/$fmt.tar" d
  done
fi

failed=0
for t in "${targets[@]}"; do
  corpus=fuzz/corpus/$t
  mkdir -p "$corpus"
  case $t in
    tar_*) cp "$seeds"/*.tar "$corpus/" 2>/dev/null ;;
  esac
  log=$(mktemp)
  # -rss_limit_mb: a parser that allocates without bound is a finding too.
  if cargo fuzz run "$t" "$corpus" -- -max_total_time="$secs" -rss_limit_mb=2048 \
      -print_final_stats=1 >"$log" 2>&1; then
    res=ok
  else
    res=CRASH
    failed=1
    grep -E "panicked|ERROR|SUMMARY|Test unit written" "$log" | head -8
  fi
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
  printf 'fuzz %-14s %6ss  %10s execs  %7s exec/s  %s\n' "$t" "$secs" "${execs:-?}" "${rate:-?}" "$res"
  rm -f "$log"
done
exit $failed
