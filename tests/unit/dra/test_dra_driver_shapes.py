"""DRA as NVIDIA's driver (gpu.nvidia.com) publishes and allocates GPUs: admin access and VFIO
passthrough devices (docs/dra.md; shared claims: tests/unit/dra/test_dra_accounting.py).

Shapes follow the resource.k8s.io/v1 types (DeviceRequestAllocationResult.adminAccess,
ResourceClaimStatus.reservedFor) and the driver's device attributes (``type``: gpu, mig or vfio).
"""

from __future__ import annotations

from typing import Any

from app.dra.index import DRIVER, DraIndex
from tests.unit.dra.test_dra import GPU_CLASS, claim_spec, gpu_device, rslice


def result(device: str, admin: bool = False) -> dict[str, Any]:
    r: dict[str, Any] = {"request": "gpu", "driver": DRIVER, "pool": "n", "device": device}
    if admin:
        r["adminAccess"] = True
    return r


def index_with_gpus(n: int = 2) -> DraIndex:
    dra = DraIndex()
    dra.put_class(GPU_CLASS)
    dra.put_slice(rslice("n", [gpu_device(i, "NVIDIA H100 80GB HBM3", "81559Mi") for i in range(n)]))
    return dra


def test_admin_access_allocations_take_no_gpu() -> None:
    dra = index_with_gpus()
    # A monitoring claim with admin access to both GPUs, and a workload claim holding one.
    admin = {"allocation": {"devices": {"results": [result("gpu-0", admin=True), result("gpu-1", admin=True)]}}}
    work = {"allocation": {"devices": {"results": [result("gpu-0")]}}}
    assert dra.demand(claim_spec(2), admin).gpus == 0
    assert dra.demand(claim_spec(1), work).gpus == 1


def test_vfio_passthrough_devices_are_not_gpus_for_containers() -> None:
    dra = DraIndex()
    vfio = gpu_device(9, "NVIDIA H100 80GB HBM3", "81559Mi")
    vfio["name"] = "gpu-9-vfio"
    vfio["attributes"]["type"] = {"string": "vfio"}
    dra.put_slice(rslice("n", [gpu_device(0, "NVIDIA H100 80GB HBM3", "81559Mi"), vfio]))
    got = dra.gpus_of("n")
    assert got is not None and got.count == 1
