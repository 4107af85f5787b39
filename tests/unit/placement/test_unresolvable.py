"""More GPUs than a node has at all is unresolvable: preemption there would evict pods for nothing.

kube-scheduler preempts only on nodes listed in ``FailedNodes``; a node in
``FailedAndUnresolvableNodes`` is skipped (docs/extender-protocol.md). A pod asking for 16 GPUs on
8-GPU nodes used to be told "not enough free GPUs (in use or reserved)", inviting futile evictions.
"""

from __future__ import annotations

import json
from typing import Any

from app.base.catalog import GpuCatalog
from app.base.objects import node_object, pod_object
from app.base.reasons import ReasonCode, Rejection
from app.base.workload import WorkloadSpec, parse_workload
from app.config.settings import Settings
from app.extender.service import ExtenderService
from app.extender.wiring import build_core
from app.placement.feasibility import MIG_BUSY, evaluate
from app.snapshot.nodes import NodeClass, NodeFacts
from app.snapshot.store import NodeUsage

H100 = "NVIDIA-H100-80GB-HBM3"


def service() -> ExtenderService:
    svc = build_core(Settings(cluster_source="none", metrics_port=0), GpuCatalog.load())
    for i in range(3):
        svc.absorb_node(node_object(f"h100-{i}", gpus=8, product=H100))
    svc.absorb_node(node_object("cpu-0", cpu="64"))
    return svc


def filter_answer(svc: ExtenderService, pod: dict[str, Any]) -> dict[str, Any]:
    names = sorted(svc.snapshot.nodes)
    return dict(json.loads(svc.filter(json.dumps({"Pod": pod, "NodeNames": names}).encode())))


def test_more_gpus_than_any_node_has_is_unresolvable_everywhere() -> None:
    svc = service()
    out = filter_answer(svc, pod_object("big", gpus=16, uid="u-big"))
    assert not out["FailedNodes"]
    unresolvable = out["FailedAndUnresolvableNodes"]
    assert set(unresolvable) == {"h100-0", "h100-1", "h100-2", "cpu-0"}
    assert unresolvable["h100-0"] == "llm-placement: pod needs 16 GPUs, more than the node has"


def test_gpus_in_use_stay_resolvable() -> None:
    svc = service()
    for i in range(3):
        svc.snapshot.assume(parse_workload(pod_object(f"busy-{i}", namespace="o", gpus=1)), f"h100-{i}")
    out = filter_answer(svc, pod_object("eight", gpus=8, uid="u-eight"))
    assert set(out["FailedNodes"]) == {"h100-0", "h100-1", "h100-2"}  # preempting busy-i frees room
    assert "not enough free GPUs" in out["FailedNodes"]["h100-0"]


def test_more_mig_slices_than_the_node_has_is_unresolvable() -> None:
    node = NodeFacts(name="mig-0", node_class=NodeClass.GPU, nvlink_domain="mig-0",
                     mig=(("1g.10gb", 10.0, 7, 0),), mig_gpus=1)
    policy = Settings(cluster_source="none", metrics_port=0).policies().placement.feasibility
    spec = WorkloadSpec(namespace="a", name="p", mig_slices=8, mig_profiles=("1g.10gb",))
    too_many = evaluate(spec, node, NodeUsage(), 0, policy)
    assert isinstance(too_many, Rejection) and too_many.unresolvable
    assert too_many.code is ReasonCode.GPU_CAPACITY and "8 MIG slices" in too_many.message
    taken = evaluate(spec.model_copy(update={"mig_slices": 2}), node, NodeUsage(), 0, policy)
    assert taken is MIG_BUSY and not taken.unresolvable
