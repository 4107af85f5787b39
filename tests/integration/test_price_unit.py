"""One price unit through the real kube-scheduler (docs/node-facts.md, "Throughput").

Cluster (one per module): two A100 nodes and two nodes of a GPU product the catalog lacks, labelled
as GPU Feature Discovery would label a product it knows nothing more of (no memory or compute
capability labels), all in one fabric block with RDMA. A training gang that states no model size
is priced per unit of work on every node: the A100s' 10.99 beat the uncatalogued GPUs' penalty
figure. Before, the uncatalogued GPUs were ranked by their plain $4/GPU-hour and took the gang.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from kubeharness import (
    create_pods,
    delete_pods,
    gpu_node,
    list_pods,
    llm_pod,
    wait_for_node_names,
    wait_until,
)

from .conftest import ClusterScope

pytestmark = pytest.mark.integration

ANN = "llm-placement.io/"
ANON = "Anon-Accelerator-X"


@pytest.fixture(scope="module")
def kinds(cluster: ClusterScope) -> dict[str, str]:
    """Node name -> "a100" or "unknown"."""
    out: dict[str, str] = {}
    manifests = []
    for i, kind in enumerate(["a100", "a100", "unknown", "unknown"]):
        name = cluster.node_name(f"{kind}-{i}")
        node = gpu_node(name, "A100", gpus=8, tier0="leaf-1", tier1="spine-1", rdma=True, index=i + 1)
        if kind == "unknown":
            labels = node["metadata"]["labels"]
            labels["nvidia.com/gpu.product"] = ANON
            for key in ("nvidia.com/gpu.memory", "nvidia.com/gpu.family"):
                labels.pop(key, None)
        manifests.append(node)
        out[name] = kind
    cluster.add_nodes(manifests)
    return out


@pytest.fixture
def run(cluster: ClusterScope, unique: Callable[[str], str]) -> Iterator[str]:
    value = unique("price")
    yield value
    delete_pods(cluster.core, cluster.namespace, f"run={value}")
    wait_until(lambda: not list_pods(cluster.core, cluster.namespace, f"run={value}"), 60,
               f"pods of {value} to be deleted")


def test_a_pretraining_gang_without_a_model_size_lands_on_the_a100s(
        cluster: ClusterScope, kinds: dict[str, str], run: str) -> None:
    pods = [llm_pod(f"{run}-{i}", stage="pretraining", gpus=8,
                    annotations={ANN + "gang-size": "2"},
                    labels={"run": run, "scheduling.x-k8s.io/pod-group": f"{run}-g"}) for i in range(2)]
    create_pods(cluster.core, cluster.namespace, pods)
    placed = wait_for_node_names(cluster.core, cluster.namespace, [p["metadata"]["name"] for p in pods],
                                 timeout=120)
    assert sorted(kinds[n] for n in placed.values()) == ["a100", "a100"], placed
