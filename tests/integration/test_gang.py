"""Gangs through the real kube-scheduler: planned whole, bound all-or-nothing, restart-safe.

Cluster (one per module): three fabric blocks (topograph tier-0 leaves) under one spine, H100 boxes
with RDMA: leaf-a 6 nodes, leaf-b 8 nodes, leaf-c 10 nodes. Every test deletes its pods, so each one
starts from the empty cluster. Invariants checked throughout (docs/gangs.md): no GPU over-committed, no
gang partially bound, no two gangs deadlocked, nobody waiting while capacity exists.
"""

from __future__ import annotations

import json
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from kubeharness import (
    ControlPlane,
    assert_stays_unbound,
    create_pods,
    delete_pods,
    get_pod,
    gpu_node,
    gpus_requested,
    list_nodes,
    list_pods,
    llm_pod,
    node_gpus,
    pod_events,
    scheduling_messages,
    wait_for_node_names,
    wait_until,
)

from .conftest import ClusterScope

pytestmark = pytest.mark.integration

ANN = "llm-placement.io/"
PLAN = ANN + "gang-plan"
TIER0 = "fabric.topograph.run/tier-0"
BLOCKS = {"leaf-a": 6, "leaf-b": 8, "leaf-c": 10}


@pytest.fixture(scope="module")
def blocks(cluster: ClusterScope) -> dict[str, str]:
    """Create the three blocks; return node name -> tier-0 block."""
    manifests = []
    index = 0
    for leaf, count in BLOCKS.items():
        for i in range(count):
            index += 1
            manifests.append(gpu_node(cluster.node_name(f"{leaf}-{i}"), "H100", gpus=8, tier0=leaf,
                                      tier1="spine-1", rdma=True, index=index))
    cluster.add_nodes(manifests)
    return {
        n["metadata"]["name"]: n["metadata"]["labels"][TIER0]
        for n in list_nodes(cluster.core) if n["metadata"]["name"].startswith(cluster.node_name(""))
    }


@pytest.fixture
def run(cluster: ClusterScope, unique: Callable[[str], str]) -> Iterator[str]:
    """A label value for this test's pods; they are all deleted afterwards."""
    value = unique("gang")
    yield value
    delete_run(cluster, value)


def delete_run(cluster: ClusterScope, run: str, timeout: float = 60) -> None:
    core, ns = cluster.core, cluster.namespace
    delete_pods(core, ns, f"run={run}")
    wait_until(lambda: not list_pods(core, ns, f"run={run}"), timeout, f"pods of {run} to be deleted")


# A member kube-scheduler cannot send to the extender yet, although it exists and is schedulable
# (not gated): every node of the module carries HOLD, which the other members tolerate.
HOLD = {"key": ANN + "test-hold", "value": "hold", "effect": "NoSchedule"}
TOLERATE = {"key": ANN + "test-hold", "operator": "Equal", "value": "hold", "effect": "NoSchedule"}


@contextmanager
def nodes_held(cluster: ClusterScope, blocks: dict[str, str]) -> Iterator[None]:
    for n in blocks:
        cluster.core.patch_node(n, {"spec": {"taints": [HOLD]}}, _preload_content=False)
    try:
        yield
    finally:
        for n in blocks:
            cluster.core.patch_node(n, {"spec": {"taints": None}}, _preload_content=False)


def let_through(cluster: ClusterScope, name: str) -> None:
    """The held-back member tolerates the taint: kube-scheduler now sends it to the extender."""
    pod = get_pod(cluster.core, cluster.namespace, name)
    tolerations = [*(pod["spec"].get("tolerations") or []), TOLERATE]
    cluster.core.patch_namespaced_pod(name, cluster.namespace, {"spec": {"tolerations": tolerations}},
                                      _preload_content=False)


def gang(run: str, name: str, size: int, gpus: int = 8, annotations: dict[str, str] | None = None,
         held: set[int] | None = None) -> list[dict[str, Any]]:
    """Members of one gang the way a PodGroup-based controller creates them (label + size).
    ``held``: members that do not tolerate HOLD, the others do (see ``nodes_held``)."""
    pods = []
    for i in range(size):
        pod = llm_pod(
            f"{run}-{name}-{i}", stage="pretraining", gpus=gpus,
            annotations={ANN + "gang-size": str(size), **(annotations or {})},
            labels={"run": run, "scheduling.x-k8s.io/pod-group": f"{run}-{name}"},
        )
        if held is not None and i not in held:
            pod["spec"]["tolerations"] = [TOLERATE]
        pods.append(pod)
    return pods


