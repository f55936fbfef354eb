#!/usr/bin/env python3
"""What the weenv daemon did during one phase of a benchmark: the difference of two
`weenv metrics` snapshots (Prometheus text), as deterministic counts.

Usage: phase_metrics.py BEFORE.prom AFTER.prom [--tsv] | phase_metrics.py --keys
Prints one line: registry requests, compressed bytes fetched by priority (on demand and
read-ahead, start-up prefetch, fill), disk-cache hits and misses, FUSE requests (lookup, read,
open, getattr, all), frames of background requests readers took (demand that a queued
prefetch or fill request held), busy CPU intervals. With --tsv: `key<TAB>value` lines.
Used by harness_import.sh and rollout.sh (per phase / iteration).
"""

from __future__ import annotations

import re
import sys

LINE = re.compile(r"^(\w+)(\{[^}]*\})?\s+(\S+)$")

# (output key, metric name, label selector or None for the unlabelled series)
KEYS: list[tuple[str, str, str | None]] = [
    ("requests", "weenv_fetch_range_requests_total", None),
    ("demand_bytes", "weenv_fetch_bytes_on_demand_total", None),
    ("prefetch_bytes", "weenv_fetch_bytes_prefetch_total", None),
    ("fill_bytes", "weenv_fetch_bytes_fill_total", None),
    ("l2_hits", "weenv_cache_l2_hits_total", None),
    ("l2_misses", "weenv_cache_l2_misses_total", None),
    ("taken", "weenv_fetch_link_promotions_total", None),
    ("busy_cpu", "weenv_fill_cpu_busy_intervals_total", None),
    ("fuse_lookup", "weenv_fuse_ops_total", 'op="lookup"'),
    ("fuse_read", "weenv_fuse_ops_total", 'op="read"'),
    ("fuse_open", "weenv_fuse_ops_total", 'op="open"'),
    ("fuse_getattr", "weenv_fuse_ops_total", 'op="getattr"'),
]


def parse(path: str) -> dict[tuple[str, str], float]:
    out: dict[tuple[str, str], float] = {}
    with open(path) as f:
        for line in f:
            m = LINE.match(line.strip())
            if not m:
                continue
            labels = (m.group(2) or "").strip("{}")
            try:
                out[(m.group(1), labels)] = float(m.group(3))
            except ValueError:
                continue
    return out


def deltas(
    before: dict[tuple[str, str], float], after: dict[tuple[str, str], float]
) -> dict[str, int]:
    d: dict[str, int] = {}
    for key, name, sel in KEYS:
        lab = sel or ""
        d[key] = int(after.get((name, lab), 0) - before.get((name, lab), 0))
    d["fuse_all"] = int(
        sum(v for (n, _), v in after.items() if n == "weenv_fuse_ops_total")
        - sum(v for (n, _), v in before.items() if n == "weenv_fuse_ops_total")
    )
    return d


def main() -> int:
    if "--keys" in sys.argv:
        for k in [k for k, _, _ in KEYS] + ["fuse_all"]:
            print(k)
        return 0
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    if len(args) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    d = deltas(parse(args[0]), parse(args[1]))
    if "--tsv" in sys.argv:
        for k, v in d.items():
            print(f"{k}\t{v}")
    else:

        def mb(b: int) -> str:
            return f"{b / 1e6:.1f}"

        print(
            f"requests {d['requests']}, MB demand {mb(d['demand_bytes'])} prefetch {mb(d['prefetch_bytes'])} "
            f"fill {mb(d['fill_bytes'])}, L2 hits {d['l2_hits']} misses {d['l2_misses']}, taken {d['taken']}, "
            f"FUSE lookup {d['fuse_lookup']} read {d['fuse_read']} open {d['fuse_open']} "
            f"all {d['fuse_all']}, busy CPU intervals {d['busy_cpu']}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
