"""Gang filtering through the real placer: waiting, planning, reservations, admission, replans."""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from app.base.catalog import GpuCatalog
from app.base.objects import node_object, pod_object
from app.base.workload import GANG_GATE, parse_workload
from app.config.settings import Settings
from app.demo.run import run_demo
from app.extender.service import ExtenderService
from app.extender.wiring import build_core
from app.gang.admission import HeldMembers
from app.gang.coordinator import RESERVED_ELSEWHERE, GangCoordinator, GangRuntime
from app.gang.persist import ANNOTATION, BackgroundWriter, decode
from app.gang.planning import SolveFn

H100 = "NVIDIA-H100-80GB-HBM3"


class FakeBinder:
    """Records what the extender would write to the API server; can fail chosen binds."""

    def __init__(self, fail: set[str] | None = None) -> None:
        self.fail = fail or set()
        self.bound: dict[str, str] = {}
        self.annotations: dict[str, dict[str, str]] = defaultdict(dict)
        self.events: list[tuple[str, str, str]] = []
        self.ungated: list[str] = []
        self.lock = threading.Lock()

    def bind(self, namespace: str, name: str, uid: str, node: str) -> bool:
        key = f"{namespace}/{name}"
        if key in self.fail:
            raise RuntimeError(f"node {node} is gone")
        with self.lock:
            if self.bound.get(key) == node:
                return False
            self.bound[key] = node
        return True

    def annotate(self, namespace: str, name: str, annotations: dict[str, str]) -> None:
        with self.lock:
            self.annotations[f"{namespace}/{name}"].update(annotations)

    def event(self, namespace: str, name: str, uid: str, reason: str, message: str,
              warning: bool = False) -> None:
        with self.lock:
            self.events.append((f"{namespace}/{name}", reason, message))

    def read_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        return None

    def ungate(self, namespace: str, name: str) -> None:
        with self.lock:
            self.ungated.append(f"{namespace}/{name}")


@dataclass
class FakeTimer:
    delay: float
    fn: Callable[[], None]
    cancelled: bool = False
    fired: bool = False

    def cancel(self) -> None:
        self.cancelled = True


class FakeTimers:
    """Timers that fire only when the test says so: no test waits on the wall clock."""

    def __init__(self) -> None:
        self.armed: list[FakeTimer] = []

    def __call__(self, delay: float, fn: Callable[[], None]) -> FakeTimer:
        timer = FakeTimer(delay, fn)
        self.armed.append(timer)
        return timer

    def pending(self) -> list[FakeTimer]:
        return [t for t in self.armed if not t.cancelled and not t.fired]

    def fire(self) -> int:
        """Fire every pending timer (in the order armed); how many fired."""
        due = self.pending()
        for t in due:
            t.fired = True
            t.fn()
        return len(due)


