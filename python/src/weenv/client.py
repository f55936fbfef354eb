"""The synchronous SDK: :class:`Client` (one service), :class:`Environment`, sessions, files.

Requests and the parsing of answers are :mod:`weenv._core`'s (shared with :mod:`weenv.aio`);
this module only sends them."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, TypeVar

import grpc

from weenv._core import (
    Call,
    Closing,
    CreateError,
    CreateResults,
    EnvInfo,
    EnvSpec,
    Event,
    ExecCollector,
    ExecResult,
    NodeView,
    SessionResult,
    Stats,
    WeenvError,
    already_gone,
    call_metadata,
    channel_options,
    close_session_call,
    create_request,
    delete_call,
    download_request,
    events_request,
    exec_request,
    info_call,
    list_call,
    map_error,
    node_call,
    open_session_call,
    read_call,
    resolve_address,
    resolve_token,
    run_in_session_call,
    stats_call,
    tar_of,
    untar_into,
    upload_chunks,
    write_call,
)
from weenv.envd.v1 import envd_pb2_grpc as rpc

OutputCallback = Callable[[bytes], None]
T = TypeVar("T")


class Client(Closing):
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

    def run(self, c: Call[T]) -> T:
        return c.parse(self.call(c.method, c.request))

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
        res = CreateResults(len(specs), lambda i, t, ms: Environment(self, i, t, ms))
        for r in self.stream("Create", create_request(specs, parallelism)):
            res.add(r)
        out, created, error = res.done()
        if raise_on_error and error is not None:
            for x in created:
                x.close()
            raise error
        return out

    def create(self, spec: EnvSpec) -> Environment:
        env = self.create_many([spec])[0]
        assert isinstance(env, Environment)
        return env

    def list(self, labels: Mapping[str, str] | None = None) -> list[EnvInfo]:
        return self.run(list_call(labels))

    def get(self, env_id: str) -> Environment:
        """The running (or failed) environment ``env_id``, e.g. after a restart of the client."""
        return Environment(self, self.run(info_call(env_id)), {}, 0.0)

    def events(self, env_id: str = "", *, replay: bool = True) -> Iterator[Event]:
        for e in self.stream("Events", events_request(env_id, replay)):
            yield Event.from_proto(e)

    def delete(self, env_ids: Sequence[str]) -> list[str]:
        return self.run(delete_call(env_ids))

    def node(self) -> NodeView:
        """This node's groups and admission room (what placement reads)."""
        return self.run(node_call(self.address))

    def close(self) -> None:
        self._channel.close()


class Files:
    """Files of one environment."""

    def __init__(self, env: Environment) -> None:
        self._env = env

    def read(self, path: str, *, limit: int = 0) -> bytes:
        return self._env.client.run(read_call(self._env.id, path, limit))

    def read_text(self, path: str, encoding: str = "utf-8", errors: str = "strict") -> str:
        return self.read(path).decode(encoding, errors)

    def write(
        self, path: str, data: str | bytes, *, mode: int = 0o644, parents: bool = True
    ) -> int:
        return self._env.client.run(write_call(self._env.id, path, data, mode, parents))

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
        req = download_request(self._env.id, path)
        return b"".join(c.data for c in self._env.client.stream("Download", req))

    def download(self, path: str, local_dir: str | os.PathLike[str]) -> None:
        """Copy ``path`` (file or directory) into the local directory ``local_dir``."""
        untar_into(self.download_tar(path), local_dir)


class Session(Closing):
    """A persistent shell in an environment: cwd and variables survive between commands."""

    def __init__(self, env: Environment, session_id: str) -> None:
        self._env = env
        self.id = session_id

    def run(
        self, command: str, *, timeout: float | None = None, output_limit: int = 0
    ) -> SessionResult:
        c = run_in_session_call(self._env.id, self.id, command, timeout, output_limit)
        return self._env.client.run(c)

    def close(self) -> None:
        try:
            self._env.client.run(close_session_call(self._env.id, self.id))
        except WeenvError:
            pass


class Environment(Closing):
    """A running environment (E2B's Sandbox, Modal's Sandbox): exec, sessions, files, close."""

    def __init__(
        self, client: Client, info: EnvInfo, timings: dict[str, float], total_ms: float
    ) -> None:
        self.client = client
        self.info = info
        self.id = info.id
        #: Milliseconds of each creation step (resolve, compose, layers, prepare, mutate, ...;
        #: ``pool`` when a pooled environment served it).
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
        col = ExecCollector(on_stdout, on_stderr)
        req = exec_request(
            self.id,
            cmd,
            cwd=cwd,
            env=env,
            stdin=stdin,
            timeout=timeout,
            output_limit=output_limit,
            buffered=not col.streamed,
        )
        for ev in self.client.stream("Exec", req):
            col.feed(ev)
        return col.result()

    def session(
        self,
        *,
        shell: str = "/bin/sh",
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> Session:
        return Session(self, self.client.run(open_session_call(self.id, shell, cwd, env)))

    def stats(self) -> Stats:
        return self.client.run(stats_call(self.id))

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
            if not already_gone(e):
                raise

    kill = close
    terminate = close

    def __repr__(self) -> str:
        return f"Environment({self.id!r}, state={self.info.state!r})"
