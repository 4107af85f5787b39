"""DRA objects shaped like NVIDIA's GPU DRA driver (``gpu.nvidia.com``) publishes them.

Field shapes follow the driver's source (github.com/NVIDIA/k8s-dra-driver-gpu) and the
resource.k8s.io/v1 types (github.com/kubernetes/api, resource/v1/types.go, v0.36); each builder
names the file it follows. Values (SM counts, memory sizes, UUIDs) are illustrative for an H100.
"""

from __future__ import annotations

from typing import Any

DRIVER = "gpu.nvidia.com"
H100 = "NVIDIA H100 80GB HBM3"
H100_MEMORY = "81559Mi"
PCI_BUS_ID = "resource.kubernetes.io/pciBusID"  # k8s.io/dynamic-resource-allocation/deviceattribute

# deployments/helm/dra-driver-nvidia-gpu/templates/deviceclass-{gpu,mig,vfio-gpu}.yaml
GPU_CLASS: dict[str, Any] = {
    "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": "gpu.nvidia.com"},
    "spec": {"selectors": [{"cel": {"expression": (
        "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'")}}],
        "extendedResourceName": "nvidia.com/gpu"}}
MIG_CLASS: dict[str, Any] = {
    "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": "mig.nvidia.com"},
    "spec": {"selectors": [{"cel": {"expression": (
        "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'mig'")}}]}}
VFIO_CLASS: dict[str, Any] = {
    "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": "vfio.gpu.nvidia.com"},
    "spec": {"selectors": [{"cel": {"expression": (
        "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'vfio'")}}]}}


def pci(minor: int) -> str:
    return f"0000:{0x18 + minor:02x}:00.0"


def _gpu_attributes(minor: int, product: str, architecture: str = "Hopper", cc: str = "9.0.0",
                    driver: str = "580.95.5") -> dict[str, Any]:
    # cmd/gpu-kubelet-plugin/deviceinfo.go, GpuInfo.Attributes
    return {
        "type": {"string": "gpu"},
        "uuid": {"string": f"GPU-{minor:08d}-aaaa-bbbb-cccc-000000000000"},
        "productName": {"string": product},
        "brand": {"string": "Nvidia"},
        "architecture": {"string": architecture},
        "cudaComputeCapability": {"version": cc},
        "driverVersion": {"version": driver},
        "cudaDriverVersion": {"version": "13.0.0"},
        PCI_BUS_ID: {"string": pci(minor)},
        "resource.kubernetes.io/pcieRoot": {"string": f"pci0000:{minor // 4:02x}"},
    }


def gpu(minor: int, product: str = H100, memory: str = H100_MEMORY, **attrs: str) -> dict[str, Any]:
    """A full GPU: cmd/gpu-kubelet-plugin/deviceinfo.go, GpuInfo.GetDevice (name gpu-<minor>,
    capacity ``memory`` from partitions.go fullGpuCapacity). ``attrs``: architecture, cc, driver."""
    return {"name": f"gpu-{minor}", "attributes": _gpu_attributes(minor, product, **attrs),
            "capacity": {"memory": {"value": memory}}}


def vfio(index: int, product: str = H100) -> dict[str, Any]:
    """A GPU offered for passthrough: cmd/gpu-kubelet-plugin/deviceinfo.go, VfioDeviceInfo.GetDevice
    (name gpu-vfio-<index>, type vfio, the same PCI bus id as its sibling full GPU; its uuid is a
    name-based UUID of the PCI address, nvlib.go getVfioDeviceInfo, not the GPU's)."""
    return {"name": f"gpu-vfio-{index}", "attributes": {
        "type": {"string": "vfio"},
        "uuid": {"string": f"{index:08x}-5a1e-5b2c-8d3e-0000{0x18 + index:08x}"},
        "deviceID": {"string": "0x2330"},
        "vendorID": {"string": "0x10de"},
        "numa": {"int": 0},
        "productName": {"string": product},
        "iommuFDEnabled": {"bool": False},
        PCI_BUS_ID: {"string": pci(index)},
    }, "capacity": {"addressableMemory": {"value": "128Gi"}}}


