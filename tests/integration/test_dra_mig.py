"""MIG slices through DRA on the real control plane (docs/dra.md, "MIG").

ResourceSlices list MIG devices the way NVIDIA's DRA driver publishes a MIG-enabled GPU: the parent
GPU is not a device, each MIG device is (name ``gpu-<minor>-mig-<profile id>-<start>-<size>``,
attributes ``type: mig``, ``profile``, ``parentUUID``, the parent's ``productName``; capacities
``memory``, ``multiprocessors``, one ``memorySlice<i>`` per memory slice it spans). Each node also has
one GPU without MIG. Pods ask for "a MIG slice" through the driver's ``mig.nvidia.com`` DeviceClass;
kube-scheduler's DynamicResources plugin allocates, the extender filters, prioritizes and binds.

What only the extender decides is what is asserted: a claim for *any* MIG slice is satisfiable on
both nodes as far as kube-scheduler is concerned, but a 7B model fits only the 40 GB slices, so it
must land on the node that has them, and once they are taken it must wait rather than go to the
10 GB slices kube-scheduler would hand out.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kubernetes.client import CustomObjectsApi
from kubernetes.client.rest import ApiException

from kubeharness import (
    assert_stays_unbound,
    create_pod,
    delete_all_pods,
    llm_pod,
    scheduling_messages,
    wait_for_node_name,
    wait_until,
)
from kubeharness.claims import admission_problems
from kubeharness.objects import bare_node

from .conftest import ClusterScope

pytestmark = pytest.mark.integration

GROUP, VERSION = "resource.k8s.io", "v1"
DRIVER = "gpu.nvidia.com"
MIG_CLASS = "mig.nvidia.com"  # the driver chart's DeviceClass for MIG devices
SET = "llm-placement.io/it-group"
H100 = "NVIDIA H100 80GB HBM3"
# profile -> (GPU instance profile id, memory slices, multiprocessors, memory as the driver reports it)
PROFILES = {"1g.10gb": (19, 1, 16, "9856Mi"), "3g.40gb": (9, 4, 60, "40192Mi")}


def _common(node: str, minor: int) -> dict[str, Any]:
    return {
        "productName": {"string": H100}, "brand": {"string": "Nvidia"},
        "architecture": {"string": "Hopper"}, "cudaComputeCapability": {"version": "9.0.0"},
        "driverVersion": {"version": "570.124.6"}, "cudaDriverVersion": {"version": "12.8.0"},
        "pcieBusID": {"string": f"0000:{0x18 + minor:02x}:00.0"}, "addressingMode": {"string": ""},
    }


def mig_device(node: str, minor: int, profile: str, start: int) -> dict[str, Any]:
    pid, size, sms, memory = PROFILES[profile]
    capacity: dict[str, Any] = {
        "multiprocessors": {"value": str(sms)}, "copyEngines": {"value": str(size)},
        "decoders": {"value": "1"}, "encoders": {"value": "0"}, "jpegEngines": {"value": "1"},
        "ofaEngines": {"value": "0"}, "memory": {"value": memory},
    }
    for i in range(start, start + size):
        capacity[f"memorySlice{i}"] = {"value": "1"}
    return {
        "name": f"gpu-{minor}-mig-{pid}-{start}-{size}",
        "attributes": {
            "type": {"string": "mig"}, "uuid": {"string": f"MIG-{node}-{minor}-{start}"},
            "parentUUID": {"string": f"GPU-{node}-{minor}"}, "profile": {"string": profile},
            **_common(node, minor),
        },
        "capacity": capacity,
    }


def full_gpu(node: str, minor: int) -> dict[str, Any]:
    return {"name": f"gpu-{minor}", "attributes": {
        "type": {"string": "gpu"}, "uuid": {"string": f"GPU-{node}-{minor}"}, **_common(node, minor)},
        "capacity": {"memory": {"value": "81559Mi"}}}


def resource_slice(node: str, devices: list[dict[str, Any]]) -> dict[str, Any]:
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "ResourceSlice",
            "metadata": {"name": f"{node}-mig-{DRIVER}"},
            "spec": {"driver": DRIVER, "nodeName": node, "devices": devices,
                     "pool": {"name": node, "generation": 1, "resourceSliceCount": 1}}}


class Mig:
    def __init__(self, cluster: ClusterScope) -> None:
        self.cluster = cluster
        self.api = CustomObjectsApi(cluster.cp.api)
        self.ns = cluster.namespace
        self.slices: list[str] = []

    def claim(self, name: str) -> None:
        """One MIG slice, any profile (the class's selector only says ``type == "mig"``)."""
        self.api.create_namespaced_custom_object(GROUP, VERSION, self.ns, "resourceclaims", {
            "apiVersion": f"{GROUP}/{VERSION}", "kind": "ResourceClaim", "metadata": {"name": name},
            "spec": {"devices": {"requests": [{"name": "mig", "exactly": {
                "deviceClassName": MIG_CLASS, "allocationMode": "ExactCount", "count": 1}}]}}})

    def held(self) -> list[tuple[str, str]]:
        out = []
        for c in self.api.list_namespaced_custom_object(GROUP, VERSION, self.ns, "resourceclaims")["items"]:
            alloc = (c.get("status") or {}).get("allocation") or {}
            out += [(r["pool"], r["device"]) for r in (alloc.get("devices") or {}).get("results") or []]
        return out

    def clean(self) -> None:
        refused = admission_problems(self.cluster.core, self.api, self.ns)  # harness/claims.py
        delete_all_pods(self.cluster.core, self.ns)
        for c in self.api.list_namespaced_custom_object(GROUP, VERSION, self.ns, "resourceclaims")["items"]:
            name = c["metadata"]["name"]
            if c["metadata"].get("finalizers"):
                self.api.patch_namespaced_custom_object(GROUP, VERSION, self.ns, "resourceclaims", name,
                                                        {"metadata": {"finalizers": None}})
            self.api.delete_namespaced_custom_object(GROUP, VERSION, self.ns, "resourceclaims", name)
        for name in self.slices:
            self._delete("resourceslices", name)
        self._delete("deviceclasses", MIG_CLASS)
        assert not refused, f"a kubelet would refuse these pods: {refused}"

    def _delete(self, plural: str, name: str) -> None:
        try:
            self.api.delete_cluster_custom_object(GROUP, VERSION, plural, name)
        except ApiException as exc:
            if exc.status != 404:
                raise


def _free_gpus(cluster: ClusterScope, node: str) -> float | None:
    # A node without an NVLink clique label is its own domain (docs/node-facts.md).
    return cluster.cp.metric_value("llm_placement_free_gpus", {"domain": f"node:{node}"})


@pytest.fixture(scope="module")
def mig(cluster: ClusterScope) -> Iterator[Mig]:
    """``small``: GPU 0 as seven 1g.10gb; ``big``: GPU 0 as two 3g.40gb. Each also has GPU 1 whole."""
    n = cluster.node_name
    m = Mig(cluster)
    try:
        m.api.create_cluster_custom_object(GROUP, VERSION, "deviceclasses", {
            "apiVersion": f"{GROUP}/{VERSION}", "kind": "DeviceClass", "metadata": {"name": MIG_CLASS},
            "spec": {"selectors": [{"cel": {"expression": (
                f"device.driver == '{DRIVER}' && device.attributes['{DRIVER}'].type == 'mig'")}}]}})
        layout = {
            n("small"): [mig_device(n("small"), 0, "1g.10gb", s) for s in range(7)],
            n("big"): [mig_device(n("big"), 0, "3g.40gb", s) for s in (0, 4)],
        }
        for node, devices in layout.items():
            body = resource_slice(node, [*devices, full_gpu(node, 1)])
            m.api.create_cluster_custom_object(GROUP, VERSION, "resourceslices", body)
            m.slices.append(body["metadata"]["name"])
        cluster.add_nodes([bare_node(node, cpu="48", memory="192Gi", labels={SET: "mig"}, index=40 + i)
                           for i, node in enumerate(layout)])
        # The whole GPU of each node is in the same slice as its MIG devices: once the extender
        # counts it free, it has read the MIG devices too (the gauge is refreshed every 10 s).
        wait_until(lambda: all(_free_gpus(cluster, x) == 1 for x in layout), 45,
                   "the extender to read the MIG slices")
        yield m
    finally:
        m.clean()


def mig_pod(name: str, claim: str, **kw: Any) -> dict[str, Any]:
    pod = llm_pod(name, stage="serving", **kw)
    spec = pod["spec"]
    spec["nodeSelector"] = {SET: "mig"}
    spec["resourceClaims"] = [{"name": "mig", "resourceClaimName": claim}]
    spec["containers"][0]["resources"]["claims"] = [{"name": "mig"}]
    return pod


def test_mig_slices_placed_by_slice_memory_and_never_over_committed(
        mig: Mig, unique: Callable[[str], str]) -> None:
    cluster = mig.cluster
    n = cluster.node_name
    seven_b = {"model_params": "7B", "precision": "bf16", "annotations": {"llm-placement.io/latency-class": "batch"}}
    # Two 7B pods: only the 40 GB slices hold weights + KV cache (~31 GB); kube-scheduler alone
    # could as well have given them 10 GB slices of the other node.
    placed = []
    for i in range(2):
        mig.claim(f"seven-{i}")
        name = unique("serve-7b-mig")
        create_pod(cluster.core, mig.ns, mig_pod(name, f"seven-{i}", **seven_b))
        placed.append(wait_for_node_name(cluster.core, mig.ns, name))
    assert placed == [n("big"), n("big")]
    # Both 40 GB slices are taken. A third 7B pod must wait: kube-scheduler cannot allocate on
    # "big" any more, and the extender refuses the 10 GB slices of "small".
    mig.claim("seven-2")
    waiting = unique("serve-7b-mig")
    create_pod(cluster.core, mig.ns, mig_pod(waiting, "seven-2", **seven_b))
    assert_stays_unbound(cluster.core, mig.ns, waiting, 8)
    msgs = scheduling_messages(cluster.core, mig.ns, waiting)
    assert msgs and "MIG slice memory too small" in msgs[-1], msgs
    # A 1B pod fits a 10 GB slice: it gets one on "small".
    mig.claim("one")
    small = unique("serve-1b-mig")
    create_pod(cluster.core, mig.ns, mig_pod(small, "one", model_params="1B", precision="int8"))
    assert wait_for_node_name(cluster.core, mig.ns, small) == n("small")
    held = mig.held()
    assert len(held) == len(set(held)) == 3, held  # no slice handed out twice
    big = sorted(d for p, d in held if p == n("big"))
    assert big == ["gpu-0-mig-9-0-4", "gpu-0-mig-9-4-4"], held
    assert next(d for p, d in held if p == n("small")).startswith("gpu-0-mig-19-"), held
