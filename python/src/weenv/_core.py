"""What the sync and async clients share: specs, results, errors, request builders."""

from __future__ import annotations

import io
import os
import tarfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Generic, TypeVar

import grpc

from weenv.envd.v1 import envd_pb2 as pb

DEFAULT_ADDRESS = "unix:///run/weenv/envd.sock"
#: Largest message either side sends (matches the service's limit).
MAX_MESSAGE = 256 << 20
CHANNEL_OPTIONS = [
    ("grpc.max_receive_message_length", MAX_MESSAGE),
    ("grpc.max_send_message_length", MAX_MESSAGE),
]


def resolve_address(address: str | None) -> str:
    """``address``, else ``$WEENV_ENVD_ADDRESS``, else the default unix socket.

    A bare path is a unix socket; ``host:port`` is TCP.
    """
    a = address or os.environ.get("WEENV_ENVD_ADDRESS") or DEFAULT_ADDRESS
    if a.startswith("/"):
        return "unix://" + a
    return a


def channel_options(address: str) -> list[tuple[str, int | str]]:
    """Message size limits; over a unix socket the authority is ``localhost`` (gRPC would
    send the socket path, which HTTP/2 servers such as the service's refuse)."""
    opts: list[tuple[str, int | str]] = list(CHANNEL_OPTIONS)
    if address.startswith("unix:"):
        opts.append(("grpc.default_authority", "localhost"))
    return opts


def resolve_token(token: str | None) -> str | None:
    return token or os.environ.get("WEENV_ENVD_TOKEN") or None


def call_metadata(token: str | None) -> list[tuple[str, str]]:
    return [("authorization", f"Bearer {token}")] if token else []


# ---- errors ----


class WeenvError(Exception):
    """An error the service (or the SDK) reported; ``code`` is the gRPC status code."""

    def __init__(self, message: str, code: grpc.StatusCode | None = None) -> None:
        super().__init__(message)
        self.code = code


class NotFound(WeenvError):
    """No such environment, session or file."""


class NotRunning(WeenvError):
    """The environment is not running (failed, exited or deleted): the message says why."""


class InvalidArgument(WeenvError):
    """The request was malformed; the message names the field."""


class CreateError(WeenvError):
    """One environment of a create could not be made."""

    def __init__(self, index: int, message: str) -> None:
        super().__init__(f"environment {index}: {message}")
        self.index = index
        self.message = message


class CommandTimeout(WeenvError, TimeoutError):
    """A command ran past its timeout (and was killed)."""


def map_error(e: grpc.RpcError) -> WeenvError:
    code = e.code() if hasattr(e, "code") else None
    details = e.details() if hasattr(e, "details") else str(e)
    msg = details or str(e)
    cls: type[WeenvError] = {
        grpc.StatusCode.NOT_FOUND: NotFound,
        grpc.StatusCode.FAILED_PRECONDITION: NotRunning,
        grpc.StatusCode.INVALID_ARGUMENT: InvalidArgument,
    }.get(code, WeenvError)  # type: ignore[arg-type]
    return cls(msg, code)


# ---- specs ----


@dataclass
class Resources:
    """CPU cores and memory bytes at the start (request) and the most the shim may give."""

    cpus: float = 0.0
    memory: int = 0
    cpu_max: float = 0.0
    memory_max: int = 0
    #: ``False``: a fixed quota (no scaling; the kernel OOM-kills at the limit).
    elastic: bool = True

    def to_proto(self) -> pb.Resources:
        return pb.Resources(
            cpus=self.cpus,
            memory_bytes=self.memory,
            cpu_max=self.cpu_max,
            memory_max_bytes=self.memory_max,
            fixed=not self.elastic,
        )


