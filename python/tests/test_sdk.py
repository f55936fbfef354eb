"""The SDK against a real weenv-envd (see conftest.py): create from plans, groups and images
with the task's patch, exec, sessions, files, list / stats / events / delete, TTL, bad input,
the shim's OOM cause, a restart of the service, TCP with a bearer token."""

from __future__ import annotations

import io
import json
import os
import tarfile
import threading
import time
from pathlib import Path

import grpc
import pytest
from conftest import Service, ctr

from weenv import (
    Client,
    CreateError,
    Environment,
    EnvSpec,
    InvalidArgument,
    NotFound,
    NotRunning,
    Resources,
    WeenvError,
)
from weenv.envd.v1 import envd_pb2 as pb

PATCH = (
    """diff --git a/app.py b/app.py
--- a/app.py
+++ b/app.py
@@ -1,3 +1,3 @@
 def answer():
-    return 42
+    return 41
"""
    + " \n"
)


def test_create_from_plan_with_task_patch_then_exec(client: Client, plan: str) -> None:
    with Environment.create(
        plan, task=PATCH, task_root="/src/repo", client=client, labels={"suite": "sdk"}
    ) as env:
        assert env.info.state == "running"
        assert env.info.labels == {"suite": "sdk"}
        # Timings of each step, the init running.
        for step in ("resolve", "compose", "layers", "prepare", "mutate", "create", "start"):
            assert step in env.timings, env.timings
        r = env.exec(["cat", "/src/repo/app.py"])
        assert r.exit_code == 0 and b"return 41" in r.stdout, r
        # The image's Cmd is not what runs: the long-lived init is.
        r = env.exec("cat /proc/1/cmdline | tr '\\0' ' '")
        assert "sleep" in r.text or "while" in r.text, r.text
    assert env.id not in [e.id for e in client.list()]


def test_create_from_a_plan_reference(client: Client, plan_ref: str) -> None:
    # No plan file on the node: the service fetches the published plan artifact.
    with Environment.create(plan_ref, task=PATCH, task_root="/src/repo", client=client) as env:
        assert env.info.state == "running"
        r = env.exec(["cat", "/src/repo/app.py"])
        assert r.exit_code == 0 and b"return 41" in r.stdout, r


def test_exec_argv_shell_cwd_env_stdin_exit_code(client: Client, groups: list[str]) -> None:
    with client.create(EnvSpec(groups=groups, env={"GLOBAL": "g"})) as env:
        r = env.exec("echo out; echo err >&2; exit 3")
        assert (r.exit_code, r.stdout, r.stderr) == (3, b"out\n", b"err\n")
        assert not r.killed and not r.timed_out
        assert env.exec(["sh", "-c", "pwd"], cwd="/src").stdout == b"/src\n"
        r = env.exec("echo $A $GLOBAL", env={"A": "1"})
        assert r.stdout == b"1 g\n"
        assert env.exec(["wc", "-c"], stdin=b"12345").stdout.strip() == b"5"
        r = env.exec(["/no/such/binary"])
        assert r.exit_code == 127 and b"/no/such/binary" in r.stderr, r
        chunks: list[bytes] = []
        r = env.exec("for i in 1 2 3; do echo $i; sleep 0.1; done", on_stdout=chunks.append)
        assert b"".join(chunks) == b"1\n2\n3\n" and r.exit_code == 0


def test_exec_timeout_and_output_cap(client: Client, groups: list[str]) -> None:
    with client.create(EnvSpec(groups=groups)) as env:
        t = time.monotonic()
        r = env.exec("sleep 30", timeout=0.5)
        assert time.monotonic() - t < 10
        assert r.timed_out and r.killed and "timed out" in r.cause, r
        r = env.exec("head -c 100000 /dev/zero", output_limit=1000)
        assert len(r.stdout) == 1000 and r.stdout_dropped == 99000, r.stdout_dropped
        # Many execs at once in one environment.
        out: list[bytes] = []

        def one(i: int) -> None:
            out.append(env.exec(f"sleep 0.2; echo {i}").stdout)

        ts = [threading.Thread(target=one, args=(i,)) for i in range(6)]
        for th in ts:
            th.start()
        for th in ts:
            th.join()
        assert sorted(out) == [f"{i}\n".encode() for i in range(6)]


def test_session_keeps_cwd_and_variables(client: Client, groups: list[str]) -> None:
    with client.create(EnvSpec(groups=groups)) as env, env.session() as s:
        assert s.run("cd /src/repo && X=5; export Y=6").exit_code == 0
        r = s.run("echo $X $Y; pwd")
        assert r.output == b"5 6\n/src/repo\n" and r.exit_code == 0
        assert s.run("printf 'no newline'").output == b"no newline"
        assert s.run("false").exit_code == 1
        # stderr is interleaved into the output; a syntax error does not end the session.
        r = s.run("echo e >&2; if then")
        assert r.exit_code != 0 and not r.session_closed
        assert s.run("echo still $X").output == b"still 5\n"
        # A command cannot eat the protocol: its stdin is /dev/null.
        assert s.run("cat").output == b""
        r = s.run("head -c 5000 /dev/zero | tr '\\0' a", output_limit=100)
        assert len(r.output) == 100 and r.output_dropped == 4900
        # Sessions are independent.
        with env.session(cwd="/tmp") as s2:
            assert s2.run("pwd; echo ${X:-unset}").output == b"/tmp\nunset\n"
        r = s.run("sleep 30", timeout=0.5)
        assert r.timed_out and r.session_closed
        with pytest.raises(NotFound):
            s.run("true")