def names(pods: list[dict[str, Any]]) -> list[str]:
    return [p["metadata"]["name"] for p in pods]


def bound_count(cluster: ClusterScope, pod_names: list[str]) -> int:
    want = set(pod_names)
    return sum(1 for p in list_pods(cluster.core, cluster.namespace)
               if p["metadata"]["name"] in want and p["spec"].get("nodeName"))


def assert_no_gpu_overcommit(cluster: ClusterScope) -> None:
    capacity = {n["metadata"]["name"]: node_gpus(n) for n in list_nodes(cluster.core)}
    used: dict[str, int] = defaultdict(int)
    for p in list_pods(cluster.core, cluster.namespace):
        node = p["spec"].get("nodeName")
        if node:
            used[node] += gpus_requested(p)
    over = {n: (u, capacity.get(n, 0)) for n, u in used.items() if u > capacity.get(n, 0)}
    assert not over, f"GPUs over-committed (used, capacity): {over}"


def events_of(cluster: ClusterScope, pod_names: list[str], reason: str) -> list[str]:
    out = []
    for name in pod_names:
        out += [str(e.get("message") or "") for e in pod_events(cluster.core, cluster.namespace, name)
                if e.get("reason") == reason]
    return out


def plan_of(cluster: ClusterScope, name: str) -> dict[str, Any] | None:
    raw = (get_pod(cluster.core, cluster.namespace, name)["metadata"].get("annotations") or {}).get(PLAN)
    return json.loads(raw) if raw else None


def test_eight_by_eight_gang_lands_inside_one_fabric_block(
    cluster: ClusterScope, blocks: dict[str, str], run: str
) -> None:
    pods = gang(run, "pt", 8)
    create_pods(cluster.core, cluster.namespace, pods)
    placed = wait_for_node_names(cluster.core, cluster.namespace, names(pods), timeout=120)
    assert len(set(placed.values())) == 8, placed
    used_blocks = {blocks[n] for n in placed.values()}
    # leaf-a is too small, leaf-c would be left with a hole: leaf-b holds the gang exactly.
    assert used_blocks == {"leaf-b"}, placed
    for name, node in placed.items():
        plan = plan_of(cluster, name)
        assert plan is not None and plan["node"] == node and plan["gang"].endswith(f"{run}-pt")
    placed_events = events_of(cluster, names(pods)[:1], "GangPlanned")
    assert placed_events and "leaf-b" in placed_events[0]
    assert_no_gpu_overcommit(cluster)


def test_gang_that_does_not_fit_binds_no_member_and_says_why(
    cluster: ClusterScope, blocks: dict[str, str], run: str
) -> None:
    # 12 x 8 GPUs inside one tier-0 block: the largest block has 10 free nodes.
    pods = gang(run, "big", 12, annotations={ANN + "topology-required-placement": TIER0})
    create_pods(cluster.core, cluster.namespace, pods)
    ns = cluster.namespace

    def explained() -> bool:
        return bool(events_of(cluster, names(pods), "GangUnschedulable"))

    wait_until(explained, 60, "a GangUnschedulable event on a member")
    detail = events_of(cluster, names(pods), "GangUnschedulable")[0]
    assert f"needs 96 GPUs (12 pods x 8 GPUs) inside one {TIER0} domain" in detail, detail
    assert "leaf-c 80" in detail and "leaf-b 64" in detail and "leaf-a 48" in detail, detail
    def reported() -> bool:
        return any("gang cannot be placed" in m for n in names(pods)
                   for m in scheduling_messages(cluster.core, ns, n))

    wait_until(reported, 60, "FailedScheduling naming the gang reason")
    for name in names(pods):
        assert_stays_unbound(cluster.core, ns, name, 0.5)
    assert bound_count(cluster, names(pods)) == 0


