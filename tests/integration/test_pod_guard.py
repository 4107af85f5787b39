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

from .conftest import ClusterScope
from .harness import (
    EXTENDER_USER,
    ControlPlane,
    create_pod,
    gpu_node,
    llm_pod,
    wait_for_node_names,
    wait_until,
)
from .harness.schedconfig import CHART_FILES

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
