#!/bin/sh
# Groups/plans benchmark: compose latency (cold/warm resolution cache), at-init mutation
# latency (median of 100), artifact counts for T=200 tasks x 4 repos x H=3 harnesses.
# Needs root, docker-registry, skopeo, umoci (the test builds its busybox image offline).
set -eu
cd "$(dirname "$0")/../.."
exec cargo test -p weenv-integration --test groups_bench -- --ignored --nocapture plan_and_mutation_bench
