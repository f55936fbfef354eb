"""The synchronous SDK: :class:`Client` (one service), :class:`Environment`, sessions, files."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from types import TracebackType
from typing import Any

import grpc

from weenv._core import (
    CreateError,
    EnvInfo,
    EnvSpec,
    Event,
    ExecCollector,
    ExecResult,
    SessionResult,
    Stats,
    WeenvError,
    call_metadata,
    channel_options,
    exec_request,
    map_error,
    resolve_address,
    resolve_token,
    session_result,
    tar_of,
    untar_into,
    upload_chunks,
)
from weenv.envd.v1 import envd_pb2 as pb
from weenv.envd.v1 import envd_pb2_grpc as rpc

OutputCallback = Callable[[bytes], None]


class Client:
    """A connection to one weenv-envd (unix socket path or ``unix://``, or ``host:port``
    with a bearer ``token``; defaults from ``$WEENV_ENVD_ADDRESS`` / ``$WEENV_ENVD_TOKEN``)."""

    def __init__(self, address: str | None = None, token: str | None = None) -> None:
        self.address = resolve_address(address)
        self._md = call_metadata(resolve_token(token))
        self._channel = grpc.insecure_channel(self.address, options=channel_options(self.address))
        self.stub = rpc.EnvdStub(self._channel)

    def call(self, method: str, request: Any, **kw: Any) -> Any:
        try:
            return getattr(self.stub, method)(request, metadata=self._md, **kw)
        except grpc.RpcError as e:
            raise map_error(e) from None

    def stream(self, method: str, request: Any) -> Iterator[Any]:
        try:
            yield from getattr(self.stub, method)(request, metadata=self._md)
        except grpc.RpcError as e:
            raise map_error(e) from None

    def create_many(
        self,
        specs: Sequence[EnvSpec],
        *,
        parallelism: int | None = None,
        raise_on_error: bool = True,
    ) -> list[Environment | CreateError]:
        """Create every spec (``parallelism`` at once); results in the order of ``specs``.

        With ``raise_on_error`` the first failure is raised after the others were created
        (and deleted again); otherwise a failed one is its :class:`CreateError`.
        """
        req = pb.CreateRequest(envs=[s.to_proto() for s in specs], parallelism=parallelism or 0)
        out: list[Environment | CreateError | None] = [None] * len(specs)
        for r in self.stream("Create", req):
            if r.error:
                out[r.index] = CreateError(r.index, r.error)
            else:
                out[r.index] = Environment(
                    self, EnvInfo.from_proto(r.env), {t.step: t.ms for t in r.timings}, r.total_ms
                )
        done = [x if x is not None else CreateError(i, "no answer") for i, x in enumerate(out)]
        errors = [x for x in done if isinstance(x, CreateError)]
        if raise_on_error and errors:
            for x in done:
                if isinstance(x, Environment):
                    x.close()
            raise errors[0]
        return done

    def create(self, spec: EnvSpec) -> Environment:
        env = self.create_many([spec])[0]
        assert isinstance(env, Environment)
        return env

    def list(self, labels: Mapping[str, str] | None = None) -> list[EnvInfo]:
        r = self.call("List", pb.ListRequest(labels=dict(labels or {})))
        return [EnvInfo.from_proto(e) for e in r.envs]

    def get(self, env_id: str) -> Environment:
        """The running (or failed) environment ``env_id``, e.g. after a restart of the client."""
        s = self.call("Stats", pb.StatsRequest(env_id=env_id))
        return Environment(self, EnvInfo.from_proto(s.env), {}, 0.0)

    def events(self, env_id: str = "", *, replay: bool = True) -> Iterator[Event]:
        for e in self.stream("Events", pb.EventsRequest(env_id=env_id, replay=replay)):
            yield Event.from_proto(e)

    def delete(self, env_ids: Sequence[str]) -> list[str]:
        r = self.call("Delete", pb.DeleteRequest(env_ids=list(env_ids)))
        if r.errors:
            raise WeenvError("; ".join(r.errors))
        return list(r.deleted)

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self,
        et: type[BaseException] | None,
        ev: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class Files:
    """Files of one environment."""

    def __init__(self, env: Environment) -> None:
        self._env = env

    def read(self, path: str, *, limit: int = 0) -> bytes:
        r = self._env.client.call(
            "ReadFile", pb.ReadFileRequest(env_id=self._env.id, path=path, limit=limit)
        )
        return bytes(r.data)

    def read_text(self, path: str, encoding: str = "utf-8", errors: str = "strict") -> str:
        return self.read(path).decode(encoding, errors)

    def write(
        self, path: str, data: str | bytes, *, mode: int = 0o644, parents: bool = True
    ) -> int:
        b = data.encode() if isinstance(data, str) else data
        r = self._env.client.call(
            "WriteFile",
            pb.WriteFileRequest(
                env_id=self._env.id, path=path, data=b, mode=mode, no_parents=not parents
            ),
        )
        return int(r.bytes)

    def upload(self, local: str | os.PathLike[str], dest: str) -> int:
        """Copy the local file or directory ``local`` into directory ``dest`` (created)."""
        return self.upload_tar(tar_of(local), dest)

    def upload_tar(self, data: bytes, dest: str) -> int:
        chunks = upload_chunks(self._env.id, dest, data)
        try:
            r = self._env.client.stub.Upload(iter(chunks), metadata=self._env.client._md)
        except grpc.RpcError as e:
            raise map_error(e) from None
        return int(r.bytes)

    def download_tar(self, path: str) -> bytes:
        return b"".join(
            c.data
            for c in self._env.client.stream(
                "Download", pb.DownloadRequest(env_id=self._env.id, path=path)
            )
        )

    def download(self, path: str, local_dir: str | os.PathLike[str]) -> None:
        """Copy ``path`` (file or directory) into the local directory ``local_dir``."""
        untar_into(self.download_tar(path), local_dir)


class Session:
    """A persistent shell in an environment: cwd and variables survive between commands."""

    def __init__(self, env: Environment, session_id: str) -> None:
        self._env = env
        self.id = session_id

    def run(
        self, command: str, *, timeout: float | None = None, output_limit: int = 0
    ) -> SessionResult:
        r = self._env.client.call(
            "RunInSession",
            pb.RunInSessionRequest(
                env_id=self._env.id,
                session_id=self.id,
                command=command,
                timeout_seconds=float(timeout or 0),
                output_limit=output_limit,
            ),
        )
        return session_result(r)

    def close(self) -> None:
        try:
            self._env.client.call(
                "CloseSession", pb.CloseSessionRequest(env_id=self._env.id, session_id=self.id)
            )
        except WeenvError:
            pass

    def __enter__(self) -> Session:
        return self

    def __exit__(
        self,
        et: type[BaseException] | None,
        ev: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class Environment:
    """A running environment (E2B's Sandbox, Modal's Sandbox): exec, sessions, files, close."""

    def __init__(
        self, client: Client, info: EnvInfo, timings: dict[str, float], total_ms: float
    ) -> None:
        self.client = client
        self.info = info
        self.id = info.id
        #: Milliseconds of each creation step (resolve, compose, layers, prepare, mutate, ...).
        self.timings = timings
        #: Milliseconds from the request until the init ran.
        self.create_ms = total_ms
        self.files = Files(self)
        self._closed = False

    @classmethod
    def create(
        cls,
        plan: str | os.PathLike[str] | None = None,
        *,
        task: str | bytes | None = None,
        client: Client | None = None,
        address: str | None = None,
        **spec: Any,
    ) -> Environment:
        """Create one environment: ``Environment.create(plan="task.toml", task=diff)``; other
        :class:`EnvSpec` fields as keywords (``image=``, ``groups=``, ``resources=``, ...)."""
        c = client or Client(address)
        return c.create(EnvSpec(plan=plan, task=task, **spec))

    @classmethod
    def create_many(
        cls,
        specs: Sequence[EnvSpec],
        *,
        client: Client | None = None,
        address: str | None = None,
        parallelism: int | None = None,
        raise_on_error: bool = True,
    ) -> list[Environment | CreateError]:
        c = client or Client(address)
        return c.create_many(specs, parallelism=parallelism, raise_on_error=raise_on_error)

    def exec(
        self,
        cmd: str | Sequence[str],
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        stdin: bytes | str | None = None,
        timeout: float | None = None,
        output_limit: int | None = None,
        on_stdout: OutputCallback | None = None,
        on_stderr: OutputCallback | None = None,
    ) -> ExecResult:
        """Run ``cmd`` (a shell line, or argv); output streamed to the callbacks as it comes."""
        streamed = on_stdout is not None or on_stderr is not None
        req = exec_request(
            self.id,
            cmd,
            cwd=cwd,
            env=env,
            stdin=stdin,
            timeout=timeout,
            output_limit=output_limit,
            buffered=not streamed,
        )
        col = ExecCollector()
        for ev in self.client.stream("Exec", req):
            got = col.add(ev)
            if got is not None:
                kind, data = got
                cb = on_stdout if kind == "stdout" else on_stderr
                if cb is not None:
                    cb(data)
        return col.result()

    def session(
        self,
        *,
        shell: str = "/bin/sh",
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> Session:
        r = self.client.call(
            "OpenSession",
            pb.OpenSessionRequest(env_id=self.id, shell=shell, cwd=cwd or "", env=dict(env or {})),
        )
        return Session(self, r.session_id)

    def stats(self) -> Stats:
        return Stats.from_proto(self.client.call("Stats", pb.StatsRequest(env_id=self.id)))

    def refresh(self) -> EnvInfo:
        self.info = self.stats().env
        return self.info

    def events(self, *, replay: bool = True) -> Iterator[Event]:
        return self.client.events(self.id, replay=replay)

    def close(self) -> None:
        """Delete the environment (quotas freed, snapshot removed). Idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            self.client.delete([self.id])
        except WeenvError as e:
            if e.code != grpc.StatusCode.NOT_FOUND and "no environment" not in str(e):
                raise

    kill = close
    terminate = close

    def __enter__(self) -> Environment:
        return self

    def __exit__(
        self,
        et: type[BaseException] | None,
        ev: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Environment({self.id!r}, state={self.info.state!r})"
