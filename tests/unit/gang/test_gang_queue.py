"""The gang queue (docs/gangs.md, "Gang queue"): complete gangs are planned in order of priority,
then creation, whichever member kube-scheduler happens to filter first; a later gang starts first
only where it fits beside the earlier gangs' plans (backfill)."""

from __future__ import annotations

import time
from typing import Any

import pytest

from app.base.objects import node_object, pod_object
from app.base.workload import created_at
from app.extender.explain import explain_spec
from tests.unit.gang.test_gang_coordinator import H100, Cluster

TIER1 = "fabric.topograph.run/tier-1"
BASE = 1_796_600_000.0  # some Unix second


def stamp(seconds: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(seconds))


def two_blocks(c: Cluster) -> None:
    """Eight 8-GPU H100 nodes in two fabric blocks of four (the gang queue's reference scenario)."""
    for block in ("b1", "b2"):
        for i in range(4):
            c.service.absorb_node(node_object(f"{block}-n{i}", gpus=8, product=H100, rdma=True, labels={
                "fabric.topograph.run/tier-0": f"leaf-{block}", TIER1: block}))


def gang(c: Cluster, name: str, size: int, created: float, required: str | None = None,
         priority: int = 0) -> list[dict[str, Any]]:
    ann = {"llm-placement.io/topology-required-placement": required} if required else {}
    pods = []
    for i in range(size):
        pod = pod_object(f"{name}-{i}", namespace="ml", stage="pretraining", gpus=8,
                         annotations={"llm-placement.io/gang-size": str(size), **ann},
                         labels={"scheduling.x-k8s.io/pod-group": name})
        pod["metadata"]["creationTimestamp"] = stamp(created + i)
        pod["spec"]["priority"] = priority
        c.add(pod)
        pods.append(pod)
    return pods


def test_creation_timestamps_are_read_as_unix_seconds() -> None:
    assert created_at({"creationTimestamp": stamp(BASE)}) == BASE
    for bad in (None, "", "yesterday", 17):
        assert created_at({"creationTimestamp": bad}) == 0.0


@pytest.mark.parametrize("filtered_first", ["pretrain-a", "pretrain-too-big"])
def test_the_earlier_gang_is_placed_whichever_member_is_filtered_first(filtered_first: str) -> None:
    c = Cluster()
    two_blocks(c)
    gangs = {"pretrain-a": gang(c, "pretrain-a", 4, BASE, required=TIER1),
             "pretrain-too-big": gang(c, "pretrain-too-big", 6, BASE + 7)}
    c.filter(gangs[filtered_first][0])
    assert set(c.gangs.ledger.plans) == {"ml/pretrain-a"}
    blocks = {c.service.snapshot.nodes[m.node].labels[TIER1]
              for m in c.gangs.ledger.plans["ml/pretrain-a"].members.values()}
    assert len(blocks) == 1
    d = c.filter(gangs["pretrain-too-big"][1])
    assert d.passed == []
    why = next(iter(d.unresolvable.values()))
    # The FailedScheduling reason names the gang ahead, its creation, its size and where it is planned.
    assert (f"waits behind gang ml/pretrain-a (created {time.strftime('%H:%M:%S', time.gmtime(BASE))}, "
            f"4 x 8 GPUs, planned on ") in why, why
    assert "1st of 1 in the gang queue" in why


@pytest.mark.parametrize("filtered_first", ["pretrain-a", "pretrain-too-big"])
def test_the_later_gang_first_in_the_queue_is_placed(filtered_first: str) -> None:
    c = Cluster()
    two_blocks(c)
    gangs = {"pretrain-too-big": gang(c, "pretrain-too-big", 6, BASE),
             "pretrain-a": gang(c, "pretrain-a", 4, BASE + 7, required=TIER1)}
    c.filter(gangs[filtered_first][0])
    assert set(c.gangs.ledger.plans) == {"ml/pretrain-too-big"}


def test_priority_comes_before_creation() -> None:
    c = Cluster()
    two_blocks(c)
    early = gang(c, "early", 6, BASE)
    gang(c, "urgent", 4, BASE + 60, required=TIER1, priority=1000)
    c.filter(early[0])
    assert set(c.gangs.ledger.plans) == {"ml/urgent"}


def test_a_later_gang_that_fits_beside_the_earlier_plan_starts_at_once() -> None:
    c = Cluster()
    two_blocks(c)
    a = gang(c, "pretrain-a", 4, BASE, required=TIER1)
    small = gang(c, "small", 2, BASE + 7)
    d = c.filter(small[0])
    assert len(d.passed) == 1  # backfill: it fits in what pretrain-a's plan leaves
    assert set(c.gangs.ledger.plans) == {"ml/pretrain-a", "ml/small"}
    planned_a = {m.node for m in c.gangs.ledger.plans["ml/pretrain-a"].members.values()}
    assert not planned_a & {m.node for m in c.gangs.ledger.plans["ml/small"].members.values()}
    assert len(c.filter(a[0]).passed) == 1