class Cluster:
    """A service with the gang coordinator wired as in production, fed like the watch would."""

    def __init__(self, settings: Settings | None = None, binder: FakeBinder | None = None,
                 clock: list[float] | None = None, solve: SolveFn | None = None, background: bool = False,
                 gather: bool = False) -> None:
        self.binder = binder or FakeBinder()
        self.bind_timers, self.wake_timers, self.member_timers = FakeTimers(), FakeTimers(), FakeTimers()
        self.hold_timers = FakeTimers()
        runtime = GangRuntime(clock=(lambda: clock[0]) if clock is not None else time.time,
                              bind_timers=self.bind_timers, wake_timers=self.wake_timers, solve=solve,
                              background=background, member_timers=self.member_timers, gather=gather,
                              hold_timers=self.hold_timers)
        self.service: ExtenderService = build_core(
            settings or Settings(cluster_source="none", metrics_port=0), GpuCatalog.load(), binder=self.binder,
            gang_runtime=runtime,
        )
        gangs = self.service.placer.gangs
        assert isinstance(gangs, GangCoordinator)
        self.gangs = gangs
        self.pods: dict[str, dict[str, Any]] = {}

    def metric(self, name: str, **labels: str) -> float:
        """A sample through the registry's public API (0 when never observed)."""
        return self.service.metrics.registry.get_sample_value(name, labels) or 0.0

    def nodes(self, prefix: str, n: int, leaf: str, spine: str = "spine-1", free: int = 8,
              rdma: bool = True) -> list[str]:
        names = []
        for i in range(n):
            name = f"{prefix}-{i}"
            self.service.absorb_node(node_object(name, gpus=8, product=H100, rdma=rdma, labels={
                "fabric.topograph.run/tier-0": leaf, "fabric.topograph.run/tier-1": spine}))
            if free < 8:
                self.occupy(name, 8 - free)
            names.append(name)
        return names

    def occupy(self, node: str, gpus: int) -> None:
        spec = parse_workload(pod_object(f"busy-{node}", namespace="other", gpus=gpus))
        self.service.snapshot.assume(spec, node)

    def gang(self, name: str, size: int, gpus: int = 8, create: int | None = None, ns: str = "ml",
             annotations: dict[str, str] | None = None) -> list[dict[str, Any]]:
        pods = []
        for i in range(create if create is not None else size):
            ann = {"llm-placement.io/gang-size": str(size), **(annotations or {})}
            pod = pod_object(f"{name}-{i}", namespace=ns, stage="pretraining", gpus=gpus, annotations=ann,
                             labels={"scheduling.x-k8s.io/pod-group": name})
            self.add(pod)
            pods.append(pod)
        return pods

    def add(self, pod: dict[str, Any]) -> None:
        with self.service.lock:
            self.service.snapshot.track_spec(parse_workload(pod))
        self.pods[pod["metadata"]["name"]] = pod

    def delete(self, pod: dict[str, Any]) -> None:
        uid = pod["metadata"]["uid"]
        with self.service.lock:
            self.service.snapshot.untrack_spec(uid)
            self.service.snapshot.finish(uid)

    def filter(self, pod: dict[str, Any], names: list[str] | None = None) -> Any:
        names = names if names is not None else sorted(self.service.snapshot.nodes)
        with self.service.lock:
            return self.service.placer.filter(pod, names)

    def place(self, pod: dict[str, Any], names: list[str] | None = None) -> str:
        """Filter and, if exactly one node passed, assume it there (the scheduler's bind)."""
        d = self.filter(pod, names)
        assert len(d.passed) == 1, d.rejections
        with self.service.lock:
            self.service.snapshot.assume(parse_workload(pod), d.passed[0])
        return str(d.passed[0])

    def flush(self) -> None:
        writer = self.gangs.writer
        assert isinstance(writer, BackgroundWriter)
        assert writer.drain(10)

    def leaf(self, node: str) -> str:
        return self.service.snapshot.nodes[node].fabric[0]


def test_incomplete_gang_waits_and_reserves_nothing() -> None:
    c = Cluster()
    c.nodes("n", 8, "leaf-1")
    pods = c.gang("g", 8, create=3)
    d = c.filter(pods[0])
    assert d.passed == [] and not d.failed
    assert set(d.unresolvable.values()) == {"llm-placement: waiting for gang members 3/8"}
    assert c.gangs.ledger.total_reserved() == 0 and not c.gangs.ledger.plans
    c.flush()
    assert not c.binder.annotations


def test_gang_without_a_size_says_how_to_give_it_one() -> None:
    c = Cluster()
    c.nodes("n", 2, "leaf-1")
    pod = pod_object("p", namespace="ml", gpus=8, labels={"scheduling.x-k8s.io/pod-group": "pg"})
    c.add(pod)
    d = c.filter(pod)
    assert d.passed == [] and "gang ml/pg has no size" in next(iter(d.unresolvable.values()))
    # The PodGroup's minMember (as the PodGroup watch records it) fills the gap.
    c.service.snapshot.podgroup_min_member["ml/pg"] = 1
    assert len(c.filter(pod).passed) == 1


