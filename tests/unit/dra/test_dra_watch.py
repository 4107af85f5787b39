"""The DRA watcher works from watch events alone (app/cluster/dra.py, docs/dra.md): a fake API
client counts every call it gets."""

from __future__ import annotations

import json
import threading
from collections import Counter
from typing import Any

import pytest

from app.base.catalog import GpuCatalog
from app.base.objects import node_object, pod_object
from app.config.settings import Settings
from app.snapshot.store import ClusterSnapshot
from tests.unit.cluster.test_cache_poison import Resp, run_cache
from tests.unit.dra import dra_fixtures as fx


class CountingApi:
    """CustomObjectsApi.list_cluster_custom_object: lists, then per kind the scripted watch streams
    in order (a stream ends as a watch that timed out does), then an idle watch. CoreV1Api reads of
    nodes and pods are counted too: the watcher must need none."""

    def __init__(self, lists: dict[str, list[dict[str, Any]]], streams: dict[str, list[list[Any]]],
                 stop: threading.Event) -> None:
        self.lists, self.streams, self.stop = lists, streams, stop
        self.calls: Counter[tuple[str, str]] = Counter()
        self.watch_versions: dict[str, list[str]] = {}

    def list_cluster_custom_object(self, group: str, version: str, plural: str, watch: bool = False,
                                   resource_version: str = "", **_: Any) -> Resp:
        self.calls["watch" if watch else "list", plural] += 1
        if not watch:
            body = {"metadata": {"resourceVersion": "5"}, "items": self.lists.get(plural, [])}
            return Resp(json.dumps(body).encode())
        self.watch_versions.setdefault(plural, []).append(resource_version)
        scripted = self.streams.get(plural, [])
        n = len(self.watch_versions[plural])
        if n <= len(scripted):
            return Resp(("\n".join(json.dumps(e) for e in scripted[n - 1]) + "\n").encode())
        self.stop.wait(5)  # nothing more to say
        return Resp(b"")

    def read_node(self, name: str, **_: Any) -> Any:
        self.calls["get", "nodes"] += 1
        return Resp(json.dumps(node_object(name, gpus=0)).encode())

    def read_namespaced_pod(self, name: str, namespace: str, **_: Any) -> Any:
        self.calls["get", "pods"] += 1
        raise AssertionError("a pod was read")


def test_watcher_applies_watch_events_without_reading_nodes_or_pods(
        settings: Settings, catalog: GpuCatalog) -> None:
    from app.cluster.dra import DraWatcher

    full = fx.slice_("n", [fx.gpu(i) for i in range(4)])
    mig = fx.slice_("m", [fx.static_mig(0, "3g.40gb", 0), fx.static_mig(0, "3g.40gb", 4)])
    c1 = fx.claim("c1", fx.request(count=2))
    snap = ClusterSnapshot()
    for obj in (fx.GPU_CLASS, fx.MIG_CLASS):
        snap.dra.put_class(obj)
    for obj in (full, mig):
        snap.dra.put_slice(obj)
    snap.dra.put_claim(c1)
    snap.dra.reads_claims = True
    pod = pod_object("p", gpus=0, stage="serving", uid="u-p")
    pod["spec"].update(nodeName="n", resourceClaims=[{"name": "g", "resourceClaimName": "c1"}])
    cache, _, _ = run_cache(settings, catalog, {"nodes": [node_object("n", gpus=0), node_object("m", gpus=0)],
                                                "pods": [pod], "namespaces": []}, {}, snapshot=snap)
    assert snap.free_gpus("n") == 2  # the pod's claim is not allocated yet: charged to the pod

    stop = threading.Event()
    allocated = fx.claim("c1", fx.request(count=2), node="n", reserved=fx.reserved_for("p"),
                         results=[fx.result("n", "gpu-0"), fx.result("n", "gpu-1")])
    slice_mig = fx.claim("mc", fx.request("mig.nvidia.com"), node="m",
                         results=[fx.result("m", fx.mig_name(0, "3g.40gb", 4))])
    for c in (allocated, slice_mig):
        c["metadata"]["resourceVersion"] = "8"
    api = CountingApi(
        {"deviceclasses": [fx.GPU_CLASS, fx.MIG_CLASS], "resourceslices": [full, mig], "resourceclaims": [c1],
         "computedomaincliques": [fx.compute_domain_clique("cd", "fabric.3", "n")]},
        {"resourceclaims": [[{"type": "MODIFIED", "object": allocated}, {"type": "ADDED", "object": slice_mig},
                             {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "9"}}}]],
         "deviceclasses": [[{"type": "ERROR", "object": {"code": 410, "message": "too old"}}]]},
        stop)
    watcher = DraWatcher(object(), cache)  # type: ignore[arg-type]
    watcher.custom = api  # type: ignore[assignment]
    watcher.core = api  # type: ignore[attr-defined]  # what an older watcher read nodes and pods with
    watcher.start()
    try:
        for _ in range(200):
            if len(api.watch_versions.get("resourceclaims", ())) >= 2 and api.calls["list", "deviceclasses"] >= 2:
                break
            stop.wait(0.02)
    finally:
        watcher.stop()
        stop.set()
    watcher.flush()  # what the flusher does at most COALESCE_SECONDS after the last event
    # The claim's devices count on the node, the pod is not charged for them any more, the MIG
    # node's facts were computed again: all from the events, not one node or pod read.
    assert snap.free_gpus("n") == 2
    assert snap.pods["u-p"].gpus == 0
    assert [(p, free) for p, _, _, free in snap.nodes["m"].mig] == [("3g.40gb", 1)]
    assert snap.nodes["n"].nvlink_domain == "fabric.3"  # from the ComputeDomainClique listed
    assert api.calls["get", "nodes"] == 0 and api.calls["get", "pods"] == 0
    # The watch that ended was resumed from its last resourceVersion, nothing listed again; only
    # 410 Gone (deviceclasses) made the watcher list again.
    assert api.watch_versions["resourceclaims"][:2] == ["5", "9"]
    assert api.calls["list", "resourceclaims"] == 1 and api.calls["list", "resourceslices"] == 1
    assert api.calls["list", "deviceclasses"] == 2


