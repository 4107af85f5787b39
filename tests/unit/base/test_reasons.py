"""Typed rejection reasons: every rule is reachable, and the metric, explain and the filter answer
read the same verdict. Bounded answers: a huge annotation value is never multiplied by the node count."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from app.base.catalog import GpuCatalog
from app.base.objects import node_object, pod_object
from app.base.reasons import (
    MESSAGE_CHARS,
    MESSAGE_PREFIX,
    AnnotationProblem,
    ReasonCode,
    Rejection,
    problem_key,
)
from app.base.workload import Stage, WorkloadError, parse_workload
from app.config.settings import Settings
from app.extender.explain import explain_spec
from app.extender.service import ExtenderService
from app.extender.wiring import build_core
from app.metrics.metrics import INVALID_KEYS, Metrics
from app.snapshot.store import PlacedPod
from tests.conftest import mixed_nodes

H100 = "NVIDIA-H100-80GB-HBM3"


def core() -> ExtenderService:
    """The pure core as the live service builds it (gangs and data gravity included)."""
    svc = build_core(Settings(cluster_source="none", metrics_port=0), GpuCatalog.load())
    for n in mixed_nodes():
        svc.absorb_node(n)
    return svc


def serving(name: str, gpus: int = 1, **ann: str) -> dict[str, Any]:
    return pod_object(name, stage="serving", gpus=gpus, uid=f"u-{name}",
                      annotations={f"llm-placement.io/{k}": v for k, v in ann.items()})


def gang_member(name: str, gang: str, size: int, **ann: str) -> dict[str, Any]:
    annotations = {"llm-placement.io/gang-size": str(size), **{f"llm-placement.io/{k}": v for k, v in ann.items()}}
    return pod_object(name, namespace="ml", stage="pretraining", gpus=8, uid=f"u-{name}",
                      annotations=annotations, labels={"scheduling.x-k8s.io/pod-group": gang})


def _unknown_gpu(svc: ExtenderService) -> tuple[dict[str, Any], str]:
    svc.absorb_node(node_object("mystery-0", gpus=8, product="Acme-X1"))
    return serving("p", **{"model-params": "7B"}), "mystery-0"


def _gpus_busy(svc: ExtenderService) -> tuple[dict[str, Any], str]:
    svc.snapshot.assume(parse_workload(pod_object("busy", namespace="other", gpus=1)), "h100-0")
    return serving("p", gpus=8, **{"model-params": "7B", "latency-class": "batch"}), "h100-0"


def _separation(svc: ExtenderService) -> tuple[dict[str, Any], str]:
    svc.snapshot.place(PlacedPod("t1", "ml/train", "h100-0", 4, 0, 0, Stage.PRETRAINING, None, None))
    return serving("p", **{"model-params": "13B"}), "h100-0"


def _gang(svc: ExtenderService) -> tuple[dict[str, Any], str]:
    pod = gang_member("g-0", "g", 2)
    svc.snapshot.track_spec(parse_workload(pod))  # one member of two: the gang waits
    return pod, "h100-0"


def _device_selector(svc: ExtenderService) -> tuple[dict[str, Any], str]:
    """A claim whose selector asks for an L4 (docs/dra.md): the H100 node is not one."""
    dra = svc.snapshot.dra
    dra.put_class({"metadata": {"name": "gpu.nvidia.com"}, "spec": {"selectors": [{"cel": {
        "expression": "device.driver == 'gpu.nvidia.com'"}}]}})
    dra.put_template({"metadata": {"namespace": "default", "name": "l4"}, "spec": {"spec": {"devices": {
        "requests": [{"name": "g", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": 1, "selectors": [
            {"cel": {"expression": 'device.attributes["gpu.nvidia.com"].productName == "NVIDIA L4"'}}]}}]}}}})
    dra.reads_claims = True
    pod = serving("p", gpus=0, **{"model-params": "7B"})
    pod["spec"]["resourceClaims"] = [{"name": "g", "resourceClaimTemplateName": "l4"}]
    return pod, "h100-0"


Case = Callable[[ExtenderService], tuple[dict[str, Any], str]]
def _volta(svc: ExtenderService) -> str:
    """A node whose GPUs run fp8 neither natively nor weight-only (compute capability 7.0)."""
    svc.absorb_node(node_object("v100-0", gpus=4, product="Tesla-V100-SXM2-32GB"))
    return "v100-0"


CASES: dict[ReasonCode, Case] = {
    ReasonCode.NO_GPUS: lambda s: (serving("p", **{"model-params": "7B"}), "cpu-0"),
    ReasonCode.CPU_STAGE_ON_GPU: lambda s: (pod_object("p", stage="data-prep", cpu="8", uid="u-p"), "h100-0"),
    ReasonCode.GPUS_BUSY: _gpus_busy,
    ReasonCode.GPU_CAPACITY: lambda s: (serving("p", gpus=16, **{"model-params": "7B"}), "h100-0"),
    ReasonCode.UNKNOWN_GPU: _unknown_gpu,
    ReasonCode.SEPARATION: _separation,
    ReasonCode.PRECISION: lambda s: (serving("p", **{"model-params": "7B", "precision": "fp8"}), _volta(s)),
    ReasonCode.LATENCY_SLO: lambda s: (serving("p", **{"model-params": "7B", "max-ms-per-token": "2"}),
                                       "l4-0"),
    ReasonCode.GPU_MEMORY: lambda s: (serving("p", gpus=4, **{"model-params": "70B"}), "t4-0"),
    ReasonCode.DEVICE_SELECTOR: _device_selector,
    ReasonCode.HOST_MEMORY: lambda s: (pod_object("q", stage="quantize", cpu="16", memory="64Gi", uid="u-q",
                                                  annotations={"llm-placement.io/model-params": "180B"}),
                                       "storage-0"),
    ReasonCode.NOT_CACHED: lambda s: (serving("p", **{"model-params": "7B"}), "ghost-0"),
    ReasonCode.GANG: _gang,
    ReasonCode.GRAVITY: lambda s: (serving("c", **{"depends-on": "producer", "colocation": "node"}), "h100-0"),
}


def rejections(svc: ExtenderService, rule: str) -> float:
    return svc.metrics.registry.get_sample_value("llm_placement_node_rejections_total", {"rule": rule}) or 0.0


def test_every_rule_but_the_fallback_has_a_case() -> None:
    assert set(CASES) | {ReasonCode.TOPOLOGY} == set(ReasonCode) - {ReasonCode.OTHER}


@pytest.mark.parametrize("code", list(CASES), ids=lambda c: c.value)
def test_each_rule_is_reachable_and_metric_explain_and_answer_agree(code: ReasonCode) -> None:
    svc = core()
    pod, node = CASES[code](svc)
    names = [*sorted(svc.snapshot.nodes), "ghost-0"]
    decision = svc.placer.filter(pod, names)
    message = decision.rejections[node]
    assert decision.codes[message] is code
    assert message.startswith(MESSAGE_PREFIX) and len(message) <= MESSAGE_CHARS

    before = rejections(svc, code.value)
    out = json.loads(svc.filter(json.dumps({"Pod": pod, "NodeNames": names}).encode()))
    assert rejections(svc, code.value) == before + 1  # once per distinct reason per call
    answered = {**(out["FailedNodes"] or {}), **(out["FailedAndUnresolvableNodes"] or {})}
    if out["NodeNames"]:
        # Another node passed: no per-node reasons (kube-scheduler reads them only when none
        # passes). Asked about that node alone, the pod's event gets this very text.
        assert answered == {}
        out = json.loads(svc.filter(json.dumps({"Pod": pod, "NodeNames": [node]}).encode()))
        assert out["NodeNames"] == []
        answered = {**(out["FailedNodes"] or {}), **(out["FailedAndUnresolvableNodes"] or {})}
    assert answered[node] == message  # kube-scheduler's event quotes this text

    if code is not ReasonCode.NOT_CACHED:  # explain lists the nodes in the cache
        spec = svc.placer.parse(pod)
        entry = next(e for e in explain_spec(svc, spec)["nodes"] if e["node"] == node)
        assert entry["rule"] == code.value and entry["reason"] == message


def test_topology_rule_for_a_gang_whose_required_domain_is_too_small() -> None:
    svc = build_core(Settings(cluster_source="none", metrics_port=0), GpuCatalog.load())
    for leaf, n in (("a", 3), ("b", 2)):
        for i in range(n):
            svc.absorb_node(node_object(f"{leaf}-{i}", gpus=8, product=H100, rdma=True,
                                        labels={"fabric.topograph.run/tier-0": f"leaf-{leaf}"}))
    req = {"topology-required-placement": "fabric.topograph.run/tier-0"}
    pods = [gang_member(f"t-{i}", "t", 4, **req) for i in range(4)]
    names = sorted(svc.snapshot.nodes)
    for p in pods:  # as the pod watch would have tracked them
        svc.snapshot.track_spec(parse_workload(p))
    body = json.dumps({"Pod": pods[0], "NodeNames": names}).encode()
    out = json.loads(svc.filter(body))
    reasons = set((out["FailedAndUnresolvableNodes"] or {}).values())
    assert len(reasons) == 1 and "in one fabric.topograph.run/tier-0 domain" in next(iter(reasons))
    assert rejections(svc, ReasonCode.TOPOLOGY.value) >= 1
    assert rejections(svc, ReasonCode.GANG.value) == 0


def test_rule_and_key_label_sets_are_exported_from_the_start() -> None:
    reg = Metrics().registry
    for code in ReasonCode:
        assert reg.get_sample_value("llm_placement_node_rejections_total", {"rule": code.value}) == 0.0
    for key in INVALID_KEYS:
        assert reg.get_sample_value("llm_placement_invalid_annotations_total", {"key": key}) == 0.0


def test_annotation_problems_carry_their_key_to_the_metric() -> None:
    svc = core()
    pod = pod_object("bad", gpus=1, uid="u-bad", annotations={
        "llm-placement.io/stage": "bogus", "llm-placement.io/model-params": "70Q",
        "llm-placement.io/precision": "fp64", "llm-placement.io/max-ms-per-token": "-1",
        "llm-placement.io/colocation": "rack", "llm-placement.io/gang-name": "g"})
    with pytest.raises(WorkloadError) as exc:
        parse_workload(pod)
    keys = sorted(problem_key(p) for p in exc.value.problems)
    assert keys == ["colocation", "gang-size", "max-ms-per-token", "model-params", "precision", "stage"]
    svc.filter(json.dumps({"Pod": pod, "NodeNames": ["h100-0"]}).encode())
    for key in keys:
        assert svc.metrics.registry.get_sample_value(
            "llm_placement_invalid_annotations_total", {"key": key}) == 1.0


def test_problem_text_is_still_text_and_unknown_keys_count_as_other() -> None:
    p = AnnotationProblem("stage", 'stage "x" is not one of ...')
    assert p == 'stage "x" is not one of ...' and "; ".join([p, p]).count("stage") == 2
    assert problem_key(p) == "stage" and problem_key("plain text") == "other"
    m = Metrics()
    m.invalid_annotation("no-such-key")
    assert m.registry.get_sample_value("llm_placement_invalid_annotations_total", {"key": "other"}) == 1.0


def test_rejection_messages_are_bounded() -> None:
    r = Rejection(ReasonCode.GRAVITY, MESSAGE_PREFIX + "x" * 10_000)
    assert len(r.message) == MESSAGE_CHARS and r.message.endswith("...")


def test_huge_invalid_value_on_5000_nodes_keeps_the_answer_small() -> None:
    """A 250 KB annotation used to be copied into the answer once per node (1.28 GB at 5,000)."""
    svc = ExtenderService(Settings(cluster_source="none", metrics_port=0), GpuCatalog.load())
    names = [f"node-{i:04d}" for i in range(5000)]
    pod = pod_object("p", gpus=1, uid="u-p", annotations={
        "llm-placement.io/stage": "x" * 250_000, "llm-placement.io/model-params": "y" * 250_000})
    out = svc.filter(json.dumps({"Pod": pod, "NodeNames": names}).encode())
    assert len(out) < 2_000_000
    answer = json.loads(out)
    assert answer["Error"] == "" and len(answer["FailedAndUnresolvableNodes"]) == 5000
    message = answer["FailedAndUnresolvableNodes"]["node-0000"]
    assert len(message) <= MESSAGE_CHARS and 'stage "xxx' in message and 'model-params "yyy' in message


def test_long_producer_name_stays_short_in_every_node_reason() -> None:
    svc = core()
    producer = "p" * 300  # a valid (bounded) name, still longer than a reason should be per node
    pod = serving("c", **{"depends-on": producer, "colocation": "node"})
    names = sorted(svc.snapshot.nodes)
    out = json.loads(svc.filter(json.dumps({"Pod": pod, "NodeNames": names}).encode()))
    reasons = {**(out["FailedNodes"] or {}), **(out["FailedAndUnresolvableNodes"] or {})}
    assert reasons and all(len(m) <= MESSAGE_CHARS for m in reasons.values())
