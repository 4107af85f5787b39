"""Holding nodes for the oldest gang, through the real kube-scheduler (docs/gangs.md, "Starvation
bound"): the extender runs with ``gang_hold_after_seconds`` 0 (hold at once).

Cluster: four H100 boxes, three of them taken by single 8-GPU jobs. A two-node gang cannot be
placed; it holds the free box and one busy one. A 1-GPU job that would fit on the free box stays
pending; when the held busy box's job ends, the gang binds on the two held boxes.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from kubeharness import (
    ControlPlane,
    assert_stays_unbound,
    create_pods,
    delete_pods,
    gpu_node,
    list_pods,
    llm_pod,
    pod_events,
    scheduling_messages,
    wait_for_node_names,
    wait_until,
)

from .conftest import ClusterScope

pytestmark = pytest.mark.integration

ANN = "llm-placement.io/"


@pytest.fixture(scope="module")
def holding(control_plane: ControlPlane) -> Iterator[None]:
    """Restart the extender with the setting on; back to the suite's settings afterwards."""
    with control_plane.extender_settings({"LLMP_GANG_HOLD_AFTER_SECONDS": "0"}):
        yield


@pytest.fixture(scope="module")
def boxes(cluster: ClusterScope, holding: None) -> list[str]:
    manifests = [gpu_node(cluster.node_name(f"h-{i}"), "H100", gpus=8, tier0="leaf-1", tier1="spine-1",
                          rdma=True, index=i + 1) for i in range(4)]
    return sorted(cluster.add_nodes(manifests))


def job(run: str, name: str, gpus: int, stage: str = "pretraining") -> dict[str, Any]:
    return llm_pod(f"{run}-{name}", stage=stage, gpus=gpus, labels={"run": run})


def test_the_oldest_gang_holds_nodes_a_small_job_waits_and_the_gang_binds_on_them(
    cluster: ClusterScope, boxes: list[str], unique: Callable[[str], str]
) -> None:
    core, ns, run = cluster.core, cluster.namespace, unique("hold")
    try:
        busy = [job(run, f"busy-{i}", 8) for i in range(3)]
        create_pods(core, ns, busy)
        busy_on = wait_for_node_names(core, ns, [p["metadata"]["name"] for p in busy], timeout=60)
        free = (set(boxes) - set(busy_on.values())).pop()

        members = [llm_pod(f"{run}-train-{i}", stage="pretraining", gpus=8,
                           annotations={ANN + "gang-size": "2"},
                           labels={"run": run, "scheduling.x-k8s.io/pod-group": f"{run}-train"})
                   for i in range(2)]
        member_names = [p["metadata"]["name"] for p in members]
        create_pods(core, ns, members)

        def held_nodes() -> set[str]:
            for name in member_names:
                for e in pod_events(core, ns, name):
                    if e.get("reason") == "GangHoldsNodes":
                        m = re.search(r"placed on (.+) until it is", str(e.get("message") or ""))
                        if m:
                            return set(m.group(1).split(", "))
            return set()

        wait_until(lambda: bool(held_nodes()), 60, "a GangHoldsNodes event on a gang member")
        held = held_nodes()
        assert len(held) == 2 and free in held, (held, free)
        for name in member_names:
            assert_stays_unbound(core, ns, name, 0.5)

        # A 1-GPU job would fit on the free box, which the gang holds: it waits.
        small = job(run, "eval", 1, stage="alignment")
        create_pods(core, ns, [small])
        small_name = small["metadata"]["name"]
        # Its FailedScheduling names the gang that holds the free box.
        named = f"GPUs held for gang {ns}/{run}-train, the oldest gang waiting for whole nodes"
        wait_until(lambda: any(named in m for m in scheduling_messages(core, ns, small_name)),
                   60, "the small job's FailedScheduling naming the holding gang")
        assert_stays_unbound(core, ns, small_name, 2.0)

        # The held busy box's job ends: the gang binds on the two held boxes, whole.
        (held_busy,) = [p for p, node in busy_on.items() if node in held]
        core.delete_namespaced_pod(held_busy, ns, grace_period_seconds=0)
        placed = wait_for_node_names(core, ns, member_names, timeout=90)
        assert set(placed.values()) == held, (placed, held)
        assert not any(p["spec"].get("nodeName") for p in list_pods(core, ns)
                       if p["metadata"]["name"] == small_name)
    finally:
        delete_pods(core, ns, f"run={run}")
        wait_until(lambda: not list_pods(core, ns, f"run={run}"), 60, "the test's pods to be deleted")


