"""The asynchronous SDK (``grpc.aio``): the same shape as :mod:`weenv.client`, awaitable."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from types import TracebackType
from typing import Any

import grpc
import grpc.aio

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


class AsyncClient:
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
        req = pb.CreateRequest(envs=[s.to_proto() for s in specs], parallelism=parallelism or 0)
        out: list[AsyncEnvironment | CreateError | None] = [None] * len(specs)
        async for r in self.stream("Create", req):
            if r.error:
                out[r.index] = CreateError(r.index, r.error)
            else:
                out[r.index] = AsyncEnvironment(
                    self, EnvInfo.from_proto(r.env), {t.step: t.ms for t in r.timings}, r.total_ms
                )
        done = [x if x is not None else CreateError(i, "no answer") for i, x in enumerate(out)]
        errors = [x for x in done if isinstance(x, CreateError)]
        if raise_on_error and errors:
            for x in done:
                if isinstance(x, AsyncEnvironment):
                    await x.close()
            raise errors[0]
        return done

    async def create(self, spec: EnvSpec) -> AsyncEnvironment:
        env = (await self.create_many([spec]))[0]
        assert isinstance(env, AsyncEnvironment)
        return env

    async def list(self, labels: Mapping[str, str] | None = None) -> list[EnvInfo]:
        r = await self.call("List", pb.ListRequest(labels=dict(labels or {})))
        return [EnvInfo.from_proto(e) for e in r.envs]

    async def get(self, env_id: str) -> AsyncEnvironment:
        s = await self.call("Stats", pb.StatsRequest(env_id=env_id))
        return AsyncEnvironment(self, EnvInfo.from_proto(s.env), {}, 0.0)

    async def events(self, env_id: str = "", *, replay: bool = True) -> AsyncIterator[Event]:
        async for e in self.stream("Events", pb.EventsRequest(env_id=env_id, replay=replay)):
            yield Event.from_proto(e)

    async def delete(self, env_ids: Sequence[str]) -> list[str]:
        r = await self.call("Delete", pb.DeleteRequest(env_ids=list(env_ids)))
        if r.errors:
            raise WeenvError("; ".join(r.errors))
        return list(r.deleted)

    async def close(self) -> None:
        await self._channel.close()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(
        self,
        et: type[BaseException] | None,
        ev: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()


class AsyncFiles:
    def __init__(self, env: AsyncEnvironment) -> None:
        self._env = env

    async def read(self, path: str, *, limit: int = 0) -> bytes:
        r = await self._env.client.call(
            "ReadFile", pb.ReadFileRequest(env_id=self._env.id, path=path, limit=limit)
        )
        return bytes(r.data)

    async def read_text(self, path: str, encoding: str = "utf-8", errors: str = "strict") -> str:
        return (await self.read(path)).decode(encoding, errors)

    async def write(
        self, path: str, data: str | bytes, *, mode: int = 0o644, parents: bool = True
    ) -> int:
        b = data.encode() if isinstance(data, str) else data
        r = await self._env.client.call(
            "WriteFile",
            pb.WriteFileRequest(
                env_id=self._env.id, path=path, data=b, mode=mode, no_parents=not parents
            ),
        )
        return int(r.bytes)

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
        parts = []
        req = pb.DownloadRequest(env_id=self._env.id, path=path)
        async for c in self._env.client.stream("Download", req):
            parts.append(c.data)
        return b"".join(parts)

    async def download(self, path: str, local_dir: str | os.PathLike[str]) -> None:
        untar_into(await self.download_tar(path), local_dir)


class AsyncSession:
    def __init__(self, env: AsyncEnvironment, session_id: str) -> None:
        self._env = env
        self.id = session_id

    async def run(
        self, command: str, *, timeout: float | None = None, output_limit: int = 0
    ) -> SessionResult:
        r = await self._env.client.call(
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

    async def close(self) -> None:
        try:
            await self._env.client.call(
                "CloseSession", pb.CloseSessionRequest(env_id=self._env.id, session_id=self.id)
            )
        except WeenvError:
            pass

    async def __aenter__(self) -> AsyncSession:
        return self

    async def __aexit__(
        self,
        et: type[BaseException] | None,
        ev: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()


class AsyncEnvironment:
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
        async for ev in self.client.stream("Exec", req):
            got = col.add(ev)
            if got is not None:
                kind, data = got
                cb = on_stdout if kind == "stdout" else on_stderr
                if cb is not None:
                    cb(data)
        return col.result()

    async def session(
        self,
        *,
        shell: str = "/bin/sh",
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> AsyncSession:
        r = await self.client.call(
            "OpenSession",
            pb.OpenSessionRequest(env_id=self.id, shell=shell, cwd=cwd or "", env=dict(env or {})),
        )
        return AsyncSession(self, r.session_id)

    async def stats(self) -> Stats:
        return Stats.from_proto(await self.client.call("Stats", pb.StatsRequest(env_id=self.id)))

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
            if e.code != grpc.StatusCode.NOT_FOUND and "no environment" not in str(e):
                raise

    async def __aenter__(self) -> AsyncEnvironment:
        return self

    async def __aexit__(
        self,
        et: type[BaseException] | None,
        ev: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    def __repr__(self) -> str:
        return f"AsyncEnvironment({self.id!r}, state={self.info.state!r})"