def test_files_read_write_upload_download(
    client: Client, groups: list[str], tmp_path: Path
) -> None:
    with client.create(EnvSpec(groups=groups)) as env:
        env.files.write("/work/a/b.txt", "hello", mode=0o600)
        assert env.files.read("/work/a/b.txt") == b"hello"
        assert env.exec("stat -c %a /work/a/b.txt").stdout == b"600\n"
        assert env.files.read_text("/src/repo/app.py").startswith("def answer")
        with pytest.raises(NotFound):
            env.files.read("/nope")
        with pytest.raises(InvalidArgument):
            env.files.read("/src/../etc/passwd")
        # A symlink inside the environment resolves inside it, never on the host.
        env.exec("ln -s / /escape && mkdir -p /inside && echo in > /inside/hostname")
        secret = tmp_path / "host-only"
        secret.write_text("host")
        with pytest.raises(NotFound):
            env.files.read(f"/escape{secret}")
        src = tmp_path / "tree"
        (src / "d").mkdir(parents=True)
        (src / "d" / "f.txt").write_text("F")
        (src / "top.txt").write_text("T")
        env.files.upload(src, "/up")
        assert env.exec("cat /up/top.txt /up/d/f.txt").stdout == b"TF"
        data = env.files.download_tar("/up")
        names = sorted(tarfile.open(fileobj=io.BytesIO(data)).getnames())
        assert "up/d/f.txt" in names and "up/top.txt" in names, names
        out = tmp_path / "down"
        out.mkdir()
        env.files.download("/up/d", out)
        assert (out / "d" / "f.txt").read_text() == "F"
        with pytest.raises(WeenvError):
            env.files.download_tar("/does/not/exist")


def test_image_source_on_overlayfs(client: Client, image: str) -> None:
    with client.create(
        EnvSpec(
            image=image,
            snapshotter="overlayfs",
            task="--- /dev/null\n+++ b/hello.txt\n@@ -0,0 +1 @@\n+patched\n",
            task_root="/tmp",
        )
    ) as env:
        assert env.info.snapshotter == "overlayfs"
        assert env.exec("cat /tmp/hello.txt").stdout == b"patched\n"


def test_bad_input_is_a_clear_error(client: Client, groups: list[str]) -> None:
    with pytest.raises(InvalidArgument):
        EnvSpec().to_proto()
    with pytest.raises(CreateError, match="plan_toml"):
        client.create(EnvSpec(plan_toml="version = 1\nnope = 3\n"))
    with pytest.raises(CreateError, match="maximum"):
        client.create(EnvSpec(groups=groups, ttl=10**9))
    with pytest.raises(CreateError, match="name"):
        client.create(EnvSpec(groups=groups, name="Bad_Name"))
    with pytest.raises(NotFound, match="no environment"):
        client.get("env-doesnotexist")
    with client.create(EnvSpec(groups=groups)) as env:
        with pytest.raises(InvalidArgument, match="argv or shell"):
            list(client.stream("Exec", pb.ExecRequest(env_id=env.id)))
        with pytest.raises(InvalidArgument):
            env.exec("true", timeout=-1)


def test_create_many_reports_each_and_keeps_the_good_ones(
    client: Client, groups: list[str]
) -> None:
    specs = [EnvSpec(groups=groups, labels={"batch": "m", "k": str(i)}) for i in range(3)]
    specs.insert(1, EnvSpec(groups=["127.0.0.1:1/none/such:1"]))
    out = client.create_many(specs, parallelism=4, raise_on_error=False)
    assert isinstance(out[1], CreateError) and out[1].index == 1
    good = [e for e in out if isinstance(e, Environment)]
    assert len(good) == 3
    assert sorted(e.id for e in client.list({"batch": "m"})) == sorted(e.id for e in good)
    client.delete([e.id for e in good])
    assert client.list({"batch": "m"}) == []