def test_complete_gang_is_planned_whole_into_the_block_that_fits() -> None:
    c = Cluster()
    c.nodes("a", 12, "leaf-a")  # pristine leaf
    c.nodes("b", 8, "leaf-b")
    c.nodes("bx", 4, "leaf-b", free=0)  # leaf-b is partly used and has exactly 8 free nodes
    pods = c.gang("g", 8)
    chosen = {}
    for pod in pods:
        d = c.filter(pod)
        assert len(d.passed) == 1
        other = {r for n, r in d.rejections.items() if n not in d.passed}
        assert RESERVED_ELSEWHERE.message in other
        chosen[pod["metadata"]["name"]] = d.passed[0]
    assert len(set(chosen.values())) == 8 and {c.leaf(n) for n in chosen.values()} == {"leaf-b"}
    # Idempotent: a re-filter of any member returns the same node.
    for pod in pods:
        assert c.filter(pod).passed == [chosen[pod["metadata"]["name"]]]
    assert c.gangs.ledger.total_reserved() == 64
    # Plans are persisted on the members and an event names the domains.
    c.flush()
    for name, node in chosen.items():
        data = decode(c.binder.annotations[f"ml/{name}"][ANNOTATION])
        assert data is not None and data["node"] == node and data["gang"] == "ml/g"
    planned = [m for _, r, m in c.binder.events if r == "GangPlanned"]
    assert len(planned) == 8 and "leaf-b" in planned[0]
    assert c.metric("llm_placement_solver_runs_total", status="optimal") == 1


def test_other_pods_see_reserved_gpus_as_taken() -> None:
    c = Cluster()
    names = c.nodes("n", 4, "leaf-1")
    pods = c.gang("g", 2)
    planned = {c.filter(p).passed[0] for p in pods}
    loner = pod_object("loner", namespace="ml", stage="pretraining", gpus=8)
    c.add(loner)
    d = c.filter(loner)
    assert set(d.passed) == set(names) - planned
    # The reason names the gang (docs/gangs.md, "Hold").
    assert all("GPUs reserved for gang ml/g, whose members are being placed" in d.rejections[n]
               for n in planned)


def test_bound_members_release_their_reservation_and_the_gang_completes() -> None:
    c = Cluster()
    c.nodes("n", 4, "leaf-1")
    pods = c.gang("g", 2)
    for p in pods:
        c.place(p)
    c.filter(pods[0])  # any later filter sweeps: both members are bound, the gang is complete
    assert c.gangs.ledger.total_reserved() == 0 and "ml/g" not in c.gangs.ledger.plans
    assert c.metric("llm_placement_gangs_total", outcome="bound") == 1
    # Usage counts each member once: nothing double counted.
    assert sum(u.gpus for u in c.service.snapshot.usage.values()) == 16


def test_two_gangs_competing_for_one_block_never_deadlock() -> None:
    c = Cluster()
    c.nodes("n", 4, "leaf-1")
    a = c.gang("a", 4)
    b = c.gang("b", 4)
    assert len(c.filter(a[0]).passed) == 1  # gang a plans first and holds the whole block
    d = c.filter(b[0])
    assert d.passed == []
    assert any("gang cannot be placed" in r for r in d.rejections.values())
    c.flush()
    why = [m for k, r, m in c.binder.events if r == "GangUnschedulable" and k == "ml/b-0"]
    assert why and "32 GPUs are reserved for other gangs" in why[0]
    for p in a:
        c.place(p)
    assert c.filter(b[0]).passed == []  # still busy: a is running
    for p in a:
        c.delete(p)
    assert len(c.filter(b[0]).passed) == 1  # a is gone: b plans and completes
    for p in b:
        c.place(p)


def test_admission_is_oldest_first() -> None:
    clock = [1000.0]
    c = Cluster(clock=clock)
    c.nodes("n", 4, "leaf-1")
    blocker = c.gang("blocker", 4)
    for p in blocker:
        c.place(p)
    a = c.gang("a", 4)
    b = c.gang("b", 4)
    assert c.filter(a[0]).passed == []  # a starts waiting first ...
    clock[0] += 5
    assert c.filter(b[0]).passed == []  # ... then b
    for p in blocker:
        c.delete(p)
    clock[0] += 5
    # b's member happens to be filtered first, but a waited longer: a gets the block.
    assert c.filter(b[0]).passed == []
    assert "ml/a" in c.gangs.ledger.plans and "ml/b" not in c.gangs.ledger.plans
    assert len(c.filter(a[1]).passed) == 1


