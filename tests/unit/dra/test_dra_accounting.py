"""Free-GPU accounting on DRA nodes, with objects shaped like NVIDIA's driver publishes them
(tests/unit/dra/dra_fixtures.py): admin access, shared and pod-less claims, taints, partitionable and
passthrough devices, consumable capacity, extended resources backed by DRA (docs/dra.md)."""

from __future__ import annotations

from typing import Any

import pytest

from app.base import workload
from app.base.catalog import GpuCatalog
from app.base.objects import node_object, pod_object
from app.cluster.cache import apply_node, apply_pod
from app.config.settings import Settings
from app.snapshot.store import ClusterSnapshot
from tests.unit.dra import dra_fixtures as fx


def dra_snapshot(settings: Settings, catalog: GpuCatalog, *slices: dict[str, Any],
                 node: str = "n") -> ClusterSnapshot:
    snap = ClusterSnapshot()
    for cls in (fx.GPU_CLASS, fx.MIG_CLASS, fx.VFIO_CLASS):
        snap.dra.put_class(cls)
    for s in slices:
        snap.dra.put_slice(s)
    snap.dra.enabled = True
    snap.dra.reads_claims = True
    apply_node(snap, catalog, settings, node_object(node, gpus=0))
    return snap


def refresh(snap: ClusterSnapshot, settings: Settings, catalog: GpuCatalog, node: str = "n") -> None:
    """What the DRA watcher does after a claim or slice event: the node's facts again."""
    apply_node(snap, catalog, settings, node_object(node, gpus=0))


def claim_pod(name: str, *claims: str, node: str = "") -> dict[str, Any]:
    pod = pod_object(name, gpus=0, stage="serving", uid=f"u-{name}")
    pod["spec"]["resourceClaims"] = [{"name": f"c{i}", "resourceClaimName": c} for i, c in enumerate(claims)]
    if node:
        pod["spec"]["nodeName"] = node
    return pod


def test_admin_access_allocations_are_not_used_gpus(settings: Settings, catalog: GpuCatalog) -> None:
    # A monitoring pod's claim with adminAccess gets every GPU of the node; those GPUs stay free
    # for workloads (kube-scheduler hands admin-access requests devices in use or not).
    snap = dra_snapshot(settings, catalog, fx.slice_("n", [fx.gpu(i) for i in range(4)]))
    admin = fx.claim("dcgm", fx.request(mode="All", admin=True), node="n",
                     results=[fx.result("n", f"gpu-{i}", admin=True) for i in range(4)],
                     reserved=fx.reserved_for("dcgm"))
    snap.dra.put_claim(admin)
    refresh(snap, settings, catalog)
    pod = claim_pod("dcgm", "dcgm", node="n")
    assert workload.parse_workload(pod, claims=snap.claim_reader()).gpus == 0
    apply_pod(snap, settings, pod)
    assert snap.free_gpus("n") == 4
    # Not yet allocated: an admin-access request asks for no free GPU either.
    snap.dra.put_claim(fx.claim("dcgm2", fx.request(mode="All", admin=True)))
    assert workload.parse_workload(claim_pod("dcgm2", "dcgm2"), claims=snap.claim_reader()).gpus == 0


def test_admin_access_does_not_hold_mig_slices(settings: Settings, catalog: GpuCatalog) -> None:
    slices = fx.slice_("n", [fx.static_mig(0, "3g.40gb", 0), fx.static_mig(0, "3g.40gb", 4)])
    snap = dra_snapshot(settings, catalog, slices)
    snap.dra.put_claim(fx.claim("watch", fx.request("mig.nvidia.com", mode="All", admin=True), node="n",
                                results=[fx.result("n", fx.mig_name(0, "3g.40gb", s), admin=True)
                                         for s in (0, 4)]))
    refresh(snap, settings, catalog)
    assert [(p, free) for p, _, _, free in snap.nodes["n"].mig] == [("3g.40gb", 2)]


def test_claims_allocated_without_a_bound_pod_hold_their_gpus(settings: Settings, catalog: GpuCatalog) -> None:
    # kube-scheduler allocated these claims; no pod of ours is bound with them (reservedFor empty,
    # or naming a pod not bound yet or gone). Their devices are not free for anyone else.
    snap = dra_snapshot(settings, catalog, fx.slice_("n", [fx.gpu(i) for i in range(8)]))
    snap.dra.put_claim(fx.claim("orphan", fx.request(count=2), node="n",
                                results=[fx.result("n", "gpu-0"), fx.result("n", "gpu-1")]))
    snap.dra.put_claim(fx.claim("waiting", fx.request(count=1), node="n",
                                results=[fx.result("n", "gpu-2")], reserved=fx.reserved_for("gone")))
    refresh(snap, settings, catalog)
    assert snap.free_gpus("n") == 5
    # Given back (deallocated): free again.
    snap.dra.put_claim(fx.claim("orphan", fx.request(count=2)))
    refresh(snap, settings, catalog)
    assert snap.free_gpus("n") == 7


