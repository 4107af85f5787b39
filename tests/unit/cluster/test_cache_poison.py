"""One bad object costs exactly that object: the watch cache skips it, counts it, reports it, goes on.

A pod with ``nvidia.com/gpu: "1e400"`` (the API server stores it) used to raise OverflowError out of
the pod watch: the watch failed in a loop, later pods went unseen and a deleted pod's GPUs stayed
counted. The fake API below serves a list and a watch stream the way kube-apiserver does.
"""

from __future__ import annotations

import json
import threading
from typing import Any

from app.base.catalog import GpuCatalog
from app.base.objects import node_object, pod_object
from app.cluster.cache import ClusterCache
from app.config.settings import Settings
from app.metrics.metrics import Metrics
from app.snapshot.store import ClusterSnapshot


class Resp:
    def __init__(self, body: bytes) -> None:
        self.data = body

    def stream(self, amt: Any = None, decode_content: bool = False) -> Any:
        yield self.data

    def release_conn(self) -> None:
        pass


class FakeCore:
    """list_* answer with a list body, or (watch=True) with a stream of watch events."""

    def __init__(self, lists: dict[str, list[dict[str, Any]]], watches: dict[str, list[Any]],
                 stop: threading.Event) -> None:
        self.lists, self.watches, self.stop = lists, watches, stop
        self.watch_calls: dict[str, int] = {}

    def _call(self, kind: str, watch: bool = False, **_: Any) -> Resp:
        if not watch:
            return Resp(json.dumps({"metadata": {"resourceVersion": "10"}, "items": self.lists[kind]}).encode())
        n = self.watch_calls[kind] = self.watch_calls.get(kind, 0) + 1
        if n > 1 or kind != "pods":
            self.stop.wait(5)  # nothing more to say
            return Resp(b"")
        lines = [e if isinstance(e, str) else json.dumps(e) for e in self.watches.get(kind, [])]
        return Resp(("\n".join(lines) + "\n").encode())

    def list_node(self, **kw: Any) -> Resp:
        return self._call("nodes", **kw)

    def list_pod_for_all_namespaces(self, **kw: Any) -> Resp:
        return self._call("pods", **kw)

    def list_namespace(self, **kw: Any) -> Resp:
        return self._call("namespaces", **kw)


class Sink:
    def __init__(self) -> None:
        self.events: list[tuple[str, str, str]] = []

    def event(self, namespace: str, name: str, uid: str, reason: str, message: str,
              warning: bool = False) -> None:
        self.events.append((f"{namespace}/{name}", reason, message))


def bound(name: str, gpus: int, node: str = "g", **kw: Any) -> dict[str, Any]:
    p = pod_object(name, gpus=gpus, uid=f"uid-{name}", **kw)
    p["spec"]["nodeName"] = node
    p["metadata"]["resourceVersion"] = "11"
    return p


def poison(name: str = "poison", node: str = "") -> dict[str, Any]:
    p = pod_object(name, namespace="tenant-b", uid=f"uid-{name}")
    p["spec"]["containers"][0]["resources"] = {"requests": {"nvidia.com/gpu": "1e400"},
                                               "limits": {"nvidia.com/gpu": "1e400"}}
    if node:
        p["spec"]["nodeName"] = node
    return p


def run_cache(settings: Settings, catalog: GpuCatalog, lists: dict[str, list[dict[str, Any]]],
              watches: dict[str, list[Any]], snapshot: ClusterSnapshot | None = None,
              ) -> tuple[ClusterCache, Metrics, Sink]:
    stop = threading.Event()
    core = FakeCore(lists, watches, stop)
    metrics, sink = Metrics(), Sink()
    cache = ClusterCache.__new__(ClusterCache)
    ClusterCache.__init__(cache, object(), snapshot or ClusterSnapshot(), threading.RLock(), catalog,  # type: ignore[arg-type]
                          settings, metrics, events=sink)
    cache.core = core  # type: ignore[assignment]
    cache.start()
    for _ in range(100):  # the first pod watch has been consumed once a second one starts
        if core.watch_calls.get("pods", 0) >= 2 and core.watch_calls.get("namespaces", 0) >= 1:
            break
        stop.wait(0.05)
    cache.stop()
    stop.set()
    return cache, metrics, sink


def test_poison_pod_costs_only_itself(settings: Settings, catalog: GpuCatalog) -> None:
    lists = {
        "nodes": [node_object("g", gpus=8, product="NVIDIA-L4")],
        "pods": [poison("poison"), bound("keep", 2), bound("victim", 4)],
        "namespaces": [],
    }
    watches = {"pods": [
        {"type": "MODIFIED", "object": poison("poison")},
        "{not json",
        {"type": "MODIFIED", "object": poison("poison2", node="g")},
        {"type": "DELETED", "object": bound("victim", 4)},
        {"type": "ADDED", "object": bound("late", 1)},
        {"type": "DELETED", "object": poison("poison")},
    ]}
    cache, metrics, sink = run_cache(settings, catalog, lists, watches)
    snap = cache.snapshot
    assert cache.synced  # the list with a poison pod in it still counts as synced
    assert snap.free_gpus("g") == 8 - 2 - 1  # victim freed, late pod counted, poison ignored
    assert "uid-late" in snap.pods and "uid-victim" not in snap.pods
    assert metrics.watch_restarts.labels("pods", "error")._value.get() == 0
    assert metrics.skipped_objects.labels("pods")._value.get() >= 1
    # The owner of a pod of ours hears about it once, however many events the pod produces.
    assert [e[:2] for e in sink.events].count(("tenant-b/poison", "Unreadable")) <= 1


def test_unknown_annotation_key_warns_once_with_nearest_key(settings: Settings, catalog: GpuCatalog) -> None:
    typo = pod_object("typo", uid="uid-typo", annotations={"llm-placement.io/model-param": "7B"})
    other = pod_object("other", uid="uid-other", scheduler_name="default-scheduler",
                       annotations={"llm-placement.io/model-param": "7B"})
    lists = {"nodes": [], "pods": [typo, other], "namespaces": []}
    watches = {"pods": [{"type": "MODIFIED", "object": typo}]}
    _, metrics, sink = run_cache(settings, catalog, lists, watches)
    assert metrics.unknown_annotation_keys._value.get() == 1
    warned = [e for e in sink.events if e[1] == "UnknownAnnotation"]
    assert len(warned) == 1 and warned[0][0] == "default/typo"
    assert "did you mean llm-placement.io/model-params?" in warned[0][2]


def test_namespace_share_annotation_is_watched(settings: Settings, catalog: GpuCatalog) -> None:
    ns = {"metadata": {"name": "b", "annotations": {"llm-placement.io/share-with": "a, c"}}}
    lists: dict[str, list[dict[str, Any]]] = {"nodes": [], "pods": [], "namespaces": [ns, {"metadata": "x"}]}
    cache, _, _ = run_cache(settings, catalog, lists, {})
    assert cache.snapshot.namespace_shares == {"b": frozenset({"a", "c"})}
