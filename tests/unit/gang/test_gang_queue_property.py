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

from app.base.objects import node_object, pod_object
from app.base.workload import parse_workload
from app.config.settings import Settings
from tests.unit.gang.test_gang_coordinator import H100, Cluster

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


# --- the starvation bound (docs/gangs.md, "Starvation bound") ------------------------------------------
# One step: the clock moves on, maybe a running job ends, maybe a later job arrives and is placed
# where it fits (before the gang's members are retried: the adversarial order), then kube-scheduler
# retries the gang's member.
# A job that ends is one of the two longest running (work ends roughly in the order it started).
steps_st = st.lists(st.tuples(st.sampled_from([0, 600, 1800, 1800]), st.sampled_from([None, 0, 0, 1]),
                              st.sampled_from([0, 1, 1, 2, 4, 8])), min_size=1, max_size=25)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(nodes=st.integers(2, 5), size=st.integers(2, 5),
       first=st.lists(st.sampled_from([1, 4, 8]), min_size=5, max_size=5), steps=steps_st)
def test_the_first_waiting_gang_starts_once_the_work_running_at_its_bound_ends(
        nodes: int, size: int, first: list[int], steps: list[tuple[int, int | None, int]]) -> None:
    """With the default settings: a gang at the head of the gang queue that fits the empty cluster,
    looked at once it has waited ``gang_hold_after_seconds``, is planned at its first look after the
    work running at that moment has ended, however much later work kept arriving and taking each
    GPU that freed. Without the bound, a 1-GPU job arriving after each end keeps it waiting."""
    size = min(size, nodes)
    clock = [BASE + 60]
    c = Cluster(clock=clock)
    bound = Settings(cluster_source="none", metrics_port=0).gang_hold_after_seconds
    names = []
    for i in range(nodes):
        name = f"n{i}"
        c.service.absorb_node(node_object(name, gpus=8, product=H100, rdma=True, labels={
            "fabric.topograph.run/tier-0": "leaf-1", TIER1: "b1"}))
        names.append(name)
    running: dict[str, dict[str, Any]] = {}  # every GPU node starts with some work on it
    for i, name in enumerate(names):
        job = pod_object(f"old-{i}", namespace="other", gpus=first[i], stage="alignment")
        c.add(job)
        with c.service.lock:
            c.service.snapshot.assume(parse_workload(job), name)
        running[f"old-{i}"] = job
    members = []
    for i in range(size):
        pod = pod_object(f"big-{i}", namespace="ml", stage="pretraining", gpus=8,
                         annotations={"llm-placement.io/gang-size": str(size)},
                         labels={"scheduling.x-k8s.io/pod-group": "big"})
        pod["metadata"]["creationTimestamp"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(BASE))
        c.add(pod)
        members.append(pod)
    assert c.filter(members[0]).passed == []  # every node has work: the gang waits
    at_bound: set[str] | None = None  # the work running when the gang was looked at past its bound
    for n, (tick, end, gpus) in enumerate(steps):
        clock[0] += tick
        if end is not None and running:
            c.delete(running.pop(list(running)[end % len(running)]))
        if gpus:
            job = pod_object(f"new-{n}", namespace="other", gpus=gpus, stage="alignment")
            c.add(job)
            passed = c.filter(job, names).passed
            if passed:
                with c.service.lock:
                    c.service.snapshot.assume(parse_workload(job), passed[0])
                running[job["metadata"]["name"]] = job
            else:
                c.delete(job)
        state = c.gangs.states["ml/big"]
        waited = state.waiting_since is not None and clock[0] - state.waiting_since >= bound
        done = at_bound is not None and not (at_bound & set(running))
        c.filter(members[0])
        if "ml/big" in c.gangs.ledger.plans:
            return
        assert not done, (f"the gang waited past its bound and every job running then ended, yet it "
                          f"has no plan; holds {c.gangs.ledger.holds}")
        if waited and at_bound is None:
            at_bound = set(running)
