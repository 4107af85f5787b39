"""What Kueue could admit now, from its Workloads and the namespace's pods: the replay's virtual clock
waits while any waiting group fits (kubeharness/kueue.py, ``admissible_now``)."""

from __future__ import annotations

from typing import Any

import pytest

from kubeharness.kueue import (
    ADMISSION_GATE,
    GROUP_COUNT,
    GROUP_LABEL,
    HOSTNAME,
    admissible_now,
    in_flight,
    unclaimed,
)

QUOTA = {"nvidia.com/gpu": "32", "cpu": "384000m", "memory": str(4 * 2**40)}


def workload(name: str, pods: int, gpus: int = 8, *, reserved: bool = False, finished: bool = False,
             members: list[str] | None = None) -> dict[str, Any]:
    conds = [{"type": "QuotaReserved", "status": "True" if reserved else "False"}]
    if finished:
        conds.append({"type": "Finished", "status": "True"})
    return {
        "metadata": {"name": name, "ownerReferences": [{"name": m} for m in members or []]},
        "spec": {"podSets": [{"name": "main", "count": pods, "template": {"spec": {"containers": [
            {"resources": {"requests": {"nvidia.com/gpu": str(gpus), "cpu": "2", "memory": "8Gi"}}}]}}}]},
        "status": {"conditions": conds},
    }


def pod(name: str, node: str | None = None, *, pinned: str | None = None, gated: bool = False,
        phase: str = "Running", gpus: int = 8) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"resources": {"requests": {"nvidia.com/gpu": str(gpus)}}}]}
    if node:
        spec["nodeName"] = node
    if pinned:
        spec["nodeSelector"] = {HOSTNAME: pinned}
    if gated:
        spec["schedulingGates"] = [{"name": ADMISSION_GATE}]
    return {"metadata": {"name": name}, "spec": spec, "status": {"phase": phase}}


def node(name: str, gpus: int = 8) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": {"pool": "gpu"}},
            "status": {"allocatable": {"nvidia.com/gpu": str(gpus), "cpu": "96", "memory": "1Ti"}}}


NODES = [node(f"n{i}") for i in range(4)]


@pytest.mark.parametrize(("tas", "running", "want"), [
    # Two nodes' worth reserved by a running group: a waiting 2 x 8 group fits the other two.
    (False, 2, ["b"]), (True, 2, ["b"]),
    # Three nodes' worth reserved: a 2 x 8 group does not fit the quota (nor the one free node).
    (False, 3, []), (True, 3, []),
])
def test_a_waiting_group_is_admissible_when_quota_and_nodes_hold_it(tas: bool, running: int,
                                                                     want: list[str]) -> None:
    members = [f"a-{i}" for i in range(running)]
    wls = [workload("a", running, reserved=True, members=members), workload("b", 2)]
    pods = {m: pod(m, node=f"n{i}") for i, m in enumerate(members)}
    pods |= {f"b-{i}": pod(f"b-{i}", gated=True) for i in range(2)}
    assert admissible_now(wls, pods, NODES, QUOTA, tas=tas, node_labels={"pool": "gpu"}) == want


def test_a_finished_workload_frees_its_quota_at_once() -> None:
    # The moment Kueue retries its inadmissible workloads comes up to a batch period later: the
    # waiting group counts as admissible from the release on.
    wls = [workload("a", 4, reserved=True, finished=True, members=[f"a-{i}" for i in range(4)]),
           workload("b", 4)]
    pods = {f"a-{i}": pod(f"a-{i}", node=f"n{i}", phase="Succeeded") for i in range(4)}
    assert admissible_now(wls, pods, NODES, QUOTA, tas=True) == ["b"]
    assert admissible_now(wls[1:], {}, NODES, {"nvidia.com/gpu": "24"}, tas=False) == []


def test_tas_needs_room_on_nodes_not_only_quota() -> None:
    # Quota for two more 8-GPU pods, but the free GPUs are 4 + 4 on two nodes: TAS cannot place
    # them, plain quota admission would.
    wls = [workload("a", 2, gpus=4, reserved=True, members=["a-0", "a-1"]),
           workload("c", 2, gpus=8, reserved=True, members=["c-0", "c-1"]), workload("b", 1)]
    pods = {"a-0": pod("a-0", node="n0", gpus=4), "a-1": pod("a-1", node="n1", gpus=4),
            "c-0": pod("c-0", pinned="n2"), "c-1": pod("c-1", node="n3")}
    assert admissible_now(wls, pods, NODES, QUOTA, tas=False) == ["b"]
    assert admissible_now(wls, pods, NODES, QUOTA, tas=True) == []


def test_nodes_outside_the_flavor_do_not_count() -> None:
    other = {"metadata": {"name": "x", "labels": {"pool": "cpu"}},
             "status": {"allocatable": {"nvidia.com/gpu": "8", "cpu": "96", "memory": "1Ti"}}}
    assert admissible_now([workload("b", 1)], {}, [other], QUOTA, tas=True, node_labels={"pool": "gpu"}) == []
    assert admissible_now([workload("b", 1)], {}, [other], QUOTA, tas=True, node_labels={"pool": "cpu"}) == ["b"]


def test_a_released_pod_kube_scheduler_has_not_tried_is_in_flight() -> None:
    # Kueue lifted its gates, kube-scheduler has not looked yet: PodScheduled still says
    # SchedulingGated, which a watcher of that condition reads as unschedulable.
    released = pod("b-0")
    released["status"]["phase"] = "Pending"
    released["status"]["conditions"] = [{"type": "PodScheduled", "status": "False", "reason": "SchedulingGated"}]
    tried = pod("b-1")
    tried["status"]["phase"] = "Pending"
    tried["status"]["conditions"] = [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]
    assert in_flight([workload("b", 1, reserved=True, members=["b-0"])], {"b-0": released}) == 1
    assert in_flight([workload("b", 1, reserved=True, members=["b-1"])], {"b-1": tried}) == 0


def test_in_flight_counts_gated_admitted_and_ended_but_reserved_workloads() -> None:
    wls = [workload("gated", 1, reserved=True, members=["g"]),
           workload("ended", 1, reserved=True, members=["e"]),
           workload("running", 1, reserved=True, members=["r"]),
           workload("done", 1, reserved=True, finished=True, members=["d"])]
    pods = {"g": pod("g", gated=True), "e": pod("e", node="n0", phase="Succeeded"), "r": pod("r", node="n1"),
            "d": pod("d", node="n2", phase="Succeeded")}
    assert in_flight(wls, pods) == 2


def test_gated_pods_of_a_complete_group_no_workload_owns_yet_are_in_flight() -> None:
    # The group's pods exist behind Kueue's gate but Kueue has not created its Workload: its queues
    # show nothing pending, yet it is about to act.
    def member(name: str, group: str, total: int) -> dict[str, Any]:
        p = pod(name, gated=True, phase="Pending")
        p["metadata"]["labels"] = {GROUP_LABEL: group}
        p["metadata"]["annotations"] = {GROUP_COUNT: str(total)}
        return p

    pods = {"a-0": member("a-0", "a", 2), "a-1": member("a-1", "a", 2), "c-0": member("c-0", "c", 3)}
    assert unclaimed([], pods) == ["a-0", "a-1"]  # c is incomplete: Kueue waits for its last pod
    assert in_flight([], pods) == 2
    owned = [workload("a", 2, members=["a-0", "a-1"])]
    assert unclaimed(owned, pods) == [] and in_flight(owned, pods) == 0
