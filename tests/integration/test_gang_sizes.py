"""Gang sizes that kube-scheduler alone would leave stranded in silence, through the real control plane
without the chart's gang gate (docs/gangs.md, "Members that disagree" and "Late sizes"); the gated
cases are in test_gang_gate.py, the Volcano late sizes in test_volcano.py.

* Members of one gang whose ``gang-size`` differs (4 and 2): before, with room the gang held 16
  GPUs for a plan that never bound, and with the cluster full its members were requeued every ~2 s.
  Now each member is told the conflict, naming both sizes, nothing is reserved and nothing requeues
  them.
* A coscheduling PodGroup (``scheduling.x-k8s.io/v1alpha1``) created after its pods, or its
  ``minMember`` lowered 4 -> 2: the members were told to wait and hear of no change of theirs; the
  extender requeues them, so they bind within seconds instead of at kube-scheduler's five-minute
  flush.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kubernetes.client import ApiextensionsV1Api, CustomObjectsApi
from kubernetes.client.rest import ApiException

from kubeharness import (
    ControlPlane,
    assert_stays_unbound,
    create_pods,
    delete_pods,
    get_pod,
    gpu_node,
    llm_pod,
    pod_events,
    wait_for_node_names,
    wait_until,
)

from .conftest import ClusterScope

pytestmark = pytest.mark.integration

ANN = "llm-placement.io/"
SET = "llm-placement.io/it-group"
GROUP, VERSION, PLURAL = "scheduling.x-k8s.io", "v1alpha1", "podgroups"
CRD_NAME = f"{PLURAL}.{GROUP}"


@pytest.fixture(scope="module")
def boxes(cluster: ClusterScope) -> list[str]:
    n = cluster.node_name
    return cluster.add_nodes([gpu_node(n(f"sz-{i}"), "H100", gpus=8, labels={SET: "sizes"}, tier0="leaf-sz",
                                       rdma=True, index=i) for i in range(2)])


def member(name: str, run: str, **annotations: str) -> dict[str, Any]:
    pod = llm_pod(name, stage="pretraining", gpus=8, annotations=annotations, labels={"run": run})
    pod["spec"]["nodeSelector"] = {SET: "sizes"}
    return pod


def _count(core: Any, ns: str, name: str, reason: str) -> int:
    """How many times the pod was told ``reason`` (a repeated event is one object with a count)."""
    return sum(int((e.get("series") or {}).get("count") or e.get("count") or 1)
               for e in pod_events(core, ns, name) if e.get("reason") == reason)


@pytest.mark.parametrize("room", ["room", "full"])
def test_members_that_disagree_on_the_size_reserve_nothing_and_are_not_requeued_in_a_loop(
    cluster: ClusterScope, control_plane: ControlPlane, boxes: list[str], unique: Callable[[str], str],
    room: str,
) -> None:
    core, ns = cluster.core, cluster.namespace
    run = unique("mixed")
    if room == "full":  # both boxes taken: the loop of "cannot be placed" requeues came from here
        fillers = [member(f"{run}-fill-{i}", run) for i in range(2)]
        for f in fillers:
            f["metadata"]["labels"]["filler"] = "yes"
        create_pods(core, ns, fillers)
        wait_for_node_names(core, ns, [p["metadata"]["name"] for p in fillers], timeout=60)
    names = [f"{run}-0", f"{run}-1"]
    create_pods(core, ns, [member(names[0], run, **{ANN + "gang-name": run, ANN + "gang-size": "4"}),
                           member(names[1], run, **{ANN + "gang-name": run, ANN + "gang-size": "2"})])
    try:
        if room == "full":
            # kube-scheduler's own filters turn the members away (no GPU free): the extender is
            # not asked, and must not requeue them in a loop either.
            for n in names:
                wait_until(lambda n=n: bool(_messages(core, ns, n)), 20, f"a FailedScheduling event on {n}")
            _nothing_held_nor_requeued(cluster, control_plane, names)
            delete_pods(core, ns, f"run={run},filler=yes")  # room now: the extender is asked
        for n in names:
            wait_until(lambda n=n: any("disagree on its size: 4 (" in m and " and 2 (" in m
                                       for m in _messages(core, ns, n)), 20,
                       f"a FailedScheduling event naming both sizes on {n}")
        _nothing_held_nor_requeued(cluster, control_plane, names)
    finally:
        delete_pods(core, ns, f"run={run}")


def _nothing_held_nor_requeued(cluster: ClusterScope, control_plane: ControlPlane, names: list[str]) -> None:
    """30 s on: nothing planned, reserved or requeued by the extender, and kube-scheduler tried each
    member only a few times (it retries on cluster events, and none comes)."""
    core, ns = cluster.core, cluster.namespace
    told = {n: _count(core, ns, n, "FailedScheduling") for n in names}
    for _ in range(6):
        time.sleep(5)
        assert control_plane.metric_value("llm_placement_reserved_gpus") in (None, 0.0)
    for n in names:
        pod = get_pod(core, ns, n)
        ann = pod["metadata"].get("annotations") or {}
        assert not pod["spec"].get("nodeName")
        assert not ann.get(ANN + "gang-plan") and not ann.get(ANN + "gang-retry"), ann
        later = _count(core, ns, n, "FailedScheduling")
        assert later - told[n] <= 3, f"{n} was tried {later - told[n]} more times in 30 s"


def _messages(core: Any, ns: str, name: str) -> list[str]:
    return [str(e.get("message") or e.get("note") or "") for e in pod_events(core, ns, name)
            if e.get("reason") == "FailedScheduling"]


def crd() -> dict[str, Any]:
    """The coscheduling PodGroup as scheduler-plugins defines it (apis/scheduling/v1alpha1), the
    field the extender reads and the rest preserved."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": CRD_NAME},
        "spec": {
            "group": GROUP, "scope": "Namespaced",
            "names": {"plural": PLURAL, "singular": "podgroup", "kind": "PodGroup", "shortNames": ["pg", "pgs"]},
            "versions": [{
                "name": VERSION, "served": True, "storage": True, "subresources": {"status": {}},
                "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                    "spec": {"type": "object", "x-kubernetes-preserve-unknown-fields": True,
                             "properties": {"minMember": {"type": "integer", "format": "int32"}}},
                    "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
                }}},
            }],
        },
    }


