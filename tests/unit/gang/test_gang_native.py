"""Gangs of the native Workload API (scheduling.k8s.io/v1alpha2 PodGroup, docs/gangs.md): identity
from the pod's ``spec.schedulingGroup``, size from the PodGroup's ``schedulingPolicy.gang.minCount``."""

from __future__ import annotations

import asyncio
import json
import threading
from typing import Any

import pytest

from app.base.objects import pod_object
from app.base.workload import parse_workload
from app.gang.kube import NATIVE, PodGroupWatcher, WatchedKind, native_min_counts
from app.snapshot.store import ClusterSnapshot
from tests.unit.gang.test_gang_coordinator import Cluster

ANN = "llm-placement.io/"


def native_pod(name: str, group: str, gpus: int = 8, labels: dict[str, str] | None = None,
               annotations: dict[str, str] | None = None, ns: str = "ml") -> dict[str, Any]:
    pod = pod_object(name, namespace=ns, stage="pretraining", gpus=gpus, labels=labels or {},
                     annotations=annotations or {})
    pod["spec"]["schedulingGroup"] = {"podGroupName": group}
    return pod


def pod_group(name: str, policy: dict[str, Any], ns: str = "ml") -> dict[str, Any]:
    return {"apiVersion": "scheduling.k8s.io/v1alpha2", "kind": "PodGroup",
            "metadata": {"name": name, "namespace": ns},
            "spec": {"podGroupTemplateRef": {"workload": {"workloadName": "w", "podGroupTemplateName": "t"}},
                     "schedulingPolicy": policy}}


# --- identity -------------------------------------------------------------------------------------

def test_scheduling_group_names_the_gang_before_every_other_convention() -> None:
    pod = native_pod("p", "native", labels={"scheduling.x-k8s.io/pod-group": "coscheduling"},
                     annotations={ANN + "gang-name": "own", ANN + "gang-size": "5"})
    gang = parse_workload(pod).gang
    assert gang is not None and gang.key == "ml/native" and gang.native
    # The size is the PodGroup's minCount only: the gang-size annotation is not read for it.
    assert gang.size is None and gang.source == "spec.schedulingGroup"


@pytest.mark.parametrize("group", [None, {}, {"podGroupName": ""}, {"podGroupName": 3}, "x"])
def test_no_readable_scheduling_group_falls_back_to_the_labels(group: Any) -> None:
    pod = native_pod("p", "native", labels={"scheduling.x-k8s.io/pod-group": "coscheduling"},
                     annotations={ANN + "gang-size": "2"})
    pod["spec"]["schedulingGroup"] = group
    gang = parse_workload(pod).gang
    assert gang is not None and gang.key == "ml/coscheduling" and not gang.native and gang.size == 2


@pytest.mark.parametrize(("items", "want"), [
    ([pod_group("g", {"gang": {"minCount": 3}})], {"ml/g": 3}),
    ([pod_group("b", {"basic": {}})], {"ml/b": None}),
    ([pod_group("z", {"gang": {"minCount": 0}}), pod_group("t", {"gang": {"minCount": True}}),
      pod_group("s", {"gang": {"minCount": "3"}}), pod_group("e", {})], {}),
    ([{"metadata": "x"}, {"metadata": {"name": "n"}, "spec": {"schedulingPolicy": []}},
      pod_group("ok", {"gang": {"minCount": 2}}, ns="other")], {"other/ok": 2}),
])
def test_native_min_counts(items: list[dict[str, Any]], want: dict[str, int | None]) -> None:
    assert native_min_counts(items) == want


def follow_once(kind: WatchedKind, items: list[dict[str, Any]], events: list[dict[str, Any]]
                ) -> tuple[ClusterSnapshot, list[tuple[Any, ...]]]:
    """One list of ``items`` then one watch delivering ``events`` through a PodGroupWatcher of
    ``kind`` (the watch ends after them); the snapshot it filled and the API calls it made."""
    calls: list[tuple[Any, ...]] = []
    snapshot = ClusterSnapshot()

    class Resp:
        def __init__(self, lines: list[bytes]) -> None:
            self.lines = lines

        def stream(self, *_: Any, **__: Any) -> Any:
            yield b"\n".join(self.lines) + b"\n"

        def release_conn(self) -> None:
            watcher.stop()

    class Custom:
        def list_cluster_custom_object(self, *args: Any, watch: bool = False, **_: Any) -> Any:
            calls.append(args)
            if not watch:
                return json.dumps({"metadata": {"resourceVersion": "7"}, "items": items}).encode()
            return Resp([json.dumps(e).encode() for e in events])

    def raw(fn: Any, *args: Any, **kw: Any) -> bytes:
        return bytes(fn(*args, **kw))

    watcher = PodGroupWatcher(Custom(), raw, snapshot, threading.RLock(), kinds=(kind,))  # type: ignore[arg-type]
    watcher._run(kind)
    return snapshot, calls


