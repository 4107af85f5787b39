"""The extender's bind verb, called by the real kube-scheduler and then again directly.

kube-scheduler may repeat a bind whose response it did not get (timeout, extender restart); the verb
must be idempotent for the same node and refuse a different node or a recreated pod (protocol
reference, gotchas 25-27).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import pytest

from kubeharness import ControlPlane, create_pod, get_pod, gpu_node, llm_pod, wait_for_node_name

from .conftest import ClusterScope

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def two_nodes(cluster: ClusterScope) -> list[str]:
    return cluster.add_nodes(
        [
            gpu_node(cluster.node_name("l4-0"), "L4", gpus=4, index=1),
            gpu_node(cluster.node_name("l4-1"), "L4", gpus=4, index=2),
        ]
    )


def _bind(cp: ControlPlane, pod: dict[str, Any], node: str, uid: str | None = None) -> dict[str, Any]:
    # The exact ExtenderBindingArgs shape kube-scheduler sends (PascalCase, no json tags).
    body = {
        "PodName": pod["metadata"]["name"],
        "PodNamespace": pod["metadata"]["namespace"],
        "PodUID": uid if uid is not None else pod["metadata"]["uid"],
        "Node": node,
    }
    r = httpx.post(f"{cp.extender_url}/bind", json=body, timeout=10)
    assert r.status_code == 200, f"bind must always answer HTTP 200, got {r.status_code}: {r.text}"
    out = r.json()
    assert isinstance(out, dict) and "Error" in out, f"not an ExtenderBindingResult: {out!r}"
    return out


def test_bind_is_idempotent_for_an_already_bound_pod(
    cluster: ClusterScope, control_plane: ControlPlane, two_nodes: list[str], unique: Callable[[str], str]
) -> None:
    name = unique("bind")
    create_pod(
        cluster.core,
        cluster.namespace,
        llm_pod(name, stage="serving", model_params="7B", precision="int8", gpus=1),
    )
    node = wait_for_node_name(cluster.core, cluster.namespace, name)
    pod = get_pod(cluster.core, cluster.namespace, name)
    other = next(n for n in two_nodes if n != node)

    # Same node again: success, nothing changes.
    assert _bind(control_plane, pod, node) == {"Error": ""}
    # Another node: refused, with a reason; the pod stays where it is.
    assert _bind(control_plane, pod, other)["Error"], "re-binding to another node must fail"
    # Same name, different UID (the pod was deleted and recreated): refused.
    assert _bind(control_plane, pod, node, uid="00000000-0000-0000-0000-000000000000")["Error"]
    assert get_pod(cluster.core, cluster.namespace, name)["spec"]["nodeName"] == node


def test_bind_of_a_missing_pod_is_an_error_not_a_crash(
    cluster: ClusterScope, control_plane: ControlPlane, two_nodes: list[str]
) -> None:
    ghost = {"metadata": {"name": "no-such-pod", "namespace": cluster.namespace, "uid": "1"}}
    assert _bind(control_plane, ghost, two_nodes[0])["Error"]
    assert httpx.get(f"{control_plane.extender_base}/healthz", timeout=5).status_code == 200


def test_direct_binds_of_other_pods_are_refused(
    cluster: ClusterScope, control_plane: ControlPlane, two_nodes: list[str], unique: Callable[[str], str]
) -> None:
    # A tenant that can reach the verbs tries to place pods itself: a pod of another scheduler, a pod
    # of ours onto a node that does not exist, and onto a node the extender never filtered it for.
    other = unique("theirs")
    create_pod(cluster.core, cluster.namespace,
               llm_pod(other, gpus=1, scheduler_name="not-ours"))  # nobody schedules it
    theirs = get_pod(cluster.core, cluster.namespace, other)
    err = _bind(control_plane, theirs, two_nodes[0])["Error"]
    assert "uses scheduler 'not-ours'" in err
    ours = unique("ours")
    create_pod(cluster.core, cluster.namespace,
               llm_pod(ours, stage="serving", model_params="7B", precision="int8", gpus=1))
    node = wait_for_node_name(cluster.core, cluster.namespace, ours)
    pod = get_pod(cluster.core, cluster.namespace, ours)
    assert "is not known to the extender" in _bind(control_plane, pod, "no-such-node")["Error"]
    assert get_pod(cluster.core, cluster.namespace, ours)["spec"]["nodeName"] == node
    assert not get_pod(cluster.core, cluster.namespace, other)["spec"].get("nodeName")


def _filter_names(cp: ControlPlane, pod: dict[str, Any], node: str) -> list[str]:
    body = {"Pod": pod, "Nodes": None, "NodeNames": [node]}
    r = httpx.post(f"{cp.extender_url}/filter", json=body, timeout=10)
    assert r.status_code == 200, r.text
    return list(r.json().get("NodeNames") or [])


def _pinned(name: str, node: str, **kw: Any) -> dict[str, Any]:
    pod = llm_pod(name, stage="serving", model_params="7B", precision="int8", gpus=1, **kw)
    pod["spec"]["nodeSelector"] = {"kubernetes.io/hostname": node}
    return pod


FORGED_CASES = {
    # node spec, node CPUs, pod changes, the words of the refusal
    "taint": ({"taints": [{"key": "dedicated", "value": "infra", "effect": "NoSchedule"}]}, "96", {},
              "has taint dedicated=infra:NoSchedule"),
    "cordoned": ({"unschedulable": True}, "96", {}, "is cordoned"),
    "node_selector": ({}, "96", {"nodeSelector": {"pool": "reserved"}}, "nodeSelector pool"),
    "cpu": ({}, "4", {"cpu": "64"}, "4000m CPU free; the pod requests 64000m"),
}


@pytest.fixture(scope="module")
def forged_nodes(cluster: ClusterScope) -> dict[str, str]:
    """One node per case, as the case's spec says (the harness creates nodes untainted, so the spec
    is patched in afterwards)."""
    names = {case: cluster.node_name("forged-" + case.replace("_", "-")) for case in FORGED_CASES}
    cluster.add_nodes([gpu_node(names[case], "L4", gpus=4, cpu=cpus, index=20 + i)
                       for i, (case, (_, cpus, _, _)) in enumerate(FORGED_CASES.items())])
    for case, (spec, _, _, _) in FORGED_CASES.items():
        if spec:
            cluster.core.patch_node(names[case], {"spec": spec})
    # Node events reach the extender in order on one watch: once it has seen a node created after
    # the patches, it has seen the patches.
    cluster.add_nodes([gpu_node(cluster.node_name("forged-sentinel"), "T4", gpus=0, index=29)])
    return names


@pytest.mark.parametrize("case", list(FORGED_CASES))
def test_forged_filter_and_bind_onto_a_node_kube_scheduler_refuses(
    cluster: ClusterScope, control_plane: ControlPlane, unique: Callable[[str], str],
    forged_nodes: dict[str, str], case: str
) -> None:
    # A tenant with pods create rights (no pods/binding) pins its pod to a node kube-scheduler will
    # not use, then calls the verbs itself over loopback: filter (ours judges GPUs, so the node
    # passes), then bind with the pod's real UID. The node rules refuse the bind.
    _, _, pod_change, words = FORGED_CASES[case]
    node = forged_nodes[case]
    pod_name = unique("forged-" + case.replace("_", "-"))
    pod = _pinned(pod_name, node, cpu=str(pod_change.get("cpu", "100m")))
    if "nodeSelector" in pod_change:
        pod["spec"]["nodeSelector"] = {**pod["spec"]["nodeSelector"], **pod_change["nodeSelector"]}
    stored = create_pod(cluster.core, cluster.namespace, pod)
    before = control_plane.metric_value("llm_placement_bind_refusals_total", {"reason": case}) or 0.0
    assert _filter_names(control_plane, stored, node) == [node]
    err = _bind(control_plane, stored, node)["Error"]
    assert "bind refused" in err and words in err, err
    assert not get_pod(cluster.core, cluster.namespace, pod_name)["spec"].get("nodeName")
    assert control_plane.metric_value("llm_placement_bind_refusals_total", {"reason": case}) == before + 1
    cluster.core.delete_namespaced_pod(pod_name, cluster.namespace, grace_period_seconds=0)


def test_precision_chosen_at_bind_arrives_on_the_pod_with_the_binding(
    cluster: ClusterScope, control_plane: ControlPlane, two_nodes: list[str], unique: Callable[[str], str]
) -> None:
    # 13B at bf16 needs more than an L4's 24 GB; at int8 it fits. The chosen precision rides on the
    # Binding (one API write), and the API server sets it on the pod as it binds it.
    name = unique("fallback")
    create_pod(cluster.core, cluster.namespace,
               llm_pod(name, stage="serving", model_params="13B", precision="bf16", gpus=1,
                       annotations={"llm-placement.io/precision-fallback": "int8"}))
    assert wait_for_node_name(cluster.core, cluster.namespace, name) in two_nodes
    annotations = get_pod(cluster.core, cluster.namespace, name)["metadata"].get("annotations") or {}
    assert annotations.get("llm-placement.io/assigned-precision") == "int8"