def test_planned_node_that_stops_fitting_is_replanned_without_it() -> None:
    c = Cluster()
    names = c.nodes("n", 6, "leaf-1")
    pods = c.gang("g", 2)
    first = c.filter(pods[0]).passed[0]
    # The node is cordoned: kube-scheduler no longer offers it.
    offered = [n for n in names if n != first]
    d = c.filter(pods[0], offered)
    assert len(d.passed) == 1 and d.passed[0] != first
    assert c.gangs.ledger.plans["ml/g"].epoch == 2
    assert c.metric("llm_placement_gangs_total", outcome="replanned") == 1
    assert first not in c.gangs.ledger.plans["ml/g"].nodes()


def test_deleting_a_member_releases_the_plan() -> None:
    c = Cluster()
    c.nodes("n", 4, "leaf-1")
    pods = c.gang("g", 3)
    c.filter(pods[0])
    assert c.gangs.ledger.total_reserved() == 24
    c.delete(pods[2])
    c.filter(pods[0])  # any filter (or reserved_gpus call) sweeps
    assert c.gangs.ledger.total_reserved() == 0
    c.flush()
    assert c.binder.annotations["ml/g-0"][ANNOTATION] == ""  # persisted plan cleared
    d = c.filter(pods[0])
    assert "waiting for gang members 2/3" in next(iter(d.unresolvable.values()))


def test_reservations_expire_after_the_ttl() -> None:
    clock = [1000.0]
    c = Cluster(Settings(cluster_source="none", metrics_port=0, gang_reservation_ttl_seconds=30), clock=clock)
    c.nodes("n", 2, "leaf-1")
    pods = c.gang("g", 2)
    c.filter(pods[0])
    assert c.gangs.reserved_gpus("n-0", None) + c.gangs.reserved_gpus("n-1", None) == 16
    clock[0] += 29
    assert c.gangs.ledger.total_reserved() == 16 and c.gangs.reserved_gpus("n-0", None) == 8
    clock[0] += 2
    assert c.gangs.reserved_gpus("n-0", None) == 0 and c.gangs.ledger.total_reserved() == 0
    assert c.metric("llm_placement_reservations_expired_total") == 1
    assert c.metric("llm_placement_reserved_gpus") == 0
    assert len(c.filter(pods[1]).passed) == 1  # the next filter plans afresh


def test_required_topology_that_fits_nowhere_names_the_domains() -> None:
    c = Cluster()
    c.nodes("a", 3, "leaf-a")
    c.nodes("b", 2, "leaf-b")
    pods = c.gang("g", 4, annotations={
        "llm-placement.io/topology-required-placement": "fabric.topograph.run/tier-0"})
    d = c.filter(pods[0])
    assert d.passed == []
    reason = next(iter(d.unresolvable.values()))
    assert "needs 32 GPUs in one fabric.topograph.run/tier-0 domain; at most 24 free in one" in reason
    c.flush()
    events = [m for _, r, m in c.binder.events if r == "GangUnschedulable"]
    assert events and "leaf-a 24" in events[0] and "leaf-b 16" in events[0]
    assert c.metric("llm_placement_solver_runs_total", status="infeasible") == 1


def test_non_rdma_nodes_host_only_single_node_gangs() -> None:
    c = Cluster()
    c.nodes("plain", 4, "leaf-1", rdma=False)
    pods = c.gang("g", 2)
    d = c.filter(pods[0])
    assert d.passed == [] and "needs RDMA" in next(iter(d.unresolvable.values()))
    small = c.gang("s", 2, gpus=4)
    assert len(c.filter(small[0]).passed) == 1
    assert len({c.filter(p).passed[0] for p in small}) == 1  # both on one node


def test_demo_pretraining_gang_lands_in_one_fabric_block() -> None:
    service, placements = run_demo(Settings(cluster_source="none", metrics_port=0))
    gang = [p for p in placements if "llama-70b-pretrain" in p.pod]
    assert len(gang) == 4 and all(p.node for p in gang)
    leaves = {service.snapshot.nodes[p.node].fabric[0] for p in gang if p.node}
    assert len(leaves) == 1
    assert len({p.node for p in gang}) == 4


