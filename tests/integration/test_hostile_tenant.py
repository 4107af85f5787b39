"""A hostile (or careless) tenant on the real control plane: one bad pod must cost only itself.

A pod in another namespace, for a scheduler nobody runs, requests ``nvidia.com/gpu: "1e400"`` (the
API server stores it as written). Before the fix its OverflowError killed the extender's pod watch
in a loop: later pods went unseen and a deleted pod's GPUs stayed counted; after a restart /readyz
stayed 503. Here other pods keep being placed, a deleted pod's GPUs are freed, and a restarted
extender becomes ready with the poison pod still present.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import httpx
import pytest

from app.gang.persist import ANNOTATION, PlanSigner, encode
from kubeharness import (
    create_pod,
    ensure_namespace,
    get_pod,
    gpu_node,
    llm_pod,
    wait_for_event,
    wait_for_node_name,
    wait_until,
)

from .conftest import ClusterScope

pytestmark = pytest.mark.integration


def poison_pod(name: str) -> dict[str, object]:
    pod = llm_pod(name, scheduler_name="nobody-runs-this-scheduler")
    pod["spec"]["containers"][0]["resources"] = {  # type: ignore[index]
        "requests": {"nvidia.com/gpu": "1e400"}, "limits": {"nvidia.com/gpu": "1e400"}}
    return pod


def test_poison_pod_in_another_namespace_costs_only_itself(cluster: ClusterScope,
                                                           unique: Callable[[str], str]) -> None:
    core, cp = cluster.core, cluster.cp
    [node] = cluster.add_nodes([gpu_node(cluster.node_name("h"), "H100", gpus=8, index=1)])
    other = cluster.namespace + "-b"
    ensure_namespace(core, other)
    poison = unique("poison")
    stored = create_pod(core, other, poison_pod(poison))
    # Stored (canonicalised) as written: an infinite float to any parser that reads it naively.
    assert stored["spec"]["containers"][0]["resources"]["requests"]["nvidia.com/gpu"] in ("1e400", "10e399")

    # The watch still delivers pods: a full-node pod is placed, deleted, and its GPUs come back.
    first = unique("first")
    create_pod(core, cluster.namespace, llm_pod(first, stage="serving", model_params="7B", gpus=8))
    assert wait_for_node_name(core, cluster.namespace, first) == node
    core.delete_namespaced_pod(first, cluster.namespace, grace_period_seconds=0)
    second = unique("second")
    create_pod(core, cluster.namespace, llm_pod(second, stage="serving", model_params="7B", gpus=8))
    assert wait_for_node_name(core, cluster.namespace, second) == node

    # A restart lists the poison pod again: the extender must still become ready and place pods.
    core.delete_namespaced_pod(second, cluster.namespace, grace_period_seconds=0)
    cp.restart_extender(crash=True)
    url = f"http://127.0.0.1:{cp.ports.extender}/readyz"
    wait_until(lambda: _ready(url), timeout=30, what="extender ready with a poison pod in the cluster")
    third = unique("third")
    create_pod(core, cluster.namespace, llm_pod(third, stage="serving", model_params="7B", gpus=8))
    assert wait_for_node_name(core, cluster.namespace, third) == node
    assert get_pod(core, other, poison)["spec"].get("nodeName") in (None, "")


def test_unknown_annotation_key_is_a_warning_event(cluster: ClusterScope,
                                                    unique: Callable[[str], str]) -> None:
    core = cluster.core
    cluster.add_nodes([gpu_node(cluster.node_name("w"), "H100", gpus=8, index=2)])
    name = unique("typo")
    create_pod(core, cluster.namespace, llm_pod(name, stage="serving", gpus=1,
                                                annotations={"llm-placement.io/model-param": "7B"}))
    wait_for_event(core, cluster.namespace, name, "UnknownAnnotation",
                   "did you mean llm-placement.io/model-params?")


def test_forged_gang_plans_are_refused_and_counted_after_a_restart(cluster: ClusterScope,
                                                                    unique: Callable[[str], str]) -> None:
    """A tenant writes gang-plan annotations on its own pending pods; a restarted extender restores
    none of them (docs/gangs.md, "Restored plans") and counts each refusal by reason."""
    core, cp, ns = cluster.core, cluster.cp, cluster.namespace
    [node] = cluster.add_nodes([gpu_node(cluster.node_name("f"), "H100", gpus=8, index=3)])
    now = time.time()
    # The harness runs without a signing key: age and node are what refuse these.
    forged = {"expired": (now - 3600, node), "future": (now + 3600, node),
              "unknown_node": (now, "no-such-node")}
    names = []
    for reason, (planned_at, target) in forged.items():
        name = unique("forged-" + reason.replace("_", "-"))
        group = f"{name}-gang"
        plan = encode(f"{ns}/{group}", target, planned_at, 1, f"{ns}/{name}", signer=PlanSigner(None))
        # One member of a gang of two: it waits for the other, so only the forged plan could
        # reserve anything.
        create_pod(core, ns, llm_pod(name, stage="pretraining", gpus=8,
                                     annotations={"llm-placement.io/gang-size": "2", ANNOTATION: plan},
                                     labels={"scheduling.x-k8s.io/pod-group": group}))
        names.append(name)
    cp.restart_extender(crash=True)

    def refused(reason: str) -> float:
        return cp.metric_value("llm_placement_rejected_gang_plans_total", {"reason": reason}) or 0.0

    # Refused at the restore listing: too old for the reservation TTL, or dated ahead.
    assert refused("expired") >= 1 and refused("future") >= 1
    # Restored, then released once the cache has the nodes; any filter call sweeps.
    probe = unique("probe")
    create_pod(core, ns, llm_pod(probe, stage="serving", model_params="7B", gpus=8))
    wait_until(lambda: refused("unknown_node") >= 1 or None, timeout=60,
               what="the plan on a node that does not exist released and counted")
    # Nothing was held for the forged gangs: the probe takes the whole node.
    assert wait_for_node_name(core, ns, probe) == node
    for name in [*names, probe]:
        core.delete_namespaced_pod(name, ns, grace_period_seconds=0)


def _ready(url: str) -> bool | None:
    try:
        return httpx.get(url, timeout=2).status_code == 200 or None
    except httpx.HTTPError:
        return None
