"""Rank bands: the integers kube-scheduler receives keep our order; agreement is judged at bind."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from app.base.objects import node_object, pod_object
from app.base.workload import Stage
from app.config.settings import Settings
from app.extender.service import ExtenderService
from app.placement.ranking import EQUAL_TOTAL, Agreement, ScoreMapping, agreement_at, bands, best_positions
from app.placement.score_list import ScoreList
from app.snapshot.store import PlacedPod

totals = st.lists(st.floats(min_value=0.0, max_value=1.0, allow_nan=False), min_size=1, max_size=60)


@given(totals)
def test_bands_never_invert_and_best_is_ten(values: list[float]) -> None:
    got = bands(values).tolist()
    assert all(0 <= b <= 10 for b in got)
    best = max(values)
    for v, b in zip(values, got, strict=True):
        assert (b == 10) == (best - v <= EQUAL_TOTAL)
    for (v1, b1) in zip(values, got, strict=True):
        for (v2, b2) in zip(values, got, strict=True):
            if v1 > v2:
                assert b1 >= b2  # order kept (equal only at 0 or within the tolerance)


@given(totals)
def test_top_ten_distinct_totals_get_distinct_bands(values: list[float]) -> None:
    got = bands(values).tolist()
    distinct = sorted(set(values), reverse=True)
    separated = [distinct[0]]
    for v in distinct[1:]:
        if separated[-1] - v > EQUAL_TOTAL:
            separated.append(v)
    for rank, v in enumerate(separated[:10]):
        assert got[values.index(v)] == 10 - rank


def test_small_difference_survives_rank_but_not_linear() -> None:
    # The measured case: one GPU used moves the weighted total by ~0.02.
    values = [0.71, 0.69, 0.69]
    assert bands(values, ScoreMapping.LINEAR).tolist() == [7, 7, 7]
    assert bands(values).tolist() == [10, 9, 9]


def test_agreement_outcomes() -> None:
    totals = np.array([0.9, 0.9, 0.5])
    assert best_positions(totals).tolist() == [0, 1]
    assert agreement_at(totals, 0) is Agreement.TIED_TOP
    assert agreement_at(totals, 2) is Agreement.LOWER
    assert agreement_at(np.array([0.9, 0.5]), 0) is Agreement.TOP
    assert ScoreList.empty().agreement("x") is Agreement.UNRANKED


def _eight_h100(service: ExtenderService) -> list[str]:
    names = [f"h100-{i}" for i in range(8)]
    for n in names:
        service.absorb_node(node_object(n, gpus=8, product="NVIDIA-H100-80GB-HBM3", cpu="128",
                                        memory="1Ti"))
    return names


def _priorities(service: ExtenderService, pod: dict[str, Any], names: list[str]) -> dict[str, int]:
    body = json.dumps({"Pod": pod, "NodeNames": names}).encode()
    service.filter(body)
    return {e["Host"]: e["Score"] for e in json.loads(service.prioritize(body))}


def test_packing_preference_reaches_kube_scheduler_as_a_whole_band(service: ExtenderService) -> None:
    names = _eight_h100(service)
    service.snapshot.place(PlacedPod("busy", "default/busy", "h100-3", 1, 1000, 1 << 30, Stage.ALIGNMENT, None, None))
    pod = pod_object("sft", stage="alignment", gpus=1, annotations={"llm-placement.io/model-params": "1B"})
    pod["metadata"]["uid"] = "u-sft"
    prio = _priorities(service, pod, names)
    assert prio["h100-3"] == 10
    assert all(prio[n] == 9 for n in names if n != "h100-3")
    # The old linear mapping gave every node the same integer (the bug this replaces).
    old = ExtenderService(Settings(cluster_source="none", metrics_port=0, feature_gates={"ScoreRankBands": False}),
                          service.catalog)
    _eight_h100(old)
    old.snapshot.place(PlacedPod("busy", "default/busy", "h100-3", 1, 1000, 1 << 30, Stage.ALIGNMENT, None, None))
    linear = _priorities(old, pod, names)
    assert len(set(linear.values())) == 1


def test_bind_counts_agreement(service: ExtenderService) -> None:
    class Binder:
        def __init__(self) -> None:
            self.events: list[str] = []

        def bind(self, namespace: str, name: str, uid: str, node: str) -> bool:
            return True

        def annotate(self, namespace: str, name: str, annotations: dict[str, str]) -> None:
            pass

        def event(self, namespace: str, name: str, uid: str, reason: str, message: str,
                  warning: bool = False) -> None:
            self.events.append(message)

        def read_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
            return None

    binder = Binder()
    service = ExtenderService(service.settings, service.catalog, binder=binder)
    names = _eight_h100(service)
    service.snapshot.place(PlacedPod("busy", "default/busy", "h100-3", 1, 1000, 1 << 30, Stage.ALIGNMENT, None, None))

    def sample(outcome: str) -> float:
        v = service.metrics.registry.get_sample_value(
            "llm_placement_scheduler_agreement_total", {"outcome": outcome})
        return v or 0.0

    for i, chosen in enumerate(["h100-3", "h100-5"]):
        pod = pod_object(f"sft-{i}", stage="alignment", gpus=1,
                         annotations={"llm-placement.io/model-params": "1B"})
        pod["metadata"]["uid"] = f"u-{i}"
        prio = _priorities(service, pod, names)
        assert prio[chosen] == (10 if chosen == "h100-3" else 9)
        spec = service.placer.parse(pod)
        assert service.binding.bind_one("default", f"sft-{i}", f"u-{i}", chosen, spec) == ""
    assert sample("top") == 1.0 and sample("lower") == 1.0 and sample("tied_top") == 0.0
    assert "followed our ranking" in binder.events[0]
    assert "ranked lower" in binder.events[1]


@given(st.one_of(st.lists(st.sampled_from([0.0, 0.1, 0.2, 0.2 + 5e-10, 0.35, 0.5, 0.71, 0.9, 1.0]),
                          min_size=1, max_size=60),
                 st.lists(st.floats(0.0, 1.0), min_size=1, max_size=60)),
       st.sampled_from(list(ScoreMapping)))
def test_one_position_s_band_is_the_band_of_the_whole_ranking(totals: list[float], mapping: ScoreMapping) -> None:
    whole = bands(np.array(totals), mapping)
    lazy = ScoreList([f"n{i}" for i in range(len(totals))], np.array(totals), None,
                     np.zeros(len(totals), dtype=np.int64), [{}], {}, {}, {}, mapping=mapping)
    assert [lazy.band_at(i) for i in range(len(totals))] == whole.tolist()
    assert lazy.bands.tolist() == whole.tolist()


@given(st.lists(st.integers(0, 40), min_size=1, max_size=30))
def test_positions_are_the_same_before_and_after_the_name_index_is_built(asked: list[int]) -> None:
    names = [f"n{i}" for i in range(30)]
    scores = ScoreList(names, np.zeros(30), None, np.zeros(30, dtype=np.int64), [{}], {}, {}, {})
    assert [scores.position(f"n{i}") for i in asked] == [i if i < 30 else None for i in asked]
