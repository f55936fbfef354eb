#!/usr/bin/env python3
"""Helpers of integration/bench/workload/build.sh (stdlib only).

  workload.py patches SRC OUT            bug-introducing patches of every task (from BUGS)
  workload.py validate ROOTFS SRC OUT    keep the tasks whose patch fails the tests and whose
                                         revert passes them (run in a chroot of the base +
                                         evaluator); writes OUT/tasks.json
  workload.py oci-image LAYOUT TAG CONFIG.json LAYER.tar.gz...   add an image to an OCI layout
  workload.py plans WORKLOAD.json REGISTRY OUTDIR [--pre-applied] [--suffix=S]  render plan
                                         files (S: appended to the base, harness and evaluator tags)
  workload.py table WORKLOAD.json REGISTRY   Table 1: artifacts and stored bytes per strategy
Used by integration/bench/rollout.sh:
  workload.py env-layers WORKLOAD.json REGISTRY KIND   "task harness digest,..." per environment:
                                         the layers of its plan's groups (KIND plans) or of its
                                         weenv-converted bundle (KIND bundles-weenv)
  workload.py env-bytes LAYERS PAIRS BEFORE.json AFTER.json   per environment of PAIRS (the
                                         iteration's "task harness expected" lines): registry
                                         bytes (on demand + prefetch; fill) and read bytes of
                                         its layers from the daemon's /status
                                         before/after the iteration, each layer shared equally
                                         among the environments that use it
  workload.py profile-groups WORKLOAD.json REGISTRY SUFFIX REF=GROUP...   republish groups with
                                         the prefetch annotations of profiled images: for each
                                         REF (a `weenv-convert prefetch` output), the layers of
                                         GROUP (base, evaluator, harness:vN) get REF's layer
                                         annotations; pushed as the group's tag + SUFFIX
"""

import base64
import difflib
import gzip
import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))

# Repositories: PyPI source distributions with their test suites (pytest, no other test deps).
# tests = arguments of the evaluator's pytest run, relative to the repository root.
REPOS = {
    "toolz": {"sdist": "toolz==1.2.0", "dir": "toolz-1.2.0", "tests": "toolz"},
    "six": {"sdist": "six==1.17.0", "dir": "six-1.17.0", "tests": "test_six.py"},
    "idna": {
        "sdist": "idna==3.20",
        "dir": "idna-3.20",
        "tests": "tests/test_idna.py tests/test_idna_codec.py tests/test_idna_compat.py tests/test_intranges.py",
    },
}

# Bugs: (repo, task id, file, old text, new text); the old text must occur exactly once.
BUGS = [
    ("toolz", "toolz-drop-off-by-one", "toolz/itertoolz.py",
     "    return itertools.islice(seq, n, None)\n", "    return itertools.islice(seq, n + 1, None)\n"),
    ("toolz", "toolz-take-nth-start", "toolz/itertoolz.py",
     "    return itertools.islice(seq, 0, None, n)\n", "    return itertools.islice(seq, 1, None, n)\n"),
    ("toolz", "toolz-frequencies-count", "toolz/itertoolz.py",
     "        d[item] += 1\n", "        d[item] = 1\n"),
    ("toolz", "toolz-get-in-typeerror", "toolz/dicttoolz.py",
     "    except (KeyError, IndexError, TypeError):\n        if no_default:",
     "    except (KeyError, IndexError):\n        if no_default:"),
    ("six", "six-ensure-text-encoding", "six.py",
     "    if isinstance(s, binary_type):\n        return s.decode(encoding, errors)\n    elif",
     "    if isinstance(s, binary_type):\n        return s.decode('latin-1', errors)\n    elif"),
    ("six", "six-ensure-binary-text", "six.py",
     "    if isinstance(s, text_type):\n        return s.encode(encoding, errors)\n    raise",
     "    if isinstance(s, text_type):\n        return s.encode('ascii', 'ignore')\n    raise"),
    ("six", "six-b-encoding", "six.py",
     '    def b(s):\n        return s.encode("latin-1")\n',
     '    def b(s):\n        return s.encode("utf-8")\n'),
    ("six", "six-add-metaclass-slots", "six.py",
     "        orig_vars.pop('__dict__', None)\n", "        orig_vars.pop('__slots__', None)\n"),
    ("idna", "idna-label-length", "idna/core.py",
     "    return len(label) <= 63\n", "    return len(label) < 63\n"),
    ("idna", "idna-hyphen-3-4", "idna/core.py",
     '    if label[2:4] == "--":\n', '    if label[1:3] == "--":\n'),
    ("idna", "idna-trailing-dot-length", "idna/core.py",
     "    return len(domain) <= _max_domain_length + trailing_dot\n",
     "    return len(domain) <= _max_domain_length\n"),
    ("idna", "idna-hyphen-end", "idna/core.py",
     '    if label.startswith("-") or label.endswith("-"):\n', '    if label.startswith("-"):\n'),
]


