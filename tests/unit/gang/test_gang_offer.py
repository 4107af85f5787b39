"""A planned node missing from what kube-scheduler offered a member (docs/gangs.md, "Offers that are a
part of the cluster"): left out of a sample or of a node tried alone, the gang keeps its plan; left
out of an offer of every node kube-scheduler's filters passed, or gone, cordoned or taken, it is
replanned without it."""

from __future__ import annotations

from typing import Any

import pytest

from app.base.objects import pod_object
from app.base.workload import parse_workload
from app.config.settings import Settings
from app.placement.offer import num_feasible_nodes_to_find, partial, patience
from tests.unit.gang.test_gang_coordinator import Cluster
from tests.unit.gang.test_gang_queue import BASE, TIER1, gang, two_blocks

ADAPTIVE = Settings(cluster_source="none", metrics_port=0, scheduler_percentage_of_nodes_to_score=0)


@pytest.mark.parametrize(("offered", "num_all", "percentage", "expected"), [
    (5, 6, 100, False),      # a small cluster: every node that passed is offered
    (6, 6, 100, False),      # every node: nothing left out
    (1, 6, 100, True),       # one node of several: a nominated node tried alone
    (1, 1, 100, False),      # the only node
    (400, 500, 100, False),  # every node scored: shorter than the cluster, so complete
    (230, 500, 0, True),     # adaptive at 500 nodes: kube-scheduler stops at 230
    (229, 500, 0, False),    # one short of the sample: it looked at every node
    (500, 5000, 0, True),    # adaptive floor 10 % at 5,000 nodes
    (100, 150, 10, True),    # 10 % of 150 is below the floor of 100
    (99, 150, 10, False),
])
def test_which_offers_may_leave_out_a_node_that_passes(offered: int, num_all: int, percentage: int,
                                                       expected: bool) -> None:
    assert partial(offered, num_all, percentage) is expected


@pytest.mark.parametrize(("offered", "num_all", "percentage", "expected"), [
    (1, 8, 100, 3),       # the full search follows in the same cycle
    (500, 5000, 0, 40),   # a 10 % sample: the ring is covered in ~10 cycles, four times that
    (230, 500, 0, 9),
    (100, 150, 10, 6),
])
def test_patience_grows_with_how_small_a_part_each_offer_is(offered: int, num_all: int, percentage: int,
                                                            expected: int) -> None:
    assert patience(offered, num_all, percentage) == expected


def test_adaptive_sample_sizes_match_kube_scheduler() -> None:
    assert [num_feasible_nodes_to_find(n, 0) for n in (99, 150, 500, 1000, 5000)] == [99, 100, 230, 420, 500]


def planned(c: Cluster, size: int = 2) -> tuple[list[dict[str, Any]], dict[str, str]]:
    pods = c.gang("g", size)
    c.filter(pods[0])
    plan = c.gangs.ledger.plans["ml/g"]
    return pods, {p["metadata"]["name"]: plan.members[p["metadata"]["uid"]].node for p in pods}


def test_a_node_tried_alone_that_is_not_the_planned_one_keeps_the_plan() -> None:
    """kube-scheduler tries a nominated node alone first; the full search follows."""
    c = Cluster()
    names = c.nodes("n", 6, "leaf-1")
    pods, where = planned(c)
    other = next(n for n in names if n not in where.values())
    d = c.filter(pods[0], [other])
    assert d.passed == []
    why = d.rejections[other]
    assert f"planned node {where['g-0']} of gang ml/g was not among the 1 of 6 nodes" in why, why
    assert "the plan stands" in why and other not in d.unresolvable  # resolvable: retried soon
    plan = c.gangs.ledger.plans["ml/g"]
    assert plan.epoch == 1 and not plan.stale and c.gangs.ledger.total_reserved() == 16
    assert c.filter(pods[0]).passed == [where["g-0"]]  # the full search: its node
    assert c.metric("llm_placement_gangs_total", outcome="replanned") == 0