def test_a_gang_that_completes_during_a_later_gangs_solve_is_committed_first() -> None:
    """The commit is serialised in queue order: a plan made for a later gang while an earlier gang
    became complete is discarded, the earlier gang planned, and the later one planned again."""
    c = Cluster()
    two_blocks(c)
    a = gang(c, "pretrain-a", 4, BASE, required=TIER1)
    last = a.pop()  # the earlier gang's last member is not there yet
    with c.service.lock:
        c.service.snapshot.untrack_spec(last["metadata"]["uid"])
    big = gang(c, "pretrain-too-big", 6, BASE + 7)
    solve = c.gangs.planner.solve
    arrived = []

    def solve_while_the_member_arrives(*args: Any) -> Any:
        if not arrived:
            arrived.append(True)
            c.add(last)  # the watch delivers the earlier gang's last member mid-solve
        return solve(*args)

    c.gangs.planner.solve = solve_while_the_member_arrives
    d = c.filter(big[0])
    assert arrived and d.passed == []
    assert set(c.gangs.ledger.plans) == {"ml/pretrain-a"}


def test_queue_length_and_oldest_age_are_exported_and_explain_names_the_place() -> None:
    clock = [BASE + 100]
    c = Cluster(clock=clock)
    two_blocks(c)
    gang(c, "pretrain-a", 4, BASE, required=TIER1)
    big = gang(c, "pretrain-too-big", 6, BASE + 7)
    gang(c, "waiting", 3, BASE - 50)  # made incomplete below: not queued
    c.service.snapshot.untrack_spec(c.pods["waiting-2"]["metadata"]["uid"])
    assert c.metric("llm_placement_gang_queue_length") == 2
    assert c.metric("llm_placement_gang_queue_oldest_seconds") == 100
    c.filter(big[0])
    assert c.metric("llm_placement_gang_queue_length") == 1  # pretrain-a is planned
    assert c.metric("llm_placement_gang_queue_oldest_seconds") == 93

    spec = c.service.snapshot.specs[big[0]["metadata"]["uid"]]
    q = explain_spec(c.service, spec)["gang_queue"]
    assert q["position"] == 1 and q["length"] == 1 and not q["planned"]
    assert len(q["waits_behind"]) == 1 and q["waits_behind"][0].startswith("gang ml/pretrain-a (created ")


@pytest.mark.parametrize("first", ["pretrain-a", "pretrain-too-big"])
def test_gangs_created_in_the_same_second_queue_in_the_order_the_watch_saw_them(first: str) -> None:
    c = Cluster()
    two_blocks(c)
    spec = {"pretrain-a": (4, TIER1), "pretrain-too-big": (6, None)}
    later = next(n for n in spec if n != first)
    # Both first members created at BASE: the whole-second creationTimestamp cannot tell them apart.
    made = {n: gang(c, n, spec[n][0], BASE, required=spec[n][1]) for n in (first, later)}
    c.filter(made[later][0])
    assert set(c.gangs.ledger.plans) == {f"ml/{first}"}


def test_in_the_background_planner_too_the_later_gang_filtered_first_waits_behind_the_earlier() -> None:
    """The live extender plans off the request path: the later gang's member filtered first starts a
    job, which plans the earlier gang first (the defect this queue fixes raced exactly here)."""
    c = Cluster(background=True)
    two_blocks(c)
    gang(c, "pretrain-a", 4, BASE, required=TIER1)
    big = gang(c, "pretrain-too-big", 6, BASE + 7)
    d = c.filter(big[0])
    assert d.passed == [] and "is being planned" in next(iter(d.rejections.values()))
    c.gangs.planner.drain(30)
    assert set(c.gangs.ledger.plans) == {"ml/pretrain-a"}
    c.filter(big[1])
    c.gangs.planner.drain(30)
    d = c.filter(big[2])
    assert set(c.gangs.ledger.plans) == {"ml/pretrain-a"}
    assert "waits behind gang ml/pretrain-a" in next(iter(d.unresolvable.values()))


def test_a_gang_behind_another_waiting_gang_is_told_its_place() -> None:
    c = Cluster()
    two_blocks(c)
    for node in list(c.service.snapshot.nodes):
        c.occupy(node, 8)  # everything busy: nobody fits now
    first = gang(c, "first", 2, BASE)
    second = gang(c, "second", 2, BASE + 7)
    assert "1st" not in next(iter(c.filter(first[0]).unresolvable.values()))
    why = next(iter(c.filter(second[0]).unresolvable.values()))
    assert why.endswith("; 2nd of 2 in the gang queue") and "waits behind" not in why
