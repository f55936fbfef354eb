#!/usr/bin/env python3
"""Simulate directory prefetch policies against a recorded access trace (issue 15 analysis).

Inputs: TOC JSON lines of the image's layers (`cargo run -q -p weenv-integration --example
toc_dump -- BLOB...`, one line per entry) and a start-up profile (`weenv profile`: files in
first-read order, e.g. the one harness_import.sh keeps in LOGS_DIR). Walks the trace and counts
the dependent misses (a file whose frames are not yet fetched) and the bytes fetched on demand,
for on-demand reads only, and for the rule "after N misses of a layer, the first read of a file
in directory D also fetches every small file of D (depth 0) and of its subdirectories down to
`depth`". Optimistic: a prefetch counts as arrived before the next read.

Usage: dir_prefetch_sim.py TOC.jsonl PROFILE
"""
import collections
import json
import sys

SMALL = 256 << 10


def load(toc_path):
    toc, frames_of, dirfiles = {}, collections.defaultdict(dict), collections.defaultdict(list)
    for line in open(toc_path):
        e = json.loads(line)
        b = e["blob"]
        toc[e["path"]] = (b, e)
        for fr in e["frames"]:
            frames_of[b][fr[0]] = fr
        if e["kind"] == "File" and e["frames"]:
            d = e["path"].rsplit("/", 1)[0] if "/" in e["path"] else ""
            dirfiles[(b, d)].append(e)
    return toc, frames_of, dirfiles


def subtree_frames(dirfiles, b, d, depth):
    out = set()
    for (bb, dd), es in dirfiles.items():
        if bb != b:
            continue
        inside = dd == d or (depth > 0 and dd.startswith(d + "/") and dd[len(d) + 1:].count("/") < depth)
        if inside:
            for e in es:
                if e["size"] <= SMALL:
                    out.update(fr[0] for fr in e["frames"])
    return out


def run(trace, toc, frames_of, dirfiles, n, prefetch, depth=0):
    have = collections.defaultdict(set)
    misses, demand, spec = 0, 0, 0
    per_layer, touched = collections.Counter(), set()
    for p in trace:
        if p not in toc:
            continue
        b, e = toc[p]
        need = [fr[0] for fr in e["frames"] if fr[0] not in have[b]]
        if need:
            misses += 1
            per_layer[b] += 1
            for i in need:
                have[b].add(i)
                demand += frames_of[b][i][2]
        d = p.rsplit("/", 1)[0]
        if prefetch and per_layer[b] >= n and (b, d) not in touched:
            touched.add((b, d))
            for i in subtree_frames(dirfiles, b, d, depth) - have[b]:
                have[b].add(i)
                spec += frames_of[b][i][2]
    return misses, demand / 1e6, spec / 1e6


def main():
    toc, frames_of, dirfiles = load(sys.argv[1])
    trace = [l.split("\t")[0].strip().lstrip("/") for l in open(sys.argv[2]) if l.strip()]
    print("policy                       misses  on-demand MB  prefetched MB")
    m, d, s = run(trace, toc, frames_of, dirfiles, 0, False)
    print(f"on demand only               {m:6d}  {d:12.1f}  {s:13.1f}")
    for n in (0, 20, 40):
        for depth in (0, 1, 2):
            m, d, s = run(trace, toc, frames_of, dirfiles, n, True, depth)
            print(f"dir prefetch N={n:<2d} depth={depth}   {m:6d}  {d:12.1f}  {s:13.1f}")


if __name__ == "__main__":
    main()
