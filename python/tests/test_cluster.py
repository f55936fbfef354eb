"""Two real services on one stack (two namespaces, state dirs and shim ledgers: two nodes as
far as placement can tell) driven through weenv.placement.Cluster; and the warm pool of a
service started with --pool."""

from __future__ import annotations

import time

from conftest import Service

from weenv import Client, Cluster, EnvSpec, Resources
from weenv.placement import groups_of

PATCH = """--- a/app.py
+++ b/app.py
@@ -1,2 +1,2 @@
 def answer():
-    return 42
+    return 41
"""


def test_cluster_places_by_locality_then_room(
    service: Service, second_service: Service, groups: list[str]
) -> None:
    a, b = Client(service.address), Client(second_service.address)
    # a composes the groups once: it holds them, b (fresh) does not
    with a.create(EnvSpec(groups=groups)) as e:
        assert e.exec(["true"]).exit_code == 0
    na, nb = a.node(), b.node()
    assert set(groups) <= na.groups, na
    assert not set(groups) & nb.groups, nb
    assert na.cpu_capacity_m >= 1000 and na.memory_capacity > 0

    # room on a for whole cores of request: that many go to a (locality), the rest to b
    room = (na.cpu_capacity_m - na.cpu_requested_m) // 1000
    assert room >= 1, na
    spec = EnvSpec(groups=groups, resources=Resources(cpus=1.0), labels={"suite": "cluster"})
    with Cluster([service.address, second_service.address]) as cl:
        envs = cl.create_many([spec] * (room + 1))
        try:
            where = [e.client.address for e in envs]  # type: ignore[union-attr]
            assert where == [service.address] * room + [second_service.address], where
            for e in envs:
                r = e.exec(["cat", "/src/repo/app.py"])  # type: ignore[union-attr]
                assert r.exit_code == 0 and b"return 42" in r.stdout, r
            # each node reports its own environments and requests
            assert a.node().cpu_requested_m >= na.cpu_requested_m + room * 1000
            assert b.node().cpu_requested_m >= 1000
            assert set(groups) <= b.node().groups
            assert {x.id for x in cl.list({"suite": "cluster"})} == {e.id for e in envs}  # type: ignore[union-attr]
        finally:
            for e in envs:
                e.close()  # type: ignore[union-attr]
    assert groups_of(spec) == groups
    a.close()
    b.close()


def wait_pooled(c: Client, n: int, limit: float = 120.0) -> int:
    t = time.monotonic()
    while time.monotonic() - t < limit:
        got = c.node().pooled
        if got >= n:
            return got
        time.sleep(0.25)
    return c.node().pooled


def test_the_warm_pool_serves_creates_with_the_task_patch(
    pooled_service: Service, groups: list[str]
) -> None:
    c = Client(pooled_service.address)
    spec = EnvSpec(groups=groups, task=PATCH, task_root="/src/repo", labels={"suite": "pool"})
    # a miss: created as usual; the demand (2 in this batch) is what the pool refills to
    first = c.create_many([spec, spec])
    for e in first:
        assert "pool" not in e.timings, e.timings  # type: ignore[union-attr]
        e.close()  # type: ignore[union-attr]
    assert wait_pooled(c, 2) == 2
    assert c.list({"suite": "pool"}) == []  # spares are not environments
    envs = c.create_many([spec, spec])
    try:
        for e in envs:
            assert "pool" in e.timings and "mutate" in e.timings, e.timings  # type: ignore[union-attr]
            assert "compose" not in e.timings, e.timings  # type: ignore[union-attr]
            # the task's patch was applied before anything of the caller's ran
            r = e.exec(["cat", "/src/repo/app.py"])  # type: ignore[union-attr]
            assert r.exit_code == 0 and b"return 41" in r.stdout, r
            assert e.info.labels == {"suite": "pool"}  # type: ignore[union-attr]
        # another request shape (a resource request) is another key: no spare for it
        other = c.create(EnvSpec(groups=groups, resources=Resources(cpus=0.25)))
        assert "pool" not in other.timings, other.timings
        other.close()
        # a bad patch on a claimed spare: a clear error, no environment left
        bad = EnvSpec(groups=groups, task="--- a/nope\n+++ b/nope\n@@ -1 +1 @@\n-x\n+y\n")
        assert wait_pooled(c, 2) >= 1
        try:
            c.create(bad)
            raise AssertionError("a patch of a missing file was accepted")
        except Exception as ex:  # CreateError
            assert "mutation" in str(ex) or "nope" in str(ex), ex
        # a restart: claimed environments are found again, spares are not environments
        pooled_service.restart()
        c2 = Client(pooled_service.address)
        assert {x.id for x in c2.list({"suite": "pool"})} == {e.id for e in envs}  # type: ignore[union-attr]
        assert c2.node().pooled == 0
        r = c2.get(envs[0].id).exec(["cat", "/src/repo/app.py"])  # type: ignore[union-attr]
        assert b"return 41" in r.stdout
        c2.close()
    finally:
        for e in envs:
            e.close()  # type: ignore[union-attr]
    c.close()
