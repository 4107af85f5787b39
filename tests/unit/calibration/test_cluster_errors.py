"""The rules of ``calibrate --from-prometheus`` (docs/stage-policy.md, "Calibrating from your
cluster"): which windows are points, which groups a refit replaces, and that "after" is judged
leaving each pod out. The whole command against a real Prometheus: tests/prometheus/."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.base.catalog import GpuCatalog
from app.base.objects import node_object, pod_object
from app.base.workload import Precision, parse_workload
from app.calibration import cluster_errors as ce
from app.calibration.from_prometheus import CalibrateError, duration
from app.config.policy import LearnPolicy
from app.config.settings import Settings
from app.serving.live_profiles import PodWindow, ServingPod
from app.serving.model import (
    MIN_GROUP_POINTS,
    QUANTILE_LEVELS,
    ServingCalibration,
    default_calibration,
    serving_estimate,
)

ANN = "llm-placement.io/"
CATALOG = GpuCatalog.load()
L4 = CATALOG.lookup("NVIDIA-L4")
assert L4 is not None
POLICY = Settings(cluster_source="none").policies()
DEFAULTS = POLICY.placement.feasibility
LEARN = LearnPolicy(min_requests=10, steady_tolerance=0.25, window_seconds=60)


def pod(name: str, node: str | None = "l4", **ann: str) -> dict[str, Any]:
    obj = pod_object(name, namespace="serve", stage="serving", gpus=1,
                     annotations={ANN + k.replace("_", "-"): v for k, v in ann.items()})
    if node:
        obj["spec"]["nodeName"] = node
    return {**obj, "kind": "Pod"}


CHAT = ServingPod(parse_workload(pod("chat", model_params="1B", prompt_tokens="512")), Precision.BF16, L4)


def history(tpot_ms: list[float], requests: float = 100, ttft_ms: float | None = None,
            prompt: float | None = None, pod_name: str = "chat") -> dict[tuple[str, str], dict[float, PodWindow]]:
    return {("serve", pod_name): {
        60.0 * i: PodWindow("serve", pod_name, "vllm", requests, ms / 1000,
                            None if ttft_ms is None else ttft_ms / 1000, prompt)
        for i, ms in enumerate(tpot_ms)}}


@pytest.mark.parametrize(("tpot", "requests", "steady"), [
    ([20, 21, 22], 100, [21, 22]),  # each window after the first, with the one before agreeing
    ([20, 40, 41], 100, [41]),  # a jump: the window after it is not steady, the next one is
    ([20, 21, 22], 5, []),  # too few requests
    ([20], 100, []),  # no window before
])
def test_a_point_is_a_steady_window_with_enough_requests(
        tpot: list[float], requests: float, steady: list[float]) -> None:
    points = ce.steady_points(history(tpot, requests), {"serve/chat": CHAT}.get, DEFAULTS, LEARN)
    assert [p.measured_ms for p in points] == pytest.approx(steady)
    assert all(p.metric == "tpot" and p.pod == "serve/chat" for p in points)


def test_a_gap_in_the_windows_breaks_steadiness() -> None:
    h = history([20, 21, 22])
    h[("serve", "chat")] = {t + (30 if t else 0): w for t, w in h[("serve", "chat")].items()}
    assert [p.measured_ms for p in ce.steady_points(h, {"serve/chat": CHAT}.get, DEFAULTS, LEARN)] == [22]


def test_pods_the_cluster_does_not_know_are_left_out() -> None:
    assert ce.steady_points(history([20, 21], pod_name="other"), {"serve/chat": CHAT}.get, DEFAULTS, LEARN) == []


def test_the_first_token_is_estimated_at_the_prompts_the_engine_saw() -> None:
    got = ce.steady_points(history([20, 20], ttft_ms=300, prompt=4096), {"serve/chat": CHAT}.get,
                           DEFAULTS, LEARN)
    (ttft,) = [p for p in got if p.metric == "ttft"]
    at_4096 = serving_estimate(CHAT.spec.model_copy(update={"prompt_tokens": 4096}), Precision.BF16, L4,
                               L4.hbm_bandwidth_tbs, DEFAULTS).ttft_ms
    at_512 = serving_estimate(CHAT.spec, Precision.BF16, L4, L4.hbm_bandwidth_tbs, DEFAULTS).ttft_ms
    assert ttft.estimate_ms == pytest.approx(at_4096) and at_4096 > 2 * at_512


def point(pod_name: str, ratio: float, metric: str = "tpot") -> ce.Point:
    return ce.Point(f"serve/{pod_name}", "vllm", metric, 10.0 * ratio, 10.0, "dense", 1, None)


def test_a_group_is_replaced_only_once_the_cluster_has_enough_windows_of_it() -> None:
    cal = default_calibration()
    few = [point("a", 2.0) for _ in range(MIN_GROUP_POINTS - 1)]
    same, replaced = ce.refit(cal, few)
    assert replaced == [] and same.error_quantiles == cal.error_quantiles
    enough = [*few, point("b", 2.0)]
    got, replaced = ce.refit(cal, enough)
    assert ("tpot", "all", MIN_GROUP_POINTS) in replaced and ("tpot", "engine vllm", MIN_GROUP_POINTS) in replaced
    assert got.error_quantiles["tpot"]["all"].at(0.7) == pytest.approx(2.0)
    # The other metric and the groups the points are not in keep the calibration's.
    assert got.error_quantiles["ttft"] == cal.error_quantiles["ttft"]
    assert got.error_quantiles["tpot"]["moe"] == cal.error_quantiles["tpot"]["moe"]


def test_after_is_judged_leaving_each_pod_out() -> None:
    # Pod a's engine matches the estimate, pod b's is three times slower. Judged in-sample, b's own
    # windows would pull the quantile up; left out, b is judged by a's alone and its targets missed
    # by a third are accepted: the table shows the refit cannot know b yet.
    cal = ServingCalibration()  # no recorded distribution: the bare estimate
    points = [point("a", 1.0) for _ in range(30)] + [point("b", 3.0) for _ in range(30)]
    after = ce.judge_after(cal, points, 0.7)
    b = [j for j in after if j.point.pod == "serve/b"]
    assert all(j.quantile.factor == pytest.approx(1.0) and j.false_accept for j in b)
    a = [j for j in after if j.point.pod == "serve/a"]
    assert all(j.quantile.factor == pytest.approx(3.0) and j.false_refusal for j in a)
    before = ce.judge_before(cal, points, 0.7)
    assert all(j.quantile.n == 0 for j in before)
    (row,) = ce.rows(before, after)
    assert (row.points, row.pods, row.before_accepts, row.after_accepts, row.after_refusals) == (60, 2, 0.5, 0.5, 0.5)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.floats(0.2, 5.0), min_size=MIN_GROUP_POINTS, max_size=200))
def test_recorded_quantiles_never_claim_less_than_the_windows_show(ratios: list[float]) -> None:
    q = ce.quantiles_of(ratios)
    truth = np.quantile(np.asarray(ratios), QUANTILE_LEVELS)
    for level, value in zip(QUANTILE_LEVELS, truth, strict=True):
        assert q.q[f"{level:g}"] >= value - 1e-12
        assert q.q[f"{level:g}"] - value < 0.001 + 1e-9


def test_the_pod_table_takes_the_assigned_precision_and_skips_what_cannot_be_attributed() -> None:
    objects = [
        {**node_object("l4", gpus=4, product="NVIDIA-L4"), "kind": "Node"},
        {**node_object("cpu"), "kind": "Node"},
        pod("chat", model_params="8B", precision="bf16", **{"assigned-precision": "int8"}),
        pod("on-cpu", node="cpu", model_params="8B"),
        pod("pending", node=None, model_params="8B"),
        pod("no-size"),
        pod("bad", model_params="lots"),
        {"kind": "Service", "metadata": {"name": "x"}},
    ]
    table = ce.pod_table(objects, CATALOG, POLICY.node_facts, ("nvidia.com/gpu",))
    assert list(table) == ["serve/chat"]
    assert table["serve/chat"].precision is Precision.INT8 and table["serve/chat"].gpu.name == L4.name


@pytest.mark.parametrize(("text", "seconds"), [("600", 600), ("10m", 600), ("6h", 21600), ("7d", 604800),
                                               ("1.5h", 5400), (" 2s ", 2)])
def test_durations(text: str, seconds: float) -> None:
    assert duration(text, "--window") == seconds


@pytest.mark.parametrize("text", ["", "ten", "-5m", "0", "5w", "1e3"])
def test_bad_durations_are_named(text: str) -> None:
    with pytest.raises(CalibrateError, match="--window"):
        duration(text, "--window")


@pytest.mark.parametrize(("lookback", "window", "error"), [
    (3600, 600, None), (600, 600, "at least two windows"), (86400 * 365, 60, "at most 11000"),
])
def test_the_range_is_bounded(lookback: float, window: float, error: str | None) -> None:
    if error is None:
        assert ce.range_bounds(10_000_000, lookback, window) == (10_000_000 - lookback, 10_000_000)
    else:
        with pytest.raises(ValueError, match=error):
            ce.range_bounds(10_000_000, lookback, window)


def test_defaults_carry_the_calibration_in_use() -> None:
    # The estimate a point is judged against is the one the extender makes with that calibration.
    slow = dataclasses.replace(DEFAULTS, serving=ServingCalibration(step_floor_ms=40.0))
    fast = ce.steady_points(history([20, 20]), {"serve/chat": CHAT}.get, DEFAULTS, LEARN)[0]
    slowed = ce.steady_points(history([20, 20]), {"serve/chat": CHAT}.get, slow, LEARN)[0]
    assert slowed.estimate_ms > fast.estimate_ms + 30


def test_a_pod_is_judged_at_the_clients_its_kv_cache_holds_as_the_filter_does() -> None:
    # 8B at 16 bits on a 24 GB L4 with 64 clients of 8k tokens: the cache holds a few, the rest queue.
    busy = ServingPod(parse_workload(pod("busy", model_params="8B", concurrency="64", context_tokens="8192")),
                      Precision.BF16, L4)
    held = ce.clients_held(busy, DEFAULTS)
    assert held is not None and 1 <= held < 64
    (p,) = ce.steady_points(history([30, 30], pod_name="busy"), {"serve/busy": busy}.get, DEFAULTS, LEARN)
    assert p.clients == held
    at_held = serving_estimate(busy.spec, Precision.BF16, L4, L4.hbm_bandwidth_tbs, DEFAULTS, held)
    assert p.estimate_ms == pytest.approx(at_held.ms_per_token)
    fits, _ = placer_fit(busy)
    assert fits.clients_held == held  # the filter's own figure


def placer_fit(facts: ServingPod) -> Any:
    from app.extender.wiring import build_core

    svc = build_core(Settings(cluster_source="none", metrics_port=0), CATALOG)
    svc.absorb_node(node_object("l4", gpus=4, product="NVIDIA-L4"))
    fits, rejections = svc.placer.evaluate_nodes(facts.spec, ["l4"])
    return fits.get("l4"), rejections
