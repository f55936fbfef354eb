"""Agent stand-in of the weenv workload (integration/bench/workload).

What a real agent harness does at start, without a model behind it:
1. prints its first instruction's time (`AGENT_START <epoch>`: the end of the environment's
   init latency, measured by the rollout benchmark against the request time);
2. imports its LLM SDKs (openai, anthropic, pydantic, httpx) and builds clients and a
   pydantic trajectory model (no network request);
3. explores the repository: walks it, reads every source file, greps for the symbols the
   task's diff touches;
4. if AGENT_SOLVE=1, "solves" the task by reverting the bug-introducing patch it is given in
   TASK_FIX (base64 of the unified diff; the stand-in's oracle);
5. runs the evaluator (/eval/run.sh), which writes /logs/reward.txt; prints `AGENT_REWARD r`.

`revert` is also what the workload builder uses to validate tasks (the fix that the tests must
accept), so the two cannot disagree.
"""

import time

T0 = time.time()

import base64  # noqa: E402
import os  # noqa: E402
import re  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402

HUNK = re.compile(r"^@@ -\d+(?:,\d+)? \+\d+(?:,\d+)? @@")


def parse(diff):
    """[(path, [(old_lines, new_lines)])] of a unified diff (paths without a/ b/)."""
    files, cur, hunk = [], None, None
    for line in diff.splitlines(keepends=True):
        if line.startswith("--- "):
            continue
        if line.startswith("+++ "):
            path = line[4:].strip().split("\t")[0]
            if path.startswith("b/"):
                path = path[2:]
            cur = (path, [])
            files.append(cur)
            hunk = None
        elif HUNK.match(line):
            hunk = ([], [])
            cur[1].append(hunk)
        elif hunk is not None and line[:1] in (" ", "-", "+"):
            body = line[1:]
            if line[0] in (" ", "-"):
                hunk[0].append(body)
            if line[0] in (" ", "+"):
                hunk[1].append(body)
    return files


def revert(diff, root):
    """Undo `diff` (as `patch -R -p1` would) in the tree at `root`; raises if a hunk is missing."""
    for path, hunks in parse(diff):
        p = os.path.join(root, path)
        with open(p) as f:
            text = f.read()
        for old, new in hunks:
            new_s, old_s = "".join(new), "".join(old)
            if text.count(new_s) < 1:
                raise ValueError(f"{path}: hunk not found")
            text = text.replace(new_s, old_s, 1)
        with open(p, "w") as f:
            f.write(text)


def main():
    import anthropic
    import httpx
    import openai
    import pydantic

    t1 = time.time()
    print(f"AGENT_IMPORTED {t1 - T0:.3f}", flush=True)

    class Step(pydantic.BaseModel):
        tool: str
        args: dict
        output: str = ""

    oa = openai.OpenAI(api_key="unused", base_url="http://127.0.0.1:9/v1")
    an = anthropic.Anthropic(api_key="unused", base_url="http://127.0.0.1:9")
    http = httpx.Client(timeout=1.0)
    steps = [Step(tool="init", args={"sdks": [openai.__version__, anthropic.__version__]})]

    root = os.environ.get("REPO", "/src/repo")
    diff = base64.b64decode(os.environ.get("TASK_FIX", "")).decode()
    symbols = set(re.findall(r"def (\w+)", diff)) | {
        w for w in re.findall(r"[A-Za-z_]\w{3,}", diff) if not w.startswith(("test", "self"))
    }
    files = lines = hits = 0
    for d, ds, fs in os.walk(root):
        ds.sort()
        for name in sorted(fs):
            if not name.endswith((".py", ".txt", ".rst", ".toml", ".cfg")):
                continue
            with open(os.path.join(d, name), errors="replace") as f:
                text = f.read()
            files += 1
            lines += text.count("\n")
            hits += sum(text.count(s) for s in list(symbols)[:20])
    steps.append(Step(tool="explore", args={"root": root}, output=f"{files} files {lines} lines {hits} hits"))
    print(f"AGENT_EXPLORED {files} files {lines} lines", flush=True)

    if os.environ.get("AGENT_SOLVE") == "1" and diff:
        revert(diff, root)
        steps.append(Step(tool="edit", args={"revert": True}))
        print("AGENT_EDITED", flush=True)

    r = subprocess.run(["/bin/sh", "/eval/run.sh"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    tail = r.stdout.decode(errors="replace").strip().splitlines()[-1:] or [""]
    with open("/logs/reward.txt") as f:
        reward = f.read().strip()
    steps.append(Step(tool="evaluate", args={}, output=tail[0]))
    http.close()
    del oa, an
    print(f"AGENT_STEPS {len(steps)}", flush=True)
    print(f"AGENT_REWARD {reward}", flush=True)
    print(f"AGENT_DONE {time.time() - T0:.3f}", flush=True)


if __name__ == "__main__":
    print(f"AGENT_START {T0:.6f}", flush=True)
    sys.exit(main())
