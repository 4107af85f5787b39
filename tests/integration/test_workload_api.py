"""Gangs of the native Workload API on the real control plane (docs/gangs.md, native Workload API).

This module starts its own control plane with the Kubernetes 1.36 alpha gates ``GenericWorkload``
and ``GangScheduling`` on kube-apiserver and kube-scheduler, and ``scheduling.k8s.io/v1alpha2``
served; the session's shared control plane keeps the defaults. Pods name their PodGroup in
``spec.schedulingGroup.podGroupName``; kube-scheduler's gang plugin holds them until ``minCount``
exist (PreEnqueue), schedules them in one pod-group cycle that calls our filter per pod, and lets
them bind only once ``minCount`` are assumed (Permit); the extender plans the gang whole from the
PodGroup's ``minCount`` and binds it all-or-nothing.

Cluster: two fabric blocks (topograph tier-0 leaves) of two 8-GPU H100 nodes with RDMA. What only
the extender's gang plan enforces (``topology-required-placement``, members on the planned nodes)
is what the assertions look at: kube-scheduler alone would place these pods whole too, just not
there.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes.client import CustomObjectsApi

from kubeharness import (
    ControlPlane,
    assert_stays_unbound,
    create_pods,
    delete_pods,
    ensure_namespace,
    find_binaries,
    get_pod,
    gpu_node,
    list_pods,
    llm_pod,
    scheduling_messages,
    wait_for_node_names,
    wait_until,
)

from .conftest import ClusterScope

pytestmark = pytest.mark.integration

GROUP, VERSION = "scheduling.k8s.io", "v1alpha2"
GATES = "--feature-gates=GenericWorkload=true,GangScheduling=true"
ANN = "llm-placement.io/"
PLAN = ANN + "gang-plan"
TIER0 = "fabric.topograph.run/tier-0"
NS = "it-workload-api"


@pytest.fixture(scope="module")
def native_cp() -> Iterator[ControlPlane]:
    base = os.environ.get("LLMP_TEST_WORKDIR")
    if base:
        Path(base).mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix="llmp-workload-api-", dir=base))
    cp = ControlPlane(workdir, find_binaries(build=False),
                      apiserver_extra_args=[GATES, f"--runtime-config={GROUP}/{VERSION}=true"],
                      scheduler_extra_args=[GATES], scheduler_verbosity=4)
    cp.start()
    failed = False
    try:
        yield cp
    except BaseException:
        failed = True
        raise
    finally:
        cp.stop()
        if failed or os.environ.get("LLMP_KEEP_LOGS") == "1":
            print(f"\nworkload-api control plane logs kept in {workdir / 'logs'}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture(scope="module")
def cluster(native_cp: ControlPlane) -> Iterator[ClusterScope]:
    ensure_namespace(native_cp.core, NS)
    scope = ClusterScope(native_cp, NS)
    manifests = [gpu_node(scope.node_name(f"{leaf}-{i}"), "H100", gpus=8, tier0=leaf, tier1="spine-1",
                          rdma=True, index=n)
                 for n, (leaf, i) in enumerate((leaf, i) for leaf in ("leaf-a", "leaf-b") for i in range(2))]
    scope.add_nodes(manifests)
    try:
        yield scope
    finally:
        scope.cleanup()


@pytest.fixture
def run(cluster: ClusterScope, request: pytest.FixtureRequest) -> Iterator[str]:
    value = f"wl{int(time.time() * 1000) % 10_000_000:x}"
    yield value
    core = cluster.core
    delete_pods(core, NS, f"run={value}")
    wait_until(lambda: not list_pods(core, NS, f"run={value}"), 60, "pods deleted")
    custom = CustomObjectsApi(cluster.cp.api)
    for kind in ("podgroups", "workloads"):
        custom.delete_collection_namespaced_custom_object(GROUP, VERSION, NS, kind,
                                                          label_selector=f"run={value}")


def create_gang_objects(cluster: ClusterScope, run: str, name: str, min_count: int) -> None:
    """A Workload with one gang template and the PodGroup its controller would stamp from it."""
    custom = CustomObjectsApi(cluster.cp.api)
    policy = {"gang": {"minCount": min_count}}
    custom.create_namespaced_custom_object(GROUP, VERSION, NS, "workloads", {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "Workload",
        "metadata": {"name": name, "labels": {"run": run}},
        "spec": {"podGroupTemplates": [{"name": "workers", "schedulingPolicy": policy}]},
    })
    custom.create_namespaced_custom_object(GROUP, VERSION, NS, "podgroups", {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "PodGroup",
        "metadata": {"name": name, "labels": {"run": run}},
        "spec": {"podGroupTemplateRef": {"workload": {"workloadName": name, "podGroupTemplateName": "workers"}},
                 "schedulingPolicy": policy},
    })


def members(run: str, group: str, count: int, gpus: int, annotations: dict[str, str] | None = None,
            first: int = 0) -> list[dict[str, Any]]:
    pods = []
    for i in range(first, first + count):
        pod = llm_pod(f"{group}-{i}", stage="pretraining", gpus=gpus, annotations=annotations,
                      labels={"run": run})
        pod["spec"]["schedulingGroup"] = {"podGroupName": group}
        pods.append(pod)
    return pods


def names(pods: list[dict[str, Any]]) -> list[str]:
    return [p["metadata"]["name"] for p in pods]


def plan_of(cluster: ClusterScope, name: str) -> dict[str, Any] | None:
    raw = (get_pod(cluster.core, NS, name)["metadata"].get("annotations") or {}).get(PLAN)
    return json.loads(raw) if raw else None


def group_condition(cluster: ClusterScope, name: str) -> dict[str, Any] | None:
    pg: Any = CustomObjectsApi(cluster.cp.api).get_namespaced_custom_object(GROUP, VERSION, NS, "podgroups", name)
    conds = (pg.get("status") or {}).get("conditions") or []
    return next((c for c in conds if c.get("type") == "PodGroupScheduled"), None)


def test_native_gang_is_placed_whole_on_the_nodes_of_the_plan(
    cluster: ClusterScope, run: str
) -> None:
    group = f"{run}-pt"
    create_gang_objects(cluster, run, group, 3)
    pods = members(run, group, 3, 4)
    create_pods(cluster.core, NS, pods)
    # The API server kept the reference (it drops the field when GenericWorkload is off).
    assert get_pod(cluster.core, NS, names(pods)[0])["spec"]["schedulingGroup"] == {"podGroupName": group}
    placed = wait_for_node_names(cluster.core, NS, names(pods), timeout=90)
    for name, node in placed.items():
        plan = plan_of(cluster, name)
        # The extender planned this gang from the PodGroup's minCount and kube-scheduler bound each
        # member on the planned node.
        assert plan is not None and plan["gang"] == f"{NS}/{group}" and plan["node"] == node, (name, plan)
    # Best fit: 12 GPUs on two nodes of one block (one full, one half), not spread over three.
    assert len(set(placed.values())) == 2, placed
    assert len({n.rsplit("-", 1)[0] for n in placed.values()}) == 1, placed
    # kube-scheduler's own workload cycle placed the group (it records that on the PodGroup).
    wait_until(lambda: (group_condition(cluster, group) or {}).get("status") == "True", 30,
               "PodGroupScheduled=True on the PodGroup")


def test_native_gang_that_cannot_fit_stays_entirely_pending(cluster: ClusterScope, run: str) -> None:
    # Three whole nodes inside one tier-0 block: each block has two. Only the extender's gang plan
    # knows this constraint; kube-scheduler alone would bind all three across the blocks.
    group = f"{run}-big"
    create_gang_objects(cluster, run, group, 3)
    pods = members(run, group, 3, 8, annotations={ANN + "topology-required-placement": TIER0})
    create_pods(cluster.core, NS, pods)

    def reported() -> bool:
        return any("gang cannot be placed" in m for n in names(pods) for m in scheduling_messages(cluster.core, NS, n))

    wait_until(reported, 60, "FailedScheduling naming the gang reason")
    for name in names(pods):
        assert_stays_unbound(cluster.core, NS, name, 1.0)
    wait_until(lambda: (group_condition(cluster, group) or {}).get("status") == "False", 30,
               "PodGroupScheduled=False on the PodGroup")


def test_members_and_pod_group_arriving_late_neither_deadlock_nor_bind_early(
    cluster: ClusterScope, run: str
) -> None:
    # Pods first, PodGroup later, the last member last: kube-scheduler waits for the PodGroup and
    # for minCount pods, the extender for the same minCount; once all exist the gang completes.
    group = f"{run}-late"
    early = members(run, group, 2, 4)
    create_pods(cluster.core, NS, early)
    time.sleep(2)
    create_gang_objects(cluster, run, group, 3)
    for name in names(early):
        assert_stays_unbound(cluster.core, NS, name, 2.0)
        assert plan_of(cluster, name) is None  # nothing reserved for an incomplete gang
    last = members(run, group, 1, 4, first=2)
    create_pods(cluster.core, NS, last)
    placed = wait_for_node_names(cluster.core, NS, names(early + last), timeout=90)
    assert all((plan_of(cluster, n) or {}).get("node") == node for n, node in placed.items()), placed


@pytest.fixture
def no_gang_plugin(cluster: ClusterScope) -> Iterator[None]:
    """kube-scheduler with ``GenericWorkload`` on and ``GangScheduling`` off: the API and the pod
    field exist, kube-scheduler's own gang plugin does not run (no PreEnqueue hold, no Permit wait)."""
    cp = cluster.cp
    saved = list(cp.scheduler_extra_args)
    cp.scheduler_extra_args = ["--feature-gates=GenericWorkload=true,GangScheduling=false"]
    cp.restart_scheduler()
    try:
        yield
    finally:
        cp.scheduler_extra_args = saved
        cp.restart_scheduler()


