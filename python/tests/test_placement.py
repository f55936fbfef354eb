"""Placement across nodes (weenv.placement): pure, no service needed."""

from __future__ import annotations

from collections import Counter

import pytest

from weenv import EnvSpec, Resources, WeenvError
from weenv._core import NodeView
from weenv.placement import groups_of, need_of, place, place_many, rendezvous

BASE = "reg/weenv/base:1"
REPO = "reg/weenv/repo:1"
OTHER = "reg/weenv/other-base:1"
GIB = 1 << 30


def node(addr: str, groups: tuple[str, ...] = (), cpu_req: int = 0, mem_req: int = 0) -> NodeView:
    return NodeView(
        address=addr,
        groups=frozenset(groups),
        cpu_capacity_m=2000,
        memory_capacity=8 * GIB,
        cpu_requested_m=cpu_req,
        memory_requested=mem_req,
    )


def test_a_node_holding_the_groups_comes_first() -> None:
    nodes = [node("a"), node("b", (BASE, REPO)), node("c", (BASE,))]
    assert place([BASE, REPO], need_of(EnvSpec(groups=[BASE])), nodes) == 1
    # holding more of them beats holding fewer
    nodes = [node("a", (BASE,)), node("b", (REPO, BASE)), node("c")]
    assert place([BASE, REPO], need_of(EnvSpec(groups=[BASE])), nodes) == 1


def test_without_locality_rendezvous_on_the_base_group() -> None:
    nodes = [node("unix:///n1"), node("unix:///n2"), node("unix:///n3")]
    got = place([BASE, REPO], need_of(EnvSpec(groups=[BASE])), nodes)
    want = max(range(3), key=lambda i: rendezvous(nodes[i].address, BASE))
    assert got == want
    # the same base lands on the same node whatever the other groups; another base may not
    assert place([BASE, "reg/weenv/task-7:1"], need_of(EnvSpec(groups=[BASE])), nodes) == got
    spread = Counter(
        place([f"reg/weenv/base-{k}:1"], need_of(EnvSpec(groups=[BASE])), nodes) for k in range(300)
    )
    assert set(spread) == {0, 1, 2} and min(spread.values()) > 50, spread
    # removing a node moves only the bases it had
    two = nodes[:2]
    for k in range(100):
        g = [f"reg/weenv/base-{k}:1"]
        before = place(g, need_of(EnvSpec(groups=g)), nodes)
        if before < 2:
            assert place(g, need_of(EnvSpec(groups=g)), two) == before


def test_admission_room_before_locality() -> None:
    spec = EnvSpec(groups=[BASE, REPO], resources=Resources(cpus=1.0, memory=GIB))
    full = node("a", (BASE, REPO), cpu_req=1500)
    free = node("b")
    assert place(groups_of(spec), need_of(spec), [full, free]) == 1
    # nobody has room: still placed (on the rendezvous choice among all)
    both_full = [node("a", cpu_req=2000), node("b", mem_req=8 * GIB)]
    assert place(groups_of(spec), need_of(spec), both_full) in (0, 1)
    with pytest.raises(WeenvError):
        place([BASE], need_of(spec), [])


def test_a_batch_follows_its_groups_until_the_node_is_full() -> None:
    spec = EnvSpec(groups=[BASE, REPO], resources=Resources(cpus=0.5, memory=GIB))
    nodes = [node("a"), node("b", (BASE, REPO))]
    where = place_many([spec] * 6, nodes)
    # b holds the groups: it takes 4 (2 cores / 0.5), then a takes the rest
    assert where == [1, 1, 1, 1, 0, 0]
    # unlimited requests: the whole batch stays where the cache is
    assert place_many([EnvSpec(groups=[OTHER, REPO])] * 5, nodes) == [1] * 5


def test_groups_of_each_source(tmp_path) -> None:
    assert groups_of(EnvSpec(groups=[BASE, REPO])) == [BASE, REPO]
    toml = f'version = 1\ngroups = ["{BASE}", "{REPO}"]\n'
    assert groups_of(EnvSpec(plan_toml=toml)) == [BASE, REPO]
    p = tmp_path / "plan.toml"
    p.write_text(toml)
    assert groups_of(EnvSpec(plan=str(p))) == [BASE, REPO]
    assert groups_of(EnvSpec(plan=str(tmp_path / "missing.toml"))) == []
    assert groups_of(EnvSpec(image="reg/busybox:1")) == ["reg/busybox:1"]
    assert need_of(EnvSpec(image="x", resources=Resources(cpus=0.25, memory=5))).cpu_m == 250