# (profile, GI profile id, memory, multiprocessors, copy engines, decoders, encoders, jpeg, ofa,
# placements (start, size)). H100 80GB; cmd/gpu-kubelet-plugin/mig.go CommonCapacitiesMig.
MIG_PROFILES = {
    "1g.10gb": (19, "9856Mi", 16, 1, 1, 0, 1, 0, [(i, 1) for i in range(7)]),
    "3g.40gb": (9, "40192Mi", 60, 3, 3, 0, 3, 0, [(0, 4), (4, 4)]),
    "7g.80gb": (0, "80896Mi", 132, 7, 7, 0, 7, 1, [(0, 8)]),
}
MEMORY_SLICES = 8


def mig_name(minor: int, profile: str, start: int) -> str:
    # cmd/gpu-kubelet-plugin/mig.go, MigSpecTuple.ToCanonicalName: gpu-<minor>-mig-<profile
    # without dots>-<GI profile id>-<placement start>
    return f"gpu-{minor}-mig-{profile.replace('.', '')}-{MIG_PROFILES[profile][0]}-{start}"


def _mig_capacity(profile: str) -> dict[str, Any]:
    _, mem, sm, ce, dec, enc, jpg, ofa, _ = MIG_PROFILES[profile]
    return {"multiprocessors": {"value": str(sm)}, "copyEngines": {"value": str(ce)},
            "decoders": {"value": str(dec)}, "encoders": {"value": str(enc)},
            "jpegEngines": {"value": str(jpg)}, "ofaEngines": {"value": str(ofa)},
            "memory": {"value": mem}}


def _mig_attributes(minor: int, profile: str, product: str) -> dict[str, Any]:
    # cmd/gpu-kubelet-plugin/mig.go, CommonAttributesMig (the parent's PCI bus id included)
    attrs = _gpu_attributes(minor, product)
    attrs.pop("uuid")
    return {**attrs, "type": {"string": "mig"}, "profile": {"string": profile},
            "parentUUID": {"string": f"GPU-{minor:08d}-aaaa-bbbb-cccc-000000000000"}}


def static_mig(minor: int, profile: str, start: int, product: str = H100) -> dict[str, Any]:
    """A MIG device that exists (static MIG): cmd/gpu-kubelet-plugin/deviceinfo.go,
    MigDeviceInfo.GetDevice (its uuid, and one ``memorySlice<i>`` capacity per slice it spans)."""
    size = dict(MIG_PROFILES[profile][8])[start]
    cap = _mig_capacity(profile)
    for i in range(start, start + size):
        cap[f"memorySlice{i}"] = {"value": "1"}
    attrs = _mig_attributes(minor, profile, product)
    attrs["uuid"] = {"string": f"MIG-{minor:04d}{start:04d}-aaaa-bbbb-cccc-000000000000"}
    return {"name": mig_name(minor, profile, start), "attributes": attrs, "capacity": cap}


def _counters(capacity: dict[str, Any], start: int, size: int) -> dict[str, Any]:
    # cmd/gpu-kubelet-plugin/partitions.go: capacitiesToCounters (names camelCase -> dns-style)
    # plus addCountersForMemSlices (memory-slice-<i>: 1 for each slice consumed)
    dns = {"multiprocessors": "multiprocessors", "copyEngines": "copy-engines", "decoders": "decoders",
           "encoders": "encoders", "jpegEngines": "jpeg-engines", "ofaEngines": "ofa-engines",
           "memory": "memory"}
    out = {dns[k]: {"value": v["value"]} for k, v in capacity.items() if k in dns}
    for i in range(start, start + size):
        out[f"memory-slice-{i}"] = {"value": "1"}
    return out


def counter_set(minor: int) -> str:
    return f"gpu-{minor}-counter-set"  # partitions.go GetSharedCounterSetName


