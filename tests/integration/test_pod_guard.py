"""Pods that could only cost others, refused at admission (docs/gangs.md, "Refused at admission"),
by the chart's ValidatingAdmissionPolicy (helm/llm-placement/files/pod-guard-policy.yaml, loaded
here as the chart loads it) on the real API server: a gang-name without a gang-size is refused at
creation, and nobody but the extender lifts the gang gate, while the extender still does."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import kubernetes
import pytest
import yaml
from kubernetes.client.rest import ApiException

from kubeharness import (
    EXTENDER_USER,
    ControlPlane,
    create_pod,
    gpu_node,
    llm_pod,
    wait_for_node_names,
    wait_until,
)
from kubeharness.schedconfig import CHART_FILES

from .conftest import ClusterScope
from .test_gang_gate import _policy_gone

pytestmark = pytest.mark.integration

ANN = "llm-placement.io/"
GATE = ANN + "gang-incomplete"
GUARD = "llm-placement-it-pod-guard"
GATE_POLICY = "llm-placement-it-guard-gang-gate"
PATCH_POLICY = "llm-placement-it-guard-pod-patch"
V1 = "admissionregistration.k8s.io/v1"


@pytest.fixture(scope="module")
def policies(control_plane: ControlPlane) -> Iterator[None]:
    adm = kubernetes.client.AdmissionregistrationV1Api(control_plane.api)
    guard = yaml.safe_load((CHART_FILES / "pod-guard-policy.yaml").read_text())
    guard["matchConditions"] = [{"name": "not-llm-placement",
                                 "expression": f"request.userInfo.username != '{EXTENDER_USER}'"}]
    gate = yaml.safe_load((CHART_FILES / "gang-gate-policy.yaml").read_text())
    patch = yaml.safe_load((CHART_FILES / "pod-patch-policy.yaml").read_text())
    patch["matchConditions"] = [{"name": "llm-placement-identity",
                                 "expression": f"request.userInfo.username == '{EXTENDER_USER}'"}]
    for name, spec in ((GUARD, guard), (PATCH_POLICY, patch)):
        adm.create_validating_admission_policy({"apiVersion": V1, "kind": "ValidatingAdmissionPolicy",
                                                "metadata": {"name": name}, "spec": spec})
        adm.create_validating_admission_policy_binding({
            "apiVersion": V1, "kind": "ValidatingAdmissionPolicyBinding", "metadata": {"name": name},
            "spec": {"policyName": name, "validationActions": ["Deny"]}})
    adm.create_mutating_admission_policy({"apiVersion": V1, "kind": "MutatingAdmissionPolicy",
                                          "metadata": {"name": GATE_POLICY}, "spec": gate})
    adm.create_mutating_admission_policy_binding({
        "apiVersion": V1, "kind": "MutatingAdmissionPolicyBinding", "metadata": {"name": GATE_POLICY},
        "spec": {"policyName": GATE_POLICY}})
    try:
        yield
    finally:
        for name in (GUARD, PATCH_POLICY):
            adm.delete_validating_admission_policy_binding(name)
            adm.delete_validating_admission_policy(name)
        adm.delete_mutating_admission_policy_binding(GATE_POLICY)
        adm.delete_mutating_admission_policy(GATE_POLICY)
        _policy_gone(kubernetes.client.CoreV1Api(control_plane.api))


def _pod(name: str, **ann: str) -> dict[str, Any]:
    return llm_pod(name, stage="pretraining", gpus=8, annotations={ANN + k: v for k, v in ann.items()})


def _refused(core: kubernetes.client.CoreV1Api, ns: str, pod: dict[str, Any]) -> str:
    """The API server's refusal message, '' if the pod was created (and then deleted)."""
    try:
        create_pod(core, ns, pod)
    except ApiException as exc:
        return str(exc.body)
    core.delete_namespaced_pod(pod["metadata"]["name"], ns, grace_period_seconds=0)
    return ""


def test_gang_name_without_a_size_is_refused_at_creation(
        cluster: ClusterScope, policies: None, unique: Callable[[str], str]) -> None:
    core, ns = cluster.core, cluster.namespace
    # The policy takes effect asynchronously (the API server's policy informer).
    wait_until(lambda: bool(_refused(core, ns, _pod(unique("probe"), **{"gang-name": "g"}))), 30,
               "the pod-guard policy to refuse a gang-name without a size")
    msg = _refused(core, ns, _pod(unique("bare"), **{"gang-name": "g"}))
    assert "gang-name is set but gang-size is missing" in msg
    # A size, or a convention that carries one, is admitted.
    assert _refused(core, ns, _pod(unique("sized"), **{"gang-name": "g2", "gang-size": "2"})) == ""
    grouped = _pod(unique("grouped"), **{"gang-name": "g3"})
    grouped["metadata"]["labels"]["scheduling.x-k8s.io/pod-group"] = "g3"
    assert _refused(core, ns, grouped) == ""
    assert _refused(core, ns, _pod(unique("plain"))) == ""


