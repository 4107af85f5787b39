"""Data gravity in gang plans (docs/gangs.md#data-gravity): a gang member goes where the data it
reads lies, once the topology tiers are satisfied, and each member gets its own producer's node.

kube-scheduler does not rank a gang member's nodes: the planner picks them. Without this a
pretraining gang never followed its data-prep shards (a pipeline replay through the real path, in
the git history of BENCHMARKS.md, measured 0 of 17 such edges co-located)."""

from __future__ import annotations

from typing import Any

from app.base.objects import node_object, pod_object
from app.base.workload import parse_workload
from app.gang.instance import FAR, NEAR_LEAF, NEAR_NODE, NEAR_NVLINK, match_inputs, near_rank
from tests.unit.gang.test_gang_coordinator import Cluster

A100 = "NVIDIA-A100-SXM4-80GB"
H100 = "NVIDIA-H100-80GB-HBM3"
L40S = "NVIDIA-L40S"


def produced_on(c: Cluster, name: str, node: str, ns: str = "ml") -> None:
    """A data-prep pod that ran on ``node`` and finished: its output is still there."""
    pod = pod_object(name, namespace=ns, stage="data-prep", gpus=8)
    spec = parse_workload(pod)
    with c.service.lock:
        c.service.snapshot.assume(spec, node)
    c.delete(pod)


def reader_gang(c: Cluster, name: str, producers: list[str], gb: float = 100) -> list[dict[str, Any]]:
    """A gang whose member i reads producers[i]."""
    pods = []
    for i, producer in enumerate(producers):
        pod = pod_object(f"{name}-{i}", namespace="ml", stage="pretraining", gpus=8, annotations={
            "llm-placement.io/gang-size": str(len(producers)), "llm-placement.io/depends-on": producer,
            "llm-placement.io/input-data-gb": f"{gb:g}"}, labels={"scheduling.x-k8s.io/pod-group": name})
        c.add(pod)
        pods.append(pod)
    return pods


def planned(c: Cluster, gang: str) -> dict[str, str]:
    plan = c.gangs.ledger.get(f"ml/{gang}")
    assert plan is not None, "the gang was not planned"
    return {m.pod.split("/")[-1]: m.node for m in plan.members.values()}


def test_a_one_member_gang_goes_to_the_node_holding_its_input() -> None:
    c = Cluster()
    names = c.nodes("n", 8, "leaf-1")
    produced_on(c, "prep-0", "n-5")
    pods = reader_gang(c, "train", ["prep-0"])
    assert c.place(pods[0], names) == "n-5"  # all 8 nodes are otherwise identical (n-0 first by name)


def test_each_member_gets_its_own_producers_node() -> None:
    c = Cluster()
    names = c.nodes("n", 8, "leaf-1")
    produced_on(c, "prep-0", "n-6")
    produced_on(c, "prep-1", "n-3")
    pods = reader_gang(c, "train", ["prep-0", "prep-1"])
    c.place(pods[0], names)
    assert planned(c, "train") == {"train-0": "n-6", "train-1": "n-3"}
    c.flush()
    planned_events = [m for pod, reason, m in c.binder.events if reason == "GangPlanned"]
    assert len(planned_events) == 2
    assert all(m.endswith("; its input data is on this node") for m in planned_events), planned_events


def test_topology_comes_before_gravity() -> None:
    """Producers in two leaves, room for the whole gang in either: one leaf, not one each."""
    c = Cluster()
    names = c.nodes("a", 4, "leaf-1") + c.nodes("b", 4, "leaf-2")
    produced_on(c, "prep-0", "a-2")
    produced_on(c, "prep-1", "b-1")
    pods = reader_gang(c, "train", ["prep-0", "prep-1"])
    c.place(pods[0], names)
    got = planned(c, "train")
    assert len({c.leaf(n) for n in got.values()}) == 1
    assert got["train-0"] == "a-2" or got["train-1"] == "b-1"  # inside that leaf, one reads locally


def two_leaves(c: Cluster, product: str = L40S) -> list[str]:
    """leaf-1: three H100 nodes, the first busy; leaf-2: three 8-GPU nodes of ``product``, the first
    busy (both leaves equally full, so only the GPU, its price and the data tell them apart). An L40S
    trains slower than an H100 but costs less per unit of work (price over dense BF16 peak): neither
    beats the other on both, so the data decides between them."""
    names = c.nodes("h", 3, "leaf-1")
    for i in range(3):
        name = f"a-{i}"
        c.service.absorb_node(node_object(name, gpus=8, product=product, rdma=True, labels={
            "fabric.topograph.run/tier-0": "leaf-2", "fabric.topograph.run/tier-1": "spine-1"}))
        names.append(name)
    c.occupy("a-0", 8)
    return names


