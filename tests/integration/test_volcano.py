"""Gangs named the way Volcano names them, sized by Volcano's PodGroup, through the real kube-scheduler.

Volcano's job controller creates a ``scheduling.volcano.sh/v1beta1`` PodGroup with ``minMember`` and
annotates each pod with ``scheduling.k8s.io/group-name`` (volcano.sh/apis, pkg/apis/scheduling/
v1beta1: types.go and labels.go). No Volcano process runs here: the CRD below is written from those
types (the fields the extender reads, the rest preserved) and the test creates what the controller
would. The pods carry no ``gang-size``: their size can only come from the PodGroup (docs/gangs.md).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes.client import ApiextensionsV1Api, CustomObjectsApi
from kubernetes.client.rest import ApiException

from kubeharness import (
    assert_stays_unbound,
    create_pods,
    delete_all_pods,
    get_pod,
    gpu_node,
    llm_pod,
    wait_for_node_names,
    wait_until,
)

from .conftest import ClusterScope

pytestmark = pytest.mark.integration

GROUP, VERSION, PLURAL = "scheduling.volcano.sh", "v1beta1", "podgroups"
CRD_NAME = f"{PLURAL}.{GROUP}"
SET = "llm-placement.io/it-group"


def crd() -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": CRD_NAME},
        "spec": {
            "group": GROUP, "scope": "Namespaced",
            "names": {"plural": PLURAL, "singular": "podgroup", "kind": "PodGroup", "shortNames": ["pg"]},
            "versions": [{
                "name": VERSION, "served": True, "storage": True, "subresources": {"status": {}},
                "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                    "spec": {"type": "object", "x-kubernetes-preserve-unknown-fields": True,
                             "properties": {"minMember": {"type": "integer", "format": "int32"},
                                            "queue": {"type": "string"}}},
                    "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
                }}},
            }],
        },
    }


@pytest.fixture(scope="module")
def volcano(cluster: ClusterScope) -> Iterator[CustomObjectsApi]:
    ext = ApiextensionsV1Api(cluster.cp.api)
    ext.create_custom_resource_definition(crd())

    def established() -> bool:
        got = ext.read_custom_resource_definition(CRD_NAME)
        return any(c.type == "Established" and c.status == "True" for c in got.status.conditions or ())

    wait_until(established, 30, "the Volcano PodGroup CRD established")
    n = cluster.node_name
    cluster.add_nodes([gpu_node(n(f"v-{i}"), "H100", gpus=8, labels={SET: "volcano"}, tier0="leaf-v", rdma=True,
                                index=i)
                       for i in range(4)])
    # The extender found the API absent at its start and looks again at most every minute; a
    # restart lists it now (the same as a Volcano install before the extender's rollout).
    cluster.cp.restart_extender()
    try:
        yield CustomObjectsApi(cluster.cp.api)
    finally:
        delete_all_pods(cluster.core, cluster.namespace)
        try:
            ext.delete_custom_resource_definition(CRD_NAME)
        except ApiException as exc:
            if exc.status != 404:
                raise


def member(run: str, group: str, i: int) -> dict[str, Any]:
    pod = llm_pod(f"{run}-{i}", stage="pretraining", gpus=8,
                  annotations={"scheduling.k8s.io/group-name": group}, labels={"run": run})
    pod["spec"]["nodeSelector"] = {SET: "volcano"}
    return pod


def test_a_volcano_gang_waits_for_its_pod_groups_min_member_then_binds_whole(
        cluster: ClusterScope, volcano: CustomObjectsApi) -> None:
    run, group = "vc", "job-a"
    volcano.create_namespaced_custom_object(GROUP, VERSION, cluster.namespace, PLURAL, {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "PodGroup", "metadata": {"name": group},
        "spec": {"minMember": 3, "queue": "default"}})
    first = [member(run, group, i) for i in range(2)]
    create_pods(cluster.core, cluster.namespace, first)
    # Two of the three minMember: nothing binds, though two nodes are free for them.
    assert_stays_unbound(cluster.core, cluster.namespace, f"{run}-0", 6)
    assert not get_pod(cluster.core, cluster.namespace, f"{run}-1")["spec"].get("nodeName")
    t0 = time.monotonic()
    create_pods(cluster.core, cluster.namespace, [member(run, group, 2)])
    placed = wait_for_node_names(cluster.core, cluster.namespace, [f"{run}-{i}" for i in range(3)], timeout=60)
    assert len(set(placed.values())) == 3, placed
    assert time.monotonic() - t0 < 60


@pytest.mark.parametrize("late", ["created", "lowered"])
def test_a_size_that_comes_after_the_pods_binds_the_gang_within_seconds(
        cluster: ClusterScope, volcano: CustomObjectsApi, late: str) -> None:
    """A PodGroup created after its pods, or its minMember lowered 4 -> 2: the members were told to
    wait and kube-scheduler hears of no change of theirs; the extender requeues them (docs/gangs.md,
    "Late sizes") instead of leaving them for kube-scheduler's five-minute flush."""
    delete_all_pods(cluster.core, cluster.namespace)  # the four nodes free for this gang alone
    run, group = f"late-{late}", f"job-late-{late}"
    body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "PodGroup", "metadata": {"name": group},
            "spec": {"minMember": 4, "queue": "default"}}
    if late == "lowered":
        volcano.create_namespaced_custom_object(GROUP, VERSION, cluster.namespace, PLURAL, body)
    create_pods(cluster.core, cluster.namespace, [member(run, group, i) for i in range(2)])
    assert_stays_unbound(cluster.core, cluster.namespace, f"{run}-0", 6)
    t0 = time.monotonic()
    if late == "lowered":
        volcano.patch_namespaced_custom_object(GROUP, VERSION, cluster.namespace, PLURAL, group,
                                               {"spec": {"minMember": 2}})
    else:
        body["spec"]["minMember"] = 2
        volcano.create_namespaced_custom_object(GROUP, VERSION, cluster.namespace, PLURAL, body)
    wait_for_node_names(cluster.core, cluster.namespace, [f"{run}-{i}" for i in range(2)], timeout=15)
    assert time.monotonic() - t0 < 15
