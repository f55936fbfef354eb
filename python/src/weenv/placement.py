"""Several nodes: each environment goes to one weenv-envd by cache locality and admission
room. The decision is pure (:func:`place`, :func:`place_many`); :class:`Cluster` and
:class:`AsyncCluster` ask every node for its :class:`~weenv._core.NodeView` (``Node`` RPC: the
group references it holds, its capacity and the requests of its environments), place a
batch, and create each part on its node.

The rule, per environment (its groups: the spec's ``groups``, a ``plan_toml``'s, a plan
file's if it is readable here, or the image reference):

1. candidates: the nodes with room for its request (CPU and memory: capacity minus what the
   node's environments requested, minus what this batch placed there already); if none has,
   every node (the shim admits by taking back others' gains);
2. cache locality: among them, those holding the most of its groups;
3. otherwise (and among equals): rendezvous hashing on its base group (the first), so one
   base lands on one node and stays warm there, and adding a node moves only its share.

Within a batch a node counts as holding what was placed on it.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TypeVar

from weenv._core import AsyncClosing, Closing, CreateError, EnvInfo, EnvSpec, NodeView, WeenvError
from weenv.aio import AsyncClient, AsyncEnvironment
from weenv.client import Client, Environment

try:  # Python 3.11+
    import tomllib as _toml
except ImportError:  # pragma: no cover - 3.10
    _toml = None  # type: ignore[assignment]


@dataclass(frozen=True)
class Need:
    """What an environment asks of a node: millicores and bytes (0: unlimited)."""

    cpu_m: int = 0
    memory: int = 0


def need_of(spec: EnvSpec) -> Need:
    r = spec.resources
    return Need(int(r.cpus * 1000), int(r.memory)) if r is not None else Need()


def groups_of(spec: EnvSpec) -> list[str]:
    """The group references of a spec (its base first); an image is its own group."""
    if spec.groups is not None:
        return list(spec.groups)
    text = spec.plan_toml
    if text is None and spec.plan is not None:
        try:
            text = Path(os.fspath(spec.plan)).read_text()
        except OSError:
            text = None
    if text is not None and _toml is not None:
        try:
            g = _toml.loads(text).get("groups", [])
            return [str(x) for x in g]
        except _toml.TOMLDecodeError:
            return []
    if spec.image is not None:
        return [spec.image]
    return []


def rendezvous(node: str, key: str) -> int:
    """Highest-random-weight score of ``node`` for ``key``."""
    return int.from_bytes(hashlib.sha256(f"{node}\0{key}".encode()).digest()[:8], "big")


def _room(n: NodeView, need: Need) -> tuple[int, int]:
    return (
        n.cpu_capacity_m - n.cpu_requested_m - need.cpu_m,
        n.memory_capacity - n.memory_requested - need.memory,
    )


def place(groups: Sequence[str], need: Need, nodes: Sequence[NodeView]) -> int:
    """The index in ``nodes`` of the node for one environment (see the module's rule)."""
    if not nodes:
        raise WeenvError("no node to place the environment on")
    fits = [i for i, n in enumerate(nodes) if min(_room(n, need)) >= 0]
    candidates = fits or list(range(len(nodes)))
    want = set(groups)
    held = {i: len(want & nodes[i].groups) for i in candidates}
    best = max(held.values())
    if best > 0:
        candidates = [i for i in candidates if held[i] == best]
    base = groups[0] if groups else ""
    return max(candidates, key=lambda i: rendezvous(nodes[i].address, base))


def place_many(specs: Sequence[EnvSpec], nodes: Sequence[NodeView]) -> list[int]:
    """:func:`place` for each spec in order, each counted on its node before the next."""
    views = list(nodes)
    out = []
    for s in specs:
        groups, need = groups_of(s), need_of(s)
        i = place(groups, need, views)
        n = views[i]
        views[i] = replace(
            n,
            groups=n.groups | frozenset(groups),
            environments=n.environments + 1,
            cpu_requested_m=n.cpu_requested_m + need.cpu_m,
            memory_requested=n.memory_requested + need.memory,
        )
        out.append(i)
    return out


E = TypeVar("E")


def _parts(where: list[int], n: int) -> list[list[int]]:
    parts: list[list[int]] = [[] for _ in range(n)]
    for k, i in enumerate(where):
        parts[i].append(k)
    return parts


def _merge(
    total: int, parts: list[list[int]], results: list[list[E | CreateError]]
) -> list[E | CreateError]:
    out: list[E | CreateError | None] = [None] * total
    for idx, res in zip(parts, results, strict=True):
        for k, r in zip(idx, res, strict=True):
            out[k] = CreateError(k, r.message) if isinstance(r, CreateError) else r
    return [x if x is not None else CreateError(k, "no answer") for k, x in enumerate(out)]


class Cluster(Closing):
    """Several services (``addresses``); environments placed by :func:`place_many`."""

    def __init__(self, addresses: Sequence[str], token: str | None = None) -> None:
        if not addresses:
            raise WeenvError("a cluster needs at least one address")
        self.clients = [Client(a, token) for a in addresses]

    def nodes(self) -> list[tuple[Client, NodeView]]:
        """The nodes that answer, with their views."""
        out = []
        for c in self.clients:
            try:
                out.append((c, c.node()))
            except WeenvError:
                continue
        return out

    def create_many(
        self,
        specs: Sequence[EnvSpec],
        *,
        parallelism: int | None = None,
        raise_on_error: bool = True,
    ) -> list[Environment | CreateError]:
        nodes = self.nodes()
        where = place_many(specs, [v for _, v in nodes])
        parts = _parts(where, len(nodes))

        def on(i: int) -> list[Environment | CreateError]:
            sub = [specs[k] for k in parts[i]]
            if not sub:
                return []
            return nodes[i][0].create_many(sub, parallelism=parallelism, raise_on_error=False)

        with ThreadPoolExecutor(max(1, len(nodes))) as ex:
            results = list(ex.map(on, range(len(nodes))))
        out = _merge(len(specs), parts, results)
        first = _first_error(out) if raise_on_error else None
        if first is not None:
            for x in out:
                if isinstance(x, Environment):
                    x.close()
            raise first
        return out

    def create(self, spec: EnvSpec) -> Environment:
        env = self.create_many([spec])[0]
        assert isinstance(env, Environment)
        return env

    def list(self, labels: dict[str, str] | None = None) -> list[EnvInfo]:
        return [e for c in self.clients for e in c.list(labels)]

    def close(self) -> None:
        for c in self.clients:
            c.close()


class AsyncCluster(AsyncClosing):
    """:class:`Cluster`, async."""

    def __init__(self, addresses: Sequence[str], token: str | None = None) -> None:
        if not addresses:
            raise WeenvError("a cluster needs at least one address")
        self.clients = [AsyncClient(a, token) for a in addresses]

    async def nodes(self) -> list[tuple[AsyncClient, NodeView]]:
        views = await asyncio.gather(*(c.node() for c in self.clients), return_exceptions=True)
        return [(c, v) for c, v in zip(self.clients, views, strict=True) if isinstance(v, NodeView)]

    async def create_many(
        self,
        specs: Sequence[EnvSpec],
        *,
        parallelism: int | None = None,
        raise_on_error: bool = True,
    ) -> list[AsyncEnvironment | CreateError]:
        nodes = await self.nodes()
        where = place_many(specs, [v for _, v in nodes])
        parts = _parts(where, len(nodes))

        async def on(i: int) -> list[AsyncEnvironment | CreateError]:
            sub = [specs[k] for k in parts[i]]
            if not sub:
                return []
            return await nodes[i][0].create_many(sub, parallelism=parallelism, raise_on_error=False)

        results = await asyncio.gather(*(on(i) for i in range(len(nodes))))
        out = _merge(len(specs), parts, list(results))
        first = _first_error(out) if raise_on_error else None
        if first is not None:
            for x in out:
                if isinstance(x, AsyncEnvironment):
                    await x.close()
            raise first
        return out

    async def create(self, spec: EnvSpec) -> AsyncEnvironment:
        env = (await self.create_many([spec]))[0]
        assert isinstance(env, AsyncEnvironment)
        return env

    async def close(self) -> None:
        for c in self.clients:
            await c.close()


def _first_error(out: Sequence[object]) -> CreateError | None:
    return next((x for x in out if isinstance(x, CreateError)), None)
