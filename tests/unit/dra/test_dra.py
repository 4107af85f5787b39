"""GPUs through DRA: node facts from ResourceSlices, pod demand and usage from ResourceClaims."""

from __future__ import annotations

import json
import threading
from types import SimpleNamespace
from typing import Any

import pytest

from app.base import workload
from app.base.catalog import GpuCatalog
from app.base.objects import node_object, pod_object
from app.cluster.cache import apply_node, apply_pod
from app.config.settings import Settings
from app.dra.index import DRIVER, DraIndex
from app.snapshot.store import ClusterSnapshot

GPU_CLASS = {"metadata": {"name": "gpu.nvidia.com"}, "spec": {"selectors": [{"cel": {"expression": (
    "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'")}}]}}
MIG_CLASS = {"metadata": {"name": "mig.nvidia.com"}, "spec": {"selectors": [{"cel": {"expression": (
    "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'mig'")}}]}}


def gpu_device(i: int, product: str, mem: str, mig: bool = False) -> dict[str, Any]:
    attrs: dict[str, Any] = {
        "type": {"string": "mig" if mig else "gpu"},
        "productName": {"string": product},
        "architecture": {"string": "Hopper"},
        "cudaComputeCapability": {"version": "9.0.0"},
        "uuid": {"string": f"GPU-{i}"},
    }
    if mig:
        attrs["profile"] = {"string": "1g.10gb"}
        attrs["parentUUID"] = {"string": "GPU-0"}
    return {"name": f"{'mig' if mig else 'gpu'}-{i}", "attributes": attrs, "capacity": {"memory": {"value": mem}}}


def rslice(node: str, devices: list[dict[str, Any]], generation: int = 1, name: str | None = None
           ) -> dict[str, Any]:
    return {"metadata": {"name": name or f"{node}-gpu"},
            "spec": {"driver": DRIVER, "nodeName": node, "devices": devices,
                     "pool": {"name": node, "generation": generation, "resourceSliceCount": 1}}}


