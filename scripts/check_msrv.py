#!/usr/bin/env python3
"""Fails when a locked dependency needs a newer Rust than the workspace declares.

Reads `cargo metadata` (the packages Cargo.lock resolves for the host platform, build and
dev dependencies included) and compares each package's `rust-version` with the
`rust-version` of the workspace members. Prints the packages that need the most recent Rust.
Usage: scripts/check_msrv.py [extra cargo metadata args, e.g. --offline]
"""
import json
import subprocess
import sys


def version(v):
    """`1.88` and `1.88.0` compare equal."""
    parts = [int(x) for x in v.split(".")]
    return tuple(parts + [0] * (3 - len(parts)))


def main():
    host = subprocess.run(["rustc", "-vV"], capture_output=True, text=True, check=True).stdout
    triple = next(l.split(": ", 1)[1] for l in host.splitlines() if l.startswith("host: "))
    meta = json.loads(subprocess.run(
        ["cargo", "metadata", "--format-version", "1", "--locked",
         "--filter-platform", triple, *sys.argv[1:]],
        capture_output=True, text=True, check=True).stdout)
    members = set(meta["workspace_members"])
    resolved = {n["id"] for n in meta["resolve"]["nodes"]}
    declared = {p["rust_version"] for p in meta["packages"] if p["id"] in members}
    if len(declared) != 1 or None in declared:
        print(f"workspace members declare rust-version {sorted(map(str, declared))}; want one")
        return 1
    msrv = declared.pop()
    deps = sorted(((version(p["rust_version"]), p["name"], p["version"])
                   for p in meta["packages"]
                   if p["id"] in resolved and p["id"] not in members and p.get("rust_version")),
                  reverse=True)
    need = deps[0][0] if deps else (0,)
    top = ", ".join(f"{n} {v} ({'.'.join(map(str, r))})" for r, n, v in deps if r == need)
    if need > version(msrv):
        print(f"rust-version {msrv} is too old: the lock file needs {'.'.join(map(str, need))}: {top}")
        return 1
    print(f"rust-version {msrv} covers every locked dependency (highest needed: {top})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
