"""A standby replica's extender adopts the plans the dead leader persisted (app/gang/takeover.py).

The integration test tests/integration/test_ha.py shows the failure on the real control plane; these
pin the pieces: which pods the watch keeps, when the adoption runs, and that a gang already planned
here keeps its own plan.
"""

from __future__ import annotations

import copy
from typing import Any

from app.base.objects import pod_object
from app.gang.persist import ANNOTATION
from app.gang.takeover import PlannedPods, Takeover
from tests.unit.gang.test_gang_coordinator import Cluster

GPU = ("nvidia.com/gpu",)


def _listed(c: Cluster) -> list[dict[str, Any]]:
    out = []
    for name, pod in c.pods.items():
        p = copy.deepcopy(pod)
        p["metadata"]["annotations"].update(c.binder.annotations.get(f"ml/{name}", {}))
        out.append(p)
    return out


def test_planned_pods_keeps_only_pending_pods_with_a_plan() -> None:
    planned = PlannedPods()
    pod = {"metadata": {"uid": "u1", "annotations": {ANNOTATION: '{"gang":"ml/g","node":"n"}'}},
           "spec": {}, "status": {"phase": "Pending"}}
    planned.update(pod)
    assert len(planned) == 1
    bound = copy.deepcopy(pod)
    bound["spec"]["nodeName"] = "n"
    planned.update(bound)  # bound: a fact, not a plan
    assert len(planned) == 0
    planned.update(pod)
    planned.update({"metadata": {"uid": "u1"}}, deleted=True)
    assert len(planned) == 0
    cleared = copy.deepcopy(pod)
    cleared["metadata"]["annotations"][ANNOTATION] = ""  # "no plan"
    planned.update(cleared)
    assert len(planned) == 0
    for junk in ({"metadata": "x"}, {"metadata": {"uid": "u2", "annotations": ["x"]}}, {"spec": 3}):
        planned.update(junk)  # never raises
    planned.replace([pod, "junk", {"metadata": {"uid": "u3"}}])
    assert [p["metadata"]["uid"] for p in planned.pods()] == ["u1"]


def test_standby_adopts_the_leaders_plan_at_its_first_filter() -> None:
    leader = Cluster()
    leader.nodes("n", 6, "leaf-1")
    pods = leader.gang("g", 4)
    plan = {p["metadata"]["name"]: leader.filter(p).passed[0] for p in pods}
    leader.flush()
    # The standby saw the same nodes and pods through its own watch, and was never called.
    standby = Cluster()
    for facts in leader.service.snapshot.nodes.values():
        standby.service.snapshot.upsert_node(facts)
    planned = PlannedPods()
    for pod in _listed(leader):
        standby.add(pod)
        planned.update(pod)
    clock = [100.0]
    takeover = Takeover(planned.pods, standby.gangs.restore, GPU, ttl=120.0, idle_seconds=10.0,
                        clock=lambda: clock[0])
    # Its first filter is for another pod: the leader's reservations must already hold.
    loner = pod_object("loner", namespace="ml", stage="pretraining", gpus=8)
    standby.add(loner)
    takeover()  # what the service runs before each filter (app/extender/service.py)
    assert not set(standby.filter(loner).passed) & set(plan.values())
    assert takeover.adopted == 1 and standby.gangs.ledger.total_reserved() == 32
    # The members get their persisted nodes.
    for p in pods:
        takeover()
        assert standby.filter(p).passed == [plan[p["metadata"]["name"]]]


def test_adoption_runs_only_after_an_idle_spell_and_keeps_our_own_plans() -> None:
    c = Cluster()
    c.nodes("n", 6, "leaf-1")
    pods = c.gang("g", 2)
    calls: list[int] = []
    clock = [0.0]

    def adopt(records: list[Any]) -> int:
        calls.append(len(records))
        return c.gangs.restore(records)

    planned = PlannedPods()
    takeover = Takeover(planned.pods, adopt, GPU, ttl=120.0, idle_seconds=10.0, clock=lambda: clock[0])
    takeover()
    c.filter(pods[0])  # the first call: nothing persisted yet
    c.flush()
    ours = c.gangs.ledger.plans["ml/g"]
    for pod in _listed(c):
        planned.update(pod)
    clock[0] = 5.0
    takeover()
    c.filter(pods[1])  # busy: no adoption
    assert calls == []  # the first call found no planned pod, so nothing to adopt
    clock[0] = 30.0
    takeover()
    c.filter(pods[1])  # after an idle spell: reads the pods, but the gang is ours already
    assert calls == [2]
    assert c.gangs.ledger.plans["ml/g"] is ours and takeover.adopted == 0
