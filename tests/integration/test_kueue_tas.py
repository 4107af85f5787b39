"""Gangs admitted by real Kueue with Topology Aware Scheduling, placed through our profile.

Kueue (kubeharness/kueue.py, built from its Go module) runs against the suite's API
server for this module's namespace. With TAS it admits a pod group only onto nodes with room for every
member and pins each member to its node with its own ``kubernetes.io/hostname`` selector before it
lifts its gates, so each member reaches the extender with a different single node on offer. The gang
(Kueue's ``pod-group-name`` and ``pod-group-total-count``, which the extender reads natively,
docs/annotations.md) must still be planned and bound whole, each member on the node Kueue chose
(docs/gangs.md, "With Kueue, JobSet and LeaderWorkerSet").
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from kubeharness import (
    ControlPlane,
    create_pods,
    delete_pods,
    get_pod,
    gpu_node,
    list_pods,
    llm_pod,
    wait_until,
)
from kubeharness.kueue import (
    GROUP_COUNT,
    GROUP_LABEL,
    KUEUE_GATES,
    Kueue,
    KueueBuildError,
    build_kueue,
    cluster_quota,
    queued,
)

from .conftest import ClusterScope

pytestmark = pytest.mark.integration

NODES = 4
PLAN = "llm-placement.io/gang-plan"
HOSTNAME = "kubernetes.io/hostname"


@pytest.fixture(scope="module")
def kueue(control_plane: ControlPlane, cluster: ClusterScope) -> Iterator[tuple[Kueue, list[str]]]:
    try:
        binary = build_kueue()
    except KueueBuildError as exc:
        pytest.fail(f"Kueue unavailable: {exc}", pytrace=False)
    mark = {"llm-placement.io/test-kueue": cluster.namespace[:63]}
    manifests = [gpu_node(cluster.node_name(f"tas{i}"), "H100", gpus=8, rdma=True, labels=mark, index=400 + i)
                 for i in range(NODES)]
    nodes = cluster.add_nodes(manifests)
    cluster.wait_extender_sees_nodes()
    k = Kueue(binary, control_plane, control_plane.workdir, cluster.namespace, tas=True, node_labels=mark)
    sample = queued(llm_pod("q", stage="pretraining", gpus=8, cpu="2", memory="8Gi"), ("q", 2), tas=True)
    k.start(cluster_quota(manifests, [sample]))
    try:
        yield k, nodes
    finally:
        k.stop()


@pytest.fixture
def run(cluster: ClusterScope, unique: Callable[[str], str]) -> Iterator[str]:
    value = unique("tas")
    yield value
    delete_pods(cluster.core, cluster.namespace, f"run={value}")


def members(run: str, size: int, gpus: int = 8) -> list[dict[str, Any]]:
    out = []
    for i in range(size):
        pod = llm_pod(f"{run}-{i}", stage="pretraining", gpus=gpus, cpu="2", memory="8Gi", labels={"run": run})
        out.append(queued(pod, (run, size), tas=True))
    return out


def test_a_kueue_tas_gang_is_bound_whole_on_the_nodes_kueue_pinned(
        kueue: tuple[Kueue, list[str]], cluster: ClusterScope, run: str) -> None:
    k, nodes = kueue
    core, ns = cluster.core, cluster.namespace
    pods = members(run, 3)
    assert all(p["metadata"]["labels"][GROUP_LABEL] == run for p in pods)
    assert all(p["metadata"]["annotations"][GROUP_COUNT] == "3" for p in pods)
    create_pods(core, ns, pods)
    names = [p["metadata"]["name"] for p in pods]

    def bound() -> bool:
        return all(get_pod(core, ns, n)["spec"].get("nodeName") for n in names)

    wait_until(bound, 120, "the Kueue TAS gang to be bound")
    got = {n: get_pod(core, ns, n) for n in names}
    pinned = {n: (p["spec"].get("nodeSelector") or {}).get(HOSTNAME) for n, p in got.items()}
    placed = {n: p["spec"]["nodeName"] for n, p in got.items()}
    # Kueue chose the nodes (one 8-GPU member per node), and every member went where it was pinned.
    assert all(pinned.values()) and placed == pinned, (pinned, placed)
    assert len(set(placed.values())) == 3 and set(placed.values()) <= set(nodes)
    k.in_flight()  # reads the Workloads: this group's must carry Kueue's topology assignment
    assert k.topology_assigned >= 1
    # The extender planned the gang whole and bound each member where its plan said.
    for n, p in got.items():
        plan = json.loads((p["metadata"].get("annotations") or {}).get(PLAN) or "null")
        assert plan is not None and plan["node"] == placed[n], (n, plan)
        assert not [g for g in p["spec"].get("schedulingGates") or [] if g.get("name") in KUEUE_GATES]


def test_a_kueue_tas_gang_that_does_not_fit_is_held_whole_at_admission(
        kueue: tuple[Kueue, list[str]], cluster: ClusterScope, run: str) -> None:
    # Five 8-GPU members on four 8-GPU nodes: Kueue's quota (the four nodes) already refuses it, and
    # no member is released to kube-scheduler, so nothing is bound or reserved for part of it.
    core, ns = cluster.core, cluster.namespace
    create_pods(core, ns, members(run, 5))

    def all_gated() -> bool:
        pods = list_pods(core, ns, f"run={run}")
        return len(pods) == 5 and all(
            any(g.get("name") in KUEUE_GATES for g in p["spec"].get("schedulingGates") or []) for p in pods)

    wait_until(all_gated, 30, "the five members to exist behind Kueue's gate")
    wait_until(lambda: k_idle(kueue[0]), 30, "Kueue to have tried the group")
    pods = list_pods(core, ns, f"run={run}")
    assert not [p["metadata"]["name"] for p in pods if p["spec"].get("nodeName")]
    assert all(any(g.get("name") in KUEUE_GATES for g in p["spec"].get("schedulingGates") or []) for p in pods)


def k_idle(k: Kueue) -> bool:
    return k.pending_active() == 0 and k.in_flight() == 0
