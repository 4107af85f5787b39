"""The gang queue through the real kube-scheduler, with the chart's gang gate (docs/gangs.md,
"Gang queue" and "Held at admission").

Cluster: eight 8-GPU H100 nodes with RDMA in two fabric blocks of four (a tier-1 label per block).
``pretrain-a`` (4 x 8 GPUs, required inside one tier-1 block, either block free) is created first,
then ``pretrain-too-big`` (6 x 8 GPUs, no topology requirement): both cannot run at once. The later
gang's members are made to reach the extender first (the race seen live, made certain by a taint
only they tolerate); still the gang created first is placed and the other waits, told which gang it
waits behind. Created the other way round, the 6-member gang is placed; a later gang that fits
beside the earlier one (a true backfill) starts at once. ``LLMP_GANG_QUEUE_RUNS`` repeats the first
scenario (default 3).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from kubeharness import (
    assert_stays_unbound,
    create_pods,
    get_pod,
    gpu_node,
    list_pods,
    llm_pod,
    scheduling_messages,
    wait_for_node_names,
    wait_until,
)

from .conftest import ClusterScope
from .test_gang import TOLERATE, delete_run, nodes_held
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
    delete_run(cluster, value)


# The race the gang queue settles, made deterministic: the later gang's members reach the extender
# first. Every node carries test_gang's HOLD taint during the test (nodes_held); the later gang
# tolerates it, so kube-scheduler sends its members to the extender while the earlier gang's
# (complete, counted, but kept off every node by kube-scheduler's own TaintToleration) wait; then
# each of them is given the toleration (a pod update), so kube-scheduler offers it every node at
# once. (Lifting the taint node by node instead would offer a member one node, replan its gang over
# that one node and drop its plan.)


def _gang(cluster: ClusterScope, run: str, name: str, size: int, required: str | None = None,
          first_to_the_extender: bool = False) -> list[str]:
    """Create a gang's members (held by the chart's gate until all exist); their names."""
    ann = {ANN + "gang-name": f"{name}-{run}", ANN + "gang-size": str(size)}
    if required:
        ann[ANN + "topology-required-placement"] = required
    pods = [llm_pod(f"{name}-{run}-{i}", stage="pretraining", gpus=8, annotations=ann, labels={"run": run})
            for i in range(size)]
    if first_to_the_extender:
        for p in pods:
            p["spec"]["tolerations"] = [TOLERATE]
    create_pods(cluster.core, cluster.namespace, pods)
    return [p["metadata"]["name"] for p in pods]


def _let_through(cluster: ClusterScope, names: list[str]) -> None:
    for name in names:
        pod = get_pod(cluster.core, cluster.namespace, name)
        tolerations = [*(pod["spec"].get("tolerations") or []), TOLERATE]
        cluster.core.patch_namespaced_pod(name, cluster.namespace, {"spec": {"tolerations": tolerations}},
                                          _preload_content=False)


def _told_to_wait_behind(cluster: ClusterScope, pod: str, gang: str) -> None:
    """kube-scheduler's FailedScheduling event names the gang ahead and where it is planned."""
    want = f"waits behind gang {cluster.namespace}/{gang} (created "
    wait_until(lambda: any(want in m and "planned on" in m
                           for m in scheduling_messages(cluster.core, cluster.namespace, pod)),
               120, f"{pod} to be told it waits behind {gang}")


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
    with nodes_held(cluster, blocks):
        a = _gang(cluster, run, "pretrain-a", 4, TIER1)
        big = _gang(cluster, run, "pretrain-too-big", 6, first_to_the_extender=True)
        _told_to_wait_behind(cluster, big[0], f"pretrain-a-{run}")
        assert not any(get_pod(cluster.core, cluster.namespace, n)["spec"].get("nodeName") for n in big)
        _let_through(cluster, a)
        placed = _bound_whole(cluster, a)
        assert len({blocks[n] for n in placed.values()}) == 1, placed
        _unbound(cluster, big, 8)


def test_created_the_other_way_round_the_six_member_gang_is_placed(
    cluster: ClusterScope, blocks: dict[str, str], gang_gate: None,  # noqa: F811
    unique: Callable[[str], str], run: str,
) -> None:
    _policy_active(cluster, unique)
    with nodes_held(cluster, blocks):
        big = _gang(cluster, run, "pretrain-too-big", 6)
        a = _gang(cluster, run, "pretrain-a", 4, TIER1, first_to_the_extender=True)
        _told_to_wait_behind(cluster, a[0], f"pretrain-too-big-{run}")
        _let_through(cluster, big)
        _bound_whole(cluster, big)
        _unbound(cluster, a, 8)


def test_a_later_gang_that_fits_beside_the_earlier_one_starts_at_once(
    cluster: ClusterScope, blocks: dict[str, str], gang_gate: None,  # noqa: F811
    unique: Callable[[str], str], run: str,
) -> None:
    _policy_active(cluster, unique)
    with nodes_held(cluster, blocks):
        a = _gang(cluster, run, "pretrain-a", 4, TIER1)
        small = _gang(cluster, run, "small", 2, first_to_the_extender=True)
        # A backfill: it fits beside the earlier gang's plan and starts while that gang is still
        # kept away from every node.
        placed = _bound_whole(cluster, small, timeout=60)
        assert not any(get_pod(cluster.core, cluster.namespace, n)["spec"].get("nodeName") for n in a)
        _let_through(cluster, a)
        placed |= _bound_whole(cluster, a)
    assert len({blocks[placed[n]] for n in a}) == 1
    assert not {placed[n] for n in a} & {placed[n] for n in small}