def sha256_file(p):
    h = hashlib.sha256()
    with open(p, "rb") as f:
        for b in iter(lambda: f.read(1 << 20), b""):
            h.update(b)
    return h.hexdigest()


def cmd_patches(src, out):
    """src/<repo>/... pristine trees -> out/<repo>/<task>.diff"""
    for repo, task, path, old, new in BUGS:
        with open(os.path.join(src, repo, path)) as f:
            text = f.read()
        if text.count(old) != 1:
            print(f"{task}: the old text occurs {text.count(old)} times in {path}", file=sys.stderr)
            sys.exit(1)
        after = text.replace(old, new, 1)
        diff = "".join(difflib.unified_diff(
            text.splitlines(keepends=True), after.splitlines(keepends=True), f"a/{path}", f"b/{path}"))
        os.makedirs(os.path.join(out, repo), exist_ok=True)
        with open(os.path.join(out, repo, task + ".diff"), "w") as f:
            f.write(diff)


def load_agent():
    spec = importlib.util.spec_from_file_location("agent", os.path.join(HERE, "agent.py"))
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    return m


def run_tests(rootfs, repo):
    """The evaluator's verdict on rootfs/src/repo, run in a chroot: 1 pass, 0 fail."""
    # No .pyc: a patch and its revert within one second of equal size would hit a stale .pyc.
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "WEENV_TESTS": REPOS[repo]["tests"], "HOME": "/root",
           "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1"}
    r = subprocess.run([shutil.which("chroot"), rootfs, "/bin/sh", "/eval/run.sh"], env=env,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    with open(os.path.join(rootfs, "logs/reward.txt")) as f:
        return int(f.read().strip()), r.stdout.decode(errors="replace").strip().splitlines()[0:1]


def cmd_validate(rootfs, src, out):
    """A task is kept when: pristine passes, patched fails, patched + agent.revert passes."""
    agent = load_agent()
    tasks, dropped = [], []
    work = os.path.join(rootfs, "src/repo")
    for repo in REPOS:
        shutil.rmtree(work, ignore_errors=True)
        shutil.copytree(os.path.join(src, repo), work, symlinks=True)
        ok, line = run_tests(rootfs, repo)
        if ok != 1:
            print(f"{repo}: pristine tests fail ({line}); repository dropped", file=sys.stderr)
            dropped += [t for r, t, *_ in BUGS if r == repo]
            continue
        for r, task, *_ in BUGS:
            if r != repo:
                continue
            diff_path = os.path.join(out, repo, task + ".diff")
            shutil.rmtree(work)
            shutil.copytree(os.path.join(src, repo), work, symlinks=True)
            p = subprocess.run(["patch", "-p1", "-s", "--no-backup-if-mismatch", "-d", work, "-i", diff_path])
            bad, bad_line = run_tests(rootfs, repo) if p.returncode == 0 else (None, ["patch failed"])
            with open(diff_path) as f:
                diff = f.read()
            try:
                agent.revert(diff, work)
                fixed, fixed_line = run_tests(rootfs, repo)
            except Exception as e:  # noqa: BLE001 - any failure drops the task
                fixed, fixed_line = None, [str(e)]
            verdict = "kept" if (bad == 0 and fixed == 1) else "DROPPED"
            print(f"  {task}: with patch {bad} {bad_line}, reverted {fixed} {fixed_line}: {verdict}",
                  file=sys.stderr)
            if verdict != "kept":
                dropped.append(task)
                continue
            tasks.append({"id": task, "repo": repo, "patch": f"tasks/{repo}/{task}.diff",
                          "fix_b64": base64.b64encode(diff.encode()).decode()})
    shutil.rmtree(work, ignore_errors=True)
    # Half the tasks are solved by the stand-in (expected reward 1), the others not (0).
    for i, t in enumerate(tasks):
        t["solve"] = 1 if i % 2 == 0 else 0
        t["expected_reward"] = t["solve"]
    with open(os.path.join(out, "tasks.json"), "w") as f:
        json.dump({"tasks": tasks, "dropped": dropped}, f, indent=1)
    print(f"{len(tasks)} tasks kept, {len(dropped)} dropped {dropped}", file=sys.stderr)


def cmd_oci_image(layout, tag, config_path, layers):
    """Add an image (gzip layers + config fragment) to an OCI layout; blobs are hard-linked."""
    blobs = os.path.join(layout, "blobs/sha256")
    os.makedirs(blobs, exist_ok=True)
    if not os.path.exists(os.path.join(layout, "oci-layout")):
        with open(os.path.join(layout, "oci-layout"), "w") as f:
            json.dump({"imageLayoutVersion": "1.0.0"}, f)
    with open(config_path) as f:
        frag = json.load(f)
    descs, diff_ids = [], []
    for lp in layers:
        d = sha256_file(lp)
        dst = os.path.join(blobs, d)
        if not os.path.exists(dst):
            os.link(lp, dst) if os.stat(lp).st_dev == os.stat(blobs).st_dev else shutil.copy(lp, dst)
        idf = lp + ".diffid"
        if not os.path.exists(idf):
            h = hashlib.sha256()
            with gzip.open(lp, "rb") as g:
                for b in iter(lambda: g.read(1 << 20), b""):
                    h.update(b)
            with open(idf, "w") as f:
                f.write(h.hexdigest())
        with open(idf) as f:
            diff_ids.append("sha256:" + f.read().strip())
        descs.append({"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                      "digest": "sha256:" + d, "size": os.path.getsize(lp)})
    config = {"architecture": "amd64", "os": "linux", "config": frag,
              "rootfs": {"type": "layers", "diff_ids": diff_ids}}

    def put(obj):
        b = json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()
        d = hashlib.sha256(b).hexdigest()
        with open(os.path.join(blobs, d), "wb") as f:
            f.write(b)
        return "sha256:" + d, len(b)

    cd, cs = put(config)
    md, ms = put({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                  "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": cd, "size": cs},
                  "layers": descs})
    ip = os.path.join(layout, "index.json")
    index = {"schemaVersion": 2, "manifests": []}
    if os.path.exists(ip):
        with open(ip) as f:
            index = json.load(f)
    index["manifests"] = [m for m in index["manifests"]
                          if m.get("annotations", {}).get("org.opencontainers.image.ref.name") != tag]
    index["manifests"].append({"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": md,
                               "size": ms, "annotations": {"org.opencontainers.image.ref.name": tag}})
    with open(ip, "w") as f:
        json.dump(index, f)


def task_env(t):
    """The task's environment variables (the agent stand-in's inputs)."""
    return [f"TASK_ID={t['id']}", f"AGENT_SOLVE={t['solve']}", f"TASK_FIX={t['fix_b64']}"]


def describe(tasks_json, bundles_weenv, install):
    """workload.json: every artifact's reference (repository:tag, no registry host) and the tasks."""
    with open(tasks_json) as f:
        tasks = json.load(f)["tasks"]
    hs = ["v1", "v2"]
    w = {
        "base": "weenv/base:1",
        "evaluator": "weenv/eval:1",
        "repos": {r: f"weenv/repo-{r}:1" for r in REPOS if any(t["repo"] == r for t in tasks)},
        "harnesses": {h: f"weenv/harness:{h}" for h in hs},
        "tasks": tasks,
        "mutations": {t["id"]: f"weenv/mut-{t['id']}:1" for t in tasks},
        "envs": {t["id"]: {h: f"envs/{t['id']}:{h}" for h in hs} for t in tasks},
        "bundles": {t["id"]: {h: f"bundles/{t['id']}:{h}" for h in hs} for t in tasks},
        "dynamic": {t["id"]: f"dynamic/{t['id']}:1" for t in tasks},
        "harness_install_bytes": {h: int(v) for h, v in install.items()},
    }
    if bundles_weenv:
        w["bundles_weenv"] = {t["id"]: {h: f"bundles-weenv/{t['id']}:{h}" for h in hs} for t in tasks}
    json.dump(w, sys.stdout, indent=1)


def plan_groups(w, t, h, suffix=""):
    """The plan's group references (no host), bottom to top; SUFFIX is appended to the tags of
    the base, harness and evaluator groups (their profiled copies, see profile-groups)."""
    return [w["base"] + suffix, w["repos"][t["repo"]], w["harnesses"][h] + suffix, w["evaluator"] + suffix]


def plan_text(w, reg, task, h, pre_applied, patch_rel, suffix=""):
    t = task
    groups = plan_groups(w, t, h, suffix)
    lines = ["version = 1", "groups = ["]
    lines += [f'  "{reg}/{g}",' for g in groups]
    lines.append("]")
    lines.append("")
    lines.append("[mutation]")
    if pre_applied:
        lines.append('mode = "pre-applied"')
        lines.append(f'group = "{reg}/{w["mutations"][t["id"]]}"')
    else:
        lines.append('mode = "init"')
        lines.append(f'patch = "{patch_rel}"')
        lines.append('root = "/src/repo"')
        lines.append("strip = 1")
    lines += ["", "[config.env]", f'TASK_ID = "{t["id"]}"', f'AGENT_SOLVE = "{t["solve"]}"',
              f'TASK_FIX = "{t["fix_b64"]}"', ""]
    return "\n".join(lines)


def cmd_plans(wpath, reg, outdir, pre_applied=False, suffix=""):
    """One plan per task x harness: base, repository, harness, evaluator + the task's mutation."""
    with open(wpath) as f:
        w = json.load(f)
    os.makedirs(outdir, exist_ok=True)
    wdir = os.path.dirname(os.path.abspath(wpath))
    for t in w["tasks"]:
        for h in w["harnesses"]:
            p = os.path.join(outdir, f"{t['id']}--{h}.toml")
            rel = os.path.relpath(os.path.join(wdir, t["patch"]), outdir)
            with open(p, "w") as f:
                f.write(plan_text(w, reg, t, h, pre_applied, rel, suffix))
            print(p)


MANIFEST_TYPES = ",".join([
    "application/vnd.oci.image.manifest.v1+json", "application/vnd.docker.distribution.manifest.v2+json"])


def get_manifest(reg, ref):
    """(body bytes, media type) of a manifest in a plain-HTTP registry."""
    repo, tag = ref.rsplit(":", 1)
    req = urllib.request.Request(f"http://{reg}/v2/{repo}/manifests/{tag}", headers={"Accept": MANIFEST_TYPES})
    with urllib.request.urlopen(req) as r:
        return r.read(), r.headers.get("Content-Type")


def put_manifest(reg, ref, body, media_type):
    repo, tag = ref.rsplit(":", 1)
    req = urllib.request.Request(f"http://{reg}/v2/{repo}/manifests/{tag}", data=body, method="PUT",
                                 headers={"Content-Type": media_type})
    with urllib.request.urlopen(req) as r:
        r.read()


def cmd_env_layers(wpath, reg, kind):
    with open(wpath) as f:
        w = json.load(f)
    cache = {}

    def layers(ref):
        if ref not in cache:
            cache[ref] = [l["digest"] for l in json.loads(get_manifest(reg, ref)[0])["layers"]]
        return cache[ref]

    for t in w["tasks"]:
        for h in sorted(w["harnesses"]):
            if kind == "plans":
                ds = [d for g in plan_groups(w, t, h) for d in layers(g)]
            elif kind == "bundles-weenv":
                ds = layers(w["bundles_weenv"][t["id"]][h])
            else:
                raise SystemExit(f"unknown kind {kind}")
            print(t["id"], h, ",".join(ds))


def cmd_env_bytes(layers_path, pairs_path, before_path, after_path):
    """One line per environment of the iteration: fetched (on demand + start-up prefetch),
    filled (background fill) and read bytes."""
    lay = {}
    with open(layers_path) as f:
        for line in f:
            t, h, ds = line.split()
            lay[(t, h)] = ds.split(",")
    with open(pairs_path) as f:
        pairs = [tuple(line.split()[:2]) for line in f if line.strip()]

    def per_layer(p):
        try:
            with open(p) as f:
                st = json.load(f)
        except (OSError, ValueError):
            return {}
        return {l["digest"]: l for l in st.get("layers", [])}

    before, after = per_layer(before_path), per_layer(after_path)
    users = {}
    for pr in pairs:
        for d in set(lay.get(pr, [])):
            users[d] = users.get(d, 0) + 1
    for pr in pairs:
        fetched = filled = read = 0.0
        for d in set(lay.get(pr, [])):
            a = after.get(d)
            if a is None:
                continue
            b = before.get(d, {})
            delta = lambda k: max(0, a.get(k, 0) - b.get(k, 0))  # noqa: E731
            fill = min(delta("bytes_fetched"), delta("bytes_filled"))
            fetched += (delta("bytes_fetched") - fill) / users[d]
            filled += fill / users[d]
            read += a.get("bytes_read", 0) / users[d]
        print(int(fetched), int(filled), int(read))


def cmd_profile_groups(wpath, reg, suffix, pairs):
    with open(wpath) as f:
        w = json.load(f)
    names = {"base": w["base"], "evaluator": w["evaluator"]}
    names.update({f"harness:{h}": r for h, r in w["harnesses"].items()})
    for pair in pairs:
        ref, groups = pair.split("=", 1)
        ann = {l["digest"]: l.get("annotations", {}) for l in json.loads(get_manifest(reg, ref)[0])["layers"]}
        for g in groups.split(","):
            gref = names[g]
            body, mt = get_manifest(reg, gref)
            m = json.loads(body)
            n = 0
            for l in m["layers"]:
                a = {k: v for k, v in ann.get(l["digest"], {}).items() if "prefetch" in k}
                if a:
                    l.setdefault("annotations", {}).update(a)
                    n += 1
            put_manifest(reg, gref + suffix, json.dumps(m, separators=(",", ":")).encode(), mt)
            print(f"{gref + suffix}: prefetch annotations on {n}/{len(m['layers'])} layers (from {ref})",
                  file=sys.stderr)


def registry_blobs(reg, ref):
    """{digest: size} of a manifest (itself, config, layers) in a plain-HTTP registry."""
    repo, tag = ref.rsplit(":", 1)
    req = urllib.request.Request(f"http://{reg}/v2/{repo}/manifests/{tag}", headers={"Accept": ",".join([
        "application/vnd.oci.image.manifest.v1+json", "application/vnd.docker.distribution.manifest.v2+json"])})
    with urllib.request.urlopen(req) as r:
        body = r.read()
    m = json.loads(body)
    out = {"sha256:" + hashlib.sha256(body).hexdigest(): len(body)}
    out[m["config"]["digest"]] = m["config"]["size"]
    for layer in m["layers"]:
        out[layer["digest"]] = layer["size"]
    return out


def dir_bytes(p):
    n = 0
    for d, _, fs in os.walk(p):
        for f in fs:
            q = os.path.join(d, f)
            if os.path.isfile(q) and not os.path.islink(q):
                n += os.path.getsize(q)
    return n


def cmd_table(wpath, reg):
    with open(wpath) as f:
        w = json.load(f)
    wdir = os.path.dirname(os.path.abspath(wpath))
    T, H = len(w["tasks"]), len(w["harnesses"])
    groups = [w["base"], w["evaluator"], *w["repos"].values(), *w["harnesses"].values()]
    patches = sum(os.path.getsize(os.path.join(wdir, t["patch"])) for t in w["tasks"])

    def stored(refs):
        blobs = {}
        for r in refs:
            blobs.update(registry_blobs(reg, r))
        return sum(blobs.values())

    rows = [("weenv groups, mutations at init", len(groups), stored(groups) + patches,
             f"{len(groups)} groups + {T} patches ({patches:,} B)", 0)]
    rows.append(("weenv groups, pre-applied mutations", len(groups) + T,
                 stored(groups + list(w["mutations"].values())), "", 0))
    bundles = [r for hs in w["bundles"].values() for r in hs.values()]
    rows.append(("static bundles (one image per task x harness)", len(bundles), stored(bundles), "", 0))
    if w.get("bundles_weenv"):
        bw = [r for hs in w["bundles_weenv"].values() for r in hs.values()]
        rows.append(("static bundles, weenv-converted", len(bw), stored(bw), "", 0))
    dyn = list(w["dynamic"].values())
    wh = os.path.join(wdir, "wheelhouse")
    per_start = w.get("harness_install_bytes", {})
    avg = sum(per_start.values()) / max(1, len(per_start))
    rows.append(("dynamic assembly (one image per task + wheelhouse)", len(dyn) + 1,
                 stored(dyn) + dir_bytes(wh), f"wheelhouse {dir_bytes(wh):,} B", avg))
    print(f"Table 1 — T = {T} tasks over {len(w['repos'])} repositories, H = {H} harnesses\n")
    print("| strategy | artifacts | stored bytes | installed per start | notes |")
    print("|---|---:|---:|---:|---|")
    for name, n, b, note, inst in rows:
        print(f"| {name} | {n} | {b:,} | {int(inst):,} | {note} |")


def main():
    a = sys.argv[1:]
    if not a:
        print(__doc__)
        sys.exit(2)
    c = a[0]
    if c == "patches":
        cmd_patches(a[1], a[2])
    elif c == "validate":
        cmd_validate(a[1], a[2], a[3])
    elif c == "oci-image":
        cmd_oci_image(a[1], a[2], a[3], a[4:])
    elif c == "plans":
        suffix = next((x.split("=", 1)[1] for x in a[4:] if x.startswith("--suffix=")), "")
        cmd_plans(a[1], a[2], a[3], "--pre-applied" in a[4:], suffix)
    elif c == "env-layers":
        cmd_env_layers(a[1], a[2], a[3])
    elif c == "env-bytes":
        cmd_env_bytes(a[1], a[2], a[3], a[4])
    elif c == "profile-groups":
        cmd_profile_groups(a[1], a[2], a[3], a[4:])
    elif c == "table":
        cmd_table(a[1], a[2])
    elif c == "repos":
        print(" ".join(REPOS))
    elif c in ("repo-dir", "repo-tests", "repo-sdist"):
        print(REPOS[a[1]][c[5:]])
    elif c in ("task-ids", "task-repo", "task-env"):
        with open(a[1]) as f:
            tasks = json.load(f)["tasks"]
        if c == "task-ids":
            print(" ".join(t["id"] for t in tasks))
        else:
            t = next(t for t in tasks if t["id"] == a[2])
            print(t["repo"] if c == "task-repo" else ", ".join(json.dumps(e) for e in task_env(t)))
    elif c == "describe":
        describe(a[1], a[2] == "1", dict(x.split("=", 1) for x in a[3:]))
    else:
        print(__doc__)
        sys.exit(2)


if __name__ == "__main__":
    main()