@pytest.mark.parametrize("members", [4, 8])
def test_gangs_of_small_pods_pack_nodes(members: int) -> None:
    c = Cluster()
    c.nodes("n", 4, "leaf-1")
    pods = c.gang("g", members, gpus=2)
    nodes = {c.filter(p).passed[0] for p in pods}
    assert len(nodes) == members * 2 // 8


def test_members_turned_away_before_the_watch_saw_them_all_are_requeued_once_all_exist() -> None:
    """Members created together, each filtered before the cache held the other: without a nudge
    they would wait for kube-scheduler's five-minute flush of unschedulable pods."""
    c = Cluster()
    c.nodes("n", 2, "leaf-1")
    [first] = c.gang("g", 2, create=1)
    d = c.filter(first)
    assert d.passed == [] and "waiting for gang members 1/2" in next(iter(d.rejections.values()))
    [check] = c.member_timers.pending()
    assert check.delay == 1.0
    # Still incomplete at the check: look again later, nothing written.
    assert c.member_timers.fire() == 1
    [again] = c.member_timers.pending()
    assert again.delay == 2.0 and not c.binder.annotations
    # The second member reaches the cache: both get the write that requeues them.
    second = pod_object("g-1", namespace="ml", stage="pretraining", gpus=8,
                        annotations={"llm-placement.io/gang-size": "2"},
                        labels={"scheduling.x-k8s.io/pod-group": "g"})
    c.add(second)
    assert c.member_timers.fire() == 1
    c.flush()
    assert {k: v.get("llm-placement.io/gang-members") for k, v in c.binder.annotations.items()} == {
        "ml/g-0": "2/2", "ml/g-1": "2/2"}
    assert not c.member_timers.pending()


def test_an_incomplete_gang_is_answered_without_looking_at_any_node(monkeypatch: pytest.MonkeyPatch) -> None:
    c = Cluster()
    c.nodes("n", 8, "leaf-1")
    pods = c.gang("g", 8, create=3)

    def no(*args: object, **kwargs: object) -> None:
        raise AssertionError("an incomplete gang's member must not be evaluated node by node")

    monkeypatch.setattr(c.service.placer, "classify", no)
    d = c.filter(pods[0])
    assert d.passed == [] and set(d.unresolvable.values()) == {"llm-placement: waiting for gang members 3/8"}
    assert len(d.unresolvable) == 8


def test_a_gang_that_cannot_fit_is_solved_again_only_after_a_change_that_could_make_it_fit() -> None:
    """docs/gangs.md, "Cannot place": kube-scheduler retries every member on every cluster event;
    a "no" stands until room is freed, a node comes or changes, the gang changes, or it expires."""
    clock = [1000.0]
    c = Cluster(clock=clock)
    c.nodes("n", 4, "leaf-1")
    busy = [pod_object(f"busy-{i}", namespace="other", gpus=8) for i in range(3)]
    for p, node in zip(busy, ("n-0", "n-1", "n-2"), strict=True):
        c.add(p)
        with c.service.lock:
            c.service.snapshot.assume(parse_workload(p), node)
    pods = c.gang("g", 2)  # 16 GPUs wanted, 8 free

    def solves() -> float:
        return c.metric("llm_placement_solver_runs_total", status="infeasible")

    for _ in range(20):  # every member, retried: one solve
        for p in pods:
            d = c.filter(p)
            assert d.passed == [] and "gang cannot be placed" in next(iter(d.unresolvable.values()))
    assert solves() == 1
    # Another pod binds (takes room, frees none): the verdict stands.
    other = pod_object("other", namespace="other", gpus=2)
    c.add(other)
    with c.service.lock:
        c.service.snapshot.assume(parse_workload(other), "n-3")
    assert c.filter(pods[0]).passed == [] and solves() == 1
    # That pod ends: room was freed somewhere, so the gang is solved again (still 6 GPUs short).
    c.delete(other)
    assert c.filter(pods[1]).passed == [] and solves() == 2
    assert c.filter(pods[0]).passed == [] and solves() == 2
    # A node is added, or an existing one changes (uncordoned, relabelled): solved again.
    c.nodes("m", 1, "leaf-1", free=0)
    assert c.filter(pods[0]).passed == [] and solves() == 3
    c.filter(pods[1])
    assert solves() == 3
    # The gang's own spec changes (a member's annotations): solved again.
    pods[0]["metadata"]["annotations"]["llm-placement.io/gpu-preference"] = "H100"
    c.add(pods[0])
    assert c.filter(pods[0]).passed == [] and solves() == 4
    # Nothing changes for a long time: the verdict expires and one more solve looks again.
    clock[0] += 61
    assert c.filter(pods[1]).passed == [] and solves() == 5
    assert c.filter(pods[0]).passed == [] and solves() == 5
    # A busy pod ends: now the gang fits and is planned.
    c.delete(busy[0])
    assert len(c.filter(pods[0]).passed) == 1 and solves() == 5
    assert c.gangs.states["ml/g"].verdict is None