def test_watcher_lists_and_follows_native_pod_groups() -> None:
    """The API call names scheduling.k8s.io/v1alpha2 podgroups, and events keep the sizes current."""
    snapshot, calls = follow_once(
        NATIVE, [pod_group("g", {"gang": {"minCount": 3}}), pod_group("b", {"basic": {}})],
        [{"type": "ADDED", "object": pod_group("late", {"gang": {"minCount": 4}})},
         {"type": "DELETED", "object": pod_group("g", {"gang": {"minCount": 3}})}])
    assert calls[0][:3] == ("scheduling.k8s.io", "v1alpha2", "podgroups")
    assert snapshot.native_min_count == {"ml/b": None, "ml/late": 4}
    assert snapshot.podgroup_min_member == {}  # the coscheduling sizes are another map


# --- filter and bind ------------------------------------------------------------------------------

def test_native_gang_waits_for_its_pod_group_then_for_min_count_members() -> None:
    c = Cluster()
    c.nodes("n", 4, "leaf-1")
    pods = [native_pod(f"g-{i}", "g", annotations={ANN + "gang-size": "1"}) for i in range(3)]
    c.add(pods[0])
    d = c.filter(pods[0])
    assert d.passed == [] and "gang ml/g waits for PodGroup g" in next(iter(d.unresolvable.values()))
    c.service.snapshot.native_min_count["ml/g"] = 3
    d = c.filter(pods[0])
    assert set(d.unresolvable.values()) == {"llm-placement: waiting for gang members 1/3"}
    for p in pods[1:]:
        c.add(p)
    chosen = [c.filter(p).passed for p in pods]
    assert all(len(n) == 1 for n in chosen) and len({n[0] for n in chosen}) == 3
    assert c.gangs.ledger.total_reserved() == 24


def test_native_gang_binds_all_or_nothing() -> None:
    c = Cluster()
    c.nodes("n", 4, "leaf-1")
    c.service.snapshot.native_min_count["ml/g"] = 2
    pods = [native_pod(f"g-{i}", "g") for i in range(2)]
    for p in pods:
        c.add(p)
    members = [(parse_workload(p), c.filter(p).passed[0]) for p in pods]

    async def run() -> list[str]:
        first = asyncio.create_task(c.gangs.bind_member(*members[0]))
        for _ in range(50):
            await asyncio.sleep(0)
        assert not first.done() and c.binder.bound == {}  # waits for the other member
        return [await c.gangs.bind_member(*members[1]), await first]

    assert asyncio.run(run()) == ["", ""]
    assert c.binder.bound == {s.key: n for s, n in members}


def test_basic_policy_pods_are_placed_and_bound_one_by_one() -> None:
    c = Cluster()
    c.nodes("n", 2, "leaf-1")
    c.service.snapshot.native_min_count["ml/b"] = None
    pod = native_pod("b-0", "b")
    c.add(pod)
    d = c.filter(pod)
    assert len(d.passed) == 2 and not c.gangs.ledger.plans
    assert asyncio.run(c.gangs.bind_member(parse_workload(pod), d.passed[0])) == ""
    assert c.binder.bound == {"ml/b-0": d.passed[0]}


@pytest.mark.parametrize("status", [None, 404])
def test_not_ready_before_the_pod_groups_are_listed(status: int | None) -> None:
    """Ready before the first PodGroup list, the extender would tell every native gang member
    "waits for PodGroup" (and read coscheduling gangs with the wrong size). Ready comes once each
    kind was listed, or found not served (docs/gangs.md)."""
    from kubernetes.client.exceptions import ApiException

    release, stop = threading.Event(), threading.Event()
    synced, notified = threading.Event(), threading.Event()

    class Custom:
        def list_cluster_custom_object(self, *args: Any, watch: bool = False, **_: Any) -> Any:
            if watch:
                stop.wait(5)
                raise ApiException(status=500)
            release.wait(5)
            if status:
                raise ApiException(status=status)
            return json.dumps({"metadata": {"resourceVersion": "1"},
                               "items": [pod_group("g", {"gang": {"minCount": 3}})]}).encode()

    def raw(fn: Any, *args: Any, **kw: Any) -> bytes:
        return bytes(fn(*args, **kw))

    snapshot = ClusterSnapshot()
    watcher = PodGroupWatcher(Custom(), raw, snapshot, threading.RLock(),  # type: ignore[arg-type]
                              synced=synced, notify=notified.set)
    watcher.start()
    try:
        assert not synced.wait(0.3) and not notified.is_set()
        release.set()
        assert synced.wait(5) and notified.wait(5)
        assert snapshot.native_min_count == ({} if status else {"ml/g": 3})
    finally:
        watcher.stop()
        stop.set()
