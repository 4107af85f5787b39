"""The oldest gang that cannot be placed holds whole nodes as they free (app/gang/hold.py,
docs/gangs.md "Starvation bound")."""

from __future__ import annotations

from typing import Any

import pytest

from app.base.objects import pod_object
from app.base.workload import parse_workload
from app.config.settings import ConfigDeprecationWarning, Settings
from tests.unit.gang.test_gang_coordinator import Cluster
from tests.unit.gang.test_gang_lockstep import free_names

HOLD = Settings(cluster_source="none", metrics_port=0, gang_hold_after_seconds=0)


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


def test_before_the_starvation_bound_a_small_job_takes_the_node_the_gang_waits_for() -> None:
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


def test_a_held_node_is_not_swapped_for_one_with_newer_work() -> None:
    """A held node only drains; a node with more free GPUs but a job started since would make the
    gang wait for that job too, and the hold could keep moving onto newer work."""
    c = Cluster(settings=HOLD)
    c.nodes("h", 3, "leaf-1")
    jobs = [busy(c, f"job-{i}", f"h-{i}") for i in range(3)]
    pods = c.gang("train", 2)
    assert c.filter(pods[0], free_names(c)).passed == []
    held = set(c.gangs.book.ledger.holds["ml/train"])
    [loose] = [n for n in ("h-0", "h-1", "h-2") if n not in held]
    c.delete(jobs[int(loose[-1])])  # the node not held frees, and a newer 1-GPU job takes it
    job = small_job(c, "eval")
    assert c.place(job, [loose]) == loose
    assert c.filter(pods[0], free_names(c)).passed == []  # solved again: room was freed
    assert set(c.gangs.book.ledger.holds["ml/train"]) == held  # 7 free on the loose node: still not held


def test_by_default_the_first_waiting_gang_holds_once_it_has_waited_the_bound() -> None:
    clock = [1_796_600_000.0]
    c = Cluster(clock=clock)
    bound = Settings(cluster_source="none", metrics_port=0).gang_hold_after_seconds
    assert bound == 3600
    c.nodes("h", 3, "leaf-1")
    first = busy(c, "job-a", "h-0")
    busy(c, "job-b", "h-1")
    pods = c.gang("train", 2)
    assert c.filter(pods[0], free_names(c)).passed == []
    assert c.gangs.book.ledger.holds == {}  # waiting less than the bound: later work may backfill
    # A look is armed for the bound: kube-scheduler may have no reason to retry the members then.
    [due] = c.hold_timers.pending()
    assert due.delay == bound
    clock[0] += bound - 1
    assert c.filter(pods[1], free_names(c)).passed == [] and c.gangs.book.ledger.holds == {}
    clock[0] += 1
    # At the bound the gang is solved again then and there (kube-scheduler's own filters may keep
    # its members from the extender: no node with room for one) and holds; its members are requeued.
    c.hold_timers.fire()
    held = c.gangs.book.ledger.holds["ml/train"]
    c.flush()
    assert {k: v.get("llm-placement.io/gang-retry") for k, v in c.binder.annotations.items()
            if k.startswith("ml/")} == {"ml/train-0": "1", "ml/train-1": "1"}
    assert c.filter(pods[0], free_names(c)).passed == []
    assert c.gangs.book.ledger.holds["ml/train"] == held
    assert "h-2" in held and len(held) == 2
    # A small job no longer takes the free node the gang waits for; the gang gets it when job-a ends.
    job = small_job(c, "eval")
    assert not set(c.filter(job, gpu_nodes(c)).passed) & set(held)
    if "h-0" in held:
        c.delete(first)
    else:
        c.delete(c.pods["job-b"])
    assert {c.place(p, free_names(c)) for p in pods} == set(held)


@pytest.mark.parametrize(("old", "after"), [("true", 0.0), ("false", 86_400.0), (True, 0.0), (False, 86_400.0)])
def test_the_former_switch_keeps_its_meaning(old: object, after: float) -> None:
    s = Settings.model_validate({"cluster_source": "none", "gang_hold_for_oldest": old})
    assert s.gang_hold_after_seconds == after and s.policies().gang.hold_after_seconds == after


def test_a_former_switch_that_is_no_boolean_is_refused_with_its_replacement() -> None:
    with pytest.warns(ConfigDeprecationWarning, match="set gang_hold_after_seconds instead"), \
            pytest.raises(ValueError, match=r"gang_hold_for_oldest: .*boolean"):
        Settings.model_validate({"cluster_source": "none", "gang_hold_for_oldest": "sometimes"})