def test_a_no_reached_on_fewer_nodes_than_a_member_is_offered_does_not_stand() -> None:
    """A member kube-scheduler offers only some nodes (a taint it does not tolerate, its own node
    affinity) gets a "cannot be placed" from the nodes it saw; another member, or the same one once
    the taint no longer keeps it off, offered nodes that solve never looked at, is solved again."""
    c = Cluster()
    c.nodes("a", 1, "leaf-1")
    c.nodes("b", 2, "leaf-2")
    pods = c.gang("g", 2)  # 16 GPUs in one leaf: only leaf-2 holds them

    def solves() -> float:
        return c.metric("llm_placement_solver_runs_total", status="infeasible")

    narrow = c.filter(pods[1], ["a-0"])
    assert narrow.passed == [] and "gang cannot be placed" in next(iter(narrow.unresolvable.values()))
    assert solves() == 1
    assert c.filter(pods[1], ["a-0"]).passed == [] and solves() == 1  # the same view: the "no" stands
    wide = c.filter(pods[0], ["a-0", "b-0", "b-1"])
    assert wide.passed and wide.passed[0].startswith("b-") and solves() == 1
    assert c.gangs.states["ml/g"].verdict is None


def _written(c: Cluster, annotation: str) -> dict[str, str | None]:
    """What the extender wrote on each pod under ``annotation`` (the pod updates that requeue)."""
    c.flush()
    return {k: v.get(annotation) for k, v in c.binder.annotations.items()}


def _one_node_busy() -> tuple[Cluster, dict[str, Any]]:
    """Two 8-GPU nodes, one running another pod: a gang of two 8-GPU members cannot be placed."""
    c = Cluster()
    c.nodes("n", 2, "leaf-1")
    busy = pod_object("busy", namespace="other", gpus=8)
    c.add(busy)
    with c.service.lock:
        c.service.snapshot.assume(parse_workload(busy), "n-0")
    return c, busy


def test_members_told_cannot_be_placed_on_facts_already_gone_are_requeued() -> None:
    """kube-scheduler retries a waiting gang as soon as its own watch sees room freed, often before
    the extender's watch has: the "no" is given on facts already gone, and without a nudge the
    members would wait for kube-scheduler's five-minute flush (docs/gangs.md, "Cannot place")."""
    c, busy = _one_node_busy()
    pods = c.gang("g", 2)  # 16 GPUs wanted, 8 free
    for p in pods:
        d = c.filter(p)
        assert d.passed == [] and "gang cannot be placed" in next(iter(d.unresolvable.values()))
    [check] = c.member_timers.pending()  # one look per gang, however many members were told
    assert check.delay == 2.0
    # Nothing changed by then: nothing written, one later look for a slow watch, then no more.
    assert c.member_timers.fire() == 1
    [later] = c.member_timers.pending()
    assert later.delay == 10.0 and not c.binder.annotations
    assert c.member_timers.fire() == 1 and not c.member_timers.pending()
    c.flush()
    assert not c.binder.annotations
    # Told "no" again; then the busy pod's deletion reaches the cache with no member filtered since.
    c.filter(pods[0])
    c.delete(busy)
    assert c.member_timers.fire() == 1
    c.flush()
    assert {k: v.get("llm-placement.io/gang-retry") for k, v in c.binder.annotations.items()} == {
        "ml/g-0": "1", "ml/g-1": "1"}
    # Requeued, the members now find the room.
    assert len(c.filter(pods[0]).passed) == 1