def test_only_the_extender_lifts_the_gang_gate(
        cluster: ClusterScope, policies: None, unique: Callable[[str], str]) -> None:
    core, ns = cluster.core, cluster.namespace
    cluster.add_nodes([gpu_node(cluster.node_name(f"guard-{i}"), "H100", gpus=8, rdma=True, index=40 + i)
                       for i in range(2)])
    group = unique("held")
    first, second = f"{group}-0", f"{group}-1"

    def gated() -> bool:
        name = unique("probe")
        create_pod(core, ns, _pod(name, **{"gang-name": unique("never"), "gang-size": "2"}))
        ok = [g.name for g in core.read_namespaced_pod(name, ns).spec.scheduling_gates or []] == [GATE]
        core.delete_namespaced_pod(name, ns, grace_period_seconds=0)
        return ok

    wait_until(gated, 30, "the gang-gate policy to gate a new gang member")
    create_pod(core, ns, _pod(first, **{"gang-name": group, "gang-size": "2"}))
    # The tenant (any identity but the extender's) lifts the gate of its own incomplete gang: refused.
    lift = {"spec": {"schedulingGates": [{"$patch": "delete", "name": GATE}]}}
    with pytest.raises(ApiException) as refused:
        core.patch_namespaced_pod(first, ns, lift, _content_type="application/strategic-merge-patch+json")
    assert refused.value.status in (403, 422) and "only the extender lifts" in str(refused.value.body)
    # The gang completes: the extender lifts the gate from both and they bind.
    create_pod(core, ns, _pod(second, **{"gang-name": group, "gang-size": "2"}))
    bound = wait_for_node_names(core, ns, [first, second], timeout=120)
    assert len(set(bound.values())) == 2
    for n in (first, second):
        core.delete_namespaced_pod(n, ns, grace_period_seconds=0)


# --- Pods no node can ever hold -------------------------------------------------------------------
# The policy file's default largest GPU (podGuard.largestGpuMemoryGB: the catalog's largest, rounded
# up; tests/unit/repo/test_pod_guard_policy.py keeps the two in step).
LARGEST_GB = 288


def _sized(name: str, params: str, gpus: int, stage: str | None = "serving", **ann: str) -> dict[str, Any]:
    return llm_pod(name, stage=stage, model_params=params, gpus=gpus,
                   annotations={ANN + k: v for k, v in ann.items()})


def _guard_active(core: kubernetes.client.CoreV1Api, ns: str, unique: Callable[[str], str]) -> None:
    wait_until(lambda: bool(_refused(core, ns, _sized(unique("probe"), "405B", 1))), 30,
               "the pod-guard policy to refuse a 405B bf16 pod on one GPU")


# (model-params, GPUs, annotations, the GB and the precision the message names)
NEVER_FITS: list[tuple[str, int, dict[str, str], str, str]] = [
    ("405B", 1, {}, "810 GB", "bf16"),
    ("405 b", 1, {"stage": "inference"}, "810 GB", "bf16"),
    ("+405B", 1, {"stage": ""}, "810 GB", "bf16"),
    ("1.5T", 1, {"precision": "int4"}, "750 GB", "int4"),
    ("700B", 2, {"precision": "FP8"}, "700 GB", "fp8"),
    ("405B", 1, {"precision-fallback": "fp8, int8"}, "405 GB", "fp8"),
    ("405B", 1, {"stage": "pretraining"}, "810 GB", "bf16"),
    ("700B", 1, {"stage": "alignment", "finetune-method": "qlora"}, "350 GB", "int4"),
    ("100B", 1, {"precision": "fp32"}, "400 GB", "fp32"),
]


@pytest.mark.parametrize(("params", "gpus", "ann", "gb", "precision"), NEVER_FITS)
def test_a_pod_no_gpu_could_hold_is_refused_with_its_numbers(
        cluster: ClusterScope, policies: None, unique: Callable[[str], str],
        params: str, gpus: int, ann: dict[str, str], gb: str, precision: str) -> None:
    core, ns = cluster.core, cluster.namespace
    _guard_active(core, ns, unique)
    stage = ann.pop("stage", "serving") or None
    msg = _refused(core, ns, _sized(unique("huge"), params, gpus, stage, **ann))
    assert "no node can ever place this pod" in msg
    assert f"at {precision} needs {gb} for the weights alone" in msg
    assert f"{gpus} GPU(s) x {LARGEST_GB} GB" in msg


def _fitting() -> list[tuple[str, int, str]]:
    """Pods whose weights just fit GPUs of the largest catalog size: the policy must admit every one
    (whether the extender then finds such a node is its business)."""
    out = []
    for gpus in (1, 2, 4, 8):
        for precision, nbytes in (("fp32", 4.0), ("bf16", 2.0), ("fp8", 1.0), ("int4", 0.5)):
            billions = int(gpus * LARGEST_GB / nbytes)  # weights <= gpus x the largest GPU
            out.append((f"{billions}B", gpus, precision))
    return out


