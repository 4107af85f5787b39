"""Node and device capacities that are not real numbers are ignored with a reason, never believed.

A GPU memory label of 0, a MIG profile whose device reports a negative (or no) memory capacity, or a
node advertising 10^18 GPUs would otherwise turn every memory and capacity check around: a GPU of
0 or -80 GB fits nothing, one of 10^12 GB fits everything.
"""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from app.base.catalog import GpuCatalog
from app.base.objects import node_object
from app.cluster.cache import apply_node
from app.config.settings import Settings
from app.snapshot.nodes import NodeClass, NodeFacts, facts_for
from app.snapshot.store import ClusterSnapshot
from tests.unit.dra.test_dra import gpu_device, rslice

H100 = "NVIDIA-H100-80GB-HBM3"


def facts(labels: dict[str, str] | None = None, gpus: int = 8, **kw: Any) -> NodeFacts:
    node = node_object("n", gpus=gpus, product=H100, labels=labels or {})
    return facts_for(node, GpuCatalog.load(), Settings(cluster_source="none").policies().node_facts, **kw)


@pytest.mark.parametrize("mib", ["0", "0.001", "-81559", "1e30", "nan"])
def test_gpu_memory_label_that_is_no_gpu_keeps_the_catalog_figure(mib: str) -> None:
    got = facts({"nvidia.com/gpu.memory": mib})
    assert 85 < got.gpu_memory_gb < 86  # the H100's 81559 MiB from the catalog
    assert any("gpu memory label" in w for w in got.warnings), got.warnings


def test_mig_profiles_with_unreal_capacities_are_dropped_with_a_reason() -> None:
    got = facts(gpus=0, mig=(("1g.10gb", -10.0, 7, 7), ("2g.20gb", float("nan"), 3, 3),
                             ("3g.40gb", 0.0, 2, 2), ("4g.40gb", 40.0, -1, 0), ("7g.80gb", 80.0, 1, 5)),
                mig_gpus=1)
    assert got.mig == (("7g.80gb", 80.0, 1, 1),)  # free clipped to the slices there are
    assert sum("MIG profile" in w for w in got.warnings) == 4


def test_absurd_gpu_count_is_ignored() -> None:
    node = node_object("n", gpus=8, product=H100)
    node["status"]["allocatable"]["nvidia.com/gpu"] = "1000000000000000000"
    got = facts_for(node, GpuCatalog.load(), Settings(cluster_source="none").policies().node_facts)
    assert got.gpu_count == 0 and any("more than a node has" in w for w in got.warnings)


def test_one_device_with_a_negative_memory_capacity_through_dra() -> None:
    # ResourceSlices as a DRA driver (or someone with write access to them) publishes them.
    snap = ClusterSnapshot()
    devices = [gpu_device(i, "NVIDIA H100 80GB HBM3", "81559Mi") for i in range(7)]
    devices.append(gpu_device(7, "NVIDIA H100 80GB HBM3", "-80Gi"))
    mig = [gpu_device(10 + i, "NVIDIA A100-SXM4-80GB", "-10Gi", mig=True) for i in range(2)]
    snap.dra.put_slice(rslice("n", devices + mig))
    apply_node(snap, GpuCatalog.load(), Settings(cluster_source="none", metrics_port=0),
               node_object("n", gpus=0))
    got = snap.nodes["n"]
    assert got.gpu_count == 8 and 85 < got.gpu_memory_gb < 86
    assert got.mig == () and any("MIG profile" in w for w in got.warnings)


@pytest.mark.parametrize("field", ["gpu_memory_gb", "gpu_count", "cpu_millis", "memory_bytes", "hourly_cost",
                                   "gpu_bandwidth_tbs"])
@pytest.mark.parametrize("value", [-1, float("nan"), float("inf")])
def test_node_facts_never_hold_a_negative_or_non_finite_capacity(field: str, value: float) -> None:
    if field == "gpu_count" and value != -1:
        return  # an int field: NaN and inf are not ints at all
    with pytest.raises(ValidationError):
        NodeFacts(name="n", node_class=NodeClass.GPU, nvlink_domain="d", **{field: value})