@dataclass
class EnvSpec:
    """One environment to create: exactly one of ``plan`` (a plan file on the service's node),
    ``plan_toml``, ``groups`` or ``image``; optionally the task's patch applied at init."""

    plan: str | os.PathLike[str] | None = None
    plan_toml: str | None = None
    plan_dir: str | None = None
    groups: Sequence[str] | None = None
    image: str | None = None
    #: The task's mutation: a unified diff (applied into the rootfs before the init starts).
    task: str | bytes | None = None
    task_root: str = "/"
    task_strip: int = 1
    resources: Resources | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    #: Seconds until the service deletes it (None: the service's default).
    ttl: float | None = None
    snapshotter: str | None = None
    runtime: str | None = None
    #: Environment variables of every exec and session.
    env: Mapping[str, str] = field(default_factory=dict)
    #: The long-lived init (default: a shell that sleeps); it must not exit.
    init: Sequence[str] | None = None
    mounts: Sequence[str] = ()
    name: str | None = None

    def to_proto(self) -> pb.EnvSpec:
        given = [x for x in (self.plan, self.plan_toml, self.groups, self.image) if x is not None]
        if len(given) != 1:
            raise InvalidArgument("give exactly one of plan, plan_toml, groups or image")
        s = pb.EnvSpec(
            plan_dir=self.plan_dir or "",
            labels=dict(self.labels),
            ttl_seconds=int(self.ttl or 0),
            snapshotter=self.snapshotter or "",
            runtime=self.runtime or "",
            env=dict(self.env),
            init=list(self.init or []),
            mounts=list(self.mounts),
            name=self.name or "",
        )
        if self.plan is not None:
            s.plan_path = os.fspath(self.plan)
        elif self.plan_toml is not None:
            s.plan_toml = self.plan_toml
        elif self.groups is not None:
            s.groups.refs.extend(self.groups)
        elif self.image is not None:
            s.image = self.image
        if self.task is not None:
            patch = self.task.encode() if isinstance(self.task, str) else self.task
            strip = -1 if self.task_strip == 0 else self.task_strip
            s.task.CopyFrom(pb.Task(patch=patch, root=self.task_root, strip=strip))
        if self.resources is not None:
            s.resources.CopyFrom(self.resources.to_proto())
        return s


# ---- results ----

STATE_NAMES = {
    pb.CREATING: "creating",
    pb.RUNNING: "running",
    pb.EXITED: "exited",
    pb.FAILED: "failed",
    pb.DELETED: "deleted",
}


@dataclass
class EnvInfo:
    id: str
    state: str
    cause: str
    labels: dict[str, str]
    created_at: int
    expires_at: int
    source: str
    snapshotter: str
    runtime: str
    pid: int

    @classmethod
    def from_proto(cls, e: pb.EnvInfo) -> EnvInfo:
        return cls(
            id=e.id,
            state=STATE_NAMES.get(e.state, "unknown"),
            cause=e.cause,
            labels=dict(e.labels),
            created_at=e.created_at,
            expires_at=e.expires_at,
            source=e.source,
            snapshotter=e.snapshotter,
            runtime=e.runtime,
            pid=e.pid,
        )


@dataclass
class ExecResult:
    """One command's outcome. ``killed`` with ``cause``: why (timeout, the shim's OOM kill)."""

    exit_code: int
    stdout: bytes
    stderr: bytes
    duration_ms: float
    timed_out: bool = False
    killed: bool = False
    cause: str = ""
    stdout_dropped: int = 0
    stderr_dropped: int = 0

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.killed

    @property
    def text(self) -> str:
        return self.stdout.decode(errors="replace")


@dataclass
class SessionResult:
    """A session command: output (stdout and stderr interleaved), exit code."""

    output: bytes
    exit_code: int
    duration_ms: float
    timed_out: bool = False
    output_dropped: int = 0
    session_closed: bool = False

    @property
    def text(self) -> str:
        return self.output.decode(errors="replace")


@dataclass
class Stats:
    env: EnvInfo
    cpu_millicores: int
    memory_limit: int
    memory_usage: int
    cpu_usage_ns: int
    quota_changes: list[str]
    shim_status_json: str
    sessions: int
    running_execs: int

    @classmethod
    def from_proto(cls, s: pb.StatsResponse) -> Stats:
        return cls(
            env=EnvInfo.from_proto(s.env),
            cpu_millicores=s.cpu_millicores,
            memory_limit=s.memory_limit_bytes,
            memory_usage=s.memory_usage_bytes,
            cpu_usage_ns=s.cpu_usage_ns,
            quota_changes=list(s.quota_changes),
            shim_status_json=s.shim_status_json,
            sessions=s.sessions,
            running_execs=s.running_execs,
        )


@dataclass
class Event:
    env_id: str
    state: str
    cause: str
    unix_ms: int

    @classmethod
    def from_proto(cls, e: pb.Event) -> Event:
        return cls(
            env_id=e.env_id,
            state=STATE_NAMES.get(e.state, "unknown"),
            cause=e.cause,
            unix_ms=e.unix_ms,
        )


def exec_request(
    env_id: str,
    cmd: str | Sequence[str],
    *,
    cwd: str | None,
    env: Mapping[str, str] | None,
    stdin: bytes | str | None,
    timeout: float | None,
    output_limit: int | None,
    buffered: bool,
) -> pb.ExecRequest:
    r = pb.ExecRequest(
        env_id=env_id,
        cwd=cwd or "",
        env=dict(env or {}),
        stdin=stdin.encode() if isinstance(stdin, str) else (stdin or b""),
        timeout_seconds=float(timeout or 0),
        output_limit=int(output_limit or 0),
        buffered=buffered,
    )
    if isinstance(cmd, str):
        r.shell = cmd
    else:
        r.argv.extend(cmd)
    return r


