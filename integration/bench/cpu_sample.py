#!/usr/bin/env python3
"""CPU seconds used on the host by process name, from /proc, until a stop file exists.

Usage: cpu_sample.py STOP_FILE > totals.tsv
Samples every process's utime + stime each 0.5 s; at the end prints `name<TAB>cpu_s` per
process name (the kernel's comm, 15 characters), largest first. Processes that start and end
between two samples are missed (the rollout's tasks run for seconds). Used by rollout.sh
(CPU_SAMPLE=1) to split an iteration's CPU between the tasks, the daemon and containerd.
"""
import os
import sys
import time

HZ = os.sysconf("SC_CLK_TCK")


def snap():
    d = {}
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            with open(f"/proc/{p}/stat") as f:
                s = f.read()
        except OSError:
            continue
        name = s[s.index("(") + 1 : s.rindex(")")]
        f = s[s.rindex(")") + 2 :].split()
        # (start time, name) tells a reused pid from the process seen before.
        d[(p, f[19])] = (name, int(f[11]) + int(f[12]))
    return d


def main():
    stop = sys.argv[1]
    # CPU already used when sampling starts is not counted; a process that starts later is
    # counted from 0.
    seen = {k: t for k, (_, t) in snap().items()}
    total = {}
    while True:
        done = os.path.exists(stop)
        for k, (name, t) in snap().items():
            dt = t - seen.get(k, 0)
            if dt > 0:
                total[name] = total.get(name, 0) + dt / HZ
            seen[k] = t
        if done:
            break
        time.sleep(0.5)
    for name, s in sorted(total.items(), key=lambda kv: -kv[1]):
        print(f"{name}\t{s:.2f}")


if __name__ == "__main__":
    main()
