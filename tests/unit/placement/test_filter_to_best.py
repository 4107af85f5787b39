"""filter_to_best (docs/scoring.md): filter answers only our best node(s), one when the pod has no soft
in-tree preference, so kube-scheduler skips scoring and our prioritize call."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from app.base.objects import node_object, pod_object
from app.config.settings import Settings
from app.extender.service import ExtenderService
from app.placement.narrowing import soft_preference
from app.placement.ranking import Agreement
from tests.conftest import mixed_nodes, mixed_service


def filter_call(svc: ExtenderService, pod: dict[str, Any], names: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = orjson.loads(svc.filter(orjson.dumps({"Pod": pod, "NodeNames": names})))
    return out


def prioritize_call(svc: ExtenderService, pod: dict[str, Any], names: list[str]) -> dict[str, int]:
    out = orjson.loads(svc.prioritize(orjson.dumps({"Pod": pod, "NodeNames": names})))
    return {p["Host"]: p["Score"] for p in out}


def alignment_pod(name: str = "sft", **extra: Any) -> dict[str, Any]:
    pod = pod_object(name, namespace="ml", stage="alignment", gpus=1, uid=f"uid-{name}",
                     annotations={"llm-placement.io/model-params": "1B"})
    pod["spec"].update(extra)
    return pod


def h100_service(mode: str) -> tuple[ExtenderService, list[str]]:
    svc = ExtenderService(Settings(cluster_source="none", metrics_port=0, feature_gates={"FilterToBest": mode == "auto"}),
                          mixed_service().catalog)
    names = [f"h100-{i}" for i in range(4)]
    for n in names:
        svc.absorb_node(node_object(n, gpus=8, product="NVIDIA-H100-80GB-HBM3"))
    return svc, names


def test_a_pod_without_soft_preferences_gets_exactly_our_best_node() -> None:
    svc = mixed_service()
    names = ["h200-0", "h100-0", "a100-0", "l40s-0", "l4-0", "t4-0", "cpu-0"]
    pod = alignment_pod()
    off = ExtenderService(Settings(cluster_source="none", metrics_port=0, feature_gates={"FilterToBest": False}), svc.catalog)
    for n in mixed_nodes():
        off.absorb_node(n)
    # The reference: every feasible node and prioritize's ranking of them.
    full = filter_call(off, pod, names)
    assert len(full["NodeNames"]) > 1
    ranks = prioritize_call(off, pod, full["NodeNames"])
    best = max(ranks.values())
    narrowed = filter_call(svc, pod, names)
    [chosen] = narrowed["NodeNames"]
    assert ranks[chosen] == best
    # The others are left out of the answer, not listed as failed: kube-scheduler reads per-node
    # reasons only when no node is feasible, and thousands of them made every answer huge.
    assert not set(full["NodeNames"]) & set(narrowed.get("FailedNodes") or {})
    # Bind's agreement reads the scores filter computed: kube-scheduler's node is our best.
    remembered = svc.remembered("uid-sft")
    assert remembered is not None and remembered.agreement_with(chosen) in (Agreement.TOP, Agreement.TIED_TOP)


def test_equal_best_nodes_narrow_to_one_unless_the_pod_has_a_soft_preference() -> None:
    svc, names = h100_service("auto")
    assert len(filter_call(svc, alignment_pod("plain"), names)["NodeNames"]) == 1
    spread = alignment_pod("spread", topologySpreadConstraints=[{
        "maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone", "whenUnsatisfiable": "ScheduleAnyway",
        "labelSelector": {"matchLabels": {"app": "x"}}}])
    # kube-scheduler's own spread scores must still choose among our equal-best nodes.
    assert sorted(filter_call(svc, spread, names)["NodeNames"]) == names
    # prioritize (now called: several nodes left) answers from the scores filter computed: all tied.
    assert prioritize_call(svc, spread, names) == dict.fromkeys(names, 10)


def test_a_prefer_no_schedule_taint_among_the_best_leaves_the_choice_to_kube_scheduler() -> None:
    svc, names = h100_service("auto")
    tainted = node_object("h100-1", gpus=8, product="NVIDIA-H100-80GB-HBM3")
    tainted["spec"]["taints"] = [{"key": "reserved", "value": "eval", "effect": "PreferNoSchedule"}]
    svc.absorb_node(tainted)
    assert sorted(filter_call(svc, alignment_pod(), names)["NodeNames"]) == names


def test_off_keeps_every_feasible_node() -> None:
    svc, names = h100_service("off")
    assert sorted(filter_call(svc, alignment_pod(), names)["NodeNames"]) == names


@pytest.mark.parametrize(("extra", "meta", "expected"), [
    ({}, {}, None),
    ({"affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 1, "preference": {"matchExpressions": []}}]}}}, {}, "preferred nodeAffinity"),
    ({"affinity": {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{}]}}}, {},
     "preferred podAntiAffinity"),
    ({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {}}}}, {}, None),
    ({"topologySpreadConstraints": [{"whenUnsatisfiable": "DoNotSchedule"}]}, {}, None),
    ({}, {"ownerReferences": [{"kind": "ReplicaSet", "name": "web-1"}]}, "default spreading of ReplicaSet pods"),
    ({}, {"ownerReferences": [{"kind": "Job", "name": "train"}]}, None),
    # Its own hard constraints replace the defaults, so a Deployment pod with them is not spread softly.
    ({"topologySpreadConstraints": [{"whenUnsatisfiable": "DoNotSchedule"}]},
     {"ownerReferences": [{"kind": "ReplicaSet"}]}, None),
    ({"affinity": "garbage", "topologySpreadConstraints": "x"}, {"ownerReferences": "y"}, None),
])
def test_soft_preference(extra: dict[str, Any], meta: dict[str, Any], expected: str | None) -> None:
    pod = alignment_pod(**extra)
    pod["metadata"].update(meta)
    assert soft_preference(pod) == expected
