"""300 nodes of which only 3 can take the pod: kube-scheduler must show the extender every node.

kube-scheduler by default stops filtering after an adaptive sample (~50% at 300 nodes, at least 100
nodes) of in-tree-feasible nodes and sends only those to the extender. The chart sets
``percentageOfNodesToScore: 100`` (docs/extender-protocol.md); without it a node outside the first
sample is never offered, the extender rejects every node it was shown, and the pod waits for the next
cluster event (up to 5 minutes) instead of binding. The last test shows exactly that with the chart's
configuration and only that field lowered, then the shipped value placing the same pod.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from kubeharness import (
    ControlPlane,
    create_pod,
    gpu_node,
    llm_pod,
    wait_for_event,
    wait_for_node_name,
)

from .conftest import ClusterScope

pytestmark = pytest.mark.integration

NODES = 300
FEASIBLE = 3


@pytest.fixture(scope="module")
def big_cluster(cluster: ClusterScope) -> list[str]:
    n = cluster.node_name
    # L4 nodes pass every in-tree filter (GPUs, cpu, memory) but cannot hold 70B bf16 (4 x 24 GB).
    decoys = [gpu_node(n(f"l4-{i:03d}"), "L4", gpus=4, index=i) for i in range(NODES - FEASIBLE)]
    cluster.add_nodes(decoys, workers=16)
    # Created last, so they sit at the end of kube-scheduler's node order.
    return cluster.add_nodes(
        [gpu_node(n(f"h100-{i}"), "H100", gpus=8, index=NODES - FEASIBLE + i) for i in range(FEASIBLE)]
    )


def test_chart_scores_all_nodes(control_plane: ControlPlane) -> None:
    assert control_plane.chart_scheduler_config.get("percentageOfNodesToScore") == 100


def test_pod_finds_one_of_three_feasible_nodes_among_300(
    cluster: ClusterScope, big_cluster: list[str], unique: Callable[[str], str]
) -> None:
    names = [unique("serve-70b") for _ in range(FEASIBLE)]
    for name in names:
        create_pod(
            cluster.core,
            cluster.namespace,
            llm_pod(name, stage="serving", model_params="70B", precision="bf16", gpus=4),
        )
    for name in names:
        # A short timeout on purpose: a pod the sample hid would wait for a requeue, not bind quickly.
        node = wait_for_node_name(cluster.core, cluster.namespace, name, timeout=45)
        assert node in big_cluster, f"{name} landed on {node}, which cannot hold 70B bf16"


def test_a_node_outside_the_sample_is_only_found_with_every_node_scored(
    cluster: ClusterScope, control_plane: ControlPlane, big_cluster: list[str], unique: Callable[[str], str]
) -> None:
    """The failure the chart's setting prevents, reproduced with kube-scheduler itself.

    The three H100s are cordoned and a fourth is created after kube-scheduler starts, so it is the
    last node of kube-scheduler's node list (nodes listed at start come in name order, later ones are
    appended). With ``percentageOfNodesToScore: 10`` kube-scheduler stops after 100 in-tree-feasible
    nodes (its floor), all L4 decoys: the extender rejects them all and the pod stays Pending although
    a node that fits exists. With the chart's 100 the same pod binds to that node.
    """
    core = cluster.core
    for node in big_cluster:
        core.patch_node(node, {"spec": {"unschedulable": True}}, _preload_content=False)
    try:
        control_plane.restart_scheduler(overrides={"percentageOfNodesToScore": 10})
        late = cluster.add_nodes([gpu_node(cluster.node_name("zz-h100"), "H100", gpus=8, index=NODES)])[0]
        name = unique("serve-70b-sampled")
        create_pod(core, cluster.namespace,
                   llm_pod(name, stage="serving", model_params="70B", precision="bf16", gpus=4))
        # The first attempt sees only the sample (100 L4 decoys): the extender rejects them all and
        # the pod is unschedulable although a node that fits exists. (Later retries start where the
        # previous one stopped, so a retry may reach the late node: only the first attempt is judged.)
        msg = wait_for_event(core, cluster.namespace, name, "FailedScheduling", "GPU memory too small",
                             timeout=45)
        assert "0/" in msg, msg

        control_plane.restart_scheduler()  # the chart's configuration: every node scored
        assert wait_for_node_name(core, cluster.namespace, name, timeout=45) == late
    finally:
        if "-custom" in str(control_plane.scheduler_config_file):
            control_plane.restart_scheduler()
        for node in big_cluster:
            core.patch_node(node, {"spec": {"unschedulable": None}}, _preload_content=False)
