"""The oldest gang that cannot be placed holds whole nodes as they free (app/gang/hold.py,
docs/gangs.md "Holding nodes for the oldest gang")."""

from __future__ import annotations

from typing import Any

from app.config import Settings
from app.core.workload import parse_workload
from app.objects import pod_object
from tests.unit.test_gang_coordinator import Cluster
from tests.unit.test_gang_lockstep import free_names

HOLD = Settings(cluster_source="none", metrics_port=0, feature_gates={"GangHoldForOldest": True})


def busy(c: Cluster, name: str, node: str, gpus: int = 8, stage: str = "pretraining") -> dict[str, Any]:
    pod = pod_object(name, namespace="other", gpus=gpus, stage=stage)
    c.add(pod)
    with c.service.lock:
        c.service.snapshot.assume(parse_workload(pod), node)
    return pod


def small_job(c: Cluster, name: str) -> dict[str, Any]:
    pod = pod_object(name, namespace="other", gpus=1, stage="alignment")
    c.add(pod)
    return pod


def gpu_nodes(c: Cluster) -> list[str]:
    return sorted(n for n in c.service.snapshot.nodes if c.service.snapshot.free_gpus(n) >= 1)


def waiting_gang(c: Cluster) -> tuple[list[dict[str, Any]], dict[str, Any], dict[str, Any]]:
    """Two 8-GPU members on three H100 nodes, two of them busy: the gang cannot be placed."""
    c.nodes("h", 3, "leaf-1")
    first, second = busy(c, "job-a", "h-0"), busy(c, "job-b", "h-1")
    pods = c.gang("train", 2)
    d = c.filter(pods[0], free_names(c))
    assert d.passed == [] and "cannot be placed" in next(iter(d.unresolvable.values()))
    return pods, first, second


def test_without_the_setting_a_small_job_takes_the_node_the_gang_waits_for() -> None:
    c = Cluster()
    pods, first, _ = waiting_gang(c)
    assert c.gangs.book.ledger.holds == {}
    c.delete(first)  # h-0 frees
    job = small_job(c, "eval")
    assert "h-0" in c.filter(job, gpu_nodes(c)).passed  # nothing keeps it off the gang's node
    with c.service.lock:
        c.service.snapshot.assume(parse_workload(job), "h-0")
    # ... and it is the same on the next node that frees: the gang never sees two free at once.
    assert c.filter(pods[0], free_names(c)).passed == []


def test_the_oldest_waiting_gang_holds_whole_nodes_and_gets_them_when_they_free() -> None:
    c = Cluster(settings=HOLD)
    pods, first, second = waiting_gang(c)
    held = c.gangs.book.ledger.holds["ml/train"]
    assert set(held) == {"h-2", "h-0"} or set(held) == {"h-2", "h-1"}
    assert all(gpus == 8 for gpus in held.values())
    # A 1-GPU job is not placed on a held node, even one with free GPUs.
    job = small_job(c, "eval")
    d = c.filter(job, gpu_nodes(c))
    assert not set(d.passed) & set(held)
    # On the held free node the reason names the gang.
    [free_held] = [n for n in held if c.service.snapshot.free_gpus(n) >= 1]
    assert d.rejections[free_held].endswith("GPUs held for gang ml/train, the oldest gang waiting "
                                            "for whole nodes")
    # The held node's own work ends: the gang is planned on the held nodes, and the hold goes.
    c.delete(first if "h-0" in held else second)
    got = {c.place(p, free_names(c)) for p in pods}
    assert got == set(held)
    assert c.gangs.book.ledger.holds == {}


def test_only_the_oldest_gang_holds_and_serving_nodes_are_never_held() -> None:
    c = Cluster(settings=HOLD)
    c.nodes("h", 4, "leaf-1")
    busy(c, "serve", "h-0", stage="serving")  # serving does not end on its own
    busy(c, "job-b", "h-1")
    busy(c, "job-c", "h-2")
    older = c.gang("train", 3)
    assert c.filter(older[0], free_names(c)).passed == []
    held = c.gangs.book.ledger.holds["ml/train"]
    assert "h-0" not in held and set(held) == {"h-1", "h-2", "h-3"}
    newer = c.gang("tune", 1, ns="ml2")
    c.filter(newer[0], free_names(c))
    assert "ml2/tune" not in c.gangs.book.ledger.holds  # one hold: the oldest gang's


def test_a_gang_no_free_node_set_could_hold_holds_nothing() -> None:
    c = Cluster(settings=HOLD)
    c.nodes("h", 2, "leaf-1")
    busy(c, "serve-0", "h-0", stage="serving")
    pods = c.gang("train", 2)  # needs both nodes; one runs serving
    assert c.filter(pods[0], free_names(c)).passed == []
    assert c.gangs.book.ledger.holds == {}


def test_a_hold_goes_with_its_gang() -> None:
    c = Cluster(settings=HOLD)
    pods, _, _ = waiting_gang(c)
    held = set(c.gangs.book.ledger.holds["ml/train"])
    for p in pods:
        c.delete(p)
    job = small_job(c, "eval")
    d = c.filter(job, gpu_nodes(c))  # the next filter sweeps the gone gang
    assert c.gangs.book.ledger.holds == {}
    assert set(d.passed) & held  # the free held box takes other pods again
