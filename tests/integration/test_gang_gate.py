"""Gang members held at admission (docs/gangs.md, "Held at admission"), on the real control plane.

The chart's MutatingAdmissionPolicy (helm/llm-placement/files/gang-gate-policy.yaml, loaded here as
the chart loads it) gates every member of a sized gang at creation; kube-scheduler never tries a
gated pod. The extender's watch counts the held members and lifts the gate from all of them once
the gang is complete, under the chart's pod-patch policy, which allows that one spec change.
"""

from __future__ import annotations

import time
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
    pod_events,
    wait_for_node_names,
    wait_until,
)
from kubeharness.schedconfig import CHART_FILES
from kubeharness.slowwrite import refused_gate_removals

from .conftest import ClusterScope

pytestmark = pytest.mark.integration

ANN = "llm-placement.io/"
GATE = ANN + "gang-incomplete"
GATE_POLICY = "llm-placement-it-gang-gate"
PATCH_POLICY = "llm-placement-it-gate-pod-patch"


@pytest.fixture(scope="module")
def gang_gate(control_plane: ControlPlane) -> Iterator[None]:
    """The chart's gang-gate policy, and its pod-patch policy matched to the extender's identity."""
    adm = kubernetes.client.AdmissionregistrationV1Api(control_plane.api)
    gate = yaml.safe_load((CHART_FILES / "gang-gate-policy.yaml").read_text())
    patch = yaml.safe_load((CHART_FILES / "pod-patch-policy.yaml").read_text())
    patch["matchConditions"] = [{"name": "llm-placement-identity",
                                 "expression": f"request.userInfo.username == '{EXTENDER_USER}'"}]
    v1 = "admissionregistration.k8s.io/v1"
    adm.create_mutating_admission_policy({"apiVersion": v1, "kind": "MutatingAdmissionPolicy",
                                          "metadata": {"name": GATE_POLICY}, "spec": gate})
    adm.create_mutating_admission_policy_binding({
        "apiVersion": v1, "kind": "MutatingAdmissionPolicyBinding", "metadata": {"name": GATE_POLICY},
        "spec": {"policyName": GATE_POLICY}})
    adm.create_validating_admission_policy({"apiVersion": v1, "kind": "ValidatingAdmissionPolicy",
                                            "metadata": {"name": PATCH_POLICY}, "spec": patch})
    adm.create_validating_admission_policy_binding({
        "apiVersion": v1, "kind": "ValidatingAdmissionPolicyBinding", "metadata": {"name": PATCH_POLICY},
        "spec": {"policyName": PATCH_POLICY, "validationActions": ["Deny"]}})
    try:
        yield
    finally:
        adm.delete_mutating_admission_policy_binding(GATE_POLICY)
        adm.delete_mutating_admission_policy(GATE_POLICY)
        adm.delete_validating_admission_policy_binding(PATCH_POLICY)
        adm.delete_validating_admission_policy(PATCH_POLICY)
        _policy_gone(kubernetes.client.CoreV1Api(control_plane.api))


def _policy_gone(core: kubernetes.client.CoreV1Api) -> None:
    """The deletion takes effect asynchronously too: until it has, a later module's gang members
    would still be created gated, and wait for a gate nobody lifts."""
    def ungated_probe() -> bool:
        name = f"gate-off-probe-{time.monotonic_ns()}"
        create_pod(core, "default", _member(name, name))
        gated = GATE in _gates(core, "default", name)
        core.delete_namespaced_pod(name, "default", grace_period_seconds=0)
        return not gated

    wait_until(ungated_probe, 30, "the gang-gate policy's removal to take effect")


def _gates(core: kubernetes.client.CoreV1Api, ns: str, name: str) -> list[str]:
    pod = core.read_namespaced_pod(name, ns)
    return [g.name for g in (pod.spec.scheduling_gates or [])]


def _member(name: str, group: str, **extra: Any) -> dict[str, Any]:
    return llm_pod(name, stage="pretraining", gpus=8,
                   annotations={ANN + "gang-name": group, ANN + "gang-size": "2", **extra})


def _policy_active(cluster: ClusterScope, unique: Callable[[str], str]) -> None:
    """The policy takes effect asynchronously (the API server's policy informer): probe pods of a
    gang that never completes until one is created gated."""
    core, ns = cluster.core, cluster.namespace

    def gated_probe() -> bool:
        name = unique("probe")
        create_pod(core, ns, _member(name, unique("never")))
        gated = GATE in _gates(core, ns, name)
        core.delete_namespaced_pod(name, ns, grace_period_seconds=0)
        return gated

    wait_until(gated_probe, 30, "the gang-gate policy to gate a new gang member")


