"""Create -> first exec through weenv-envd on a warm node (issue 26, target <= 0.5 s p50 and
<= 1.5 s p99 at B = 32): B environments requested at once (one Create call each, as an RL
framework's workers do), each with the task's patch at init; readiness = the first exec
(`true`) answered. A warm-up round (untimed) composes the plan and fills the node's caches;
then ROUNDS timed rounds, each deleting its environments before the next.

Per B: ready p50/p99, create p50/p99, the first exec p50, the service's per-step timings
(mean ms), and the pool hits (`pool` step present). Run through
`integration/tests/envd_python.rs` (its stack: registry, weenv daemon, containerd, the weenv
shim; WEENV_ENVD_RUN names this script) or against any service:

    python3 envd_create.py --address unix:///run/weenv/envd.sock --plan PLAN --b 8,32
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1] / "python" / "src"))

from weenv import AsyncClient, EnvSpec  # noqa: E402

PATCH = """--- a/app.py
+++ b/app.py
@@ -1,2 +1,2 @@
 def answer():
-    return 42
+    return 41
"""


def pct(xs: list[float], p: float) -> float:
    s = sorted(xs)
    k = min(len(s) - 1, max(0, round(p / 100 * (len(s) - 1))))
    return s[k]


async def one(c: AsyncClient, spec: EnvSpec, t0: float) -> dict:
    env = await c.create(spec)
    t_create = time.monotonic() - t0
    r = await env.exec(["true"])
    t_ready = time.monotonic() - t0
    assert r.exit_code == 0, r
    return {"id": env.id, "create_s": t_create, "ready_s": t_ready, "timings": env.timings}


async def round_(c: AsyncClient, spec: EnvSpec, b: int) -> list[dict]:
    t0 = time.monotonic()
    recs = await asyncio.gather(*(one(c, spec, t0) for _ in range(b)))
    # a pause as an RL step has (the policy thinks): the service refills what it pools
    await asyncio.sleep(1.0)
    await c.delete([r["id"] for r in recs])
    return list(recs)


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--address", default=os.environ.get("WEENV_ENVD_ADDRESS"))
    ap.add_argument("--plan", default=os.environ.get("WEENV_TEST_PLAN"))
    ap.add_argument("--b", default=os.environ.get("B", "1,8,32"))
    ap.add_argument("--rounds", type=int, default=int(os.environ.get("ROUNDS", "3")))
    ap.add_argument("--settle", type=float, default=float(os.environ.get("SETTLE", "0")))
    ap.add_argument("--out", default=os.environ.get("OUT"))
    a = ap.parse_args()
    c = AsyncClient(a.address)
    spec = EnvSpec(plan=a.plan, task=PATCH, task_root="/src/repo", labels={"bench": "create"})
    report = []
    for b in [int(x) for x in a.b.split(",")]:
        await round_(c, spec, b)  # warm-up
        if a.settle:
            await asyncio.sleep(a.settle)
        recs: list[dict] = []
        for _ in range(a.rounds):
            recs += await round_(c, spec, b)
            if a.settle:
                await asyncio.sleep(a.settle)
        ready = [r["ready_s"] for r in recs]
        create = [r["create_s"] for r in recs]
        first = [r["ready_s"] - r["create_s"] for r in recs]
        steps: dict[str, list[float]] = {}
        for r in recs:
            for k, v in r["timings"].items():
                steps.setdefault(k, []).append(v)
        row = {
            "b": b,
            "n": len(recs),
            "ready_p50_s": pct(ready, 50),
            "ready_p99_s": pct(ready, 99),
            "create_p50_s": pct(create, 50),
            "create_p99_s": pct(create, 99),
            "first_exec_p50_s": pct(first, 50),
            "pool_hits": sum(1 for r in recs if "pool" in r["timings"]),
            "steps_mean_ms": {k: round(statistics.mean(v), 1) for k, v in steps.items()},
        }
        report.append(row)
        print(
            f"B={b} n={row['n']}: ready p50 {row['ready_p50_s']:.3f} s p99 "
            f"{row['ready_p99_s']:.3f} s; create p50 {row['create_p50_s']:.3f} s; first exec "
            f"p50 {row['first_exec_p50_s']:.3f} s; pool hits {row['pool_hits']}; steps (mean ms) "
            f"{row['steps_mean_ms']}",
            flush=True,
        )
    if a.out:
        Path(a.out).write_text(json.dumps(report, indent=1))
    await c.close()


if __name__ == "__main__":
    asyncio.run(main())