def dynamic_gpu(minor: int, product: str = H100) -> list[dict[str, Any]]:
    """One physical GPU under DynamicMIG (KEP 4815): cmd/gpu-kubelet-plugin/partitions.go
    GpuInfo.PartGetDevice (the full device consumes every counter of its set) and
    MigSpec.PartGetDevice (every possible placement, consuming its own counters and memory slices)."""
    full_cap = _mig_capacity("7g.80gb")  # maxCapacities: the largest profile's, per dimension
    full = {"name": f"gpu-{minor}", "attributes": _gpu_attributes(minor, product), "capacity": full_cap,
            "consumesCounters": [{"counterSet": counter_set(minor),
                                  "counters": _counters(full_cap, 0, MEMORY_SLICES)}]}
    parts = []
    for profile, (_, _, _, _, _, _, _, _, placements) in MIG_PROFILES.items():
        for start, size in placements:
            cap = _mig_capacity(profile)
            parts.append({"name": mig_name(minor, profile, start),
                          "attributes": _mig_attributes(minor, profile, product), "capacity": cap,
                          "consumesCounters": [{"counterSet": counter_set(minor),
                                                "counters": _counters(cap, start, size)}]})
    return [full, *parts]


def dynamic_counters(minor: int) -> dict[str, Any]:
    """partitions.go GpuInfo.PartSharedCounterSets: one counter set per physical GPU."""
    return {"name": counter_set(minor), "counters": _counters(_mig_capacity("7g.80gb"), 0, MEMORY_SLICES)}


def slice_(node: str, devices: list[dict[str, Any]], *, name: str | None = None, generation: int = 1,
           count: int = 1, counters: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """A ResourceSlice of the node's pool (pool name = node name; cmd/gpu-kubelet-plugin/driver.go
    publishResources). Only one of devices and sharedCounters is set (resource/v1 types.go)."""
    spec: dict[str, Any] = {"driver": DRIVER, "nodeName": node,
                            "pool": {"name": node, "generation": generation, "resourceSliceCount": count}}
    if counters is not None:
        spec["sharedCounters"] = counters
    else:
        spec["devices"] = devices
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": name or f"{node}-{DRIVER}-x1"}, "spec": spec}


def dynamic_mig_slices(node: str, gpus: int) -> list[dict[str, Any]]:
    """driver.go generateSplitResourceSlices (Kubernetes 1.35+): one slice with every counter set,
    then one slice of devices per physical GPU, all in one pool."""
    n = gpus + 1
    out = [slice_(node, [], name=f"{node}-counters", count=n,
                  counters=[dynamic_counters(m) for m in range(gpus)])]
    out += [slice_(node, dynamic_gpu(m), name=f"{node}-gpu-{m}", count=n) for m in range(gpus)]
    return out


def taint(effect: str, key: str = "gpu.nvidia.com/xid", value: str = "48") -> dict[str, Any]:
    """cmd/gpu-kubelet-plugin/device_health.go healthEventToTaint; resource/v1 DeviceTaint."""
    return {"key": key, "value": value, "effect": effect, "timeAdded": "2026-01-01T00:00:00Z"}


def request(cls: str = "gpu.nvidia.com", count: int = 1, *, mode: str = "ExactCount",
            admin: bool = False, name: str = "gpu", capacity: dict[str, str] | None = None) -> dict[str, Any]:
    """resource/v1 DeviceRequest with ``exactly`` (ExactDeviceRequest)."""
    exactly: dict[str, Any] = {"deviceClassName": cls, "allocationMode": mode}
    if mode == "ExactCount":
        exactly["count"] = count
    if admin:
        exactly["adminAccess"] = True
    if capacity:
        exactly["capacity"] = {"requests": capacity}
    return {"name": name, "exactly": exactly}


def result(node: str, device: str, *, req: str = "gpu", admin: bool = False, share: str | None = None,
           consumed: dict[str, str] | None = None) -> dict[str, Any]:
    """resource/v1 DeviceRequestAllocationResult."""
    out: dict[str, Any] = {"request": req, "driver": DRIVER, "pool": node, "device": device}
    if admin:
        out["adminAccess"] = True
    if share:
        out["shareID"] = share
    if consumed:
        out["consumedCapacity"] = consumed
    return out


def claim(name: str, *requests: dict[str, Any], results: list[dict[str, Any]] | None = None,
          node: str = "", reserved: list[dict[str, Any]] | None = None, namespace: str = "default",
          annotations: dict[str, str] | None = None) -> dict[str, Any]:
    """A ResourceClaim; allocated when ``results`` is given (status.allocation, with the
    nodeSelector kube-scheduler writes for node-local devices)."""
    obj: dict[str, Any] = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                           "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{name}"},
                           "spec": {"devices": {"requests": list(requests or [request()])}}}
    if annotations:
        obj["metadata"]["annotations"] = annotations
    status: dict[str, Any] = {}
    if results is not None:
        status["allocation"] = {"devices": {"results": results}, "nodeSelector": {"nodeSelectorTerms": [
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}]}}
    if reserved:
        status["reservedFor"] = reserved
    if status:
        obj["status"] = status
    return obj