def test_pods_sharing_an_allocated_claim_are_not_charged_again(settings: Settings, catalog: GpuCatalog) -> None:
    from app.extender.wiring import build_core

    svc = build_core(Settings(cluster_source="none", metrics_port=0), GpuCatalog.load())
    snap = svc.snapshot
    for cls in (fx.GPU_CLASS, fx.MIG_CLASS):
        snap.dra.put_class(cls)
    snap.dra.put_slice(fx.slice_("n", [fx.gpu(i) for i in range(4)]))
    snap.dra.reads_claims = True
    apply_node(snap, svc.catalog, svc.settings, node_object("n", gpus=0))
    shared = fx.claim("shared", fx.request(count=2), node="n", results=[fx.result("n", "gpu-0"),
                      fx.result("n", "gpu-1")], reserved=fx.reserved_for("a", "b"))
    snap.dra.put_claim(shared)
    refresh(snap, svc.settings, svc.catalog)
    for p in ("a", "b"):
        apply_pod(snap, svc.settings, claim_pod(p, "shared", node="n"))
    assert snap.free_gpus("n") == 2
    # Two more pods take the other two GPUs through their own claim, one of them also sharing the
    # first: the node is full, yet a third pod of the shared claim needs no free GPU (its GPUs are
    # held), while a pod asking for a GPU of its own does.
    snap.dra.put_claim(fx.claim("own", fx.request(count=2), node="n",
                                results=[fx.result("n", "gpu-2"), fx.result("n", "gpu-3")]))
    refresh(snap, svc.settings, svc.catalog)
    apply_pod(snap, svc.settings, claim_pod("d", "shared", "own", node="n"))
    assert snap.free_gpus("n") == 0
    spec = workload.parse_workload(claim_pod("c", "shared"), claims=snap.claim_reader())
    assert spec.gpus == 2
    assert svc.placer.filter(claim_pod("c", "shared"), ["n"]).passed == ["n"]
    snap.dra.put_claim(fx.claim("mine", fx.request(count=1)))
    assert "not enough free GPUs" in svc.placer.filter(claim_pod("e", "mine"), ["n"]).failed["n"]


def test_extended_resource_claim_counts_once(settings: Settings, catalog: GpuCatalog) -> None:
    # nvidia.com/gpu on a DRA-only node: kube-scheduler backs it with a claim of the class that
    # names it (demo/specs/extended-resources/gpu-full.yaml in the driver's repository) and names
    # the claim in the pod's status. Its GPUs count once: on the node, as the claim's devices.
    snap = dra_snapshot(settings, catalog, fx.slice_("n", [fx.gpu(i) for i in range(4)]))
    snap.dra.put_claim(fx.claim(
        "ext-extended-resources-x7k9m", fx.request(count=2, name="container-0-request-0"), node="n",
        annotations={"resource.kubernetes.io/extended-resource-claim": "true"}, reserved=fx.reserved_for("ext"),
        results=[fx.result("n", f"gpu-{i}", req="container-0-request-0") for i in range(2)]))
    refresh(snap, settings, catalog)
    pod = pod_object("ext", gpus=2, stage="serving", uid="u-ext")
    pod["spec"]["nodeName"] = "n"
    container = pod["spec"]["containers"][0]["name"]
    pod["status"]["extendedResourceClaimStatus"] = {
        "resourceClaimName": "ext-extended-resources-x7k9m",
        "requestMappings": [{"containerName": container, "requestName": "container-0-request-0",
                             "resourceName": "nvidia.com/gpu"}]}
    apply_pod(snap, settings, pod)
    assert snap.free_gpus("n") == 2


