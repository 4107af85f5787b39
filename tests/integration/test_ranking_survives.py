"""Modest preferences survive the real kube-scheduler under the shipped configuration.

kube-scheduler sees only our 0-10 integer and adds its own points; these tests create cases where
our preference is small (one GPU of packing, ~13 % of price, one fabric tier of distance) and the
in-tree scorers of the default profile would choose differently (bigger, emptier nodes), then check
where the pods really land and that every bind counted as agreement (docs/scoring.md).
Each test keeps its pods on its own nodes with a nodeSelector, so tests in this module cannot
interfere.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest

from kubeharness import create_pod, get_pod, gpu_node, llm_pod, wait_for_node_name, wait_for_node_names

from .conftest import ClusterScope

pytestmark = pytest.mark.integration

GROUP = "llm-placement.io/it-group"
AGREEMENT = "llm_placement_scheduler_agreement_total"


def _agreement(cluster: ClusterScope) -> dict[str, float]:
    return {o: cluster.cp.metric_value(AGREEMENT, {"outcome": o}) or 0.0
            for o in ("top", "tied_top", "lower", "unranked")}


def _in_group(pod: dict[str, Any], group: str) -> dict[str, Any]:
    pod["spec"]["nodeSelector"] = {GROUP: group}
    return pod


def test_sixteen_small_and_four_double_pods_leave_five_whole_h100_nodes(
    cluster: ClusterScope, unique: Callable[[str], str]
) -> None:
    # Eight identical 8-GPU nodes; 24 GPUs of small alignment jobs. Packed, they fill 3 nodes and
    # leave 5 whole for the next 8-GPU job. Rounded linear scores gave every node the same integer
    # and kube-scheduler's LeastAllocated spread them: 0 whole nodes.
    n = cluster.node_name
    nodes = cluster.add_nodes([
        gpu_node(n(f"pack-{i}"), "H100", gpus=8, labels={GROUP: "pack"}, index=40 + i) for i in range(8)
    ])
    cluster.wait_extender_sees_nodes()
    before = _agreement(cluster)
    names: list[str] = []
    # Interleaved as a burst of jobs arrives: 1, 1, 2, 1, 1, 2, ... then the rest of the 1-GPU pods.
    sizes = [1, 1, 2, 1, 1, 2] * 2 + [1] * 8
    assert sizes.count(1) == 16 and sizes.count(2) == 4
    for size in sizes:
        name = unique(f"sft-{size}g")
        pod = llm_pod(name, stage="alignment", model_params="1B" if size == 1 else "2B", gpus=size)
        create_pod(cluster.core, cluster.namespace, _in_group(pod, "pack"))
        names.append(name)
    placed = wait_for_node_names(cluster.core, cluster.namespace, names, timeout=120)
    used: Counter[str] = Counter()
    for name, size in zip(names, sizes, strict=True):
        used[placed[name]] += size
    assert all(v <= 8 for v in used.values()), f"over-committed: {dict(used)}"
    whole = [x for x in nodes if used[x] == 0]
    assert len(whole) == 5, f"GPUs used per node: {dict(used)}"
    after = _agreement(cluster)
    assert after["lower"] == before["lower"], (before, after)
    ranked = sum(after[o] - before[o] for o in ("top", "tied_top", "lower"))
    assert ranked == len(names), (before, after)


def test_a_node_cheaper_by_13_percent_wins_over_bigger_ones(
    cluster: ClusterScope, unique: Callable[[str], str]
) -> None:
    # Same GPU, same count; the expensive nodes have twice the CPU and memory, so kube-scheduler's own
    # LeastAllocated/BalancedAllocation scoring (default profile) would pick them.
    n = cluster.node_name
    pricey = [n(f"price-hi-{i}") for i in range(2)]
    cheap = [n(f"price-lo-{i}") for i in range(2)]
    cluster.add_nodes(
        [gpu_node(x, "L4", gpus=4, cpu="96", memory="768Gi", labels={GROUP: "price"},
                  annotations={"llm-placement.io/hourly-cost": "3.20"}, index=60 + i)
         for i, x in enumerate(pricey)]
        + [gpu_node(x, "L4", gpus=4, cpu="48", memory="192Gi", labels={GROUP: "price"},
                    annotations={"llm-placement.io/hourly-cost": "2.80"}, index=62 + i)
           for i, x in enumerate(cheap)]
    )
    cluster.wait_extender_sees_nodes()
    before = _agreement(cluster)
    names = []
    for _ in range(6):
        name = unique("chat-7b")
        pod = llm_pod(name, stage="serving", model_params="7B", precision="int8", gpus=1)
        create_pod(cluster.core, cluster.namespace, _in_group(pod, "price"))
        names.append(name)
    placed = wait_for_node_names(cluster.core, cluster.namespace, names, timeout=90)
    assert set(placed.values()) <= set(cheap), placed
    assert _agreement(cluster)["lower"] == before["lower"]


def test_consumer_lands_in_its_producers_rack(cluster: ClusterScope, unique: Callable[[str], str]) -> None:
    # The producer's node is full, so the best a consumer can get is the producer's leaf switch
    # (one fabric tier away). The other rack's nodes are bigger and emptier.
    n = cluster.node_name
    home, near = n("rack-home"), n("rack-near")
    far = [n(f"rack-far-{i}") for i in range(3)]
    cluster.add_nodes(
        [gpu_node(home, "H100", gpus=8, tier0=n("leaf-h"), tier1="spine-g", labels={GROUP: "rack"}, index=70),
         gpu_node(near, "H100", gpus=8, cpu="48", memory="512Gi", tier0=n("leaf-h"), tier1="spine-g",
                  labels={GROUP: "rack"}, index=71)]
        + [gpu_node(x, "H100", gpus=8, cpu="192", memory="2Ti", tier0=n("leaf-f"), tier1="spine-g",
                    labels={GROUP: "rack"}, index=72 + i) for i, x in enumerate(far)]
    )
    cluster.wait_extender_sees_nodes()
    producer = unique("pretrain")
    pod = llm_pod(producer, stage="pretraining", model_params="1B", gpus=8)
    pod["spec"]["nodeSelector"] = {GROUP: "rack", "kubernetes.io/hostname": home}
    create_pod(cluster.core, cluster.namespace, pod)
    assert wait_for_node_name(cluster.core, cluster.namespace, producer) == home
    before = _agreement(cluster)
    consumer = unique("sft")
    pod = llm_pod(consumer, stage="alignment", model_params="1B", gpus=1,
                  annotations={"llm-placement.io/depends-on": producer})
    create_pod(cluster.core, cluster.namespace, _in_group(pod, "rack"))
    node = wait_for_node_name(cluster.core, cluster.namespace, consumer)
    assert node == near, f"consumer on {node}, producer's rack is {near}"
    assert get_pod(cluster.core, cluster.namespace, consumer)["spec"]["nodeName"] == near
    assert _agreement(cluster)["lower"] == before["lower"]
