"""Filter and prioritize judge one node per class of identical nodes (app/snapshot/node_table.py,
Placer.classify): every node judged on its own (app.placement.feasibility.evaluate) must get its class's
verdict, and scoring the filter's classes must rank exactly as scoring the same nodes' fits
(the classes of app.placement.scoring.score_nodes), on generated clusters with varied usage."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.base.objects import node_object, pod_object
from app.base.reasons import Rejection
from app.base.workload import LatencyClass, Stage
from app.config.settings import Settings
from app.extender.service import ExtenderService
from app.placement.feasibility import evaluate
from app.placement.placer import FitMap
from app.placement.scoring import score_nodes
from app.snapshot.store import PlacedPod
from tests.conftest import mixed_service

# Few shapes, so that nodes of one shape differ only in usage: that is where grouping could go wrong.
PRODUCTS = [None, "NVIDIA-H100-80GB-HBM3", "NVIDIA-L4", "Tesla-T4"]
CATALOG = mixed_service().catalog

node_st = st.tuples(
    st.sampled_from(PRODUCTS),
    st.sampled_from([4, 8]),
    st.sampled_from(["32", "96"]),
    st.booleans(),  # PreferNoSchedule taint
)
usage_st = st.tuples(
    st.integers(0, 8),  # GPUs busy (clipped to the node's count)
    st.integers(0, 60),  # CPU busy, in 500m steps
    st.sampled_from([None, Stage.PRETRAINING, Stage.SERVING, Stage.ALIGNMENT]),
    st.sampled_from([LatencyClass.INTERACTIVE, LatencyClass.BATCH]),
)
pod_st = st.tuples(
    st.sampled_from(["serving", "alignment", "pretraining", "deployment", "data-prep", None]),
    st.sampled_from([0, 1, 2, 4, 8]),
    st.sampled_from([None, "1B", "7B", "13B", "70B"]),
    st.sampled_from([None, "20", "60"]),  # max-ms-per-token
    st.sampled_from(["1", "8", "30"]),
)


def build(nodes: list[tuple[Any, ...]], usage: list[tuple[Any, ...]],
          cross_shape: bool = False) -> tuple[ExtenderService, list[str]]:
    svc = ExtenderService(Settings(cluster_source="none", metrics_port=0,
                                   feature_gates={"CrossShapeGuard": cross_shape}), CATALOG)
    names = []
    for i, (product, gpus, cpu, tainted) in enumerate(nodes):
        name = f"n{i}"
        obj = node_object(name, gpus=gpus if product else 0, product=product, cpu=cpu)
        if tainted:
            obj["spec"]["taints"] = [{"key": "x", "value": "y", "effect": "PreferNoSchedule"}]
        svc.absorb_node(obj)
        names.append(name)
    for i, (busy, cpu_steps, stage, latency) in enumerate(usage[: len(names)]):
        facts = svc.snapshot.nodes[names[i]]
        busy = min(busy, facts.gpu_count)
        if busy or cpu_steps:
            svc.snapshot.place(PlacedPod(f"u{i}", f"ns/u{i}", names[i], busy, 500.0 * cpu_steps, 2**30,
                                         stage, latency, None))
    return svc, names


def spec_for(svc: ExtenderService, pod: tuple[Any, ...]) -> Any:
    stage, gpus, params, slo, cpu = pod
    ann = {}
    if params:
        ann["llm-placement.io/model-params"] = params
    if slo and stage == "serving":
        ann["llm-placement.io/max-ms-per-token"] = slo
    return svc.placer.parse(pod_object("p", stage=stage, gpus=gpus, cpu=cpu, annotations=ann, uid="uid-p"))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(nodes=st.lists(node_st, min_size=1, max_size=24), usage=st.lists(usage_st, max_size=24),
       pod=pod_st, order=st.randoms(use_true_random=False), cross_shape=st.booleans())
def test_grouped_verdicts_and_scores_equal_the_per_node_ones(
        nodes: list[tuple[Any, ...]], usage: list[tuple[Any, ...]], pod: tuple[Any, ...], order: Any,
        cross_shape: bool) -> None:
    # cross_shape also exercises the whole-node guard across shapes (docs/scoring.md).
    svc, names = build(nodes, usage, cross_shape)
    order.shuffle(names)
    names.append("not-a-node")
    spec = spec_for(svc, pod)
    placer = svc.placer
    c = placer.classify(spec, names)
    fits = FitMap(c, svc.snapshot.entries)

    # Verdicts: every node judged on its own gives the same outcome as its class.
    for i, name in enumerate(names):
        entry = svc.snapshot.entries.get(name)
        if entry is None:
            assert name not in fits
            continue
        facts, usage_now, _ = entry
        own = evaluate(spec, facts, usage_now, facts.gpu_count - usage_now.gpus, placer.policy.feasibility)
        if isinstance(own, Rejection):
            shared = c.verdicts[int(c.class_of[i])]
            # The default interactive target can reject a feasible class (it needs every verdict).
            assert name not in fits
            assert isinstance(shared, Rejection)
        else:
            if name in fits:
                fit = fits[name]
                assert fit.node is facts
                assert (fit.sizing, fit.ms_per_token, fit.pod_hourly_cost) == (
                    own.sizing, own.ms_per_token, own.pod_hourly_cost)
            else:  # only the default target may drop a feasible node
                assert "default interactive target" in c.verdicts[int(c.class_of[i])].message  # type: ignore[union-attr]

    # Scores: the filter's classes against the classes of the same nodes' fits.
    passing = [fits[n] for n in fits]
    reference = score_nodes(spec, passing, svc.snapshot.usage, placer.policy.scoring)
    batch = placer._score_positions(spec, c, c.passing)
    assert [s.node for s in batch] == [s.node for s in reference]
    for got, want in zip(batch, reference, strict=True):
        assert got.total == want.total, (got.node, got.terms, want.terms)
        assert got.score == want.score
        assert got.guarded_by == want.guarded_by
        assert got.terms == want.terms


def test_the_node_table_follows_every_usage_change() -> None:
    svc, _ = build([("NVIDIA-H100-80GB-HBM3", 8, "96", False)] * 3, [])
    snap, table = svc.snapshot, svc.snapshot.table
    spec = spec_for(svc, ("pretraining", 4, "7B", None, "8"))
    snap.assume(spec, "n1")
    row = table.index["n1"]
    assert (table.gpus_used[row], table.cpu_used[row], table.training[row]) == (4, 8000.0, 1)
    snap.unassume(spec.uid)
    assert (table.gpus_used[row], table.cpu_used[row], table.training[row]) == (0, 0.0, 0)
    # A node removed and added again starts from the usage the snapshot still holds for it.
    snap.place(PlacedPod("w", "ns/w", "n2", 2, 1000.0, 2**30, Stage.SERVING, LatencyClass.INTERACTIVE, None))
    facts = snap.nodes["n2"]
    snap.remove_node("n2")
    assert "n2" not in table.index
    assert table.rows(["n2", "n0"]).tolist() == [-1, table.index["n0"]]
    snap.upsert_node(facts)
    row = table.index["n2"]
    assert (table.gpus_used[row], table.interactive[row]) == (2, 1)
    # Growing past the initial capacity keeps every row.
    for i in range(3, 1500):
        svc.absorb_node(node_object(f"n{i}", gpus=8, product="NVIDIA-L4"))
    assert table.gpus_used[table.index["n2"]] == 2
    assert table.gpu_count[table.index["n1499"]] == 8


def test_the_row_translation_is_reused_only_for_the_same_names() -> None:
    svc, _ = build([("NVIDIA-L4", 4, "32", False)] * 4, [])
    table = svc.snapshot.table
    asked = ["n2", "n0"]
    assert table.rows(asked).tolist() == [table.index["n2"], table.index["n0"]]
    asked[0] = "n3"  # the caller reuses its list: the kept translation must not follow it
    assert table.rows(asked).tolist() == [table.index["n3"], table.index["n0"]]
    svc.snapshot.remove_node("n0")  # a name losing its row invalidates the kept translation
    assert table.rows(asked).tolist() == [table.index["n3"], -1]