def test_stats_events_and_delete_frees_everything(client: Client, groups: list[str]) -> None:
    env = client.create(EnvSpec(groups=groups, resources=Resources(cpus=0.5, memory=64 << 20)))
    st = env.stats()
    assert st.env.state == "running"
    assert st.memory_usage > 0
    status = json.loads(st.shim_status_json)
    assert status["state"] == "running" and status["memory_bytes"] == 64 << 20, status
    assert st.memory_limit == 64 << 20 and st.cpu_millicores == 500
    ledger = os.environ.get("WEENV_TEST_LEDGER")
    key = None
    if ledger:
        text = Path(ledger, "ledger.json").read_text()
        key = next(k for k in json.loads(text)["entries"] if k.endswith("/" + env.id))
    snaps = ctr("snapshots", "--snapshotter", "weenv", "ls")
    assert env.id in snaps
    env.close()
    # Freed at once: the ledger entry, the snapshot, the record.
    if ledger and key:
        assert key not in json.loads(Path(ledger, "ledger.json").read_text())["entries"]
    assert env.id not in ctr("snapshots", "--snapshotter", "weenv", "ls")
    assert env.id not in ctr("containers", "ls", "-q")
    seen = []
    for ev in _events_until(client, env.id, "deleted"):
        seen.append(ev.state)
    assert seen[:2] == ["creating", "running"] and seen[-1] == "deleted", seen
    with pytest.raises(NotFound):
        env.stats()


def _events_until(client: Client, env_id: str, final: str) -> list:
    got = []
    stream = client.events(env_id, replay=True)
    for ev in stream:
        got.append(ev)
        if ev.state == final and not ev.cause.startswith("deleting"):
            break
    return got


def test_ttl_expires_and_is_collected(client: Client, groups: list[str]) -> None:
    env = client.create(EnvSpec(groups=groups, ttl=1))
    t = time.monotonic()
    while time.monotonic() - t < 30 and env.id in [e.id for e in client.list()]:
        time.sleep(0.2)
    assert env.id not in [e.id for e in client.list()]
    causes = [
        e.cause
        for e in _events_until(client, env.id, "deleted")
        if e.state == "deleted" and not e.cause.startswith("deleting")
    ]
    assert causes == ["time to live expired"]


def test_oom_at_the_top_tier_fails_with_the_shim_cause(client: Client, groups: list[str]) -> None:
    big = client.create(
        EnvSpec(groups=groups, resources=Resources(memory=32 << 20, memory_max=64 << 20))
    )
    ok = client.create(EnvSpec(groups=groups, resources=Resources(memory=32 << 20)))
    try:
        grow = (
            'awk \'BEGIN { for (i = 0; i < 1024; i++) { a[i] = sprintf("%1048576s", ""); '
            'if (i % 4 == 0) system("sleep 0.02") }; print "grown" }\''
        )
        r = big.exec(grow, timeout=120)
        assert r.killed and "out of memory at the maximum memory tier" in r.cause, r
        t = time.monotonic()
        while big.refresh().state == "running" and time.monotonic() - t < 10:
            time.sleep(0.1)
        assert big.info.state == "failed" and "out of memory" in big.info.cause, big.info
        with pytest.raises(NotRunning, match="out of memory"):
            big.exec("true")
        # The other environment is unaffected.
        assert ok.exec("echo fine").stdout == b"fine\n"
        assert ok.refresh().state == "running"
    finally:
        big.close()
        ok.close()


def test_async_sdk(service: Service, groups: list[str]) -> None:
    import asyncio

    from weenv import AsyncClient

    async def main() -> None:
        async with AsyncClient(service.address) as c:
            envs = await c.create_many([EnvSpec(groups=groups) for _ in range(2)])
            for e in envs:
                assert not isinstance(e, CreateError)
            a, b = envs
            assert not isinstance(a, CreateError) and not isinstance(b, CreateError)
            async with a, b:
                r1, r2 = await asyncio.gather(a.exec("echo a"), b.exec(["echo", "b"]))
                assert (r1.stdout, r2.stdout) == (b"a\n", b"b\n")
                async with await a.session() as s:
                    await s.run("cd /tmp")
                    assert (await s.run("pwd")).output == b"/tmp\n"
                await a.files.write("/x", b"1")
                assert await a.files.read("/x") == b"1"

    asyncio.run(main())


def test_tcp_needs_the_bearer_token(service: Service, groups: list[str]) -> None:
    if not service.tcp:
        pytest.skip("the service was not started by the tests")
    with Client(service.tcp, token="wrong") as bad, pytest.raises(WeenvError) as e:
        bad.list()
    assert e.value.code == grpc.StatusCode.UNAUTHENTICATED
    with Client(service.tcp, token=service.token) as good:
        good.list()


def test_environments_survive_a_restart_of_the_service(
    service: Service, client: Client, groups: list[str]
) -> None:
    if not service.can_restart:
        pytest.skip("the service was not started by the tests")
    envs = [client.create(EnvSpec(groups=groups, labels={"restart": "1"})) for _ in range(2)]
    envs[0].files.write("/state.txt", "kept")
    service.restart()
    c = Client(service.address)
    found = {e.id: e for e in c.list({"restart": "1"})}
    assert set(found) == {e.id for e in envs}
    assert all(e.state == "running" for e in found.values()), found
    again = c.get(envs[0].id)
    assert again.files.read("/state.txt") == b"kept"
    assert again.exec("echo up").stdout == b"up\n"
    # And after a crash (SIGKILL) too.
    service.restart(9)
    c2 = Client(service.address)
    assert {e.id for e in c2.list({"restart": "1"})} == set(found)
    c2.delete(list(found))
    assert c2.list({"restart": "1"}) == []
