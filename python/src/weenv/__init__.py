"""weenv: the Python SDK of weenv-envd, the environment service of a weenv node.

    from weenv import Environment
    with Environment.create(plan="task.toml", task=diff) as env:
        print(env.exec("ls /src/repo").text)
        with env.session() as s:
            s.run("cd /src/repo"); print(s.run("pwd").text)
        env.files.write("/tmp/x", "hi")

Async: :mod:`weenv.aio` (``AsyncEnvironment``). Adapters: :mod:`weenv.swe_rex` (SWE-ReX
deployment and runtime), :mod:`weenv.gym` (reset / step / close). Several nodes:
:mod:`weenv.placement`.
"""

from weenv._core import (
    CommandTimeout,
    CreateError,
    EnvInfo,
    EnvSpec,
    Event,
    ExecResult,
    InvalidArgument,
    NotFound,
    NotRunning,
    Resources,
    SessionResult,
    Stats,
    WeenvError,
)
from weenv.aio import AsyncClient, AsyncEnvironment, AsyncSession
from weenv.client import Client, Environment, Files, Session
from weenv.placement import AsyncCluster, Cluster

__all__ = [
    "AsyncClient",
    "AsyncCluster",
    "AsyncEnvironment",
    "AsyncSession",
    "Client",
    "Cluster",
    "CommandTimeout",
    "CreateError",
    "EnvInfo",
    "EnvSpec",
    "Environment",
    "Event",
    "ExecResult",
    "Files",
    "InvalidArgument",
    "NotFound",
    "NotRunning",
    "Resources",
    "Session",
    "SessionResult",
    "Stats",
    "WeenvError",
]
