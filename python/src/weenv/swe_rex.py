"""SWE-ReX on weenv: :class:`WeenvDeployment` (``AbstractDeployment``) and its
:class:`WeenvRuntime` (``AbstractRuntime``), so code written against SWE-ReX
(``deployment.start()`` → ``runtime.execute()`` / ``create_session()`` + ``run_in_session()`` /
``read_file()`` / ``write_file()`` / ``upload()`` → ``deployment.stop()``) runs on weenv
environments unchanged. Needs ``pip install 'weenv[swerex]'``.

Differences from SWE-ReX's own bash sessions: there is no terminal, so the output has no
prompt or ``\\r`` framing (SWE-ReX's observations are compared after stripping both);
``is_interactive_command`` (driving a REPL) is not supported; a timed-out command kills the
session's shell, and the session is started again under the same name (SWE-ReX leaves it to
a ``BashInterruptAction``, which here also starts a fresh shell).
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

from swerex.deployment.abstract import AbstractDeployment
from swerex.deployment.hooks.abstract import CombinedDeploymentHook, DeploymentHook
from swerex.exceptions import (
    BashIncorrectSyntaxError,
    CommandTimeoutError,
    DeploymentNotStartedError,
    NonZeroExitCodeError,
    SessionDoesNotExistError,
    SessionExistsError,
)
from swerex.runtime.abstract import (
    AbstractRuntime,
    Action,
    BashAction,
    BashInterruptAction,
    BashObservation,
    CloseBashSessionResponse,
    CloseResponse,
    CloseSessionRequest,
    CloseSessionResponse,
    Command,
    CommandResponse,
    CreateBashSessionResponse,
    CreateSessionRequest,
    CreateSessionResponse,
    IsAliveResponse,
    Observation,
    ReadFileRequest,
    ReadFileResponse,
    UploadRequest,
    UploadResponse,
    WriteFileRequest,
    WriteFileResponse,
)

from weenv._core import EnvSpec, WeenvError, tar_of
from weenv.aio import AsyncClient, AsyncEnvironment, AsyncSession

__all__ = ["WeenvDeployment", "WeenvRuntime"]


def _check_syntax(command: str) -> None:
    """What SWE-ReX does before a session command: ``bash -n`` (here, if bash is installed)."""
    bash = shutil.which("bash")
    if bash is None:
        return
    r = subprocess.run([bash, "-n"], input=command.encode(), capture_output=True, check=False)
    if r.returncode != 0:
        msg = (
            f"Error ({r.returncode}) while checking bash command \n{command!r}\n"
            f"---- Stderr ----\n{r.stderr.decode(errors='replace')}"
        )
        raise BashIncorrectSyntaxError(msg, extra_info={"bash_stdout": "", "bash_stderr": ""})


class WeenvRuntime(AbstractRuntime):
    """SWE-ReX's runtime API on one weenv environment."""

    def __init__(self, env: AsyncEnvironment, *, logger: logging.Logger | None = None) -> None:
        self.env = env
        self.logger = logger or logging.getLogger("weenv.swerex")
        self._sessions: dict[str, AsyncSession] = {}
        self._shell: str | None = None

    async def _session_shell(self) -> str:
        if self._shell is None:
            r = await self.env.exec(["/bin/sh", "-c", "command -v bash || echo /bin/sh"])
            self._shell = r.stdout.decode().strip().splitlines()[-1] or "/bin/sh"
        return self._shell

    async def is_alive(self, *, timeout: float | None = None) -> IsAliveResponse:
        try:
            info = await self.env.refresh()
        except WeenvError as e:
            return IsAliveResponse(is_alive=False, message=str(e))
        if info.state != "running":
            return IsAliveResponse(is_alive=False, message=f"{info.state}: {info.cause}")
        return IsAliveResponse(is_alive=True)

    async def _open(self, name: str, startup_source: list[str]) -> str:
        s = await self.env.session(shell=await self._session_shell())
        self._sessions[name] = s
        out = ""
        for f in startup_source:
            r = await s.run(f"source {f}")
            out += r.text
        return out

    async def create_session(self, request: CreateSessionRequest) -> CreateSessionResponse:
        if request.session in self._sessions:
            msg = f"session {request.session} already exists"
            raise SessionExistsError(msg)
        out = await self._open(request.session, list(request.startup_source))
        return CreateBashSessionResponse(output=out)

    async def run_in_session(self, action: Action) -> Observation:
        if action.session not in self._sessions:
            msg = f"session {action.session!r} does not exist"
            raise SessionDoesNotExistError(msg)
        if isinstance(action, BashInterruptAction):
            await self._sessions.pop(action.session).close()
            await self._open(action.session, [])
            return BashObservation(output="", exit_code=0)
        assert isinstance(action, BashAction)
        if action.is_interactive_command or action.is_interactive_quit:
            msg = "interactive commands need a terminal; weenv sessions have none"
            raise NotImplementedError(msg)
        _check_syntax(action.command)
        s = self._sessions[action.session]
        r = await s.run(action.command, timeout=action.timeout)
        if r.timed_out or r.session_closed:
            self._sessions.pop(action.session, None)
            await self._open(action.session, [])
            if r.timed_out:
                msg = (
                    f"timeout after {action.timeout} seconds while running command "
                    f"{action.command!r}"
                )
                raise CommandTimeoutError(msg)
        output = r.output.decode(errors="backslashreplace")
        code: int | None = None if action.check == "ignore" else r.exit_code
        if action.check == "raise" and r.exit_code != 0:
            msg = (
                f"Command {action.command!r} failed with exit code {r.exit_code}. "
                f"Here is the output:\n{output!r}"
            )
            if action.error_msg:
                msg = f"{action.error_msg}: {msg}"
            raise NonZeroExitCodeError(msg)
        return BashObservation(output=output, exit_code=code)

    async def close_session(self, request: CloseSessionRequest) -> CloseSessionResponse:
        if request.session not in self._sessions:
            msg = f"session {request.session!r} does not exist"
            raise SessionDoesNotExistError(msg)
        await self._sessions.pop(request.session).close()
        return CloseBashSessionResponse()

    async def execute(self, command: Command) -> CommandResponse:
        cmd: str | list[str]
        if command.shell:
            c = command.command if isinstance(command.command, str) else " ".join(command.command)
            cmd = ["/bin/sh", "-c", ("exec 2>&1; " if command.merge_output_streams else "") + c]
        else:
            argv = [command.command] if isinstance(command.command, str) else command.command
            cmd = list(argv)
            if command.merge_output_streams:
                cmd = ["/bin/sh", "-c", 'exec 2>&1; exec "$@"', "sh", *cmd]
        r = await self.env.exec(cmd, cwd=command.cwd, env=command.env, timeout=command.timeout)
        if r.timed_out:
            msg = f"Timeout ({command.timeout}s) exceeded while running command"
            raise CommandTimeoutError(msg)
        resp = CommandResponse(
            stdout=r.stdout.decode(errors="backslashreplace"),
            stderr=r.stderr.decode(errors="backslashreplace"),
            exit_code=r.exit_code,
        )
        if command.check and r.exit_code != 0:
            msg = (
                f"Command {command.command!r} failed with exit code {r.exit_code}. "
                f"Stdout:\n{resp.stdout!r}\nStderr:\n{resp.stderr!r}"
            )
            if command.error_msg:
                msg = f"{command.error_msg}: {msg}"
            raise NonZeroExitCodeError(msg)
        return resp

    async def read_file(self, request: ReadFileRequest) -> ReadFileResponse:
        data = await self.env.files.read(request.path)
        return ReadFileResponse(
            content=data.decode(request.encoding or "utf-8", request.errors or "strict")
        )

    async def write_file(self, request: WriteFileRequest) -> WriteFileResponse:
        await self.env.files.write(request.path, request.content)
        return WriteFileResponse()

    async def upload(self, request: UploadRequest) -> UploadResponse:
        src = Path(request.source_path)
        if src.is_dir():
            # copytree: target_path becomes the directory with src's contents.
            await self.env.files.upload_tar(tar_of(src), request.target_path)
        else:
            # copy: the file named target_path (in an existing directory target_path: inside it).
            target = request.target_path
            probe = await self.env.exec(["/bin/sh", "-c", 'test -d "$1"', "sh", target])
            if probe.exit_code == 0:
                await self.env.files.upload_tar(tar_of(src), target)
            else:
                await self.env.files.write(
                    target, src.read_bytes(), mode=src.stat().st_mode & 0o777
                )
        return UploadResponse()

    async def close(self) -> CloseResponse:
        for s in list(self._sessions.values()):
            await s.close()
        self._sessions.clear()
        return CloseResponse()


