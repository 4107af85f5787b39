"""Selector predicates on the attributes and capacities NVIDIA's driver publishes besides
productName and memory (docs/dra.md, "What is read from selectors")."""

from __future__ import annotations

from typing import Any

import pytest

from app.base import workload
from app.base.catalog import GpuCatalog
from app.base.objects import node_object, pod_object
from app.cluster.cache import apply_node
from app.config.settings import Settings
from app.extender.wiring import build_core
from tests.unit.dra import dra_fixtures as fx

L4 = "NVIDIA L4"
A = "device.attributes['gpu.nvidia.com']"



def two_nodes() -> Any:
    svc = build_core(Settings(cluster_source="none", metrics_port=0), GpuCatalog.load())
    dra = svc.snapshot.dra
    for cls in (fx.GPU_CLASS, fx.MIG_CLASS):
        dra.put_class(cls)
    dra.put_slice(fx.slice_("h", [fx.gpu(i) for i in range(4)]))
    dra.put_slice(fx.slice_("l", [fx.gpu(i, L4, "23034Mi", architecture="Ada Lovelace", cc="8.9.0",
                                         driver="570.86.10") for i in range(4)]))
    dra.put_slice(fx.slice_("m", [fx.static_mig(0, "1g.10gb", s) for s in range(4)]
                            + [fx.static_mig(1, "3g.40gb", 0)]))
    for n in ("h", "l", "m"):
        apply_node(svc.snapshot, svc.catalog, svc.settings, node_object(n, gpus=0))
    dra.reads_claims = True
    return svc


def claim_pod(svc: Any, name: str, expr: str, cls: str = "gpu.nvidia.com") -> dict[str, Any]:
    req = fx.request(cls)
    req["exactly"]["selectors"] = [{"cel": {"expression": expr}}]
    svc.snapshot.dra.put_claim(fx.claim(name, req))
    pod = pod_object(name, gpus=0, stage="serving", uid=f"u-{name}",
                     annotations={"llm-placement.io/latency-class": "batch"})
    pod["spec"]["resourceClaims"] = [{"name": "g", "resourceClaimName": name}]
    return pod


@pytest.mark.parametrize(("expr", "passed"), [
    (f"{A}.architecture == 'Hopper'", ["h"]),
    (f"{A}.cudaComputeCapability.compareTo(semver('9.0.0')) >= 0", ["h"]),
    (f"{A}.driverVersion.compareTo(semver('575.0.0')) < 0", ["l"]),
    (f"{A}.brand == 'Nvidia' && {A}.cudaDriverVersion.compareTo(semver('12.8.0')) > 0", ["h", "l"]),
    (f"device.attributes['resource.kubernetes.io'].pciBusID == '{fx.pci(2)}' && {A}.architecture != 'x'",
     ["h", "l"]),
    (f"device.attributes['resource.kubernetes.io'].pcieRoot.startsWith('pci0000:') && "
     f"{A}.architecture in ['Ada Lovelace']", ["l"]),
    ("device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('30Gi')) < 0", ["l"]),
    (f"{A}.architecture == 'Blackwell'", []),
])
def test_predicates_on_driver_attributes_restrict_the_nodes(expr: str, passed: list[str]) -> None:
    svc = two_nodes()
    got = svc.placer.filter(claim_pod(svc, "c", expr), ["h", "l"])
    assert got.passed == passed, (expr, got.unresolvable)


def test_mig_capacity_predicates_restrict_the_profiles() -> None:
    svc = two_nodes()
    pod = claim_pod(svc, "c", "device.capacity['gpu.nvidia.com'].multiprocessors.compareTo(quantity('60')) >= 0",
                    "mig.nvidia.com")
    spec = workload.parse_workload(pod, claims=svc.snapshot.claim_reader())
    assert (spec.mig_slices, spec.mig_profiles) == (1, ("3g.40gb",))
