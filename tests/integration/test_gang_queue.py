"""The gang queue through the real kube-scheduler, with the chart's gang gate (docs/gangs.md,
"Gang queue" and "Held at admission").

Cluster: eight 8-GPU H100 nodes with RDMA in two fabric blocks of four (a tier-1 label per block).
``pretrain-a`` (4 x 8 GPUs, required inside one tier-1 block, either block free) is created first,
then ``pretrain-too-big`` (6 x 8 GPUs, no topology requirement): both cannot run at once. The gang
created first is placed and the other waits, whichever member kube-scheduler pops first; created the
other way round, the 6-member gang is placed; a later gang that fits beside the earlier one (a true
backfill) starts at once. ``LLMP_GANG_QUEUE_RUNS`` repeats the first scenario (default 3).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from .conftest import ClusterScope
from .harness import (
    assert_stays_unbound,
    create_pods,
    delete_pods,
    gpu_node,
    list_pods,
    llm_pod,
    wait_for_node_names,
    wait_until,
)
from .test_gang_gate import _policy_active, gang_gate  # noqa: F401  (the chart's gate policies)

pytestmark = pytest.mark.integration

ANN = "llm-placement.io/"
TIER1 = "fabric.topograph.run/tier-1"
RUNS = int(os.environ.get("LLMP_GANG_QUEUE_RUNS", "3"))


@pytest.fixture(scope="module")
def blocks(cluster: ClusterScope) -> dict[str, str]:
    """Node name -> tier-1 block."""
    manifests, out = [], {}
    for b, block in enumerate(("b1", "b2")):
        for i in range(4):
            name = cluster.node_name(f"{block}-{i}")
            manifests.append(gpu_node(name, "H100", gpus=8, tier0=f"leaf-{block}", tier1=block, rdma=True,
                                      index=4 * b + i + 1))
            out[name] = block
    cluster.add_nodes(manifests)
    return out


@pytest.fixture
def run(cluster: ClusterScope, unique: Callable[[str], str]) -> Iterator[str]:
    value = unique("q")
    yield value
    delete_pods(cluster.core, cluster.namespace, f"run={value}")
    wait_until(lambda: not list_pods(cluster.core, cluster.namespace, f"run={value}"), 60,
               f"pods of {value} to be deleted")


def _gang(cluster: ClusterScope, run: str, name: str, size: int, required: str | None = None) -> list[str]:
    """Create a gang's members (held by the chart's gate until all exist); their names."""
    ann = {ANN + "gang-name": f"{name}-{run}", ANN + "gang-size": str(size)}
    if required:
        ann[ANN + "topology-required-placement"] = required
    pods = [llm_pod(f"{name}-{run}-{i}", stage="pretraining", gpus=8, annotations=ann, labels={"run": run})
            for i in range(size)]
    create_pods(cluster.core, cluster.namespace, pods)
    return [p["metadata"]["name"] for p in pods]


def _bound_whole(cluster: ClusterScope, names: list[str], timeout: float = 120) -> dict[str, str]:
    return wait_for_node_names(cluster.core, cluster.namespace, names, timeout=timeout)


def _unbound(cluster: ClusterScope, names: list[str], seconds: float) -> None:
    assert_stays_unbound(cluster.core, cluster.namespace, names[0], seconds)
    pods: list[dict[str, Any]] = [p for p in list_pods(cluster.core, cluster.namespace) if
                                  p["metadata"]["name"] in set(names)]
    assert not [p["metadata"]["name"] for p in pods if p["spec"].get("nodeName")], "half-bound gang"


@pytest.mark.parametrize("attempt", range(RUNS))
def test_the_earlier_gang_is_placed_and_the_later_one_waits(
    cluster: ClusterScope, blocks: dict[str, str], gang_gate: None,  # noqa: F811
    unique: Callable[[str], str], run: str, attempt: int,
) -> None:
    if attempt == 0:
        _policy_active(cluster, unique)
    a = _gang(cluster, run, "pretrain-a", 4, TIER1)
    big = _gang(cluster, run, "pretrain-too-big", 6)
    placed = _bound_whole(cluster, a)
    assert len({blocks[n] for n in placed.values()}) == 1, placed
    _unbound(cluster, big, 8)


def test_created_the_other_way_round_the_six_member_gang_is_placed(
    cluster: ClusterScope, blocks: dict[str, str], gang_gate: None,  # noqa: F811
    unique: Callable[[str], str], run: str,
) -> None:
    _policy_active(cluster, unique)
    big = _gang(cluster, run, "pretrain-too-big", 6)
    a = _gang(cluster, run, "pretrain-a", 4, TIER1)
    _bound_whole(cluster, big)
    _unbound(cluster, a, 8)


def test_a_later_gang_that_fits_beside_the_earlier_one_starts_at_once(
    cluster: ClusterScope, blocks: dict[str, str], gang_gate: None,  # noqa: F811
    unique: Callable[[str], str], run: str,
) -> None:
    _policy_active(cluster, unique)
    a = _gang(cluster, run, "pretrain-a", 4, TIER1)
    small = _gang(cluster, run, "small", 2)
    placed = _bound_whole(cluster, a + small)
    assert len({blocks[placed[n]] for n in a}) == 1
    assert not {placed[n] for n in a} & {placed[n] for n in small}
