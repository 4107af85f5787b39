"""Cluster-level placement quality (app.metrics.quality) on hand-made snapshots, and its gauges."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from app.base.catalog import GpuCatalog
from app.base.objects import node_object, pod_object
from app.base.workload import Stage, parse_workload
from app.config.settings import Settings
from app.extender.service import ExtenderService
from app.extender.wiring import start_quality_refresher
from app.metrics.metrics import Metrics
from app.metrics.quality import (
    UNKNOWN_GPU,
    QualityPublisher,
    QualityRefresher,
    share_hourly_cost,
    snapshot_quality,
)
from app.placement.feasibility import pod_hourly_cost
from app.snapshot.nodes import NodeFacts, node_facts
from app.snapshot.store import ClusterSnapshot, PlacedPod

CLIQUE = "nvidia.com/gpu.clique"
H100 = "NVIDIA-H100-80GB-HBM3"
A100 = "NVIDIA-A100-SXM4-80GB"
# The gpu label is the catalog's name for the product, not the raw node label.
H = GpuCatalog.load().lookup(H100).name  # type: ignore[union-attr]
A = GpuCatalog.load().lookup(A100).name  # type: ignore[union-attr]


@pytest.fixture(scope="module")
def cat() -> GpuCatalog:
    return GpuCatalog.load()


def facts(cat: GpuCatalog, name: str, **kw: Any) -> NodeFacts:
    return node_facts(node_object(name, **kw), cat, Settings().labels)


def pod(uid: str, node: str, gpus: int, stage: Stage | None = Stage.PRETRAINING, **kw: Any) -> PlacedPod:
    return PlacedPod(uid=uid, key=f"ns/{uid}", node=node, gpus=gpus, cpu_millis=kw.get("cpu", 1000.0),
                     memory_bytes=kw.get("mem", 4e9), stage=stage, latency_class=None, gang=None)


def pending(snap: ClusterSnapshot, name: str, gpus: int) -> None:
    """A pod the watch has seen but nobody has bound (what stranded-ness is measured against)."""
    snap.track_spec(parse_workload(pod_object(name, namespace="ns", gpus=gpus, uid=f"uid-{name}")))


def cluster(cat: GpuCatalog) -> ClusterSnapshot:
    """h100-a/b share clique clq-a; h100-c is its own domain; a100-0 is cordoned; cpu-0 has no GPUs."""
    snap = ClusterSnapshot()
    snap.upsert_node(facts(cat, "h100-a", gpus=8, product=H100, labels={CLIQUE: "clq-a"}))
    snap.upsert_node(facts(cat, "h100-b", gpus=8, product=H100, labels={CLIQUE: "clq-a"}))
    snap.upsert_node(facts(cat, "h100-c", gpus=8, product=H100))
    cordoned = node_object("a100-0", gpus=8, product=A100)
    cordoned["spec"]["unschedulable"] = True
    snap.upsert_node(node_facts(cordoned, cat, Settings().labels))
    snap.upsert_node(facts(cat, "cpu-0", node_class="cpu"))
    snap.place(pod("p1", "h100-a", 6))  # partly used: 2 free
    snap.place(pod("p2", "h100-c", 8))  # full
    return snap


def test_free_gpus_by_domain_and_model_skip_cordoned_and_cpu_nodes(cat: GpuCatalog) -> None:
    q = snapshot_quality(cluster(cat))
    # clq-a: 2 free on h100-a + 8 on h100-b; h100-c is full; the cordoned A100 offers nothing.
    assert q.free_gpus == {("clq-a", H): 10, ("node:h100-c", H): 0}
    assert q.allocatable_gpus == {H: 24}


def test_fragmentation_is_the_share_of_free_gpus_beside_busy_ones(cat: GpuCatalog) -> None:
    q = snapshot_quality(cluster(cat))
    assert q.fragmentation == {H: pytest.approx(2 / 10)}
    snap = cluster(cat)
    snap.place(pod("p3", "h100-b", 1))  # now every free GPU sits beside a busy one
    assert snapshot_quality(snap).fragmentation == {H: pytest.approx(1.0)}


def test_nothing_pending_means_nothing_stranded(cat: GpuCatalog) -> None:
    q = snapshot_quality(cluster(cat))
    assert q.stranded_gpus == {H: 0}
    assert q.pending_gpus == 0


def test_stranded_counts_partial_nodes_too_small_for_every_pending_pod(cat: GpuCatalog) -> None:
    snap = cluster(cat)
    pending(snap, "big", 8)
    q = snapshot_quality(snap)
    # h100-a's 2 free GPUs can take no pending pod; h100-b is whole (not stranded, merely free).
    assert q.stranded_gpus == {H: 2}
    assert q.pending_gpus == 8
    pending(snap, "small", 2)  # a 2-GPU pod fits h100-a's 2 free GPUs: they are usable again
    q = snapshot_quality(snap)
    assert q.stranded_gpus == {H: 0}
    assert q.pending_gpus == 10


def test_bound_and_cpu_pods_are_not_pending_demand(cat: GpuCatalog) -> None:
    snap = cluster(cat)
    pending(snap, "cpu-only", 0)
    bound = parse_workload(pod_object("done", namespace="ns", gpus=1, uid="uid-done"))
    snap.track_spec(bound)
    snap.assume(bound, "h100-b")
    q = snapshot_quality(snap)
    assert q.pending_gpus == 0
    assert q.stranded_gpus == {H: 0}


def test_gang_reservations_are_not_free(cat: GpuCatalog) -> None:
    snap = cluster(cat)
    pending(snap, "big", 8)
    q = snapshot_quality(snap, reserved=lambda node: 5 if node == "h100-b" else 0)
    # h100-b: 3 free beside 5 reserved -> partly used, and too small for the pending 8-GPU pod.
    assert q.free_gpus[("clq-a", H)] == 2 + 3
    assert q.stranded_gpus == {H: 5}
    assert q.fragmentation == {H: pytest.approx(1.0)}


def test_unknown_products_get_a_bounded_label_and_are_counted(cat: GpuCatalog) -> None:
    snap = ClusterSnapshot()
    snap.upsert_node(facts(cat, "mystery-0", gpus=4, product="ACME-Tensor-9000"))
    snap.upsert_node(facts(cat, "mystery-1", gpus=4, product="ACME-Tensor-9001"))
    q = snapshot_quality(snap)
    assert q.unknown_gpu_nodes == 2
    assert q.allocatable_gpus == {UNKNOWN_GPU: 8}
    assert set(q.free_gpus) == {("node:mystery-0", UNKNOWN_GPU), ("node:mystery-1", UNKNOWN_GPU)}


def test_uncatalogued_products_are_a_warning_metric_naming_each_product(cat: GpuCatalog) -> None:
    m = Metrics()
    pub = QualityPublisher(m)
    snap = ClusterSnapshot()
    for i, product in enumerate(["NVIDIA-H800", "NVIDIA-H800", "NVIDIA-L20", "x" * 200]):
        snap.upsert_node(facts(cat, f"u-{i}", gpus=8, product=product))
    snap.upsert_node(facts(cat, "h100", gpus=8, product=H100))
    pub.publish(snapshot_quality(snap))
    metric = "llm_placement_unknown_gpu_product_nodes"
    assert sample(m, metric, product="NVIDIA-H800") == 2
    assert sample(m, metric, product="NVIDIA-L20") == 1
    assert sample(m, metric, product="x" * 64) == 1  # cut short: a label is no free-text field
    assert sample(m, metric, product=H100) is None  # catalogued
    snap.remove_node("u-2")
    pub.publish(snapshot_quality(snap))
    assert sample(m, metric, product="NVIDIA-L20") is None


def test_unknown_product_series_are_bounded(cat: GpuCatalog) -> None:
    snap = ClusterSnapshot()
    for i in range(40):
        snap.upsert_node(facts(cat, f"u-{i}", gpus=1, product=f"ACME-{i}"))
    q = snapshot_quality(snap)
    assert len(q.unknown_gpu_products) == 33 and q.unknown_gpu_products["(other)"] == 8
    assert sum(q.unknown_gpu_products.values()) == 40


@pytest.mark.parametrize(
    ("gpus", "cpu", "memory", "node_kw"),
    [
        (4, "8", "64Gi", {"gpus": 8, "product": H100}),  # GPU share of an HGX box
        (0, "16", "32Gi", {"node_class": "cpu", "cpu": "64", "memory": "256Gi"}),  # CPU share
        (0, "100m", "128Mi", {"node_class": "cpu"}),  # tiny pod: the 1% floor
        (0, "4", "400Gi", {"node_class": "cpu", "cpu": "64", "memory": "512Gi"}),  # memory dominates
    ],
)
def test_share_cost_matches_the_filter_formula(
    cat: GpuCatalog, gpus: int, cpu: str, memory: str, node_kw: dict[str, Any]
) -> None:
    node = facts(cat, "n", **node_kw)
    spec = parse_workload(pod_object("p", gpus=gpus, cpu=cpu, memory=memory))
    want = pod_hourly_cost(spec, node)
    assert want > 0
    assert share_hourly_cost(spec.gpus, spec.cpu_millis, spec.memory_bytes, node) == pytest.approx(want)


def test_running_cost_is_summed_by_stage(cat: GpuCatalog) -> None:
    snap = cluster(cat)
    snap.place(pod("s1", "h100-b", 2, Stage.SERVING))
    snap.place(pod("x1", "h100-b", 1, None))
    snap.place(pod("gone", "deleted-node", 1, Stage.SERVING))  # its node vanished: not priced
    q = snapshot_quality(snap)
    per_gpu = snap.nodes["h100-b"].hourly_cost / 8
    assert per_gpu > 0
    assert q.hourly_cost["serving"] == pytest.approx(2 * per_gpu)
    assert q.hourly_cost["none"] == pytest.approx(per_gpu)
    assert q.hourly_cost["pretraining"] == pytest.approx((6 + 8) * per_gpu)
    # Every stage has a value, so a dashboard line does not vanish when a stage has no pods.
    assert q.hourly_cost["data-prep"] == 0.0 and set(q.hourly_cost) >= {s.value for s in Stage}


def sample(m: Metrics, name: str, **labels: str) -> float | None:
    return m.registry.get_sample_value(name, labels)


def test_publish_sets_gauges_and_drops_vanished_label_sets(cat: GpuCatalog) -> None:
    m = Metrics()
    pub = QualityPublisher(m)
    snap = cluster(cat)
    pending(snap, "big", 8)
    pub.publish(snapshot_quality(snap))
    assert sample(m, "llm_placement_free_gpus", domain="clq-a", gpu=H) == 10
    assert sample(m, "llm_placement_stranded_gpus", gpu=H) == 2
    assert sample(m, "llm_placement_gpu_fragmentation_ratio", gpu=H) == pytest.approx(0.2)
    assert sample(m, "llm_placement_allocatable_gpus", gpu=H) == 24
    assert sample(m, "llm_placement_pending_gpus") == 8
    assert sample(m, "llm_placement_running_hourly_cost_dollars", stage="pretraining") > 0  # type: ignore[operator]
    snap.remove_node("h100-c")
    snap.upsert_node(facts(cat, "a100-1", gpus=8, product=A100))
    pub.publish(snapshot_quality(snap))
    assert sample(m, "llm_placement_free_gpus", domain="node:h100-c", gpu=H) is None
    assert sample(m, "llm_placement_free_gpus", domain="node:a100-1", gpu=A) == 8
    assert sample(m, "llm_placement_stranded_gpus", gpu=A) == 0
    for s in list(snap.nodes):
        if snap.nodes[s].gpu is not None and snap.nodes[s].gpu.name == A:  # type: ignore[union-attr]
            snap.remove_node(s)
    pub.publish(snapshot_quality(snap))
    assert sample(m, "llm_placement_stranded_gpus", gpu=A) is None
    assert sample(m, "llm_placement_gpu_fragmentation_ratio", gpu=A) is None


def test_service_refresh_reads_its_snapshot(service: ExtenderService) -> None:
    spec = parse_workload(pod_object("train", gpus=6, stage="pretraining"))
    service.snapshot.assume(spec, "h100-0")
    q = service.refresh_quality()
    assert q.free_gpus[("node:h100-0", H)] == 2
    m = service.metrics
    assert sample(m, "llm_placement_free_gpus", domain="node:h100-0", gpu=H) == 2
    assert sample(m, "llm_placement_gpu_fragmentation_ratio", gpu=H) == 1.0
    cost = sample(m, "llm_placement_running_hourly_cost_dollars", stage="pretraining")
    assert cost == pytest.approx(service.snapshot.nodes["h100-0"].hourly_cost * 6 / 8)


def test_refresher_runs_now_and_periodically_and_survives_errors() -> None:
    calls: list[float] = []
    two = threading.Event()

    def refresh() -> None:
        calls.append(time.monotonic())
        if len(calls) >= 3:
            two.set()
        if len(calls) == 1:
            raise RuntimeError("a bad refresh must not end the thread")

    r = QualityRefresher(refresh, interval=0.02)
    r.start()
    try:
        assert two.wait(5), f"refresher stopped after {len(calls)} calls"
    finally:
        r.stop()
    n = len(calls)
    time.sleep(0.1)
    assert len(calls) == n, "refresher kept running after stop()"


def test_wired_refresher_waits_for_the_cache(service: ExtenderService) -> None:
    # service.ready is unset, as while the watch is still listing: nothing may be published.
    r = start_quality_refresher(service, interval=0.02)
    try:
        time.sleep(0.15)
        assert sample(service.metrics, "llm_placement_allocatable_gpus", gpu=H) is None
        service.ready.set()
        deadline = time.monotonic() + 5
        while sample(service.metrics, "llm_placement_allocatable_gpus", gpu=H) is None:
            assert time.monotonic() < deadline, "refresher never published after the cache synced"
            time.sleep(0.02)
        assert sample(service.metrics, "llm_placement_allocatable_gpus", gpu=H) == 8
    finally:
        r.stop()