def test_past_its_bound_the_first_waiting_gang_holds_though_nothing_else_changes(
    cluster: ClusterScope, control_plane: ControlPlane, boxes: list[str], unique: Callable[[str], str]
) -> None:
    """The starvation bound as shipped, shortened to 20 s (docs/gangs.md, "Starvation bound"): before
    it, a small job backfills the free box the gang waits for; at it, with no cluster event to bring
    the members back, the extender's own look requeues them and the gang holds; after it, small jobs
    wait and the gang binds on the held boxes once their work ends."""
    core, ns, run = cluster.core, cluster.namespace, unique("bound")
    bound = 20.0
    with control_plane.extender_settings({"LLMP_GANG_HOLD_AFTER_SECONDS": str(bound)}):
        try:
            busy = [job(run, f"busy-{i}", 8) for i in range(3)]
            create_pods(core, ns, busy)
            busy_on = wait_for_node_names(core, ns, [p["metadata"]["name"] for p in busy], timeout=60)
            members = [llm_pod(f"{run}-train-{i}", stage="pretraining", gpus=8,
                               annotations={ANN + "gang-size": "2"},
                               labels={"run": run, "scheduling.x-k8s.io/pod-group": f"{run}-train"})
                       for i in range(2)]
            member_names = [p["metadata"]["name"] for p in members]
            create_pods(core, ns, members)
            wait_until(lambda: any("gang cannot be placed" in m
                                   for n in member_names for m in scheduling_messages(core, ns, n)),
                       60, "the gang told it cannot be placed")
            told = time.monotonic()
            # Before the bound: a 1-GPU job backfills the free box.
            early = job(run, "early", 1, stage="alignment")
            create_pods(core, ns, [early])
            early_on = wait_for_node_names(core, ns, [early["metadata"]["name"]], timeout=30)
            assert early_on[early["metadata"]["name"]] not in busy_on.values()

            def held_nodes() -> set[str]:
                for name in member_names:
                    for e in pod_events(core, ns, name):
                        if e.get("reason") == "GangHoldsNodes":
                            m = re.search(r"placed on (.+) until it is", str(e.get("message") or ""))
                            if m:
                                return set(m.group(1).split(", "))
                return set()

            wait_until(lambda: bool(held_nodes()), bound + 40, "a GangHoldsNodes event at the bound")
            waited = time.monotonic() - told
            held = held_nodes()
            # Not before the bound (the event is read a little late, never early).
            assert waited >= bound - 3, waited
            assert len(held) == 2, held
            # After it: a 1-GPU job that would fit beside the early one waits.
            late = job(run, "late", 1, stage="alignment")
            create_pods(core, ns, [late])
            named = f"GPUs held for gang {ns}/{run}-train"
            wait_until(lambda: any(named in m for m in scheduling_messages(core, ns, late["metadata"]["name"])),
                       60, "the late job's FailedScheduling naming the holding gang")
            # The work on the held boxes ends: the gang binds there, whole.
            gone = [p for p, node in {**busy_on, **early_on}.items() if node in held]
            for name in gone:
                core.delete_namespaced_pod(name, ns, grace_period_seconds=0)
            placed = wait_for_node_names(core, ns, member_names, timeout=90)
            assert set(placed.values()) == held, (placed, held)
        finally:
            delete_pods(core, ns, f"run={run}")
            wait_until(lambda: not list_pods(core, ns, f"run={run}"), 60, "the test's pods to be deleted")