def test_tainted_devices_are_not_free(settings: Settings, catalog: GpuCatalog) -> None:
    # The driver's health monitor taints a GPU after an XID error (NoSchedule) or when it is lost;
    # an informational taint (effect None: unmonitored) keeps nothing off.
    devices = [fx.gpu(i) for i in range(8)]
    devices[1]["taints"] = [fx.taint("NoSchedule")]
    devices[2]["taints"] = [fx.taint("NoExecute", key="gpu.nvidia.com/gpu-lost", value="")]
    devices[3]["taints"] = [fx.taint("None", key="gpu.nvidia.com/unmonitored", value="")]
    snap = dra_snapshot(settings, catalog, fx.slice_("n", devices))
    assert (snap.nodes["n"].gpu_count, snap.free_gpus("n")) == (8, 6)
    # A tainted GPU that a running pod's claim holds counts once.
    snap.dra.put_claim(fx.claim("running", node="n", results=[fx.result("n", "gpu-1")]))
    refresh(snap, settings, catalog)
    assert snap.free_gpus("n") == 6
    # DeviceTaintRules taint devices the same way; without a selector or with effect None, none.
    assert snap.dra.put_taint_rule(fx.taint_rule("maint", pool="n", device="gpu-4")) == {"n"}
    snap.dra.put_taint_rule(fx.taint_rule("whole-node", "NoSchedule", pool="n"))
    snap.dra.put_taint_rule(fx.taint_rule("note", "None"))
    snap.dra.put_taint_rule({"metadata": {"name": "empty"}, "spec": {"taint": fx.taint("NoExecute")}})
    refresh(snap, settings, catalog)
    assert snap.free_gpus("n") == 0
    snap.dra.drop_taint_rule("whole-node")
    refresh(snap, settings, catalog)
    assert snap.free_gpus("n") == 5


def test_tainted_mig_slices_are_not_free(settings: Settings, catalog: GpuCatalog) -> None:
    devices = [fx.static_mig(0, "3g.40gb", 0), fx.static_mig(0, "3g.40gb", 4)]
    devices[0]["taints"] = [fx.taint("NoSchedule")]
    snap = dra_snapshot(settings, catalog, fx.slice_("n", devices))
    assert [(p, n, free) for p, _, n, free in snap.nodes["n"].mig] == [("3g.40gb", 2, 1)]


def test_partitionable_gpus_count_once_and_a_mig_partition_takes_its_parent(
        settings: Settings, catalog: GpuCatalog) -> None:
    # DynamicMIG: each physical GPU is its full device plus every possible MIG placement, all
    # taking from the GPU's counter set (published in a slice of its own).
    snap = dra_snapshot(settings, catalog, *fx.dynamic_mig_slices("n", 2))
    facts = snap.nodes["n"]
    assert (facts.gpu_count, facts.mig_gpus, snap.free_gpus("n")) == (2, 0, 2)
    assert facts.gpu is not None and facts.hourly_cost == pytest.approx(2 * facts.gpu.hourly_cost_usd)

    def mig() -> dict[str, tuple[int, int]]:
        return {p: (n, free) for p, _, n, free in snap.nodes["n"].mig}

    assert mig() == {"1g.10gb": (14, 14), "3g.40gb": (4, 4), "7g.80gb": (2, 2)}
    # One 1g.10gb partition of gpu-0 allocated: gpu-0 is no longer whole-free, and the placements
    # overlapping it (3g.40gb at slice 0, 7g.80gb) are not free either.
    snap.dra.put_claim(fx.claim("small", fx.request("mig.nvidia.com"), node="n",
                                results=[fx.result("n", fx.mig_name(0, "1g.10gb", 0))]))
    refresh(snap, settings, catalog)
    assert snap.free_gpus("n") == 1
    assert mig() == {"1g.10gb": (14, 13), "3g.40gb": (4, 3), "7g.80gb": (2, 1)}
    # gpu-1 allocated whole: none of its partitions is free.
    snap.dra.put_claim(fx.claim("whole", node="n", results=[fx.result("n", "gpu-1")]))
    refresh(snap, settings, catalog)
    assert snap.free_gpus("n") == 0
    assert mig() == {"1g.10gb": (14, 6), "3g.40gb": (4, 1), "7g.80gb": (2, 0)}