def test_a_busy_producer_node_still_pulls_to_its_leaf_over_a_cheaper_leaf() -> None:
    c = Cluster()
    names = two_leaves(c)
    produced_on(c, "prep-0", "h-0")
    c.occupy("h-0", 8)  # someone else took the producer's node since
    pods = reader_gang(c, "train", ["prep-0"])
    assert c.place(pods[0], names) in {"h-1", "h-2"}


def test_without_input_data_the_gang_takes_the_gpu_cheaper_per_unit_of_work() -> None:
    """The control for the test above: the same cluster without data goes to the L40S nodes."""
    c = Cluster()
    names = two_leaves(c)
    c.occupy("h-0", 8)
    pods = c.gang("train", 1)
    assert c.place(pods[0], names) in {"a-1", "a-2"}


def test_training_prices_per_unit_of_work_not_per_hour() -> None:
    """An A100 hour is half an H100 hour, but the A100's dense BF16 peak is under a third: per unit
    of work (how the scorer prices training, docs/scoring.md) the H100 is cheaper, and faster."""
    c = Cluster()
    names = two_leaves(c, A100)
    c.occupy("h-0", 8)
    pods = c.gang("train", 1)
    assert c.place(pods[0], names) in {"h-1", "h-2"}


def test_data_does_not_pull_training_onto_a_slower_dearer_gpu() -> None:
    """Its input on an A100 node, a free H100 leaf beside: the A100 loses on speed and on price per
    unit of work, so its nearness does not count (docs/data-gravity.md); an L40S leaf, cheaper per
    unit of work though slower, still wins the pull (test_a_busy_producer_node_...)."""
    c = Cluster()
    names = two_leaves(c, A100)
    c.occupy("h-0", 8)
    produced_on(c, "prep-0", "a-1")
    pods = reader_gang(c, "train", ["prep-0"])
    assert c.place(pods[0], names) in {"h-1", "h-2"}
    c = Cluster()
    names = two_leaves(c)
    c.occupy("h-0", 8)
    produced_on(c, "prep-0", "a-1")
    pods = reader_gang(c, "train", ["prep-0"])
    assert c.place(pods[0], names) == "a-1"


def test_near_rank_ladder_and_matching() -> None:
    c = Cluster()
    c.nodes("n", 3, "leaf-1")
    c.nodes("m", 2, "leaf-2")
    snap = c.service.snapshot
    rank = near_rank(snap, frozenset({"n-1"}))
    assert [rank(snap.nodes[n]) for n in ("n-1", "n-0", "m-0")] == [NEAR_NODE, NEAR_LEAF, FAR]
    assert near_rank(snap, frozenset())(snap.nodes["m-0"]) == NEAR_NODE  # no data: no pull
    # NVLink domain: two trays of one rack share a clique label.
    for i in range(2):
        c.service.absorb_node(node_object(f"t-{i}", gpus=4, product=H100, labels={
            "nvidia.com/gpu.clique": "rack-1", "fabric.topograph.run/tier-0": "leaf-3"}))
    assert near_rank(snap, frozenset({"t-0"}))(snap.nodes["t-1"]) == NEAR_NVLINK
    a, b, x = (parse_workload(pod_object(n, namespace="ml", gpus=8)) for n in ("a", "b", "x"))
    inputs = {a.uid: frozenset({"m-1"}), b.uid: frozenset({"n-2"})}
    got = {s.name: node for s, node in match_inputs(snap, [a, b, x], ["n-0", "m-1", "n-2"], inputs)}
    assert got == {"a": "m-1", "b": "n-2", "x": "n-0"}




def test_matching_a_large_gang_and_a_producer_node_that_is_gone() -> None:
    """Commit runs under the service lock: 300 members each find their own shard's node, and an
    input on a node deleted since the plan was made is ignored rather than failing the commit."""
    c = Cluster()
    names = c.nodes("n", 300, "leaf-1")
    snap = c.service.snapshot
    members = [parse_workload(pod_object(f"m-{i}", namespace="ml", gpus=8)) for i in range(300)]
    inputs = {m.uid: frozenset({names[i], "deleted-node"}) for i, m in enumerate(members)}
    got = match_inputs(snap, members, list(reversed(names)), inputs)
    assert {m.name: node for m, node in got} == {f"m-{i}": names[i] for i in range(300)}
