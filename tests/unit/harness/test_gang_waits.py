"""The per-gang wait table of the replay (kubeharness/replay.py, ``GangWaits``): when a
gang could first have started on free whole nodes of one GPU model, when it did, and why it waited."""

from __future__ import annotations

from app.base.objects import node_object, pod_object
from kubeharness.replay import Gangs, GangWaits, PodState, ReplayPod, node_caps

H100, A100 = "NVIDIA-H100-80GB-HBM3", "NVIDIA-A100-SXM4-80GB"


def gang(name: str, members: int, gpus: int = 8) -> list[ReplayPod]:
    return [ReplayPod(pod_object(f"{name}-{i}", stage="pretraining", gpus=gpus, annotations={
        "llm-placement.io/gang-name": name, "llm-placement.io/gang-size": str(members)}))
        for i in range(members)]


def setup(trace: list[ReplayPod], nodes: list[dict[str, object]]) -> tuple[GangWaits, Gangs, dict[str, ReplayPod]]:
    g = Gangs(trace)
    return GangWaits(trace, g, nodes, node_caps(nodes)), g, {p.name: p for p in trace}


def run(states: dict[str, PodState], name: str, node: str) -> None:
    states[name] = PodState(node=node, phase="Running")


def test_a_gang_that_could_start_on_free_whole_nodes_and_did_not_is_timed_and_explained() -> None:
    nodes = [node_object(f"h{i}", gpus=8, product=H100) for i in range(2)]
    trace = gang("a", 2) + gang("b", 2)
    waits, gangs, by_name = setup(trace, nodes)
    created = {p.name: 0.0 for p in trace}
    states: dict[str, PodState] = {}
    for m in ("a-0", "a-1"):
        run(states, m, f"h{m[-1]}")
        gangs.bind(m, 0.0)
    waits.check(0.0, created, by_name, states)  # a holds both nodes: b cannot start
    states = {m: PodState(node=f"h{m[-1]}", phase="Succeeded") for m in ("a-0", "a-1")}
    waits.check(100.0, created, by_name, states)  # a ended: b could start now
    waits.check(400.0, created, by_name, states)  # still could: the first time is kept
    table = waits.table({"a-0": 0.0, "a-1": 0.0, "b-0": 500.0, "b-1": 500.0}, by_name)
    assert table["default/a"]["wait_s"] is None and table["default/a"]["started"] == 0.0
    assert table["default/b"]["could_start"] == 100.0 and table["default/b"]["started"] == 500.0
    assert table["default/b"]["wait_s"] == 400.0 and table["default/b"]["why"] == "nothing started meanwhile"


def test_whole_nodes_must_be_of_one_model_and_wholly_free() -> None:
    # One free H100 and one free A100: a 2 x 8 gang has no two whole nodes of one model.
    nodes = [node_object("h0", gpus=8, product=H100), node_object("a0", gpus=8, product=A100),
             node_object("h1", gpus=8, product=H100)]
    trace = [*gang("b", 2), ReplayPod(pod_object("small", gpus=1))]
    waits, _, by_name = setup(trace, nodes)
    states = {"small": PodState(node="h1", phase="Running")}  # partly used: not whole
    waits.check(0.0, {p.name: 0.0 for p in trace}, by_name, states)
    assert "default/b" not in waits.first
    states["small"] = PodState(node="h1", phase="Succeeded")
    waits.check(50.0, {p.name: 0.0 for p in trace}, by_name, states)
    assert waits.first["default/b"] == 50.0


def test_a_gang_passed_by_a_larger_one_was_held_for_it() -> None:
    nodes = [node_object(f"h{i}", gpus=8, product=H100) for i in range(4)]
    trace = gang("small", 2) + gang("big", 4)
    waits, _, by_name = setup(trace, nodes)
    waits.check(0.0, {p.name: 0.0 for p in trace}, by_name, {})
    started = {f"big-{i}": 0.0 for i in range(4)} | {f"small-{i}": 200.0 for i in range(2)}
    table = waits.table(started, by_name)
    assert table["default/small"]["wait_s"] == 200.0 and table["default/small"]["why"] == "held for a larger gang"
    assert table["default/big"]["wait_s"] is None


def test_a_gang_not_yet_complete_is_not_counted_as_able_to_start() -> None:
    nodes = [node_object(f"h{i}", gpus=8, product=H100) for i in range(2)]
    trace = gang("b", 2)
    waits, _, by_name = setup(trace, nodes)
    waits.check(0.0, {"b-0": 0.0}, by_name, {})  # b-1 not created yet
    assert "default/b" not in waits.first