class WeenvDeployment(AbstractDeployment):
    """A SWE-ReX deployment that is one weenv environment: ``start()`` creates it (from a
    plan, groups or an image, with the task's patch), ``stop()`` deletes it.

    Keywords are :class:`weenv.EnvSpec` fields (``plan=``, ``image=``, ``task=``,
    ``resources=``, ...); ``address`` / ``token`` name the service.
    """

    def __init__(
        self,
        *,
        address: str | None = None,
        token: str | None = None,
        logger: logging.Logger | None = None,
        **spec: Any,
    ) -> None:
        self.logger = logger or logging.getLogger("weenv.swerex")
        self._spec = EnvSpec(**spec)
        self._address = address or os.environ.get("WEENV_ENVD_ADDRESS")
        self._token = token
        self._hooks = CombinedDeploymentHook()
        self._client: AsyncClient | None = None
        self._runtime: WeenvRuntime | None = None

    def add_hook(self, hook: DeploymentHook) -> None:
        self._hooks.add_hook(hook)

    async def is_alive(self, *, timeout: float | None = None) -> IsAliveResponse:
        if self._runtime is None:
            return IsAliveResponse(is_alive=False, message="Runtime is None.")
        return await self._runtime.is_alive(timeout=timeout)

    async def start(self) -> None:
        self._hooks.on_custom_step("Creating the weenv environment")
        self._client = AsyncClient(self._address, self._token)
        env = await self._client.create(self._spec)
        self._runtime = WeenvRuntime(env, logger=self.logger)

    async def stop(self) -> None:
        if self._runtime is not None:
            await self._runtime.close()
            await self._runtime.env.close()
            self._runtime = None
        if self._client is not None:
            await self._client.close()
            self._client = None

    @property
    def runtime(self) -> WeenvRuntime:
        if self._runtime is None:
            raise DeploymentNotStartedError()
        return self._runtime
