#!/bin/sh
# Benchmarks of the weenv shim (needs root, containerd, runc, umoci, busybox-static):
#  1. monitoring cost of one elastic round per container over real cgroup files (µs),
#     built optimised (opt-level 2) as the shim ships;
#  2. a bursty workload's completion time: elastic vs fixed 0.5 core vs unlimited.
# Env: WEENV_BENCH_RUNS (default 3), WEENV_BENCH_ITERS (default 400000),
#      WEENV_BENCH_CPUS: the small quota (default 0.5; the script runs 0.5 and 0.2).
set -eu
cd "$(dirname "$0")/../.."
cargo build -p weenv-shim
echo "== monitoring cost per container per round"
CARGO_PROFILE_DEV_OPT_LEVEL=2 cargo test -p weenv-shim --test monitor_cost -- --ignored --nocapture 2>&1 | grep -E '^(cgroup|references) '
for cpus in 0.5 0.2; do
  echo "== bursty workload, small quota $cpus core"
  WEENV_BENCH=1 WEENV_BENCH_CPUS=$cpus cargo test -p weenv-integration --test shim_bench -- --ignored --nocapture 2>&1 |
    sed -n '/^bursty workload/,/^elastic \/ unlimited/p'
done