def test_node_facts_from_the_kept_inputs_equal_those_from_the_node(settings: Settings, catalog: GpuCatalog) -> None:
    from app.snapshot.nodes import facts_for, node_inputs

    node = node_object("n", gpus=8, product="NVIDIA-H100-80GB-HBM3", rdma=True,
                       labels={"topology.kubernetes.io/zone": "z1", "nvidia.com/gpu.clique": "c.1"})
    node["metadata"]["annotations"] = {"llm-placement.io/hourly-cost": "31.5", "other.io/big": "x" * 5000}
    node["spec"] = {"unschedulable": True, "taints": [{"key": "a", "effect": "PreferNoSchedule"},
                                                      {"key": "b", "effect": "NoSchedule"}]}
    policy = settings.policies().node_facts
    kept = node_inputs(node)
    assert facts_for(kept, catalog, policy) == facts_for(node, catalog, policy)
    assert "other.io/big" not in kept["metadata"]["annotations"]


def test_a_burst_of_slice_events_re_applies_its_node_once(
        settings: Settings, catalog: GpuCatalog, monkeypatch: pytest.MonkeyPatch) -> None:
    import app.cluster.dra as watch_module
    import app.dra.index as dra_module
    from app.cluster.cache import ClusterCache
    from app.cluster.dra import DraWatcher
    from app.metrics.metrics import Metrics

    def slice_of(i: int) -> dict[str, Any]:
        got = fx.slice_("big", [fx.gpu(8 * i + j) for j in range(8)], name=f"big-{i}")
        got["spec"]["pool"]["name"] = f"big-{i}"  # one pool per slice, as a driver may publish
        return got

    snap = ClusterSnapshot()
    cache = ClusterCache(object(), snap, threading.RLock(), catalog, settings, Metrics())  # type: ignore[arg-type]
    cache._apply_node(node_object("big", gpus=0))
    watcher = DraWatcher(object(), cache)  # type: ignore[arg-type]
    applied, summaries = 0, 0
    real_apply, real_summary = watch_module.apply_node, dra_module.node_gpus

    def count_apply(*a: Any, **k: Any) -> Any:
        nonlocal applied
        applied += 1
        return real_apply(*a, **k)

    def count_summary(*a: Any, **k: Any) -> Any:
        nonlocal summaries
        summaries += 1
        return real_summary(*a, **k)

    monkeypatch.setattr(watch_module, "apply_node", count_apply)
    monkeypatch.setattr(dra_module, "node_gpus", count_summary)
    for i in range(50):
        with watcher.lock:
            watcher.mark(watcher._put("resourceslices", slice_of(i), False))
    assert applied == 0 and summaries == 0  # nothing re-applied per event
    watcher.flush()
    assert applied == 1 and summaries == 1  # one re-apply, one summary for overlay and MIG facts
    assert snap.nodes["big"].gpu_count == 400


def test_a_node_publishing_more_devices_than_the_limit_has_no_dra_gpus_read(settings: Settings,
                                                                            catalog: GpuCatalog) -> None:
    from app.cluster.cache import apply_node
    from app.dra.index import DRIVER, MAX_NODE_DEVICES

    def slice_(i: int, n: int) -> dict[str, Any]:
        devs = [{"name": f"gpu-{i}-{j}", "attributes": {"type": {"string": "gpu"},
                                                       "productName": {"string": "NVIDIA H100 80GB HBM3"}},
                 "capacity": {"memory": {"value": "81559Mi"}}} for j in range(n)]
        return {"metadata": {"name": f"s{i}"}, "spec": {"driver": DRIVER, "nodeName": "big", "devices": devs,
                                                        "pool": {"name": f"p{i}", "generation": 1,
                                                                 "resourceSliceCount": 1}}}

    snap = ClusterSnapshot()
    apply_node(snap, catalog, settings, node_object("big", gpus=0))
    snap.dra.enabled = True
    snap.dra.put_slice(slice_(0, 8))
    apply_node(snap, catalog, settings, node_object("big", gpus=0))
    assert snap.nodes["big"].gpu_count == 8
    # Past the limit the node's slices are not read at all, and reading it stays cheap.
    for i in range(1, MAX_NODE_DEVICES // 128 + 2):
        snap.dra.put_slice(slice_(i, 128))
    apply_node(snap, catalog, settings, node_object("big", gpus=0))
    assert snap.dra.over_limit("big") and snap.nodes["big"].gpu_count == 0
    assert snap.dra.busy_gpus("big") == 0
    # Back under it (slices deleted), the GPUs count again.
    for i in range(1, MAX_NODE_DEVICES // 128 + 2):
        snap.dra.drop_slice(f"s{i}")
    apply_node(snap, catalog, settings, node_object("big", gpus=0))
    assert not snap.dra.over_limit("big") and snap.nodes["big"].gpu_count == 8