def test_a_no_given_again_while_a_look_is_pending_gets_a_later_look_of_its_own() -> None:
    """Under load the extender's watch can trail kube-scheduler's by seconds: the members are told
    "no" again between the looks, and the room the deletion freed reaches the cache only after the
    last look of the first answer. That later answer is looked at once more, and requeues them."""
    c, busy = _one_node_busy()
    pods = c.gang("g", 2)
    c.filter(pods[0])
    assert c.member_timers.fire() == 1  # the 2 s look: still stands
    c.filter(pods[1])  # kube-scheduler retried a member: told "no" again
    [later] = c.member_timers.pending()
    assert later.delay == 10.0
    assert c.member_timers.fire() == 1  # still stands (the watch has not delivered the deletion)
    [again] = c.member_timers.pending()  # one more look, for the answer given since
    assert again.delay == 10.0
    c.delete(busy)
    assert c.member_timers.fire() == 1
    assert _written(c, "llm-placement.io/gang-retry") == {"ml/g-0": "1", "ml/g-1": "1"}
    assert not c.member_timers.pending()


def test_an_older_gang_that_cannot_fit_is_not_solved_again_at_each_younger_gangs_filter() -> None:
    clock = [1000.0]
    c = Cluster(clock=clock)
    c.nodes("n", 2, "leaf-1")
    big = c.gang("big", 3)  # 24 GPUs: never fits on 16
    assert c.filter(big[0]).passed == []
    clock[0] += 1
    small = c.gang("small", 4, gpus=2)
    for _ in range(5):
        for p in small:
            c.filter(p)
    # One solve for each gang: the older gang's "no" is reused by admission, not solved again.
    assert c.metric("llm_placement_solver_runs_total", status="infeasible") == 1
    assert "ml/small" in c.gangs.ledger.plans


def test_live_members_pass_filter_only_once_every_member_has_arrived_there() -> None:
    """docs/gangs.md, "Gather at filter": no member goes on to bind while another has not yet been
    filtered against the plan; the last arrival requeues the others with one pod update each."""
    c = Cluster(gather=True)
    c.nodes("n", 4, "leaf-1")
    pods = c.gang("g", 3)
    for i, p in enumerate(pods[:2]):
        d = c.filter(p)
        assert d.passed == []
        assert set(d.unresolvable.values()) >= {
            f"llm-placement: waiting for gang ml/g: {i + 1} of 3 members arrived"}
    assert c.gangs.ledger.total_reserved() == 24  # planned and held meanwhile
    last = c.filter(pods[2])
    assert len(last.passed) == 1
    c.flush()
    gathered = {k: v.get("llm-placement.io/gang-gathered") for k, v in c.binder.annotations.items()
                if "llm-placement.io/gang-gathered" in v}
    assert gathered == {"ml/g-0": "1", "ml/g-1": "1"}
    plan = c.gangs.ledger.plans["ml/g"]
    for p in pods:  # back after the requeue: each passes to its planned node, again and again
        assert c.filter(p).passed == [plan.members[p["metadata"]["uid"]].node]
    # A replan (here: a planned node stopped fitting) starts the gathering again.
    node0 = plan.members[pods[0]["metadata"]["uid"]].node
    d = c.filter(pods[0], [n for n in sorted(c.service.snapshot.nodes) if n != node0])
    assert d.passed == [] and c.gangs.ledger.plans["ml/g"].epoch == 2
    assert "1 of 3 members arrived" in next(iter(d.unresolvable.values()))