@pytest.mark.parametrize(("params", "gpus", "precision"), _fitting())
def test_a_pod_the_largest_gpus_could_hold_is_admitted(
        cluster: ClusterScope, policies: None, unique: Callable[[str], str],
        params: str, gpus: int, precision: str) -> None:
    core, ns = cluster.core, cluster.namespace
    _guard_active(core, ns, unique)
    assert _refused(core, ns, _sized(unique("fits"), params, gpus, precision=precision)) == ""
    # The same weights through a fallback precision, the declared one too large.
    if precision != "fp32":
        assert _refused(core, ns, _sized(unique("falls"), params, gpus, **{
            "precision": "fp32", "precision-fallback": precision})) == ""


def _two_containers(name: str) -> dict[str, Any]:
    pod = _sized(name, "300B", 1, precision="fp8")  # 300 GB: more than one GPU, less than two
    second = dict(pod["spec"]["containers"][0], name="second")
    pod["spec"]["containers"].append(second)
    return pod


def _claims(name: str) -> dict[str, Any]:
    pod = _sized(name, "405B", 1)
    pod["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimName": "absent"}]
    return pod


def _gang(name: str) -> dict[str, Any]:
    return _sized(name, "405B", 1, stage="pretraining", **{"gang-name": "big", "gang-size": "64"})


# Pods the rule leaves to the extender: what it cannot read or count, gangs, claims, CPU stages.
LEFT_ALONE: list[tuple[str, Callable[[str], dict[str, Any]]]] = [
    ("GPUs in two containers", _two_containers),
    ("a pod with ResourceClaims", _claims),
    ("a gang member (training shards over the gang)", _gang),
    ("a CPU stage", lambda n: _sized(n, "405B", 1, stage="deployment")),
    ("a CPU stage alias", lambda n: _sized(n, "405B", 1, stage="Quantize")),
    ("no GPUs", lambda n: _sized(n, "405B", 0)),
    ("model-params without a suffix", lambda n: _sized(n, "405000000000", 1)),
    ("model-params with an exponent", lambda n: _sized(n, "4.05e2B", 1)),
    ("an unknown precision", lambda n: _sized(n, "405B", 1, precision="fp4")),
    ("an unknown stage", lambda n: _sized(n, "405B", 1, stage="warmup")),
    ("a registry model without model-params", lambda n: llm_pod(
        n, stage="serving", gpus=1, annotations={ANN + "model": "llama-3.1-405b"})),
]


@pytest.mark.parametrize(("what", "make"), LEFT_ALONE, ids=[w for w, _ in LEFT_ALONE])
def test_what_the_rule_cannot_judge_is_admitted(
        cluster: ClusterScope, policies: None, unique: Callable[[str], str],
        what: str, make: Callable[[str], dict[str, Any]]) -> None:
    core, ns = cluster.core, cluster.namespace
    _guard_active(core, ns, unique)
    assert _refused(core, ns, make(unique("alone"))) == "", what


def test_annotating_a_bigger_model_afterwards_is_refused(
        cluster: ClusterScope, policies: None, unique: Callable[[str], str]) -> None:
    core, ns = cluster.core, cluster.namespace
    _guard_active(core, ns, unique)
    name = unique("grows")
    pod = _sized(name, "7B", 1)
    pod["spec"]["schedulingGates"] = [{"name": "example.com/hold"}]  # stays unbound meanwhile
    create_pod(core, ns, pod)
    try:
        with pytest.raises(ApiException) as refused:
            core.patch_namespaced_pod(name, ns, {"metadata": {"annotations": {ANN + "model-params": "405B"}}})
        assert "no node can ever place this pod" in str(refused.value.body)
        # Other changes to the pod go through.
        core.patch_namespaced_pod(name, ns, {"metadata": {"annotations": {"example.com/note": "x"}}})
    finally:
        core.delete_namespaced_pod(name, ns, grace_period_seconds=0)


def test_gpus_written_as_json_numbers_are_counted(
        cluster: ClusterScope, policies: None, unique: Callable[[str], str]) -> None:
    # A client may send a quantity as a JSON number; the API server stores it as a quantity, and the
    # rule must read it rather than fail (a failing rule refuses every pod: failurePolicy Fail).
    core, ns = cluster.core, cluster.namespace
    _guard_active(core, ns, unique)
    for gpus, refused in ((1, True), (8, False)):
        pod = _sized(unique("number"), "405B", gpus)
        res = pod["spec"]["containers"][0]["resources"]
        res["requests"]["nvidia.com/gpu"] = res["limits"]["nvidia.com/gpu"] = gpus
        api = core.api_client
        # The typed client would not send a number where a quantity goes: the raw call does.
        resp = api.call_api("POST", f"{api.configuration.host}/api/v1/namespaces/{ns}/pods",
                            header_params={"Content-Type": "application/json"}, body=pod)
        resp.read()
        body = resp.data.decode() if isinstance(resp.data, bytes) else str(resp.data)
        assert ("no node can ever place this pod" in body) is refused, body
        assert (resp.status == 201) is not refused, body
        if not refused:
            core.delete_namespaced_pod(pod["metadata"]["name"], ns, grace_period_seconds=0)
