"""After a kube-apiserver outage the extender sees new pods within seconds (app/cluster/backoff.py).

The watches used to back off from 0.5 s doubling to 30 s: through an outage of some seconds (plus
the apiserver's own start-up) they slept past its return, and a gang created right after it waited
23 s. Here kube-apiserver is killed, kept down, started again, and a pod created the moment it is
ready must reach the extender's cache within a few seconds, and a pod of ours must be placed.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from kubeharness import create_pod, gpu_node, llm_pod, wait_for_node_name, wait_until

from .conftest import ClusterScope

pytestmark = pytest.mark.integration

# Long enough for a doubling backoff to be deep into its schedule when the apiserver is back (it
# then needs 4-9 s to start): the 30 s-capped one next retried 16 s after the kill, then 32 s.
OUTAGE_SECONDS = 15.5
# The watches retry at least every 2 s; the rest is the list/watch round trip on a busy machine.
SEEN_WITHIN_SECONDS = 5.0


def test_pod_created_right_after_an_apiserver_restart_is_seen_within_seconds(
    cluster: ClusterScope, unique: Callable[[str], str]
) -> None:
    core, cp, ns = cluster.core, cluster.cp, cluster.namespace
    [node] = cluster.add_nodes([gpu_node(cluster.node_name("r"), "H100", gpus=8, index=1)])
    cluster.wait_extender_sees_nodes()

    def cached_pods() -> float:
        return cp.metric_value("llm_placement_cache_pods") or 0.0

    assert cp.apiserver is not None
    cp.apiserver.kill()  # a crash: every watch breaks at once
    time.sleep(OUTAGE_SECONDS)
    cp.start_apiserver()  # returns once /readyz answers
    before = cached_pods()
    # Bound at creation (no scheduler involved): only the extender's pod watch can count it.
    bound = llm_pod(unique("bound"), gpus=2, scheduler_name="default-scheduler")
    bound["spec"]["nodeName"] = node
    t0 = time.monotonic()
    create_pod(core, ns, bound)
    wait_until(lambda: cached_pods() > before or None, timeout=60,
               what="the extender's cache to count the pod created after the restart")
    seen = time.monotonic() - t0
    assert seen <= SEEN_WITHIN_SECONDS, f"pod seen {seen:.1f} s after the apiserver came back"
    # And a pod of ours is placed (kube-scheduler's own reconnection counts here too).
    ours = unique("ours")
    create_pod(core, ns, llm_pod(ours, stage="serving", model_params="7B", gpus=4))
    assert wait_for_node_name(core, ns, ours, timeout=60) == node
    for name in (bound["metadata"]["name"], ours):
        core.delete_namespaced_pod(name, ns, grace_period_seconds=0)