def test_two_gangs_competing_for_one_block_complete_one_after_the_other(
    cluster: ClusterScope, blocks: dict[str, str], run: str
) -> None:
    # Both need a whole 10-node block and only leaf-c has one: one completes, the other waits with
    # nothing held (no deadlock), then completes once the first one's pods are gone.
    required = {ANN + "topology-required-placement": TIER0}
    first, second = gang(run, "x", 10, annotations=required), gang(run, "y", 10, annotations=required)
    create_pods(cluster.core, cluster.namespace, first + second)

    def one_complete() -> bool:
        return bound_count(cluster, names(first)) == 10 or bound_count(cluster, names(second)) == 10

    wait_until(one_complete, 180, "one of the two gangs to bind completely")
    winner, loser = (first, second) if bound_count(cluster, names(first)) == 10 else (second, first)
    placed = wait_for_node_names(cluster.core, cluster.namespace, names(winner), timeout=5)
    assert {blocks[n] for n in placed.values()} == {"leaf-c"}
    time.sleep(5)
    assert bound_count(cluster, names(loser)) == 0  # all-or-nothing: none of it is half bound
    assert_no_gpu_overcommit(cluster)
    group = winner[0]["metadata"]["labels"]["scheduling.x-k8s.io/pod-group"]
    delete_pods(cluster.core, cluster.namespace, f"scheduling.x-k8s.io/pod-group={group}")
    placed = wait_for_node_names(cluster.core, cluster.namespace, names(loser), timeout=180)
    assert {blocks[n] for n in placed.values()} == {"leaf-c"}
    assert_no_gpu_overcommit(cluster)