def test_shares_of_a_device_count_it_once(settings: Settings, catalog: GpuCatalog) -> None:
    # Consumable capacity: gpu-0 allows several allocations; three claims each hold a share of it
    # (a shareID per result, the memory consumed), each used by one bound pod.
    from app.extender.wiring import build_core

    svc = build_core(Settings(cluster_source="none", metrics_port=0), GpuCatalog.load())
    snap = svc.snapshot
    snap.dra.put_class(fx.GPU_CLASS)
    snap.dra.put_slice(fx.slice_("n", [fx.shareable_gpu(0), fx.shareable_gpu(1)]))
    snap.dra.reads_claims = True
    apply_node(snap, svc.catalog, svc.settings, node_object("n", gpus=0))
    share = fx.request(capacity={"memory": "20Gi"})
    for i in range(3):
        snap.dra.put_claim(fx.claim(f"s{i}", share, node="n", reserved=fx.reserved_for(f"p{i}"), results=[
            fx.result("n", "gpu-0", share=f"a1b2c3d4-0000-0000-0000-00000000000{i}",
                      consumed={"memory": "20Gi"})]))
    refresh(snap, svc.settings, svc.catalog)
    for i in range(3):
        apply_pod(snap, svc.settings, claim_pod(f"p{i}", f"s{i}", node="n"))
    assert (snap.nodes["n"].gpu_count, snap.free_gpus("n")) == (2, 1)
    # A fourth share asks for room on a device (kube-scheduler checks it has), not a whole free
    # GPU; a whole GPU is asked for as before.
    snap.dra.put_claim(fx.claim("s3", share))
    spec = workload.parse_workload(claim_pod("p3", "s3"), claims=snap.claim_reader())
    assert (spec.gpus, spec.gpus_needed_free) == (1, 0)
    snap.dra.put_claim(fx.claim("whole", fx.request(count=2)))
    assert svc.placer.filter(claim_pod("p3", "s3"), ["n"]).passed == ["n"]
    assert "not enough free GPUs" in svc.placer.filter(claim_pod("w", "whole"), ["n"]).failed["n"]
    # Bound before its share is allocated, the pod is not charged a whole GPU either.
    apply_pod(snap, svc.settings, claim_pod("p3", "s3", node="n"))
    assert snap.free_gpus("n") == 1


def test_passthrough_devices_are_not_extra_gpus(settings: Settings, catalog: GpuCatalog) -> None:
    # With passthrough support the driver publishes each GPU twice: gpu-<i> for containers and
    # gpu-vfio-<i> (type vfio, same PCI bus id) for a VM. Four GPUs, not eight.
    snap = dra_snapshot(settings, catalog, fx.slice_("n", [fx.gpu(i) for i in range(4)]
                                                     + [fx.vfio(i) for i in range(4)]))
    assert (snap.nodes["n"].gpu_count, snap.free_gpus("n")) == (4, 4)
    # A VM's claim of the vfio class asks for no container GPU ...
    snap.dra.put_claim(fx.claim("vm", fx.request("vfio.gpu.nvidia.com")))
    assert workload.parse_workload(claim_pod("vm", "vm"), claims=snap.claim_reader()).gpus == 0
    # ... and, allocated, takes its twin away from containers.
    snap.dra.put_claim(fx.claim("vm", fx.request("vfio.gpu.nvidia.com"), node="n",
                                results=[fx.result("n", "gpu-vfio-2")], reserved=fx.reserved_for("vm")))
    refresh(snap, settings, catalog)
    assert snap.free_gpus("n") == 3
    pod = claim_pod("vm", "vm", node="n")
    assert workload.parse_workload(pod, claims=snap.claim_reader()).gpus == 0
    apply_pod(snap, settings, pod)
    assert snap.free_gpus("n") == 3


def ext_pod(name: str, resources: dict[str, str], node: str = "") -> dict[str, Any]:
    pod = pod_object(name, gpus=0, stage="serving", uid=f"u-{name}")
    c = pod["spec"]["containers"][0]["resources"]
    c["limits"] = {**c.get("limits", {}), **resources}
    if node:
        pod["spec"]["nodeName"] = node
    return pod


def test_extended_resources_backed_by_device_classes_are_gpus(settings: Settings, catalog: GpuCatalog) -> None:
    # DRAExtendedResource: the chart's gpu.nvidia.com class names nvidia.com/gpu; every class also
    # answers to deviceclass.resource.kubernetes.io/<class>; an admin's class may name its own
    # resource (demo/specs/extended-resources/mig-1g-12gb.yaml in the driver's repository).
    snap = dra_snapshot(settings, catalog, fx.slice_("n", [fx.gpu(i) for i in range(4)]
                                                     + [fx.static_mig(9, "1g.10gb", 0)]))
    expr = ("device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'mig' && "
            "device.attributes['gpu.nvidia.com'].profile == '1g.10gb'")
    snap.dra.put_class({"metadata": {"name": "mig-1g-10gb.gpu.nvidia.com"}, "spec": {
        "selectors": [{"cel": {"expression": expr}}], "extendedResourceName": "nvidia.com/mig-1g.10gb"}})
    h100 = ("device.driver == 'gpu.nvidia.com' && "
            "device.attributes['gpu.nvidia.com'].productName == 'NVIDIA H100 80GB HBM3'")
    snap.dra.put_class({"metadata": {"name": "h100"}, "spec": {
        "selectors": [{"cel": {"expression": h100}}], "extendedResourceName": "example.com/h100"}})
    gpu_res = tuple(settings.labels.gpu_resource)

    def parse(pod: dict[str, Any]) -> workload.WorkloadSpec:
        return workload.parse_workload(pod, gpu_res, claims=snap.claim_reader())

    assert parse(ext_pod("plain", {"nvidia.com/gpu": "2"})).gpus == 2  # counted once
    assert parse(ext_pod("implicit", {"deviceclass.resource.kubernetes.io/gpu.nvidia.com": "2"})).gpus == 2
    own = parse(ext_pod("own", {"example.com/h100": "1"}))
    assert (own.gpus, own.gpu_products) == (1, (("in", ("NVIDIA H100 80GB HBM3",)),))
    mig = parse(ext_pod("mig", {"nvidia.com/mig-1g.10gb": "1"}))
    assert (mig.gpus, mig.mig_slices, mig.mig_profiles) == (0, 1, ("1g.10gb",))
    # Bound on the DRA-only node: counted there until its claim's devices are.
    apply_pod(snap, settings, ext_pod("implicit", {"deviceclass.resource.kubernetes.io/gpu.nvidia.com": "2"},
                                      node="n"))
    assert snap.free_gpus("n") == 2