def test_an_incomplete_gang_waits_gated_and_enters_the_queue_whole(
    cluster: ClusterScope, gang_gate: None, unique: Callable[[str], str]
) -> None:
    core, ns = cluster.core, cluster.namespace
    cluster.add_nodes([gpu_node(cluster.node_name(f"gate-{i}"), "H100", gpus=8, rdma=True, index=i)
                       for i in range(2)])
    _policy_active(cluster, unique)
    group = unique("gated")
    first, second = f"{group}-0", f"{group}-1"
    create_pod(core, ns, _member(first, group))
    # Alone, the member stays behind the gate: kube-scheduler never tries it (no FailedScheduling
    # round trips), and the extender leaves the gate while the gang is incomplete.
    time.sleep(3)
    assert _gates(core, ns, first) == [GATE]
    pod = core.read_namespaced_pod(first, ns)
    assert not pod.spec.node_name
    reasons = {c.reason for c in (pod.status.conditions or []) if c.type == "PodScheduled"}
    assert reasons <= {"SchedulingGated"}
    create_pod(core, ns, _member(second, group))
    bound = wait_for_node_names(core, ns, [first, second], timeout=120)
    assert len(set(bound.values())) == 2
    assert _gates(core, ns, first) == [] and _gates(core, ns, second) == []
    for n in (first, second):
        core.delete_namespaced_pod(n, ns, grace_period_seconds=0)


def test_a_member_behind_another_gate_has_not_arrived_and_only_the_gang_gate_is_ours(
    cluster: ClusterScope, gang_gate: None, unique: Callable[[str], str]
) -> None:
    core, ns = cluster.core, cluster.namespace
    _policy_active(cluster, unique)
    group = unique("other-gate")
    names = [f"{group}-{i}" for i in range(2)]
    quota = {"name": "example.com/quota"}
    for n in names:
        pod = _member(n, group)
        pod["spec"]["schedulingGates"] = [quota]
        create_pod(core, ns, pod)
    # Someone else's gate: the members have not arrived, so the gang gate stays too.
    time.sleep(3)
    assert all(sorted(_gates(core, ns, n)) == sorted(["example.com/quota", GATE]) for n in names)
    # The pod-patch policy refuses the extender's identity any gate but its own.
    cfg = kubernetes.client.Configuration()
    kubernetes.config.load_kube_config(config_file=str(cluster.cp.extender_kubeconfig),
                                       client_configuration=cfg)
    ext = kubernetes.client.CoreV1Api(kubernetes.client.ApiClient(cfg))
    lift_quota = {"spec": {"schedulingGates": [{"$patch": "delete", **quota}]}}
    with pytest.raises(ApiException) as refused:
        ext.patch_namespaced_pod(names[0], ns, lift_quota,
                                 _content_type="application/strategic-merge-patch+json")
    assert refused.value.status in (403, 422)
    # The owner lifts its gate: now both members are held only by the gang gate, and the extender
    # lifts that from both.
    for n in names:
        core.patch_namespaced_pod(n, ns, lift_quota, _content_type="application/strategic-merge-patch+json")
    wait_until(lambda: all(_gates(core, ns, n) == [] for n in names), 30,
               "the extender to lift the gang gate once no other gate holds a member")
    for n in names:
        core.delete_namespaced_pod(n, ns, grace_period_seconds=0)


def _told(core: kubernetes.client.CoreV1Api, ns: str, name: str, reason: str) -> list[str]:
    return [str(e.get("message") or e.get("note") or "") for e in pod_events(core, ns, name)
            if e.get("reason") == reason]


@pytest.mark.parametrize(("size", "reason", "words"), [
    ("0", "GangSizeInvalid", "gang-size"), ("-1", "GangSizeInvalid", "gang-size"),
    ("abc", "GangSizeInvalid", "gang-size"), ("1.5", "GangSizeInvalid", "gang-size"),
    ("", "GangSizeInvalid", "gang-size"), ("100000", "GangWaiting", "waiting for gang members 1/100000"),
])
def test_a_held_pod_with_an_unusable_size_is_told_why_within_seconds(
    cluster: ClusterScope, gang_gate: None, unique: Callable[[str], str], size: str, reason: str, words: str,
) -> None:
    """kube-scheduler never tries a gated pod: the extender's event is the only word it gets."""
    core, ns = cluster.core, cluster.namespace
    _policy_active(cluster, unique)
    name = unique("badsize")
    create_pod(core, ns, _member(name, name, **{ANN + "gang-size": size}))
    assert _gates(core, ns, name) == [GATE]
    wait_until(lambda: any(words in m for m in _told(core, ns, name, reason)), 10,
               f"a {reason} event on the pod with gang-size {size!r}")
    core.delete_namespaced_pod(name, ns, grace_period_seconds=0)