def test_without_kube_schedulers_gang_plugin_the_extender_keeps_the_gang_whole(
    cluster: ClusterScope, run: str, no_gang_plugin: None
) -> None:
    # Nothing in kube-scheduler holds the members now: each comes to our filter on its own. Our
    # gang logic must still be all-or-nothing (nothing bound, nothing reserved before minCount
    # members exist) and must not deadlock (all bound once the last one arrives).
    group = f"{run}-solo"
    create_gang_objects(cluster, run, group, 3)
    early = members(run, group, 2, 4)
    create_pods(cluster.core, NS, early)

    def waiting() -> bool:
        return all(any("waiting for gang members" in m for m in scheduling_messages(cluster.core, NS, n))
                   for n in names(early))

    # Our filter's words: with the gang plugin on, PreEnqueue would hold these pods before filter,
    # so seeing them also shows the gate really is off.
    wait_until(waiting, 30, "both early members told they wait for the gang")
    for name in names(early):
        assert_stays_unbound(cluster.core, NS, name, 1.0)
        assert plan_of(cluster, name) is None
    last = members(run, group, 1, 4, first=2)
    create_pods(cluster.core, NS, last)
    placed = wait_for_node_names(cluster.core, NS, names(early + last), timeout=90)
    assert all((plan_of(cluster, n) or {}).get("node") == node for n, node in placed.items()), placed
    assert len(set(placed.values())) == 2, placed  # best fit: one whole node and a half, as planned
