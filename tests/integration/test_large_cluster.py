"""300 nodes of which only 3 can take the pod: kube-scheduler must show the extender every node.

kube-scheduler by default stops filtering after an adaptive sample (~50% at 300 nodes, at least 100
nodes) of in-tree-feasible nodes and sends only those to the extender. The chart sets
``percentageOfNodesToScore: 100``; without it the H100 boxes, created last, would fall outside the
first sample, the extender would reject every node it was shown, and the pod would wait for the
next cluster event (up to 5 minutes) instead of binding.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from .conftest import ClusterScope
from .harness import ControlPlane, create_pod, gpu_node, llm_pod, wait_for_node_name

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
