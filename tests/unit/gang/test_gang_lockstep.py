"""A training gang waits for one GPU model rather than run in lockstep at the slower of two
(app/gang/lockstep.py, docs/gangs.md "One GPU model")."""

from __future__ import annotations

from app.base.objects import node_object, pod_object
from app.base.workload import parse_workload
from tests.unit.gang.test_gang_coordinator import Cluster

A100 = "NVIDIA-A100-SXM4-80GB"


def a100_nodes(c: Cluster, n: int, leaf: str = "leaf-1") -> list[str]:
    names = []
    for i in range(n):
        name = f"a-{i}"
        c.service.absorb_node(node_object(name, gpus=8, product=A100, rdma=True, labels={
            "fabric.topograph.run/tier-0": leaf, "fabric.topograph.run/tier-1": "spine-1"}))
        names.append(name)
    return names


def free_names(c: Cluster) -> list[str]:
    """What kube-scheduler offers: the nodes with room for an 8-GPU member."""
    return sorted(n for n in c.service.snapshot.nodes if c.service.snapshot.free_gpus(n) >= 8)


def test_a_gang_that_one_model_could_hold_waits_instead_of_mixing_h100_and_a100() -> None:
    c = Cluster()
    c.nodes("h", 2, "leaf-1")
    a100_nodes(c, 2)
    busy = pod_object("busy", namespace="other", gpus=8)
    c.add(busy)
    with c.service.lock:
        c.service.snapshot.assume(parse_workload(busy), "h-0")
    c.occupy("a-0", 8)
    pods = c.gang("train", 2)
    d = c.filter(pods[0], free_names(c))  # free now: one H100 node and one A100 node
    assert d.passed == []
    why = next(iter(d.unresolvable.values()))
    assert "waiting for one GPU model" in why and "H100-SXM-80GB nodes hold the whole gang" in why
    assert c.gangs.book.ledger.get("ml/train") is None  # nothing held while it waits
    # The H100 node's work ends: both members go to H100 nodes.
    c.delete(busy)
    got = {c.place(p, free_names(c)) for p in pods}
    assert got == {"h-0", "h-1"}


def test_a_gang_no_single_model_can_hold_starts_mixed() -> None:
    c = Cluster()
    c.nodes("h", 2, "leaf-1")
    a100_nodes(c, 2)
    pods = c.gang("train", 3)  # three 8-GPU members: two H100 nodes cannot hold it, nor two A100
    got = sorted(c.place(p, free_names(c)) for p in pods)
    assert len(got) == 3 and {n[0] for n in got} == {"a", "h"}


def test_a_gang_of_one_model_or_close_speeds_is_not_held() -> None:
    c = Cluster()
    c.nodes("h", 3, "leaf-1")
    c.occupy("h-0", 8)
    pods = c.gang("train", 2)
    assert {c.place(p, free_names(c)) for p in pods} == {"h-1", "h-2"}