@pytest.fixture(scope="module")
def coscheduling(cluster: ClusterScope, boxes: list[str]) -> Iterator[CustomObjectsApi]:
    ext = ApiextensionsV1Api(cluster.cp.api)
    try:
        ext.create_custom_resource_definition(crd())
    except ApiException as exc:
        if exc.status != 409:
            raise

    def established() -> bool:
        got = ext.read_custom_resource_definition(CRD_NAME)
        return any(c.type == "Established" and c.status == "True" for c in got.status.conditions or ())

    wait_until(established, 30, "the coscheduling PodGroup CRD established")
    # The extender found the API absent at its start and looks again at most every minute; a
    # restart lists it now (as a scheduler-plugins install before the extender's rollout would).
    cluster.cp.restart_extender()
    try:
        yield CustomObjectsApi(cluster.cp.api)
    finally:
        try:
            ext.delete_custom_resource_definition(CRD_NAME)
        except ApiException as exc:
            if exc.status != 404:
                raise
        cluster.cp.restart_extender()


@pytest.mark.parametrize("late", ["created", "lowered"])
def test_a_coscheduling_size_that_comes_after_the_pods_binds_the_gang_within_seconds(
    cluster: ClusterScope, coscheduling: CustomObjectsApi, unique: Callable[[str], str], late: str,
) -> None:
    core, ns = cluster.core, cluster.namespace
    run = unique(f"late-{late}")
    body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "PodGroup", "metadata": {"name": run},
            "spec": {"minMember": 4}}
    if late == "lowered":
        coscheduling.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, body)
    pods = []
    for i in range(2):
        pod = member(f"{run}-{i}", run)
        pod["metadata"]["labels"]["scheduling.x-k8s.io/pod-group"] = run
        pods.append(pod)
    create_pods(core, ns, pods)
    try:
        assert_stays_unbound(core, ns, f"{run}-0", 6)
        t0 = time.monotonic()
        if late == "lowered":
            coscheduling.patch_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, run, {"spec": {"minMember": 2}})
        else:
            body["spec"]["minMember"] = 2
            coscheduling.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, body)
        placed = wait_for_node_names(core, ns, [f"{run}-{i}" for i in range(2)], timeout=15)
        assert time.monotonic() - t0 < 15 and len(set(placed.values())) == 2
    finally:
        delete_pods(core, ns, f"run={run}")
        coscheduling.delete_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, run)