def _bind(cluster: ClusterScope, pod: str, node: str) -> None:
    body = {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": pod},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node}}
    cluster.core.create_namespaced_binding(cluster.namespace, body, _preload_content=False)


def test_extender_killed_mid_gang_resumes_without_overcommit(
    cluster: ClusterScope, control_plane: ControlPlane, blocks: dict[str, str], run: str
) -> None:
    core, ns = cluster.core, cluster.namespace
    # Member 7 is held back (it exists, so the gang is planned, but kube-scheduler cannot send it
    # to the extender): the gang cannot complete, so the extender dies with a plan in flight.
    pods = gang(run, "pt", 8, held={7})
    member = names(pods)
    with nodes_held(cluster, blocks):
        create_pods(core, ns, pods)
        wait_until(lambda: all(plan_of(cluster, m) for m in member), 90,
                   "the gang plan persisted on every member")
        _extender_killed_mid_gang(cluster, control_plane, blocks, run, member)


def _extender_killed_mid_gang(cluster: ClusterScope, control_plane: ControlPlane, blocks: dict[str, str],
                              run: str, member: list[str]) -> None:
    core, ns = cluster.core, cluster.namespace
    planned = {m: str((plan_of(cluster, m) or {})["node"]) for m in member}
    assert {blocks[n] for n in planned.values()} == {"leaf-b"}
    assert bound_count(cluster, member) == 0  # all-or-nothing: member 7 never reached bind
    # The extender binds member 0 and dies (SIGKILL) before the others: the worst moment.
    _bind(cluster, member[0], planned[member[0]])
    control_plane.restart_extender(crash=True)
    cluster.wait_extender_sees_nodes()
    # A pod that may only run in leaf-b must not get the GPUs reserved for the gang.
    intruder = llm_pod(f"{run}-intruder", stage="pretraining", gpus=8, labels={"run": run})
    intruder["spec"]["nodeSelector"] = {TIER0: "leaf-b"}
    intruder["spec"]["tolerations"] = [TOLERATE]
    create_pods(core, ns, [intruder])
    assert_stays_unbound(core, ns, intruder["metadata"]["name"], 8)
    # Release member 7: the whole gang completes on the persisted plan.
    let_through(cluster, member[7])
    placed = wait_for_node_names(core, ns, member, timeout=240)
    assert placed == planned, {m: (placed[m], planned[m]) for m in member if placed[m] != planned[m]}
    assert {blocks[n] for n in placed.values()} == {"leaf-b"}
    assert not get_pod(core, ns, intruder["metadata"]["name"])["spec"].get("nodeName")
    assert_no_gpu_overcommit(cluster)


def test_planned_node_cordoned_before_bind_is_replanned(
    cluster: ClusterScope, blocks: dict[str, str], run: str
) -> None:
    core, ns = cluster.core, cluster.namespace
    # Member 3 exists (so the gang is planned) but kube-scheduler cannot send it to us yet: the
    # others gather at filter meanwhile, and one of their planned nodes is cordoned.
    pods = gang(run, "small", 4, held={3})
    member = names(pods)
    with nodes_held(cluster, blocks):
        create_pods(core, ns, pods)
        wait_until(lambda: all(plan_of(cluster, m) for m in member), 90,
                   "the gang plan persisted on every member")
        planned = {m: str((plan_of(cluster, m) or {})["node"]) for m in member}
        cordoned = planned[member[0]]
        core.patch_node(cordoned, {"spec": {"unschedulable": True}}, _preload_content=False)
        let_through(cluster, member[3])
    try:
        placed = wait_for_node_names(core, ns, member, timeout=240)
        assert cordoned not in placed.values()
        assert len({blocks[n] for n in placed.values()}) == 1, placed
        # Members whose planned node still fitted kept it (a replan moves as little as it can).
        assert sum(placed[m] == planned[m] for m in member[1:]) == 3
        assert_no_gpu_overcommit(cluster)
    finally:
        core.patch_node(cordoned, {"spec": {"unschedulable": None}}, _preload_content=False)


def test_kueue_style_gated_then_node_selected_gang_is_placed_whole_inside_the_selection(
    cluster: ClusterScope, blocks: dict[str, str], run: str
) -> None:
    """What Kueue's Topology Aware Scheduling hands us (docs/gangs.md): pods created behind a
    scheduling gate, then, on admission, given a nodeSelector for the block it chose and ungated.
    Nothing may be planned or reserved while they are gated, and the plan must stay inside the
    selected block although on its own it would pick the smallest block that fits (leaf-a)."""
    core, ns = cluster.core, cluster.namespace
    pods = gang(run, "kq", 4)
    for p in pods:
        p["spec"]["schedulingGates"] = [{"name": "kueue.x-k8s.io/admission"}]
    create_pods(core, ns, pods)
    for name in names(pods):
        assert_stays_unbound(core, ns, name, 1)
        assert plan_of(cluster, name) is None  # gated pods never reach filter: nothing planned
    for name in names(pods):  # admission: Kueue writes the topology it chose, then lifts the gate
        core.patch_namespaced_pod(name, ns, {"spec": {"nodeSelector": {TIER0: "leaf-c"}}})
        core.patch_namespaced_pod(name, ns, [{"op": "remove", "path": "/spec/schedulingGates"}])
    placed = wait_for_node_names(core, ns, names(pods), timeout=120)
    assert {blocks[n] for n in placed.values()} == {"leaf-c"}, placed
    assert len(set(placed.values())) == 4
    for name, node in placed.items():
        plan = plan_of(cluster, name)
        assert plan is not None and plan["node"] == node
    assert_no_gpu_overcommit(cluster)


def scheduler_log_from(cluster: ClusterScope, offset: int) -> str:
    assert cluster.cp.scheduler is not None
    with cluster.cp.scheduler.log_path.open("rb") as f:
        f.seek(offset)
        return f.read().decode(errors="replace")


def test_a_gang_whose_members_come_back_seconds_apart_binds_whole_with_no_error_in_kube_schedulers_log(
    cluster: ClusterScope, blocks: dict[str, str], run: str
) -> None:
    """kube-scheduler brings members back one by one, each after its own backoff, and logs every
    bind call answered with an error at error level ("Error scheduling pod; retrying"). Members held
    at bind while the rest came (the last one here arrives seconds after the others, longer than a
    bind call may wait) were such errors; gathered at filter instead, they are Unschedulable events
    until every member has arrived, and the gang binds without one (docs/gangs.md)."""
    core, ns = cluster.core, cluster.namespace
    assert cluster.cp.scheduler is not None
    offset = cluster.cp.scheduler.log_path.stat().st_size
    pods = gang(run, "late", 4, held={3})
    member = names(pods)
    with nodes_held(cluster, blocks):
        create_pods(core, ns, pods)
        wait_until(lambda: all(plan_of(cluster, m) for m in member), 90,
                   "the gang plan persisted on every member")
        time.sleep(6)  # the others are retried meanwhile: longer than any bind call may wait
        assert bound_count(cluster, member) == 0
        let_through(cluster, member[3])
        placed = wait_for_node_names(core, ns, member, timeout=120)
    assert len(set(placed.values())) == 4 and len({blocks[n] for n in placed.values()}) == 1, placed
    assert_no_gpu_overcommit(cluster)
    time.sleep(1)  # kube-scheduler logs a failed binding cycle after answering it
    errors = [line for line in scheduler_log_from(cluster, offset).splitlines()
              if line[:1] == "E" and line[1:5].isdigit() and f"{run}-late" in line]
    assert not errors, "\n".join(errors[:5])
    waited = events_of(cluster, member[:3], "FailedScheduling")
    assert any("waiting for gang" in m and "members arrived" in m for m in waited), waited
