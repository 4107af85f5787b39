"""The extender crashes (SIGKILL) in the middle of a burst of pods and comes back.

The invariants of docs/extender-protocol.md (Targets): every pod ends up bound, none is bound twice or to a node other than the
one kube-scheduler recorded, and no node holds more GPUs than it has. The cluster has exactly as many
GPUs as the pods request, so a GPU the restarted extender double-counts leaves a pod unbindable.
"""

from __future__ import annotations

import re
import time
from collections import Counter, defaultdict
from collections.abc import Callable

import pytest

from kubeharness import (
    ControlPlane,
    create_pods,
    gpu_node,
    gpus_requested,
    list_nodes,
    list_pods,
    llm_pod,
    node_gpus,
    pod_events,
    wait_for_node_names,
    wait_until,
)

from .conftest import ClusterScope

pytestmark = pytest.mark.integration

PODS = 30


@pytest.fixture(scope="module")
def exact_capacity(cluster: ClusterScope) -> list[str]:
    # 8 + 8 + 8 + 6 = 30 GPUs for 30 one-GPU pods.
    sizes = [8, 8, 8, 6]
    return cluster.add_nodes(
        [gpu_node(cluster.node_name(f"l4-{i}"), "L4", gpus=g, index=i) for i, g in enumerate(sizes)]
    )


def test_pods_bind_exactly_once_across_an_extender_crash(
    cluster: ClusterScope,
    control_plane: ControlPlane,
    exact_capacity: list[str],
    unique: Callable[[str], str],
) -> None:
    core, ns = cluster.core, cluster.namespace
    run = unique("burst")
    selector = f"run={run}"
    manifests = [
        llm_pod(
            f"{run}-{i:02d}",
            stage="serving",
            model_params="7B",
            precision="int8",
            gpus=1,
            labels={"run": run},
        )
        for i in range(PODS)
    ]
    names = [m["metadata"]["name"] for m in manifests]

    # First third, and crash the extender as soon as a few are bound (others are then in flight).
    create_pods(core, ns, manifests[:10])
    wait_until(
        lambda: sum(1 for p in list_pods(core, ns, selector) if p["spec"].get("nodeName")) >= 3,
        60,
        "the first pods to be bound",
        interval=0.05,
    )
    control_plane.stop_extender(crash=True)
    crashed_at = time.monotonic()

    # The rest arrive while the extender is down: kube-scheduler cannot filter them.
    create_pods(core, ns, manifests[10:])
    wait_until(
        lambda: any(
            "connection refused" in (e.get("message") or "")
            for n in names[10:]
            for e in pod_events(core, ns, n)
        ),
        60,
        "kube-scheduler to report the extender unreachable",
    )
    assert time.monotonic() - crashed_at < 60

    control_plane.start_extender()
    bound = wait_for_node_names(core, ns, names, timeout=180, label_selector=selector)
    assert len(bound) == PODS

    # Never bound twice, never moved: kube-scheduler emits one Scheduled event per successful bind,
    # naming the node; a pod bound by the extender whose answer was lost in the crash has none.
    for name in names:
        scheduled = [e for e in pod_events(core, ns, name) if e.get("reason") == "Scheduled"]
        assert len(scheduled) <= 1, f"{name} has {len(scheduled)} Scheduled events"
        for e in scheduled:
            m = re.search(r"to (\S+)$", e.get("message") or "")
            assert m and m.group(1) == bound[name], (
                f"{name}: event {e.get('message')!r} vs node {bound[name]}"
            )

    # No node over its GPU allocatable.
    used: dict[str, int] = defaultdict(int)
    for p in list_pods(core, ns, selector):
        used[p["spec"]["nodeName"]] += gpus_requested(p)
    alloc = {
        n["metadata"]["name"]: node_gpus(n)
        for n in list_nodes(core)
        if n["metadata"]["name"] in exact_capacity
    }
    over = {n: (u, alloc.get(n)) for n, u in used.items() if u > alloc.get(n, 0)}
    assert not over, f"GPUs over-committed (used, allocatable): {over}"
    assert sum(used.values()) == PODS
    assert Counter(bound.values()).keys() <= set(exact_capacity)
