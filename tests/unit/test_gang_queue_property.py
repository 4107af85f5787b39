"""The gang queue's promise, over random clusters, arrival orders, sizes and topology requirements
(docs/gangs.md, "Gang queue"): no gang gets a plan while a gang ahead of it in the queue, complete and
without a plan, would have fitted at that moment on the capacity the new plan took. A later gang
planned beside an earlier one's plan, or while the earlier one did not fit, is a backfill.

The oracle is independent of the planner: every member of a generated gang asks the same GPUs, all
nodes have RDMA and room for any member's CPU and memory, so a gang fits iff the free GPUs (net of
every reservation) hold ``size`` members, counting ``free // gpus`` per node, inside one tier-1 block
when the gang requires it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.core.workload import parse_workload
from app.objects import node_object, pod_object
from tests.unit.test_gang_coordinator import H100, Cluster

TIER1 = "fabric.topograph.run/tier-1"
BASE = 1_796_600_000.0


@dataclass(frozen=True)
class G:
    name: str
    size: int
    gpus: int
    required: bool
    priority: int
    created: float


gangs_st = st.lists(
    st.tuples(st.integers(1, 4), st.sampled_from([2, 4, 8]), st.booleans(), st.sampled_from([0, 0, 0, 100])),
    min_size=2, max_size=5,
)
actions_st = st.lists(st.tuples(st.sampled_from(["filter", "filter", "start", "end"]), st.integers(0, 4)),
                      min_size=1, max_size=14)


def order(g: G) -> tuple[int, float, str]:
    return (-g.priority, g.created, f"ml/{g.name}")


def fits(g: G, free: dict[str, int], block: dict[str, str]) -> bool:
    groups: dict[str, int] = {}
    for node, n in free.items():
        key = block[node] if g.required else ""
        groups[key] = groups.get(key, 0) + max(0, n) // g.gpus
    return any(room >= g.size for room in groups.values())


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(per_block=st.tuples(st.integers(1, 3), st.integers(1, 3)),
       busy=st.lists(st.sampled_from([0, 0, 4, 8]), min_size=6, max_size=6),
       raw=gangs_st, arrival=st.permutations(range(5)), actions=actions_st)
def test_no_gang_is_planned_while_an_earlier_gang_that_fitted_waits(
        per_block: tuple[int, int], busy: list[int], raw: list[tuple[int, int, bool, int]],
        arrival: list[int], actions: list[tuple[str, int]]) -> None:
    c = Cluster()
    block: dict[str, str] = {}
    for b, count in zip(("b1", "b2"), per_block, strict=True):
        for i in range(count):
            name = f"{b}-n{i}"
            c.service.absorb_node(node_object(name, gpus=8, product=H100, rdma=True, labels={
                "fabric.topograph.run/tier-0": f"leaf-{b}", TIER1: b}))
            block[name] = b
            if used := busy[len(block) - 1]:
                c.occupy(name, used)
    ranks = [r for r in arrival if r < len(raw)]
    gangs = [G(f"g{i}", size, gpus, req, prio, BASE + 10 * ranks[i])
             for i, (size, gpus, req, prio) in enumerate(raw)]
    pods: dict[str, list[dict[str, Any]]] = {}
    for g in gangs:
        pods[g.name] = []
        ann = {"llm-placement.io/gang-size": str(g.size)}
        if g.required:
            ann["llm-placement.io/topology-required-placement"] = TIER1
        for i in range(g.size):
            pod = pod_object(f"{g.name}-{i}", namespace="ml", stage="pretraining", gpus=g.gpus,
                             annotations=ann, labels={"scheduling.x-k8s.io/pod-group": g.name})
            pod["metadata"]["creationTimestamp"] = time.strftime(
                "%Y-%m-%dT%H:%M:%SZ", time.gmtime(g.created + i))
            pod["spec"]["priority"] = g.priority
            c.add(pod)
            pods[g.name].append(pod)
    started: set[str] = set()
    ended: set[str] = set()
    snap, ledger = c.service.snapshot, c.gangs.ledger
    for what, i in actions:
        g = gangs[i % len(gangs)]
        key = f"ml/{g.name}"
        if g.name in ended:
            continue
        if what == "start" and key in ledger.plans and g.name not in started:
            plan = ledger.plans[key]
            with c.service.lock:
                for pod in pods[g.name]:
                    uid = pod["metadata"]["uid"]
                    snap.assume(parse_workload(pod), plan.members[uid].node)
            c.filter(pods[g.name][0])  # the sweep sees the gang bound
            started.add(g.name)
            continue
        if what == "end" and g.name in started:
            for pod in pods[g.name]:
                c.delete(pod)
            ended.add(g.name)
            continue
        if what != "filter" or g.name in started:
            continue
        before = set(ledger.plans)
        c.filter(pods[g.name][0])
        for new in sorted(set(ledger.plans) - before):
            newest = next(x for x in gangs if f"ml/{x.name}" == new)
            # The capacity the new plan was made on: free GPUs net of every other reservation.
            free = {n: snap.free_gpus(n) - ledger.reserved_gpus(n, new) for n in block}
            for e in gangs:
                ek = f"ml/{e.name}"
                if order(e) >= order(newest) or ek in ledger.plans or e.name in started | ended:
                    continue
                assert not fits(e, free, block), (
                    f"{new} was planned while {ek}, ahead of it in the gang queue, fitted and waits")