def claim_spec(count: int = 1, cls: str = "gpu.nvidia.com", mode: str = "ExactCount",
               selectors: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    exactly: dict[str, Any] = {"deviceClassName": cls, "allocationMode": mode}
    if mode == "ExactCount":
        exactly["count"] = count
    if selectors:
        exactly["selectors"] = selectors
    return {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}



def h100_node_slices(dra: DraIndex, node: str = "big", n: int = 8) -> None:
    dra.put_slice(rslice(node, [gpu_device(i, "NVIDIA H100 80GB HBM3", "81559Mi") for i in range(n)]))


def test_slices_become_facts_like_gfd_labels(settings: Settings, catalog: GpuCatalog) -> None:
    snap = ClusterSnapshot()
    h100_node_slices(snap.dra)
    # No GFD label, no nvidia.com/gpu allocatable: the GPUs exist only in the slices.
    apply_node(snap, catalog, settings, node_object("big", gpus=0))
    facts = snap.nodes["big"]
    assert facts.gpu_count == 8
    assert facts.gpu is not None and facts.gpu.name == "H100-SXM-80GB"
    assert facts.gpu_product == "NVIDIA H100 80GB HBM3"
    assert 85 < facts.gpu_memory_gb < 86  # 81559 MiB, from the device's memory capacity
    assert facts.node_class.value == "gpu"
    assert facts.hourly_cost == pytest.approx(8 * facts.gpu.hourly_cost_usd)


def test_slices_win_over_gfd_labels_and_allocatable(settings: Settings, catalog: GpuCatalog) -> None:
    snap = ClusterSnapshot()
    snap.dra.put_slice(rslice("n", [gpu_device(i, "NVIDIA L4", "23034Mi") for i in range(2)]))
    apply_node(snap, catalog, settings, node_object("n", gpus=4, product="NVIDIA-H100-80GB-HBM3"))
    facts = snap.nodes["n"]
    assert (facts.gpu_count, facts.gpu and facts.gpu.name) == (2, "L4")
    # A node without slices keeps its GFD facts.
    apply_node(snap, catalog, settings, node_object("m", gpus=4, product="NVIDIA-L4"))
    assert snap.nodes["m"].gpu_count == 4


def test_mig_devices_are_not_full_gpus_and_old_generations_are_ignored() -> None:
    dra = DraIndex()
    dra.put_slice(rslice("n", [gpu_device(0, "NVIDIA A100-SXM4-80GB", "80Gi")]
                         + [gpu_device(i, "NVIDIA A100-SXM4-80GB", "10Gi", mig=True) for i in range(1, 4)]))
    got = dra.gpus_of("n")
    assert got is not None and (got.count, got.mig_devices) == (1, 3)
    dra.put_slice(rslice("n", [gpu_device(i, "NVIDIA L4", "24Gi") for i in range(4)], generation=2,
                         name="n-new"))
    got = dra.gpus_of("n")
    assert got is not None and (got.count, got.product) == (4, "NVIDIA L4")
    assert dra.drop_slice("n-new") == "n"


def test_slices_of_other_drivers_and_network_devices_are_ignored() -> None:
    dra = DraIndex()
    other = rslice("n", [gpu_device(0, "NVIDIA L4", "24Gi")])
    other["spec"]["driver"] = "nic.example.com"
    dra.put_slice(other)
    net = rslice("n", [gpu_device(0, "NVIDIA L4", "24Gi")], name="net")
    del net["spec"]["nodeName"]
    net["spec"]["allNodes"] = True
    dra.put_slice(net)
    assert dra.gpus_of("n") is None


def test_claim_demand_counts_gpus_of_the_driver_class() -> None:
    dra = DraIndex()
    dra.put_class(GPU_CLASS)
    dra.put_class(MIG_CLASS)
    dra.put_class({"metadata": {"name": "nic"}, "spec": {"selectors": [
        {"cel": {"expression": "device.driver == 'nic.example.com'"}}]}})
    assert dra.demand(claim_spec(2)).gpus == 2
    assert dra.demand(claim_spec(2, cls="nic")).gpus == 0
    assert dra.demand(claim_spec(1, cls="mig.nvidia.com")).gpus == 0
    assert dra.demand(claim_spec(1, cls="unknown")).gpus == 0
    every = dra.demand(claim_spec(mode="All"))
    assert (every.gpus, every.all_devices) == (1, True)
    sel = [{"cel": {"expression": 'device.attributes["gpu.nvidia.com"].productName == "NVIDIA L4"'}}]
    assert dra.demand(claim_spec(1, selectors=sel)).product == "NVIDIA L4"
    fancy = [{"cel": {"expression": "device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('40Gi')) >= 0"}}]
    assert dra.demand(claim_spec(1, selectors=fancy)).product is None
    first = {"devices": {"requests": [{"name": "g", "firstAvailable": [
        {"name": "a", "deviceClassName": "gpu.nvidia.com", "count": 4},
        {"name": "b", "deviceClassName": "gpu.nvidia.com", "count": 2}]}]}}
    assert dra.demand(first).gpus == 4


def test_allocated_claims_count_their_full_gpus() -> None:
    dra = DraIndex()
    dra.put_slice(rslice("n", [gpu_device(0, "NVIDIA A100-SXM4-80GB", "80Gi"),
                               gpu_device(1, "NVIDIA A100-SXM4-80GB", "10Gi", mig=True)]))
    status = {"allocation": {"devices": {"results": [
        {"request": "gpu", "driver": DRIVER, "pool": "n", "device": "gpu-0"},
        {"request": "gpu", "driver": DRIVER, "pool": "n", "device": "mig-1"},
        {"request": "nic", "driver": "nic.example.com", "pool": "n", "device": "eth0"}]}}}
    got = dra.demand(claim_spec(5), status)
    assert (got.gpus, got.allocated) == (1, True)


def claim_pod(name: str, node: str = "", **ref: str) -> dict[str, Any]:
    pod = pod_object(name, gpus=0, stage="serving")
    pod["spec"]["resourceClaims"] = [{"name": "gpus", **ref}]
    if node:
        pod["spec"]["nodeName"] = node
    return pod


def test_pod_gpus_from_claims_templates_and_generated_claims(settings: Settings, catalog: GpuCatalog) -> None:
    snap = ClusterSnapshot()
    dra = snap.dra
    dra.put_class(GPU_CLASS)
    h100_node_slices(dra, "big", 4)
    apply_node(snap, catalog, settings, node_object("big", gpus=0))
    dra.put_claim({"metadata": {"name": "two", "namespace": "default"}, "spec": claim_spec(2)})
    dra.put_template({"metadata": {"name": "tpl", "namespace": "default"}, "spec": {"spec": claim_spec(3)}})
    assert dra.pod_gpus(claim_pod("a", resourceClaimName="two")) == 2
    assert dra.pod_gpus(claim_pod("b", resourceClaimTemplateName="tpl")) == 3
    assert dra.pod_gpus(claim_pod("c", resourceClaimName="missing")) == 0
    # The claim the controller generated from the template, once named in the pod's status, wins.
    gen = claim_pod("d", resourceClaimTemplateName="tpl")
    gen["status"]["resourceClaimStatuses"] = [{"name": "gpus", "resourceClaimName": "d-gpus-x"}]
    dra.put_claim({"metadata": {"name": "d-gpus-x", "namespace": "default"}, "spec": claim_spec(3),
                   "status": {"allocation": {"devices": {"results": [
                       {"request": "gpu", "driver": DRIVER, "pool": "big", "device": "gpu-0"}]}}}})
    assert dra.pod_gpus(gen) == 1

    # Without the resolver installed, claims are invisible (clusters without DRA); with it, the
    # pod's spec and its usage on the node count them.
    assert workload.parse_workload(claim_pod("a", resourceClaimName="two")).gpus == 0
    dra.reads_claims = True  # as the watcher does
    assert workload.parse_workload(claim_pod("a", resourceClaimName="two"), claims=snap.claim_reader()).gpus == 2
    bound = claim_pod("a", node="big", resourceClaimName="two")
    apply_pod(snap, settings, bound)
    assert snap.free_gpus("big") == 2
    apply_pod(snap, settings, bound, deleted=True)
    assert snap.free_gpus("big") == 4


def test_hostile_objects_do_not_raise() -> None:
    dra = DraIndex()
    for obj in ({}, {"spec": None}, {"spec": {"nodeName": 3}}, {"spec": {"nodeName": "n", "driver": DRIVER,
                "devices": [None, {"name": 1}, {"name": "x", "attributes": [], "capacity": {"memory": 5}}]}}):
        dra.put_slice(obj)
    dra.put_class({"spec": {"selectors": [None, {"cel": None}, {"cel": {"expression": 7}}]}})
    assert dra.demand({"devices": {"requests": [None, {"exactly": {"count": "many"}}]}}).gpus == 0
    assert dra.pod_gpus({"spec": {"resourceClaims": [None, {"name": 5}]}}) == 0
    assert dra.pod_gpus({}) == 0


def test_watched_pod_keeps_the_name_of_its_generated_claim(settings: Settings, catalog: GpuCatalog) -> None:
    # A pod bound with a template's claim, arriving through the pod watch. Its claim asked for every
    # device (allocationMode All: "at least one") and got all four of the node's GPUs; only the
    # pod's status names that claim. The node must count four GPUs used, not the template's one.
    from tests.unit.cluster.test_cache_poison import bound, run_cache

    dra_pod = bound("all", 0, node="big")
    dra_pod["spec"]["resourceClaims"] = [{"name": "gpus", "resourceClaimTemplateName": "every"}]
    dra_pod["status"] = {"phase": "Pending", "resourceClaimStatuses": [
        {"name": "gpus", "resourceClaimName": "all-gpus-x"}]}
    snap = ClusterSnapshot()
    dra = snap.dra
    dra.put_class(GPU_CLASS)
    h100_node_slices(dra, "big", 4)
    dra.put_template({"metadata": {"name": "every", "namespace": "default"},
                      "spec": {"spec": claim_spec(mode="All")}})
    dra.put_claim({"metadata": {"name": "all-gpus-x", "namespace": "default"}, "spec": claim_spec(mode="All"),
                   "status": {"allocation": {"devices": {"results": [
                       {"request": "gpu", "driver": DRIVER, "pool": "big", "device": f"gpu-{i}"}
                       for i in range(4)]}}}})
    dra.reads_claims = True  # as the watcher does
    lists = {"nodes": [node_object("big", gpus=0)], "pods": [dra_pod], "namespaces": []}
    cache, _, _ = run_cache(settings, catalog, lists, {"pods": [{"type": "MODIFIED", "object": dra_pod}]},
                            snapshot=snap)
    assert cache.snapshot.nodes["big"].gpu_count == 4
    assert cache.snapshot.free_gpus("big") == 0


def test_watch_count_replaces_the_bind_time_assumption(settings: Settings, catalog: GpuCatalog) -> None:
    # The extender assumes a pod on its node at bind with what it knew at filter time; a claim is
    # allocated in kube-scheduler's PreBind, so the watch then reports what the claim really holds
    # (here every device of the node, for "at least one"). The claim's devices then count on the
    # node instead of the pod's ask; a repeated assumption (a retried bind) does not undo it.
    snap = ClusterSnapshot()
    dra = snap.dra
    dra.put_class(GPU_CLASS)
    h100_node_slices(dra, "big", 4)
    apply_node(snap, catalog, settings, node_object("big", gpus=0))
    dra.put_claim({"metadata": {"name": "every", "namespace": "default"}, "spec": claim_spec(mode="All")})
    dra.reads_claims = True  # as the watcher does
    pod = claim_pod("a", resourceClaimName="every")
    pod["metadata"]["uid"] = "uid-a"
    spec = workload.parse_workload(pod, claims=snap.claim_reader())
    assert spec.gpus == 1
    snap.assume(spec, "big")
    assert snap.free_gpus("big") == 3
    dra.put_claim({"metadata": {"name": "every", "namespace": "default"}, "spec": claim_spec(mode="All"),
                   "status": {"allocation": {"devices": {"results": [
                       {"request": "gpu", "driver": DRIVER, "pool": "big", "device": f"gpu-{i}"}
                       for i in range(4)]}}}})
    snap.refresh_dra({"big"}, {"default/every"})  # what the watcher does on the claim's event
    assert snap.free_gpus("big") == 0
    assert snap.new_gpus(spec) == 0  # the bind gate: the spec read before PreBind needs none free
    pod["spec"]["nodeName"] = "big"
    apply_pod(snap, settings, pod)
    assert snap.free_gpus("big") == 0
    assert not snap.pods["uid-a"].assumed
    snap.assume(spec, "big")
    assert snap.free_gpus("big") == 0 and not snap.pods["uid-a"].assumed


def test_claim_allocated_before_the_bind_is_seen_keeps_the_assumed_pod(
        settings: Settings, catalog: GpuCatalog) -> None:
    # kube-scheduler writes the claim's allocation (PreBind) and then asks us to bind; the claim's
    # watch event can arrive before the pod's bind event. The claim's devices count on the node from
    # that event on (and the assumed pod no longer for them), and the pod must not be taken for
    # finished (data gravity remembers finished pods). No API request is made for it.
    from app.cluster.dra import DraWatcher

    snap = ClusterSnapshot()
    dra = snap.dra
    dra.put_class(GPU_CLASS)
    h100_node_slices(dra, "big", 4)
    apply_node(snap, catalog, settings, node_object("big", gpus=0))
    claim = {"metadata": {"name": "two", "namespace": "default"}, "spec": claim_spec(2)}
    dra.put_claim(claim)
    dra.reads_claims = True  # as the watcher does
    pod = claim_pod("a", resourceClaimName="two")
    pod["metadata"]["uid"] = "uid-a"
    snap.assume(workload.parse_workload(pod, claims=snap.claim_reader()), "big")
    assert snap.free_gpus("big") == 2
    cache = SimpleNamespace(snapshot=snap, lock=threading.RLock(), settings=settings, catalog=catalog,
                            on_change=None, _guarded=lambda kind, obj, fn, *args: fn(*args))
    watcher = DraWatcher.__new__(DraWatcher)
    watcher.cache, watcher.snapshot, watcher.lock = cache, snap, cache.lock  # type: ignore[assignment]
    allocated = {**claim, "status": {
        "allocation": {"devices": {"results": [
            {"request": "gpu", "driver": DRIVER, "pool": "big", "device": f"gpu-{i}"} for i in range(3)]}},
        "reservedFor": [{"resource": "pods", "name": "a", "uid": "uid-a"}]}}
    with watcher.lock:
        watcher._reapply(watcher._put("resourceclaims", allocated, False))
    assert "uid-a" in snap.pods and "default/a" not in snap.finished
    assert snap.free_gpus("big") == 1
    # The pod's bind event: nothing is counted twice.
    pod["spec"]["nodeName"] = "big"
    apply_pod(snap, settings, pod)
    assert snap.free_gpus("big") == 1 and "default/a" not in snap.finished


class _FakeCustom:
    """list_cluster_custom_object of a fake CustomObjectsApi: lists, an idle watch, or an error."""

    def __init__(self, items: dict[str, list[dict[str, Any]]], stop: threading.Event,
                 status: int | None = None) -> None:
        self.items, self.stop, self.status = items, stop, status
        self.release = threading.Event()  # the lists answer only once released

    def list_cluster_custom_object(self, group: str, version: str, plural: str, watch: bool = False,
                                   **_: Any) -> Any:
        from kubernetes.client.exceptions import ApiException

        from tests.unit.cluster.test_cache_poison import Resp

        self.release.wait(5)
        if self.status is not None:
            raise ApiException(status=self.status)
        if watch:
            self.stop.wait(5)
            return Resp(b"")
        body = {"metadata": {"resourceVersion": "5"}, "items": self.items.get(plural, [])}
        return Resp(json.dumps(body).encode())


@pytest.mark.parametrize("status", [None, 404])
def test_extender_is_not_ready_before_the_dra_objects_are_read(
        settings: Settings, catalog: GpuCatalog, status: int | None) -> None:
    # Ready with nodes and pods listed but the slices not yet read, the extender would take a DRA
    # GPU node for a CPU node (and a claim pod for a CPU pod) for its first requests. Ready comes
    # once every DRA kind was listed, or found absent (a cluster without the API: GPUs from
    # extended resources only, as before).
    from app.cluster.dra import DraWatcher
    from tests.unit.cluster.test_cache_poison import run_cache

    cache, _, _ = run_cache(settings, catalog, {"nodes": [node_object("big", gpus=0)], "pods": [],
                                                "namespaces": []}, {})
    assert cache.synced
    stop = threading.Event()
    fake = _FakeCustom({"deviceclasses": [GPU_CLASS], "resourceslices": [rslice("big", [
        gpu_device(i, "NVIDIA H100 80GB HBM3", "81559Mi") for i in range(8)])]}, stop, status)
    watcher = DraWatcher(object(), cache)  # type: ignore[arg-type]
    watcher.custom = fake  # type: ignore[assignment]
    watcher.start()
    try:
        assert not cache.synced
        fake.release.set()
        for _ in range(100):
            if cache.synced:
                break
            stop.wait(0.05)
        assert cache.synced
        assert cache.snapshot.nodes["big"].gpu_count == (0 if status else 8)
    finally:
        watcher.stop()
        stop.set()