def test_a_pod_given_the_gang_gate_by_hand_is_told_nothing_will_lift_it(
    cluster: ClusterScope, gang_gate: None, unique: Callable[[str], str]
) -> None:
    core, ns = cluster.core, cluster.namespace
    name = unique("handgate")
    pod = llm_pod(name, stage="pretraining", gpus=8)
    pod["spec"]["schedulingGates"] = [{"name": GATE}]
    create_pod(core, ns, pod)
    wait_until(lambda: any("names no gang" in m for m in _told(core, ns, name, "GangGateWithoutGang")), 10,
               "a GangGateWithoutGang event")
    core.delete_namespaced_pod(name, ns, grace_period_seconds=0)


def test_members_that_disagree_on_the_size_stay_held_reserve_nothing_and_are_told_both_sizes(
    cluster: ClusterScope, control_plane: ControlPlane, gang_gate: None, unique: Callable[[str], str]
) -> None:
    core, ns = cluster.core, cluster.namespace
    cluster.add_nodes([gpu_node(cluster.node_name(f"mix-{i}"), "H100", gpus=8, rdma=True, index=10 + i)
                       for i in range(2)])
    _policy_active(cluster, unique)
    group = unique("mixed")
    names = [f"{group}-0", f"{group}-1"]
    create_pod(core, ns, _member(names[0], group, **{ANN + "gang-size": "4"}))
    create_pod(core, ns, _member(names[1], group, **{ANN + "gang-size": "2"}))
    for n in names:
        wait_until(lambda n=n: any("disagree on its size: 4 (" in m and " and 2 (" in m
                                   for m in _told(core, ns, n, "GangSizeConflict")), 10,
                   f"a GangSizeConflict event naming both sizes on {n}")
    time.sleep(5)
    assert control_plane.metric_value("llm_placement_reserved_gpus") in (None, 0.0)  # 0 GPUs held
    for n in names:
        pod = core.read_namespaced_pod(n, ns)
        assert _gates(core, ns, n) == [GATE] and not pod.spec.node_name
        ann = pod.metadata.annotations or {}
        # Nothing planned (no plan written), nothing requeued in a loop.
        assert not ann.get(ANN + "gang-plan") and not ann.get(ANN + "gang-retry")
        events = [e for e in pod_events(core, ns, n) if e.get("reason") == "GangSizeConflict"]
        assert sum(int((e.get("series") or {}).get("count") or e.get("count") or 1) for e in events) == 1
    for n in names:
        core.delete_namespaced_pod(n, ns, grace_period_seconds=0)


def test_a_gate_removal_refused_for_forty_seconds_is_retried_until_the_gang_binds(
    cluster: ClusterScope, gang_gate: None, unique: Callable[[str], str]
) -> None:
    """Past the old retry schedule (1 + 3 + 10 s), the extender keeps trying (docs/gangs.md, "Held
    at admission"): the gang binds once the API server accepts the removal."""
    core, ns = cluster.core, cluster.namespace
    cluster.add_nodes([gpu_node(cluster.node_name(f"refuse-{i}"), "H100", gpus=8, rdma=True, index=20 + i)
                       for i in range(2)])
    _policy_active(cluster, unique)
    group = unique("refused")
    names = [f"{group}-{i}" for i in range(2)]
    with refused_gate_removals(core.api_client, cluster.cp.pki, ns, GATE, seconds=40) as refused:
        time.sleep(2)  # the apiserver picks up webhook configurations from its own watch
        for n in names:
            create_pod(core, ns, _member(n, group))
        wait_until(lambda: len(refused) >= 2, 20, "the webhook to refuse the gate removals")
        time.sleep(25)
        assert all(_gates(core, ns, n) == [GATE] for n in names)  # still refused
        bound = wait_for_node_names(core, ns, names, timeout=90)
    # Refused for 40 s, longer than the old schedule (its last try 14 s after the first): only a
    # retry after that could bind it.
    assert len(set(bound.values())) == 2
    for n in names:
        core.delete_namespaced_pod(n, ns, grace_period_seconds=0)