def test_a_planned_node_cordoned_while_members_gather_is_replanned_at_any_members_filter() -> None:
    """The member planned on the cordoned node waits in kube-scheduler's unschedulable pool and
    may not come back: the next filter of any member replans without the node."""
    c = Cluster(gather=True)
    c.nodes("n", 4, "leaf-1")
    pods = c.gang("g", 3)
    c.filter(pods[0])  # planned; 1 of 3 arrived
    plan = c.gangs.ledger.plans["ml/g"]
    node1 = plan.members[pods[1]["metadata"]["uid"]].node
    facts = c.service.snapshot.nodes[node1]
    c.service.snapshot.upsert_node(facts.model_copy(update={"unschedulable": True}))
    offered = [n for n in sorted(c.service.snapshot.nodes) if n != node1]
    d = c.filter(pods[2], offered)
    assert d.passed == [] and "1 of 3 members arrived" in next(iter(d.unresolvable.values()))
    new = c.gangs.ledger.plans["ml/g"]
    assert new.epoch == 2 and node1 not in new.nodes()
    # Members away from the cordoned node keep theirs.
    assert new.members[pods[0]["metadata"]["uid"]].node == plan.members[pods[0]["metadata"]["uid"]].node


def test_a_member_behind_scheduling_gates_has_not_arrived() -> None:
    """kube-scheduler does not schedule a gated pod: counting it would plan (and hold GPUs for) a
    gang that cannot bind until the gate is lifted, however long that takes."""
    c = Cluster()
    c.nodes("n", 4, "leaf-1")
    pods = c.gang("g", 3, create=2)
    gated = pod_object("g-2", namespace="ml", stage="pretraining", gpus=8,
                       annotations={"llm-placement.io/gang-size": "3"},
                       labels={"scheduling.x-k8s.io/pod-group": "g"})
    gated["spec"]["schedulingGates"] = [{"name": "example.com/admission"}]
    c.add(gated)
    d = c.filter(pods[0])
    assert d.passed == [] and set(d.unresolvable.values()) == {"llm-placement: waiting for gang members 2/3"}
    assert not c.gangs.ledger.plans and c.gangs.ledger.total_reserved() == 0
    del gated["spec"]["schedulingGates"]  # the gate is lifted: the pod update the watch delivers
    c.add(gated)
    assert len(c.filter(pods[0]).passed) == 1 and c.gangs.ledger.total_reserved() == 24


def _held(c: Cluster, name: str, size: int, i: int, other_gate: bool = False) -> dict[str, Any]:
    pod = pod_object(f"{name}-{i}", namespace="ml", stage="pretraining", gpus=8,
                     annotations={"llm-placement.io/gang-size": str(size)},
                     labels={"scheduling.x-k8s.io/pod-group": name})
    pod["spec"]["schedulingGates"] = [{"name": GANG_GATE}] + (
        [{"name": "example.com/quota"}] if other_gate else [])
    c.add(pod)
    return pod


def test_held_members_count_and_their_gate_is_lifted_from_all_once_the_gang_is_complete() -> None:
    """The admission gate keeps members out of kube-scheduler's queue; the watch lifts it from
    every member at once when the last one arrives, and not before (docs/gangs.md)."""
    c = Cluster()
    assert isinstance(c.gangs.writer, BackgroundWriter)
    held = HeldMembers(c.gangs.book, c.gangs.writer)
    first = _held(c, "g", 3, 0)
    assert parse_workload(first).held and not parse_workload(first).gated
    second = _held(c, "g", 3, 1)
    with c.service.lock:
        held.update(first)
        held.update(second)
    c.flush()
    assert c.binder.ungated == []  # 2 of 3: the gang waits, gated
    third = _held(c, "g", 3, 2)
    with c.service.lock:
        held.update(third)
        held.update(third)  # a second event while the patch is on its way: no second patch
    c.flush()
    assert sorted(c.binder.ungated) == ["ml/g-0", "ml/g-1", "ml/g-2"]
    # A gang whose members wait behind someone else's gate too has not arrived.
    blocked = [_held(c, "h", 2, i, other_gate=True) for i in range(2)]
    with c.service.lock:
        for p in blocked:
            held.update(p)
    c.flush()
    assert not any(u.startswith("ml/h-") for u in c.binder.ungated)
    # After a restart the fresh list lets a complete held gang go.
    for p in blocked:
        p["spec"]["schedulingGates"] = [{"name": GANG_GATE}]
        c.add(p)
    with c.service.lock:
        HeldMembers(c.gangs.book, c.gangs.writer).replace(blocked)
    c.flush()
    assert sorted(u for u in c.binder.ungated if u.startswith("ml/h-")) == ["ml/h-0", "ml/h-1"]