class ExecCollector:
    """Turns the Exec stream's events into an :class:`ExecResult`, handing output chunks to
    the callbacks as they come."""

    def __init__(
        self,
        on_stdout: Callable[[bytes], None] | None = None,
        on_stderr: Callable[[bytes], None] | None = None,
    ) -> None:
        self.out = bytearray()
        self.err = bytearray()
        self.exit: pb.ExecExit | None = None
        self.on_stdout = on_stdout
        self.on_stderr = on_stderr

    @property
    def streamed(self) -> bool:
        return self.on_stdout is not None or self.on_stderr is not None

    def feed(self, ev: pb.ExecEvent) -> None:
        got = self.add(ev)
        if got is not None:
            kind, data = got
            cb = self.on_stdout if kind == "stdout" else self.on_stderr
            if cb is not None:
                cb(data)

    def add(self, ev: pb.ExecEvent) -> tuple[str, bytes] | None:
        kind = ev.WhichOneof("event")
        if kind == "stdout":
            self.out += ev.stdout
            return ("stdout", ev.stdout)
        if kind == "stderr":
            self.err += ev.stderr
            return ("stderr", ev.stderr)
        if kind == "exit":
            self.exit = ev.exit
        return None

    def result(self) -> ExecResult:
        x = self.exit
        if x is None:
            raise WeenvError("the exec stream ended without an exit status")
        return ExecResult(
            exit_code=x.exit_code,
            stdout=bytes(self.out) + x.stdout,
            stderr=bytes(self.err) + x.stderr,
            duration_ms=x.duration_ms,
            timed_out=x.timed_out,
            killed=x.killed,
            cause=x.cause,
            stdout_dropped=x.stdout_dropped,
            stderr_dropped=x.stderr_dropped,
        )


def session_result(r: pb.RunInSessionResponse) -> SessionResult:
    return SessionResult(
        output=r.output,
        exit_code=r.exit_code,
        duration_ms=r.duration_ms,
        timed_out=r.timed_out,
        output_dropped=r.output_dropped,
        session_closed=r.session_closed,
    )


UPLOAD_CHUNK = 1 << 20


def tar_of(local: str | os.PathLike[str]) -> bytes:
    """A tar of the file or directory ``local`` (its contents, for a directory)."""
    p = Path(local)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as t:
        if p.is_dir():
            for child in sorted(p.iterdir()):
                t.add(child, arcname=child.name)
        else:
            t.add(p, arcname=p.name)
    return buf.getvalue()


def upload_chunks(env_id: str, dest: str, data: bytes) -> list[pb.UploadChunk]:
    chunks = [
        pb.UploadChunk(data=data[i : i + UPLOAD_CHUNK])
        for i in range(0, max(len(data), 1), UPLOAD_CHUNK)
    ]
    chunks[0].env_id = env_id
    chunks[0].dest = dest
    return chunks


def untar_into(data: bytes, local_dir: str | os.PathLike[str]) -> None:
    with tarfile.open(fileobj=io.BytesIO(data), mode="r") as t:
        t.extractall(local_dir, filter="data")


@dataclass
class NodeView:
    """One service's node as placement sees it (:mod:`weenv.placement`): ``address`` is the
    client's (its identity), ``groups`` the group references it holds."""

    address: str
    name: str = ""
    groups: frozenset[str] = frozenset()
    environments: int = 0
    pooled: int = 0
    cpu_capacity_m: int = 0
    memory_capacity: int = 0
    cpu_requested_m: int = 0
    memory_requested: int = 0

    @classmethod
    def from_proto(cls, address: str, n: pb.NodeInfo) -> NodeView:
        return cls(
            address=address,
            name=n.name,
            groups=frozenset(n.groups),
            environments=n.environments,
            pooled=n.pooled,
            cpu_capacity_m=n.cpu_capacity_millicores,
            memory_capacity=n.memory_capacity_bytes,
            cpu_requested_m=n.cpu_requested_millicores,
            memory_requested=n.memory_requested_bytes,
        )


# ---- calls: what the sync and async clients send and how they read the answer ----

T = TypeVar("T")


@dataclass(frozen=True)
class Call(Generic[T]):
    """One unary RPC: the method, its request, and the answer's parser."""

    method: str
    request: Any
    parse: Callable[[Any], T]


def _envs(r: pb.ListResponse) -> list[EnvInfo]:
    return [EnvInfo.from_proto(e) for e in r.envs]


