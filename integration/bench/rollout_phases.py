#!/usr/bin/env python3
"""Per-iteration table of a rollout.sh run (OUT dir): for each mode and iteration, the
environments, the wall time and its ratio to the `bundles` mode's same iteration (same run),
the median init and task times, MB on the link, and for the weenv modes what the daemon did
(phases.tsv: registry requests, MB on demand / prefetch / fill, FUSE requests).

Usage: rollout_phases.py OUT   (markdown on stdout)
"""

from __future__ import annotations

import csv
import statistics
import sys
from collections import defaultdict


def rows(path: str) -> list[dict[str, str]]:
    try:
        with open(path) as f:
            return list(csv.DictReader(f, delimiter="\t"))
    except FileNotFoundError:
        return []


def num(s: str | None) -> float | None:
    try:
        return float(s) if s not in (None, "", "NA", "none") else None
    except ValueError:
        return None


def med(v: list[float]) -> float | None:
    return statistics.median(v) if v else None


def fmt(x: float | None, nd: int = 2) -> str:
    return "–" if x is None else f"{x:.{nd}f}"


def table(out: str) -> str:
    iters = rows(f"{out}/iterations.tsv")
    envs = rows(f"{out}/envs.tsv")
    phases = {(r["mode"], r["iter"]): r for r in rows(f"{out}/phases.tsv")}
    by: dict[tuple[str, str], list[dict[str, str]]] = defaultdict(list)
    for e in envs:
        by[(e["mode"], e["iter"])].append(e)
    wall = {(r["mode"], r["iter"]): num(r["wall_s"]) for r in iters}
    head = (
        "| mode | iter | envs | wall (s) | ÷ bundles | init median (s) | task median (s) | "
        "MB on link | requests | MB demand / prefetch / fill | FUSE requests |"
    )
    lines = [
        head,
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|",
    ]
    for r in iters:
        m, i = r["mode"], r["iter"]
        es = by[(m, i)]
        w = wall.get((m, i))
        base = wall.get(("bundles", i))
        ratio = w / base if w is not None and base and m != "bundles" else None
        init = med([x for x in (num(e["init_s"]) for e in es) if x is not None])
        task = med([x for x in (num(e["task_s"]) for e in es) if x is not None])
        link = num(r["link_bytes"])
        p = phases.get((m, i))
        if p and m != "bundles" and m != "dynamic":
            req = p["requests"]
            mbs = " / ".join(
                f"{int(p[k]) / 1e6:.1f}"
                for k in ("demand_bytes", "prefetch_bytes", "fill_bytes")
            )
            fuse = p["fuse_all"]
        else:
            req, mbs, fuse = "–", "–", "–"
        lines.append(
            f"| {m} | {i} | {len(es)} | {fmt(w)} | {fmt(ratio)} | {fmt(init)} | {fmt(task)} | "
            f"{fmt(link / 1e6 if link is not None else None, 1)} | {req} | {mbs} | {fuse} |"
        )
    return "\n".join(lines) + "\n"


def main() -> int:
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    sys.stdout.write(table(sys.argv[1]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
