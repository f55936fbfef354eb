"""The asynchronous SDK (``grpc.aio``): the same shape as :mod:`weenv.client`, awaitable; the
same requests and parsing (:mod:`weenv._core`)."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import Any, TypeVar

import grpc
import grpc.aio

from weenv._core import (
    AsyncClosing,
    Call,
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
from weenv.envd.v1 import envd_pb2 as pb
from weenv.envd.v1 import envd_pb2_grpc as rpc

OutputCallback = Callable[[bytes], None]
T = TypeVar("T")


class AsyncClient(AsyncClosing):
    """A connection to one weenv-envd (see :class:`weenv.Client`)."""

    def __init__(self, address: str | None = None, token: str | None = None) -> None:
        self.address = resolve_address(address)
        self._md = call_metadata(resolve_token(token))
        self._channel = grpc.aio.insecure_channel(
            self.address, options=channel_options(self.address)
        )
        self.stub = rpc.EnvdStub(self._channel)

    async def call(self, method: str, request: Any) -> Any:
        try:
            return await getattr(self.stub, method)(request, metadata=self._md)
        except grpc.RpcError as e:
            raise map_error(e) from None

    async def run(self, c: Call[T]) -> T:
        return c.parse(await self.call(c.method, c.request))

    async def stream(self, method: str, request: Any) -> AsyncIterator[Any]:
        try:
            async for m in getattr(self.stub, method)(request, metadata=self._md):
                yield m
        except grpc.RpcError as e:
            raise map_error(e) from None

    async def create_many(
        self,
        specs: Sequence[EnvSpec],
        *,
        parallelism: int | None = None,
        raise_on_error: bool = True,
    ) -> list[AsyncEnvironment | CreateError]:
        res = CreateResults(len(specs), lambda i, t, ms: AsyncEnvironment(self, i, t, ms))
        async for r in self.stream("Create", create_request(specs, parallelism)):
            res.add(r)
        out, created, error = res.done()
        if raise_on_error and error is not None:
            for x in created:
                await x.close()
            raise error
        return out

    async def create(self, spec: EnvSpec) -> AsyncEnvironment:
        env = (await self.create_many([spec]))[0]
        assert isinstance(env, AsyncEnvironment)
        return env

    async def list(self, labels: Mapping[str, str] | None = None) -> list[EnvInfo]:
        return await self.run(list_call(labels))

    async def get(self, env_id: str) -> AsyncEnvironment:
        return AsyncEnvironment(self, await self.run(info_call(env_id)), {}, 0.0)

    async def events(self, env_id: str = "", *, replay: bool = True) -> AsyncIterator[Event]:
        async for e in self.stream("Events", events_request(env_id, replay)):
            yield Event.from_proto(e)

    async def delete(self, env_ids: Sequence[str]) -> list[str]:
        return await self.run(delete_call(env_ids))

    async def node(self) -> NodeView:
        return await self.run(node_call(self.address))

    async def close(self) -> None:
        await self._channel.close()


class AsyncFiles:
    def __init__(self, env: AsyncEnvironment) -> None:
        self._env = env

    async def read(self, path: str, *, limit: int = 0) -> bytes:
        return await self._env.client.run(read_call(self._env.id, path, limit))

    async def read_text(self, path: str, encoding: str = "utf-8", errors: str = "strict") -> str:
        return (await self.read(path)).decode(encoding, errors)

    async def write(
        self, path: str, data: str | bytes, *, mode: int = 0o644, parents: bool = True
    ) -> int:
        return await self._env.client.run(write_call(self._env.id, path, data, mode, parents))

    async def upload(self, local: str | os.PathLike[str], dest: str) -> int:
        return await self.upload_tar(tar_of(local), dest)

    async def upload_tar(self, data: bytes, dest: str) -> int:
        chunks = upload_chunks(self._env.id, dest, data)

        async def gen() -> AsyncIterator[pb.UploadChunk]:
            for c in chunks:
                yield c

        try:
            r = await self._env.client.stub.Upload(gen(), metadata=self._env.client._md)
        except grpc.RpcError as e:
            raise map_error(e) from None
        return int(r.bytes)

    async def download_tar(self, path: str) -> bytes:
        req = download_request(self._env.id, path)
        return b"".join([c.data async for c in self._env.client.stream("Download", req)])

    async def download(self, path: str, local_dir: str | os.PathLike[str]) -> None:
        untar_into(await self.download_tar(path), local_dir)


class AsyncSession(AsyncClosing):
    def __init__(self, env: AsyncEnvironment, session_id: str) -> None:
        self._env = env
        self.id = session_id

    async def run(
        self, command: str, *, timeout: float | None = None, output_limit: int = 0
    ) -> SessionResult:
        c = run_in_session_call(self._env.id, self.id, command, timeout, output_limit)
        return await self._env.client.run(c)

    async def close(self) -> None:
        try:
            await self._env.client.run(close_session_call(self._env.id, self.id))
        except WeenvError:
            pass


class AsyncEnvironment(AsyncClosing):
    """A running environment, async (see :class:`weenv.Environment`)."""

    def __init__(
        self, client: AsyncClient, info: EnvInfo, timings: dict[str, float], total_ms: float
    ) -> None:
        self.client = client
        self.info = info
        self.id = info.id
        self.timings = timings
        self.create_ms = total_ms
        self.files = AsyncFiles(self)
        self._closed = False

    @classmethod
    async def create(
        cls,
        plan: str | os.PathLike[str] | None = None,
        *,
        task: str | bytes | None = None,
        client: AsyncClient | None = None,
        address: str | None = None,
        **spec: Any,
    ) -> AsyncEnvironment:
        c = client or AsyncClient(address)
        return await c.create(EnvSpec(plan=plan, task=task, **spec))

    @classmethod
    async def create_many(
        cls,
        specs: Sequence[EnvSpec],
        *,
        client: AsyncClient | None = None,
        address: str | None = None,
        parallelism: int | None = None,
        raise_on_error: bool = True,
    ) -> list[AsyncEnvironment | CreateError]:
        c = client or AsyncClient(address)
        return await c.create_many(specs, parallelism=parallelism, raise_on_error=raise_on_error)

    async def exec(
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
        async for ev in self.client.stream("Exec", req):
            col.feed(ev)
        return col.result()

    async def session(
        self,
        *,
        shell: str = "/bin/sh",
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> AsyncSession:
        sid = await self.client.run(open_session_call(self.id, shell, cwd, env))
        return AsyncSession(self, sid)

    async def stats(self) -> Stats:
        return await self.client.run(stats_call(self.id))

    async def refresh(self) -> EnvInfo:
        self.info = (await self.stats()).env
        return self.info

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            await self.client.delete([self.id])
        except WeenvError as e:
            if not already_gone(e):
                raise

    def __repr__(self) -> str:
        return f"AsyncEnvironment({self.id!r}, state={self.info.state!r})"
