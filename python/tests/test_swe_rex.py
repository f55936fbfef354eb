"""The same SWE-ReX calls to weenv's deployment and to SWE-ReX's own LocalDeployment: the
observations must agree (outputs compared without the terminal's prompt and ``\\r`` framing,
which only SWE-ReX's pexpect sessions have)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from conftest import Service

pytest.importorskip("swerex")

from swerex.deployment.abstract import AbstractDeployment
from swerex.deployment.local import LocalDeployment
from swerex.exceptions import (
    BashIncorrectSyntaxError,
    CommandTimeoutError,
    NonZeroExitCodeError,
    SessionDoesNotExistError,
)
from swerex.runtime.abstract import (
    BashAction,
    CloseBashSessionRequest,
    Command,
    CreateBashSessionRequest,
    ReadFileRequest,
    UploadRequest,
    WriteFileRequest,
)

from weenv.swe_rex import WeenvDeployment

SESSION_COMMANDS = [
    "echo hello",
    "cd /tmp && X=5",
    "echo $X; pwd",
    "printf 'a\\nb'",
    "false",
    "echo err >&2",
    "(exit 3)",
    "export Y=7; echo ${Y}x",
    "for i in 1 2 3; do echo $i; done",
]


def norm(s: str) -> str:
    return s.replace("\r", "").strip()


async def drive(d: AbstractDeployment, scratch: str, local_dir: Path) -> list[object]:
    """The calls; every observation recorded (exceptions by class)."""
    await d.start()
    r = d.runtime
    obs: list[object] = [bool(await d.is_alive())]
    await r.create_session(CreateBashSessionRequest(session="main", startup_timeout=30))
    for c in SESSION_COMMANDS:
        o = await r.run_in_session(BashAction(command=c, session="main", check="silent"))
        obs.append((c, norm(o.output), o.exit_code))
    for bad in [
        BashAction(command="false", session="main", check="raise"),
        BashAction(command="if then fi", session="main"),
        BashAction(command="true", session="other"),
    ]:
        try:
            await r.run_in_session(bad)
            obs.append(("no error", bad.command))
        except (
            NonZeroExitCodeError,
            BashIncorrectSyntaxError,
            CommandTimeoutError,
            SessionDoesNotExistError,
        ) as e:
            obs.append(type(e).__name__)
    o = await r.run_in_session(BashAction(command="echo after", session="main"))
    obs.append(norm(o.output))
    await r.close_session(CloseBashSessionRequest(session="main"))
    await r.create_session(CreateBashSessionRequest(session="t", startup_timeout=30))
    try:
        await r.run_in_session(BashAction(command="sleep 10", session="t", timeout=0.5))
    except CommandTimeoutError:
        obs.append("session timeout")
    for cmd in [
        Command(command=["echo", "x y"]),
        Command(command="echo $((1+2)); echo e >&2", shell=True),
        Command(command="echo o; echo e >&2", shell=True, merge_output_streams=True),
        Command(command=["sh", "-c", "exit 4"]),
        Command(command=["sh", "-c", "pwd"], cwd="/tmp"),
    ]:
        c = await r.execute(cmd)
        obs.append((norm(c.stdout), norm(c.stderr), c.exit_code))
    try:
        await r.execute(Command(command=["sleep", "10"], timeout=0.5))
    except CommandTimeoutError:
        obs.append("timeout")
    await r.write_file(WriteFileRequest(path=f"{scratch}/w/f.txt", content="written\n"))
    obs.append((await r.read_file(ReadFileRequest(path=f"{scratch}/w/f.txt"))).content)
    await r.upload(UploadRequest(source_path=str(local_dir), target_path=f"{scratch}/up"))
    await r.upload(
        UploadRequest(source_path=str(local_dir / "one.txt"), target_path=f"{scratch}/single.txt")
    )
    c = await r.execute(
        Command(command=f"cd {scratch} && cat up/one.txt up/sub/two.txt single.txt", shell=True)
    )
    obs.append(c.stdout)
    await d.stop()
    return obs


async def test_weenv_deployment_matches_local_deployment(
    service: Service, groups: list[str], tmp_path: Path
) -> None:
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "one.txt").write_text("1\n")
    (src / "sub" / "two.txt").write_text("2\n")
    scratch = f"/tmp/weenv-swerex-{os.getpid()}"
    local = await drive(LocalDeployment(), scratch + "-local", src)
    os.system(f"rm -rf {scratch}-local")
    remote = await drive(
        WeenvDeployment(address=service.address, groups=groups), scratch + "-local", src
    )
    assert remote == local
    assert len(local) > 20
