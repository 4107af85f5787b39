"""Watch events folded into the snapshot: usage, terminal pods, bad annotations, producers."""

from __future__ import annotations

from app.base.catalog import GpuCatalog
from app.base.objects import node_object, pod_object
from app.cluster.cache import apply_node, apply_pod
from app.config.settings import Settings
from app.snapshot.store import ClusterSnapshot


def test_bound_pods_count_and_terminal_pods_free(settings: Settings, catalog: GpuCatalog) -> None:
    snap = ClusterSnapshot()
    apply_node(snap, catalog, settings, node_object("g", gpus=8, product="NVIDIA-L4"))
    p = pod_object("a", gpus=3, stage="serving")
    p["spec"]["nodeName"] = "g"
    apply_pod(snap, settings, p)
    apply_pod(snap, settings, p)  # a repeated MODIFIED event must not double count
    assert snap.free_gpus("g") == 5
    p["status"]["phase"] = "Succeeded"
    apply_pod(snap, settings, p)
    assert snap.free_gpus("g") == 8
    assert snap.node_of("default/a") == ("g", True)  # remembered for data gravity


def test_pod_with_bad_annotations_still_holds_its_gpus(settings: Settings, catalog: GpuCatalog) -> None:
    snap = ClusterSnapshot()
    apply_node(snap, catalog, settings, node_object("g", gpus=8, product="NVIDIA-L4"))
    p = pod_object("bad", gpus=2, annotations={"llm-placement.io/model-params": "70Q"})
    p["spec"]["nodeName"] = "g"
    apply_pod(snap, settings, p)
    assert snap.free_gpus("g") == 6
    apply_pod(snap, settings, p, deleted=True)
    assert snap.free_gpus("g") == 8


def test_pending_gang_members_tracked(settings: Settings) -> None:
    snap = ClusterSnapshot()
    for i in range(3):
        apply_pod(snap, settings, pod_object(f"m{i}", gpus=8, labels={"scheduling.x-k8s.io/pod-group": "g"},
                                             annotations={"llm-placement.io/gang-size": "4"}))
    assert len(snap.gang_members("default/g")) == 3
    assert snap.free_gpus("nowhere") == 0


def test_moved_pod_releases_old_node(settings: Settings, catalog: GpuCatalog) -> None:
    snap = ClusterSnapshot()
    for n in ("a", "b"):
        apply_node(snap, catalog, settings, node_object(n, gpus=4, product="Tesla-T4"))
    p = pod_object("x", gpus=4)
    p["spec"]["nodeName"] = "a"
    apply_pod(snap, settings, p)
    p["spec"]["nodeName"] = "b"
    apply_pod(snap, settings, p)
    assert (snap.free_gpus("a"), snap.free_gpus("b")) == (4, 0)