def reserved_for(*pods: str) -> list[dict[str, Any]]:
    """resource/v1 ResourceClaimConsumerReference entries for pods."""
    return [{"resource": "pods", "name": p, "uid": f"u-{p}"} for p in pods]


def taint_rule(name: str, effect: str = "NoExecute", *, pool: str | None = None,
               device: str | None = None) -> dict[str, Any]:
    """resource.k8s.io DeviceTaintRule (v1beta2 in Kubernetes 1.36; resource/v1beta2/types.go)."""
    selector: dict[str, Any] = {"driver": DRIVER}
    if pool:
        selector["pool"] = pool
    if device:
        selector["device"] = device
    return {"apiVersion": "resource.k8s.io/v1beta2", "kind": "DeviceTaintRule", "metadata": {"name": name},
            "spec": {"deviceSelector": selector,
                     "taint": {"key": "example.com/maintenance", "value": "planned", "effect": effect}}}


def shareable_gpu(minor: int, product: str = H100, memory: str = H100_MEMORY) -> dict[str, Any]:
    """A GPU several claims may share (consumable capacity, KEP 5075): the driver's GPU attributes
    (deviceinfo.go) with ``allowMultipleAllocations`` and a ``requestPolicy`` on its memory capacity
    (resource/v1 types.go Device, DeviceCapacity, CapacityRequestPolicy). NVIDIA's driver does not
    publish this today; the shape is the API's."""
    dev = gpu(minor, product, memory)
    dev["allowMultipleAllocations"] = True
    dev["capacity"]["memory"]["requestPolicy"] = {
        "default": "10Gi", "validRange": {"min": "1Gi", "max": memory, "step": "1Gi"}}
    return dev


def compute_domain_clique(cd_uid: str, clique: str, *nodes: str) -> dict[str, Any]:
    """api/nvidia.com/resource/v1beta1/computedomainclique.go: named "<ComputeDomain UID>.<clique
    id>" in the driver's namespace, one daemon per node; the clique id is "<fabric cluster
    UUID>.<clique id>" (cmd/compute-domain-kubelet-plugin/nvlib.go getCliqueID)."""
    return {"apiVersion": "resource.nvidia.com/v1beta1", "kind": "ComputeDomainClique",
            "metadata": {"name": f"{cd_uid}.{clique}", "namespace": "nvidia-dra-driver-gpu"},
            "daemons": [{"nodeName": n, "ipAddress": f"10.0.0.{i}", "cliqueID": clique, "index": i,
                         "status": "Ready"} for i, n in enumerate(nodes)]}


def compute_domain(name: str, clique: str, *nodes: str) -> dict[str, Any]:
    """api/nvidia.com/resource/v1beta1/computedomain.go: status.nodes (filled when the driver runs
    without ComputeDomainClique objects)."""
    return {"apiVersion": "resource.nvidia.com/v1beta1", "kind": "ComputeDomain",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"numNodes": len(nodes), "channel": {"resourceClaimTemplate": {"name": f"{name}-channel"}}},
            "status": {"status": "Ready", "nodes": [
                {"name": n, "ipAddress": f"10.0.1.{i}", "cliqueID": clique, "index": i, "status": "Ready"}
                for i, n in enumerate(nodes)]}}