def test_compute_domain_cliques_name_the_nodes_nvlink_domain(settings: Settings, catalog: GpuCatalog) -> None:
    # GB200 NVL72: the driver's slices carry no clique id; its ComputeDomain daemons report each
    # node's (ComputeDomainClique objects, or the ComputeDomain's status without them).
    gb200 = [fx.gpu(i, "NVIDIA GB200", "189471Mi", architecture="Blackwell", cc="10.0.0") for i in range(4)]
    snap = dra_snapshot(settings, catalog, fx.slice_("g0", gb200), node="g0")
    assert snap.nodes["g0"].nvlink_domain == "node:g0"
    clique = "a1b2c3d4-0000-4000-8000-000000000001.1"
    assert snap.dra.put_domain("computedomaincliques", fx.compute_domain_clique("cd-uid", clique, "g0", "g1")) \
        == {"g0", "g1"}
    refresh(snap, settings, catalog, "g0")
    assert snap.nodes["g0"].nvlink_domain == clique
    # A node without DRA GPUs (device plugin) in a domain: the GFD label it carries wins anyway.
    apply_node(snap, catalog, settings, node_object("g1", gpus=4, labels={"nvidia.com/gpu.clique": "gfd.7"}))
    assert snap.nodes["g1"].nvlink_domain == "gfd.7"
    apply_node(snap, catalog, settings, node_object("g1", gpus=4))
    assert snap.nodes["g1"].nvlink_domain == clique
    snap.dra.drop_domain("computedomaincliques", fx.compute_domain_clique("cd-uid", clique, "g0", "g1"))
    snap.dra.put_domain("computedomains", fx.compute_domain("train", "other.2", "g0"))
    refresh(snap, settings, catalog, "g0")
    assert snap.nodes["g0"].nvlink_domain == "other.2"


def test_a_pool_being_republished_keeps_its_last_complete_generation(
        settings: Settings, catalog: GpuCatalog) -> None:
    # DynamicMIG on Kubernetes 1.35+: a counters slice and one slice per GPU, resourceSliceCount 3.
    # The driver republishes (new generation) slice by slice; until all three are in, the node must
    # not look as if it had lost its GPUs (the counters slice alone lists no device).
    first = fx.dynamic_mig_slices("n", 2)
    snap = dra_snapshot(settings, catalog, *first[:1])
    assert snap.nodes["n"].gpu_count == 0  # nothing complete yet: what has arrived is all there is
    for s in first[1:]:
        snap.dra.put_slice(s)
    refresh(snap, settings, catalog)
    assert (snap.nodes["n"].gpu_count, snap.free_gpus("n")) == (2, 2)
    second = fx.dynamic_mig_slices("n", 2)
    for s in second:
        s["spec"]["pool"]["generation"] = 2
    snap.dra.put_slice(second[0])
    refresh(snap, settings, catalog)
    assert snap.nodes["n"].gpu_count == 2
    snap.dra.put_slice(second[1])
    refresh(snap, settings, catalog)
    assert snap.nodes["n"].gpu_count == 2
    # All in, and the driver dropped gpu-1 this time (two slices for one GPU): the new generation.
    for s in second[:2]:
        s["spec"]["pool"]["resourceSliceCount"] = 2
        snap.dra.put_slice(s)
    snap.dra.drop_slice(second[2]["metadata"]["name"])
    snap.dra.drop_slice(first[2]["metadata"]["name"])
    refresh(snap, settings, catalog)
    assert snap.nodes["n"].gpu_count == 1