def _deleted(r: pb.DeleteResponse) -> list[str]:
    if r.errors:
        raise WeenvError("; ".join(r.errors))
    return list(r.deleted)


def list_call(labels: Mapping[str, str] | None) -> Call[list[EnvInfo]]:
    return Call("List", pb.ListRequest(labels=dict(labels or {})), _envs)


def stats_call(env_id: str) -> Call[Stats]:
    return Call("Stats", pb.StatsRequest(env_id=env_id), Stats.from_proto)


def info_call(env_id: str) -> Call[EnvInfo]:
    return Call("Stats", pb.StatsRequest(env_id=env_id), lambda s: EnvInfo.from_proto(s.env))


def delete_call(env_ids: Sequence[str]) -> Call[list[str]]:
    return Call("Delete", pb.DeleteRequest(env_ids=list(env_ids)), _deleted)


def read_call(env_id: str, path: str, limit: int) -> Call[bytes]:
    req = pb.ReadFileRequest(env_id=env_id, path=path, limit=limit)
    return Call("ReadFile", req, lambda r: bytes(r.data))


def write_call(env_id: str, path: str, data: str | bytes, mode: int, parents: bool) -> Call[int]:
    b = data.encode() if isinstance(data, str) else data
    req = pb.WriteFileRequest(env_id=env_id, path=path, data=b, mode=mode, no_parents=not parents)
    return Call("WriteFile", req, lambda r: int(r.bytes))


def open_session_call(
    env_id: str, shell: str, cwd: str | None, env: Mapping[str, str] | None
) -> Call[str]:
    req = pb.OpenSessionRequest(env_id=env_id, shell=shell, cwd=cwd or "", env=dict(env or {}))
    return Call("OpenSession", req, lambda r: str(r.session_id))


def run_in_session_call(
    env_id: str, session_id: str, command: str, timeout: float | None, output_limit: int
) -> Call[SessionResult]:
    req = pb.RunInSessionRequest(
        env_id=env_id,
        session_id=session_id,
        command=command,
        timeout_seconds=float(timeout or 0),
        output_limit=output_limit,
    )
    return Call("RunInSession", req, session_result)


def close_session_call(env_id: str, session_id: str) -> Call[None]:
    req = pb.CloseSessionRequest(env_id=env_id, session_id=session_id)
    return Call("CloseSession", req, lambda _r: None)


def node_call(address: str) -> Call[NodeView]:
    return Call("Node", pb.NodeRequest(), lambda r: NodeView.from_proto(address, r))


def events_request(env_id: str, replay: bool) -> pb.EventsRequest:
    return pb.EventsRequest(env_id=env_id, replay=replay)


def download_request(env_id: str, path: str) -> pb.DownloadRequest:
    return pb.DownloadRequest(env_id=env_id, path=path)


def create_request(specs: Sequence[EnvSpec], parallelism: int | None) -> pb.CreateRequest:
    return pb.CreateRequest(envs=[s.to_proto() for s in specs], parallelism=parallelism or 0)


E = TypeVar("E")


class CreateResults(Generic[E]):
    """The Create stream's answers in the order of the specs; ``make`` turns a created one
    into the client's environment object."""

    def __init__(self, n: int, make: Callable[[EnvInfo, dict[str, float], float], E]) -> None:
        self._out: list[E | CreateError | None] = [None] * n
        self._make = make

    def add(self, r: pb.CreateResult) -> None:
        if r.error:
            self._out[r.index] = CreateError(r.index, r.error)
        else:
            timings = {t.step: t.ms for t in r.timings}
            self._out[r.index] = self._make(EnvInfo.from_proto(r.env), timings, r.total_ms)

    def done(self) -> tuple[list[E | CreateError], list[E], CreateError | None]:
        """All results, the created ones, and the first error (if any)."""
        out = [x if x is not None else CreateError(i, "no answer") for i, x in enumerate(self._out)]
        created = [x for x in out if not isinstance(x, CreateError)]
        errors = [x for x in out if isinstance(x, CreateError)]
        return out, created, (errors[0] if errors else None)


def already_gone(e: WeenvError) -> bool:
    """A delete's error meaning the environment is gone already (a close is idempotent)."""
    return e.code == grpc.StatusCode.NOT_FOUND or "no environment" in str(e)


class Closing:
    """``with x:`` closes ``x`` (sync)."""

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self: T) -> T:
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


class AsyncClosing:
    """``async with x:`` closes ``x``."""

    async def close(self) -> None:
        raise NotImplementedError

    async def __aenter__(self: T) -> T:
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()