def test_a_sample_without_the_planned_node_keeps_the_plan_until_one_includes_it() -> None:
    c = Cluster(ADAPTIVE)
    names = c.nodes("n", 150, "leaf-1")
    pods, where = planned(c)
    sample = [n for n in names if n not in where.values()][:100]  # adaptive at 150 nodes: 100
    for _ in range(patience(100, 150, 0)):
        d = c.filter(pods[1], sample)
        assert d.passed == [] and "the plan stands" in d.rejections[sample[0]]
    assert c.gangs.ledger.plans["ml/g"].epoch == 1
    assert c.filter(pods[1], sorted(names)).passed == [where["g-1"]]
    assert c.gangs.ledger.plans["ml/g"].unoffered == {}  # the count starts again


def test_a_node_left_out_of_too_many_samples_in_a_row_is_replanned_without() -> None:
    """A filter the extender cannot see (a taint, the pod's affinity) keeps it out for good."""
    c = Cluster(ADAPTIVE)
    names = c.nodes("n", 150, "leaf-1")
    pods, where = planned(c)
    sample = [n for n in names if n not in where.values()][:100]
    for _ in range(patience(100, 150, 0)):
        c.filter(pods[1], sample)
    d = c.filter(pods[1], sample)
    plan = c.gangs.ledger.plans["ml/g"]
    assert plan.epoch == 2 and where["g-1"] not in plan.nodes()
    assert d.passed == [plan.members[pods[1]["metadata"]["uid"]].node]


@pytest.mark.parametrize("change", ["cordoned", "deleted", "taken", "left out of a complete offer"])
def test_a_planned_node_that_really_stopped_fitting_is_replanned_without_it(change: str) -> None:
    c = Cluster()
    names = c.nodes("n", 6, "leaf-1")
    pods, where = planned(c)
    lost = where["g-0"]
    snap = c.service.snapshot
    with c.service.lock:
        if change == "cordoned":
            snap.upsert_node(snap.nodes[lost].model_copy(update={"unschedulable": True}))
        elif change == "deleted":
            snap.remove_node(lost)
        elif change == "taken":
            snap.assume(parse_workload(pod_object("intruder", namespace="other", gpus=4)), lost)
    # A node tried alone first: the plan is not made again on one node (that would give the
    # reservation back), it is marked for a replan and kept until the full search's offer.
    # (Left out of a node tried alone with nothing wrong with it, a node keeps its plan: above.)
    offered = [n for n in names if n != lost]
    if change != "left out of a complete offer":
        d = c.filter(pods[0], offered[:1])
        assert d.passed == [] and "replanned at its next offer" in d.rejections[offered[0]]
        plan = c.gangs.ledger.plans["ml/g"]
        assert plan.epoch == 1 and plan.stale and c.gangs.ledger.total_reserved() > 0
    # Every node kube-scheduler's filters pass (not the lost one): replanned without it.
    d = c.filter(pods[0], offered)
    plan = c.gangs.ledger.plans["ml/g"]
    assert plan.epoch == 2 and lost not in plan.nodes(), change
    assert c.metric("llm_placement_gangs_total", outcome="replanned") == 1
    assert d.passed == [plan.members[pods[0]["metadata"]["uid"]].node]


def test_a_partial_offer_does_not_hand_the_earlier_gangs_place_to_a_later_one() -> None:
    """The gang queue's two-block scenario: the earlier gang, planned inside one block, is offered
    one node of the other block alone; it keeps its block, and the later six-member gang still waits."""
    c = Cluster()
    two_blocks(c)
    early = gang(c, "pretrain-a", 4, BASE, required=TIER1)
    late = gang(c, "pretrain-too-big", 6, BASE + 7)
    c.filter(early[0])
    plan = c.gangs.ledger.plans["ml/pretrain-a"]
    block = {c.service.snapshot.nodes[m.node].labels[TIER1] for m in plan.members.values()}
    other = next(n for n in sorted(c.service.snapshot.nodes)
                 if c.service.snapshot.nodes[n].labels[TIER1] not in block)
    assert c.filter(early[1], [other]).passed == []
    assert c.gangs.ledger.plans["ml/pretrain-a"] is plan and not plan.stale
    assert c.filter(late[0]).passed == []
    assert set(c.gangs.ledger.plans) == {"ml/pretrain-a"}
