"""Agentic rollout through weenv-envd and the Python SDK (issue 26): one iteration of B
environments of one mode, each driven from outside by a deterministic stand-in policy.

Per environment: create (time to the first exec answered = readiness), open a session, T turns
of (think time, one tool call: ls, grep, cat, the harness import, an edit through the files
API, the tests), each turn also probing the round trip of a session command (`true`) and of a
one-off exec (`true`); then the candidate diff (the edited files against the task's buggy
tree) is applied as the task patch of a second, clean environment (the evaluator group's
`/eval/run.sh`), whose REWARD is checked against the task's expected reward. With --fault, one
more environment (memory 64 MiB, at most 128 MiB, elastic) grows its memory past its top tier:
it must be reported failed with the shim's cause while the others finish right.

Modes (only the backend differs; all through the same service and runtime):
  plans    weenv plans: composed on the node, lazy layers, the bug patch at init
  bundles  static bundle images (bundles/TASK:H) on containerd's overlayfs snapshotter
  dynamic  dynamic/TASK:1 on overlayfs; the harness pip-installed as the first exec
           (wheelhouse bind-mounted read-only)

Writes a JSON report (--out); prints one summary line.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import difflib
import json
import random
import re
import statistics
import sys
import time
import tomllib
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1] / "python" / "src"))
sys.path.insert(0, str(HERE / "workload"))

from agent import parse, revert
from weenv import AsyncClient, AsyncEnvironment, EnvSpec, Resources

HARNESS_IMPORT = "/opt/harness/bin/python -c 'import openai, anthropic, pydantic, httpx; print(1)'"
TESTS = "cd /src/repo && /opt/eval/bin/python -m pytest -q -x -p no:cacheprovider $WEENV_TESTS 2>&1 | tail -2"
GROW = ("python3 -c 'import time\na=[]\nfor i in range(8192):\n a.append(bytearray(1<<20))\n"
        " if i % 16 == 0: time.sleep(0.01)\nprint(len(a))'")


def pct(xs: list[float], p: float) -> float:
    if not xs:
        return float("nan")
    s = sorted(xs)
    k = min(len(s) - 1, max(0, round(p / 100 * (len(s) - 1))))
    return s[k]


def rss_kib(pids: list[int]) -> int:
    tot = 0
    for p in pids:
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    tot += int(line.split()[1])
        except OSError:
            pass
    return tot


def shim_pids(ctd_sock: str) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            cmd = (d / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if cmd and cmd[0].endswith((b"containerd-shim-weenv-v1", b"containerd-shim-runc-v2")) and \
                ctd_sock.encode() in cmd:
            out.append(int(d.name))
    return out


def unified(path: str, old: str, new: str) -> str:
    return "".join(difflib.unified_diff(
        old.splitlines(keepends=True), new.splitlines(keepends=True),
        fromfile=f"a/{path}", tofile=f"b/{path}"))


class Run:
    def __init__(self, a: argparse.Namespace) -> None:
        self.a = a
        self.w = json.loads(Path(a.workload).read_text())
        self.tasks = {t["id"]: t for t in self.w["tasks"]}
        self.client: AsyncClient

    def pairs(self) -> list[tuple[str, str, str]]:
        ps = [(t["id"], h, str(t["expected_reward"])) for t in self.w["tasks"]
              for h in sorted(self.w["harnesses"])]
        return [ps[((self.a.iteration - 1) * self.a.b + k) % len(ps)] for k in range(self.a.b)]

    def spec(self, task: str, harness: str, *, labels: dict[str, str]) -> EnvSpec:
        a = self.a
        if a.mode == "plans":
            return EnvSpec(plan=f"{a.plans}/{task}--{harness}.toml", labels=labels)
        if a.mode == "bundles":
            return EnvSpec(image=f"{a.reg}/bundles/{task}:{harness}", snapshotter="overlayfs",
                           labels=labels)
        return EnvSpec(image=f"{a.reg}/dynamic/{task}:1", snapshotter="overlayfs", labels=labels,
                       mounts=[f"type=bind,src={a.wheelhouse},dst=/wheelhouse,options=rbind:ro"],
                       env={"HARNESS": harness, "WHEELHOUSE": "/wheelhouse"})

    def eval_spec(self, task: str, harness: str, diff_vs_buggy: str, diff_vs_pristine: str
                  ) -> EnvSpec:
        lab = {"bench": "envd-rollout", "role": "evaluator"}
        if self.a.mode == "plans":
            plan = tomllib.loads(Path(f"{self.a.plans}/{task}--{harness}.toml").read_text())
            return EnvSpec(groups=plan["groups"], task=diff_vs_pristine or None,
                           task_root="/src/repo", labels=lab)
        s = self.spec(task, harness, labels=lab)
        s.task = diff_vs_buggy or None
        s.task_root = "/src/repo"
        return s

    async def one(self, k: int, task: str, harness: str, expected: str, t_req: float) -> dict:
        a, t = self.a, self.tasks[task]
        rec: dict = {"k": k, "task": task, "harness": harness, "expected": expected}
        rng = random.Random(f"{a.seed}/{a.iteration}/{k}")
        env: AsyncEnvironment = await self.client.create(
            self.spec(task, harness, labels={"bench": "envd-rollout", "k": str(k)}))
        rec["create_s"] = time.monotonic() - t_req
        rec["timings_ms"] = env.timings
        try:
            if a.mode == "dynamic":
                r = await env.exec(
                    "set -e; python3 -m venv /opt/harness && /opt/harness/bin/pip install -q "
                    "--no-index --disable-pip-version-check --find-links /wheelhouse "
                    f"-r /wheelhouse/harness-{harness}.txt", timeout=900)
                assert r.exit_code == 0, r.stderr[-500:]
            else:
                r = await env.exec(["true"])
            rec["ready_s"] = time.monotonic() - t_req
            s = await env.session(cwd="/src/repo")
            bug = base64.b64decode(t["fix_b64"]).decode()
            files = [p for p, _ in parse(bug)]
            symbols = re.findall(r"def (\w+)", bug) or re.findall(r"[A-Za-z_]\w{3,}", bug)[:1]
            buggy: dict[str, str] = {}
            plan = ["ls", "grep", "cat", "import", "edit", "test"]
            while len(plan) < a.turns:
                plan.insert(2, rng.choice(["grep", "cat", "ls"]))
            turns = []
            for i, tool in enumerate(plan[: a.turns]):
                await asyncio.sleep(rng.uniform(a.think_lo, a.think_hi))
                t0 = time.monotonic()
                if tool == "ls":
                    out = (await s.run("ls -R . | head -100")).exit_code
                elif tool == "grep":
                    sym = symbols[i % len(symbols)] if symbols else "def"
                    out = (await s.run(f"grep -rn '{sym}' . | head -20")).exit_code
                elif tool == "cat":
                    out = (await s.run(f"cat {files[i % len(files)]} | head -200")).exit_code
                elif tool == "import":
                    out = (await s.run(HARNESS_IMPORT, timeout=600)).exit_code
                elif tool == "edit":
                    out = 0
                    for p in files:
                        buggy[p] = (await env.files.read(f"/src/repo/{p}")).decode()
                    if t.get("solve") in (1, "1", True):
                        # The stand-in's fix: the bug's hunks reverted (what agent.py does).
                        tmp = Path(a.scratch) / f"e{a.iteration}-{k}"
                        for p, text in buggy.items():
                            (tmp / p).parent.mkdir(parents=True, exist_ok=True)
                            (tmp / p).write_text(text)
                        revert(bug, str(tmp))
                        for p in files:
                            await env.files.write(f"/src/repo/{p}", (tmp / p).read_text())
                else:
                    out = (await s.run(TESTS, timeout=600)).exit_code
                dt = time.monotonic() - t0
                # Probes: a session round trip and a one-off exec of `true`.
                p0 = time.monotonic()
                await s.run("true")
                p1 = time.monotonic()
                await env.exec(["true"])
                p2 = time.monotonic()
                turns.append({"tool": tool, "s": dt, "rc": out, "session_s": p1 - p0,
                              "exec_s": p2 - p1})
            rec["turns"] = turns
            # The candidate diff: edited files against the buggy tree (and, for plans, against
            # the pristine tree: the bug reverted).
            d_buggy, d_pristine = [], []
            for p in files:
                final = (await env.files.read(f"/src/repo/{p}")).decode()
                d_buggy.append(unified(p, buggy[p], final))
                tmp = Path(a.scratch) / f"p{a.iteration}-{k}"
                (tmp / p).parent.mkdir(parents=True, exist_ok=True)
                (tmp / p).write_text(buggy[p])
                revert(bug, str(tmp))
                d_pristine.append(unified(p, (tmp / p).read_text(), final))
            await s.close()
        finally:
            await env.close()
        t0 = time.monotonic()
        ev = await self.client.create(self.eval_spec(task, harness, "".join(d_buggy),
                                                     "".join(d_pristine)))
        try:
            r = await ev.exec(["/bin/sh", "/eval/run.sh"], timeout=600)
            m = re.search(rb"REWARD (\S+)", r.stdout)
            rec["reward"] = m.group(1).decode() if m else "none"
        finally:
            await ev.close()
        rec["eval_s"] = time.monotonic() - t0
        rec["done_s"] = time.monotonic() - t_req
        return rec

    async def fault(self, t_req: float) -> dict:
        task, harness, _ = self.pairs()[0]
        s = self.spec(task, harness, labels={"bench": "envd-rollout", "role": "fault"})
        s.resources = Resources(memory=64 << 20, memory_max=128 << 20)
        env = await self.client.create(s)
        try:
            r = await env.exec(GROW, timeout=300)
            for _ in range(100):
                if (await env.refresh()).state != "running":
                    break
                await asyncio.sleep(0.1)
            return {"killed": r.killed, "exit_code": r.exit_code, "cause": r.cause,
                    "state": env.info.state, "state_cause": env.info.cause,
                    "s": time.monotonic() - t_req}
        finally:
            await env.close()

    async def memory_idle(self) -> dict:
        """Resident memory of the service + daemon (and the shims) per idle environment."""
        a = self.a
        pids = [int(x) for x in a.pids.split(",") if x] if a.pids else []
        before, shims0 = rss_kib(pids), rss_kib(shim_pids(a.ctd_sock))
        n = a.idle
        specs = [self.spec(*self.pairs()[i % a.b][:2], labels={"bench": "idle"}) for i in range(n)]
        envs = await self.client.create_many(specs, parallelism=8)
        await asyncio.sleep(3)
        after, shims1 = rss_kib(pids), rss_kib(shim_pids(a.ctd_sock))
        await self.client.delete([e.id for e in envs if isinstance(e, AsyncEnvironment)])
        return {"n": n, "service_daemon_kib_per_env": (after - before) / n,
                "shim_kib_per_env": (shims1 - shims0) / n}

    async def latency_compare(self) -> dict:
        """One environment: `true` through `ctr task exec`, Exec and a session, interleaved."""
        a = self.a
        task, harness, _ = self.pairs()[0]
        env = await self.client.create(self.spec(task, harness, labels={"bench": "latency"}))
        ctr, sdk, ses = [], [], []
        try:
            s = await env.session()
            for i in range(a.compare):
                t0 = time.monotonic()
                p = await asyncio.create_subprocess_exec(
                    "ctr", "-a", a.ctd_sock, "-n", a.namespace, "task", "exec", "--exec-id",
                    f"cmp{i}", env.id, "true")
                await p.wait()
                t1 = time.monotonic()
                await env.exec(["true"])
                t2 = time.monotonic()
                await s.run("true")
                t3 = time.monotonic()
                ctr.append(t1 - t0)
                sdk.append(t2 - t1)
                ses.append(t3 - t2)
        finally:
            await env.close()
        return {"n": a.compare, "ctr_exec_p50_ms": pct(ctr, 50) * 1e3,
                "sdk_exec_p50_ms": pct(sdk, 50) * 1e3, "session_p50_ms": pct(ses, 50) * 1e3,
                "ratio": pct(sdk, 50) / pct(ctr, 50)}

    async def main(self) -> dict:
        a = self.a
        self.client = AsyncClient(a.address)  # inside the running loop
        out: dict = {"mode": a.mode, "iteration": a.iteration, "b": a.b, "turns": a.turns,
                     "think": [a.think_lo, a.think_hi]}
        t_req = time.monotonic()
        jobs = [self.one(k, t, h, e, t_req) for k, (t, h, e) in enumerate(self.pairs())]
        if a.fault:
            jobs.append(self.fault(t_req))
        res = await asyncio.gather(*jobs, return_exceptions=True)
        out["wall_s"] = time.monotonic() - t_req
        envs = [r for r in res[: a.b]]
        out["errors"] = [repr(r) for r in envs if isinstance(r, BaseException)]
        envs = [r for r in envs if isinstance(r, dict)]
        out["envs"] = envs
        if a.fault:
            out["fault"] = res[-1] if isinstance(res[-1], dict) else {"error": repr(res[-1])}
        if a.idle:
            out["idle"] = await self.memory_idle()
        if a.compare:
            out["compare"] = await self.latency_compare()
        ready = [e["ready_s"] for e in envs]
        ses = [t["session_s"] for e in envs for t in e["turns"]]
        exe = [t["exec_s"] for e in envs for t in e["turns"]]
        out["summary"] = {
            "ready_p50": pct(ready, 50), "ready_p99": pct(ready, 99),
            "session_p50_ms": pct(ses, 50) * 1e3, "session_p99_ms": pct(ses, 99) * 1e3,
            "exec_p50_ms": pct(exe, 50) * 1e3, "exec_p99_ms": pct(exe, 99) * 1e3,
            "rewards_ok": sum(e["reward"] == e["expected"] for e in envs), "n": len(envs),
            "done_p50": statistics.median([e["done_s"] for e in envs]) if envs else None,
        }
        await self.client.close()
        return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--address", required=True)
    p.add_argument("--workload", required=True)
    p.add_argument("--reg", required=True)
    p.add_argument("--plans", required=True)
    p.add_argument("--wheelhouse", required=True)
    p.add_argument("--mode", choices=["plans", "bundles", "dynamic"], required=True)
    p.add_argument("--iteration", type=int, default=1)
    p.add_argument("--b", type=int, default=8)
    p.add_argument("--turns", type=int, default=6)
    p.add_argument("--think-lo", type=float, default=1.0)
    p.add_argument("--think-hi", type=float, default=8.0)
    p.add_argument("--seed", default="26")
    p.add_argument("--fault", action="store_true")
    p.add_argument("--idle", type=int, default=0, help="also measure memory with N idle envs")
    p.add_argument("--pids", default="", help="service and daemon pids (memory)")
    p.add_argument("--ctd-sock", default="")
    p.add_argument("--namespace", default="envd-bench")
    p.add_argument("--compare", type=int, default=0,
                   help="also time N `true` via ctr task exec vs Exec vs a session")
    p.add_argument("--scratch", default="/tmp/envd-rollout")
    p.add_argument("--out", required=True)
    a = p.parse_args()
    out = asyncio.run(Run(a).main())
    Path(a.out).write_text(json.dumps(out, indent=1))
    s = out["summary"]
    print(f"{a.mode} it{a.iteration} B={a.b}: wall {out['wall_s']:.1f} s, ready p50 "
          f"{s['ready_p50']:.2f} s p99 {s['ready_p99']:.2f} s, session p50 "
          f"{s['session_p50_ms']:.1f} ms, exec p50 {s['exec_p50_ms']:.1f} ms, rewards "
          f"{s['rewards_ok']}/{s['n']}, errors {len(out['errors'])}"
          + (f", fault {out['fault']}" if a.fault else "")
          + (f", idle {out['idle']}" if a.idle else "")
          + (f", compare {out['compare']}" if a.compare else ""))


if __name__ == "__main__":
    main()
