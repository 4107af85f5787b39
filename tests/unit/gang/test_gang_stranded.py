"""No gang stranded in silence (docs/gangs.md, "Held at admission", "Members that disagree", "Late
sizes", "Incomplete gangs"): a refused gate removal is retried until it works, a held pod is told
what it waits for, members that disagree on the size hold nothing and loop nowhere, a size that comes
after the pods requeues them, and a gang incomplete for too long is reported."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from typing import Any

import pytest

from app.base.objects import pod_object
from app.base.workload import GANG_GATE, WorkloadError, created_at
from app.gang.admission import HeldMembers
from app.gang.kube import COSCHEDULING, PodGroupWatcher
from app.gang.persist import UNGATE_RETRY_SECONDS, BackgroundWriter
from app.gang.requeue import RETRY_ANNOTATION
from app.snapshot.store import ClusterSnapshot
from tests.unit.gang.test_gang_coordinator import Cluster, FakeBinder, FakeTimers


class RefusingBinder(FakeBinder):
    """An API server that refuses the first ``refusals`` gate removals (an admission webhook)."""

    def __init__(self, refusals: int) -> None:
        super().__init__()
        self.refusals = refusals
        self.attempts = 0

    def ungate(self, namespace: str, name: str) -> None:
        self.attempts += 1
        if self.attempts <= self.refusals:
            raise RuntimeError("admission webhook denied the request")
        super().ungate(namespace, name)


def test_a_refused_gate_removal_is_retried_with_backoff_until_it_succeeds() -> None:
    target, timers = RefusingBinder(refusals=7), FakeTimers()
    writer = BackgroundWriter(target, workers=1, timers=timers)
    writer.ungate("ml", "g-0")
    delays = []
    while writer.drain(5) and not target.ungated:
        [timer] = timers.pending()
        delays.append(timer.delay)
        timers.fire()
    assert writer.drain(5)
    # Past the old 1 + 3 + 10 s schedule, with the backoff capped, and never given up.
    assert target.attempts == 8 and target.ungated == ["ml/g-0"]
    assert delays == [1.0, 3.0, 10.0, 30.0, 60.0, 60.0, 60.0]
    assert delays[-1] == UNGATE_RETRY_SECONDS[-1] and writer.pending_ungates() == 0


def test_asking_again_tries_at_once_instead_of_waiting_for_the_backoff() -> None:
    target, timers = RefusingBinder(refusals=1), FakeTimers()
    writer = BackgroundWriter(target, workers=1, timers=timers)
    writer.ungate("ml", "g-0")
    assert writer.drain(5) and writer.pending_ungates() == 1
    writer.ungate("ml", "g-0")  # a member or gang-object change asks again
    assert writer.drain(5)
    assert target.ungated == ["ml/g-0"] and all(t.cancelled for t in timers.pending()) is True
    assert timers.fire() == 0 and target.attempts == 2


def held_pod(name: str, i: int, size: str | None, gate: bool = True, group: str | None = None,
             **ann: str) -> dict[str, Any]:
    annotations = dict(ann)
    if size is not None:
        annotations["llm-placement.io/gang-size"] = size
    if group is not None:
        annotations["llm-placement.io/gang-name"] = group
    pod = pod_object(f"{name}-{i}", namespace="ml", stage="pretraining", gpus=8, annotations=annotations)
    if gate:
        pod["spec"]["schedulingGates"] = [{"name": GANG_GATE}]
    return pod


def follow(c: Cluster, pods: list[dict[str, Any]], held: HeldMembers | None = None) -> HeldMembers:
    """Feed pods as the watch would: into the snapshot (parsed or not), then to the follower."""
    held = held or HeldMembers(c.gangs.book, c.gangs.writer)  # type: ignore[arg-type]
    for pod in pods:
        with contextlib.suppress(WorkloadError):  # unreadable: the cache keeps no spec for it
            c.add(pod)
        with c.service.lock:
            held.update(pod)
    c.flush()
    return held


def events(c: Cluster, reason: str) -> dict[str, str]:
    return {pod: msg for pod, r, msg in c.binder.events if r == reason}


@pytest.mark.parametrize(("size", "why"), [
    ("0", "gang-size"), ("-1", "gang-size"), ("abc", "gang-size"), ("1.5", "gang-size"),
    ("", 'gang-size "" is not a whole number'),
])
def test_a_held_pod_with_an_unusable_size_is_told_why(size: str, why: str) -> None:
    c = Cluster()
    follow(c, [held_pod("bad", 0, size, group="bad")])
    told = events(c, "GangSizeInvalid")
    assert list(told) == ["ml/bad-0"] and why in told["ml/bad-0"] and "held at admission" in told["ml/bad-0"]
    assert not c.binder.ungated


def test_a_held_pod_is_told_the_members_it_waits_for_and_a_gate_without_a_gang_is_named() -> None:
    c = Cluster()
    follow(c, [held_pod("g", 0, "4", group="g"), held_pod("lone", 0, None)])
    assert events(c, "GangWaiting")["ml/g-0"].endswith("waiting for gang members 1/4 of gang ml/g")
    assert "names no gang" in events(c, "GangGateWithoutGang")["ml/lone-0"]


def test_members_that_disagree_on_the_size_stay_gated_hold_nothing_and_are_told_both_sizes() -> None:
    c = Cluster()
    c.nodes("n", 4, "leaf-1")
    follow(c, [held_pod("g", 0, "4", group="g"), held_pod("g", 1, "2", group="g")])
    assert not c.binder.ungated  # the smaller size is complete, but not lifted on it
    told = events(c, "GangSizeConflict")
    assert set(told) == {"ml/g-0", "ml/g-1"}
    assert "disagree on its size: 4 (ml/g-0) and 2 (ml/g-1)" in told["ml/g-0"]
    # The same members without the gate (lifted by hand): filter says the same, plans nothing,
    # reserves nothing and arms no requeue.
    for i, size in enumerate(("4", "2")):
        c.add(held_pod("g", i, size, gate=False, group="g"))
    d = c.filter(c.pods["g-1"])
    assert d.passed == [] and "disagree on its size: 4 (ml/g-0) and 2 (ml/g-1)" in next(iter(d.unresolvable.values()))
    assert c.gangs.ledger.total_reserved() == 0 and not c.gangs.ledger.plans
    assert not c.member_timers.pending() and not c.gangs.book.queue()


def test_a_gate_refused_once_is_asked_again_at_the_next_member_change() -> None:
    timers = FakeTimers()
    binder = RefusingBinder(refusals=1)
    c = Cluster(binder=binder)
    writer = BackgroundWriter(binder, workers=1, timers=timers)
    c.gangs.writer = writer
    clock = [100.0]
    held = HeldMembers(c.gangs.book, writer, clock=lambda: clock[0])
    pods = [held_pod("g", i, "2", group="g") for i in range(2)]
    follow(c, pods, held)
    assert writer.drain(5) and binder.attempts == 2 and len(binder.ungated) == 1
    lifted = 0 if binder.ungated == ["ml/g-0"] else 1
    pods[lifted]["spec"]["schedulingGates"] = []  # the watch shows the lifted gate gone
    follow(c, [pods[lifted]], held)
    clock[0] += 5
    refused = pods[1 - lifted]
    refused["metadata"]["annotations"]["example.com/touched"] = "1"  # any update of a member
    follow(c, [refused], held)
    assert writer.drain(5) and sorted(binder.ungated) == ["ml/g-0", "ml/g-1"]


def test_a_size_that_arrives_after_the_pods_requeues_them_at_once() -> None:
    c = Cluster()
    c.nodes("n", 2, "leaf-1")
    pods = [pod_object(f"pg-{i}", namespace="ml", stage="pretraining", gpus=8,
                       labels={"scheduling.x-k8s.io/pod-group": "pg"}) for i in range(2)]
    for p in pods:
        c.add(p)
        assert "has no size" in next(iter(c.filter(p).unresolvable.values()))
    with c.service.lock:
        c.service.snapshot.podgroup_min_member["ml/pg"] = 4
        c.gangs.requeue.resized("ml/pg")  # 2 of 4: nothing to requeue yet
        c.service.snapshot.podgroup_min_member["ml/pg"] = 2
        c.gangs.requeue.resized("ml/pg")  # minMember lowered: both are requeued
    c.flush()
    assert {k: v.get(RETRY_ANNOTATION) for k, v in c.binder.annotations.items()} == {
        "ml/pg-0": "1", "ml/pg-1": "1"}


def test_a_gang_incomplete_for_too_long_gets_a_warning_and_counts_in_the_gauge() -> None:
    clock = [1_796_600_000.0]
    incomplete = FakeTimers()
    c = Cluster(clock=clock)
    c.gangs.requeue.incomplete_timers = incomplete
    pod = held_pod("slow", 0, "3", gate=False, group="slow")
    pod["metadata"]["creationTimestamp"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(clock[0]))
    c.add(pod)
    c.filter(pod)
    [timer] = incomplete.pending()
    assert timer.delay == 600.0  # gang_incomplete_warn_seconds from its first member's creation
    assert c.metric("llm_placement_gangs_incomplete_too_long") == 0
    clock[0] += 600
    incomplete.fire()
    c.flush()
    warned = events(c, "GangIncompleteTooLong")
    assert "has had 1 of 3 members for more than 600 s" in warned["ml/slow-0"]
    assert "delete its pods" in warned["ml/slow-0"]
    assert c.metric("llm_placement_gangs_incomplete_too_long") == 1
    c.filter(pod)
    assert not incomplete.pending()  # reported once
    c.delete(pod)
    assert c.metric("llm_placement_gangs_incomplete_too_long") == 0



def test_the_pod_group_watch_reports_sizes_that_arrive_or_change_and_their_creation() -> None:
    """What ``resized`` (the requeue above) and the gang queue's creation order are fed with."""
    def group(name: str, size: int) -> dict[str, Any]:
        return {"metadata": {"name": name, "namespace": "ml", "creationTimestamp": "2026-12-07T01:00:00Z"},
                "spec": {"minMember": size}}

    events = [{"type": "MODIFIED", "object": group("g", 4)},  # unchanged: nothing to requeue
              {"type": "MODIFIED", "object": group("g", 2)},  # lowered
              {"type": "ADDED", "object": group("late", 3)}]  # created after its pods
    snapshot, resized = ClusterSnapshot(), []

    class Resp:
        def stream(self, *_: Any, **__: Any) -> Any:
            yield b"\n".join(json.dumps(e).encode() for e in events) + b"\n"

        def release_conn(self) -> None:
            watcher.stop()

    class Custom:
        def list_cluster_custom_object(self, *args: Any, watch: bool = False, **_: Any) -> Any:
            if not watch:
                return json.dumps({"metadata": {"resourceVersion": "1"}, "items": [group("g", 4)]}).encode()
            return Resp()

    watcher = PodGroupWatcher(Custom(), lambda fn, *a, **k: bytes(fn(*a, **k)), snapshot,  # type: ignore[arg-type]
                              threading.RLock(), kinds=(COSCHEDULING,), resized=resized.append)
    watcher._run(COSCHEDULING)
    assert resized == ["ml/g", "ml/g", "ml/late"]  # the first list, the change, the late one
    assert snapshot.podgroup_min_member == {"ml/g": 2, "ml/late": 3}
    assert snapshot.gang_created["ml/late"] == created_at({"creationTimestamp": "2026-12-07T01:00:00Z"})
