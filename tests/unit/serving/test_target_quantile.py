"""The filter's target check multiplies an estimate by its group's quantile of measured / estimate
at the configured confidence (docs/stage-policy.md, "Target decision"); the calibrate command
records the quantiles from the cross-validated errors."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.base.catalog import GpuCatalog
from app.base.objects import node_object, pod_object
from app.base.workload import WorkloadError, parse_workload
from app.calibration import corpus, fit
from app.config.settings import Settings
from app.extender.service import ExtenderService
from app.extender.wiring import build_core
from app.serving.model import (
    MIN_GROUP_POINTS,
    QUANTILE_LEVELS,
    ErrorQuantiles,
    ServingCalibration,
    decision_keys,
    default_calibration,
    target_quantile,
)

ANN = "llm-placement.io/"


def spec_of(**ann: str) -> Any:
    pod = pod_object("p", stage="serving", gpus=1,
                     annotations={ANN + k.replace("_", "-"): v for k, v in ann.items()})
    return parse_workload(pod)


def service_with(cal: ServingCalibration, confidence: float = 0.9) -> ExtenderService:
    settings = Settings(cluster_source="none", metrics_port=0, serving_confidence=confidence)
    svc = build_core(settings, GpuCatalog.load())
    policy = svc.placer.policy.feasibility
    object.__setattr__(policy, "serving", cal)
    svc.absorb_node(node_object("h100", gpus=8, product="NVIDIA-H100-80GB-HBM3"))
    return svc


def flat(value: float, n: int = 50) -> ErrorQuantiles:
    return ErrorQuantiles(n=n, q={f"{p:g}": value for p in QUANTILE_LEVELS})


def rising(n: int = 50) -> ErrorQuantiles:
    """measured / estimate 0.8 at the median to 1.29 at 0.99."""
    return ErrorQuantiles(n=n, q={f"{p:g}": round(0.8 + (p - 0.5), 3) for p in QUANTILE_LEVELS})


def test_an_estimate_under_the_target_is_refused_when_its_group_is_often_slower() -> None:
    plain = default_calibration().model_copy(update={"error_quantiles": {}})
    svc = service_with(plain)
    probe = spec_of(model_params="70B", precision="int4", concurrency="2")
    fits, _ = svc.placer.evaluate_nodes(probe, ["h100"])
    est = fits["h100"].ms_per_token
    assert est is not None
    target = f"{est * 1.1:.3f}"  # met by the bare estimate, missed at a quantile of 1.2
    spec = spec_of(model_params="70B", precision="int4", concurrency="2", max_ms_per_token=target)
    fits, _ = svc.placer.evaluate_nodes(spec, ["h100"])
    assert "h100" in fits
    slow = plain.model_copy(update={"error_quantiles": {"tpot": {"int4": flat(1.2), "all": flat(1.0)}}})
    fits, rejections = service_with(slow).placer.evaluate_nodes(spec, ["h100"])
    assert "h100" not in fits
    assert rejections["h100"].message.endswith("(estimate x q90 1.20)")
    # Another group's distribution does not apply to this pod.
    other = plain.model_copy(update={"error_quantiles": {"tpot": {"moe": flat(2.0), "all": flat(1.0)}}})
    assert "h100" in service_with(other).placer.evaluate_nodes(spec, ["h100"])[0]
    # A group whose estimates run pessimistic lets a target below the estimate through.
    fast = plain.model_copy(update={"error_quantiles": {"tpot": {"int4": flat(0.8), "all": flat(1.0)}}})
    below = spec_of(model_params="70B", precision="int4", concurrency="2",
                    max_ms_per_token=f"{est * 0.9:.3f}")
    assert "h100" in service_with(fast).placer.evaluate_nodes(below, ["h100"])[0]


@pytest.mark.parametrize(("confidence", "placed"), [(0.5, True), (0.9, False)])
def test_the_confidence_setting_picks_the_quantile(confidence: float, placed: bool) -> None:
    cal = default_calibration().model_copy(update={"error_quantiles": {"tpot": {"int4": rising()}}})
    probe = spec_of(model_params="70B", precision="int4", concurrency="2")
    est = service_with(cal).placer.evaluate_nodes(probe, ["h100"])[0]["h100"].ms_per_token
    assert est is not None
    # The median says 0.8 x estimate, the 90th percentile 1.2 x: a target at the estimate.
    spec = spec_of(model_params="70B", precision="int4", concurrency="2", max_ms_per_token=f"{est:.3f}")
    fits, _ = service_with(cal, confidence).placer.evaluate_nodes(spec, ["h100"])
    assert ("h100" in fits) is placed


def test_a_small_group_borrows_from_its_parent_never_from_its_few_points() -> None:
    table = {"tpot": {"int4": flat(3.0, n=MIN_GROUP_POINTS - 1), "dense": flat(1.1), "all": flat(1.5)}}
    cal = ServingCalibration(error_quantiles=table)
    got = target_quantile(cal, "int4", "tpot", 0.9, 8)
    assert (got.group, got.factor, got.n) == ("dense", 1.1, 50)
    # With enough points the group's own is used.
    table["tpot"]["int4"] = flat(3.0, n=MIN_GROUP_POINTS)
    assert target_quantile(ServingCalibration(error_quantiles=table), "int4", "tpot", 0.9, 8).factor == 3.0
    # The narrow 16-bit dense group is recorded apart from all dense models, its parent.
    assert target_quantile(cal, "dense", "tpot", 0.9, 8).group == "dense"
    # MoE's parent is the pool; nothing recorded for a metric: factor 1, said so.
    assert target_quantile(cal, "moe", "tpot", 0.9, 8).group == "all"
    none = target_quantile(cal, "moe", "ttft", 0.9, 8)
    assert (none.factor, none.n) == (1.0, 0)
    assert "no error distribution" in none.says(10.0)


@pytest.mark.parametrize(("clients", "keys"), [
    (1, ("tp>=4, 1 client", "1 client", "all")),
    (8, ("tp>=4", "dense", "all")),
    (64, ("tp>=4", "dense", "all")),
])
def test_one_client_is_its_own_regime(clients: int, keys: tuple[str, ...]) -> None:
    # A request alone waits behind no other prompt: its first token is the tighter regime, and a
    # one-client group too small to stand alone borrows from every one-client point first.
    assert decision_keys("tp>=4", clients) == keys
    table = {"ttft": {"tp>=4": flat(1.7), "1 client": flat(1.3), "all": flat(1.5)}}
    got = target_quantile(ServingCalibration(error_quantiles=table), "tp>=4", "ttft", 0.9, clients)
    assert got.factor == (1.3 if clients == 1 else 1.7)


@given(st.floats(min_value=QUANTILE_LEVELS[0], max_value=QUANTILE_LEVELS[-1]),
       st.floats(min_value=QUANTILE_LEVELS[0], max_value=QUANTILE_LEVELS[-1]))
def test_a_higher_confidence_never_takes_a_smaller_quantile(a: float, b: float) -> None:
    q = rising()
    lo, hi = sorted((a, b))
    assert q.at(lo) <= q.at(hi) + 1e-12
    assert q.at(0.9) == pytest.approx(1.2)
    assert q.at(0.925) == pytest.approx(1.225)  # linear between the recorded levels


def test_recorded_quantiles_cover_the_errors_they_were_made_from() -> None:
    rows = corpus.packaged()
    ratios = fit.predict(rows, default_calibration())
    table = fit.error_quantiles(ratios)
    for metric, groups in table.items():
        for key, q in groups.items():
            members = [r.measured / r.estimated for r in ratios
                       if r.metric == metric and key in fit.decision_keys(r.row)]
            assert q.n == len(members)
            for p in (0.5, 0.9):
                below = sum(v <= q.at(p) + 1e-9 for v in members) / len(members)
                assert below >= p - 1 / len(members), (metric, key, p)


def test_the_shipped_calibration_records_every_group_it_decides_with() -> None:
    shipped = default_calibration()
    assert shipped.provenance.get("error_quantiles_from") == "cross-validated"
    for metric in ("tpot", "ttft"):
        assert shipped.error_quantiles[metric]["all"].n >= MIN_GROUP_POINTS
        for group in ("moe", "int4", "int8/fp8", "tp>=4", "concurrency>=16", "dense"):
            for clients in (1, 8):
                assert target_quantile(shipped, group, metric, 0.9, clients).n >= MIN_GROUP_POINTS


@pytest.mark.parametrize("bad", [0.0, -1.0, float("inf"), 1001.0])
def test_a_quantile_out_of_range_is_refused(bad: float) -> None:
    with pytest.raises(ValueError):
        ServingCalibration.model_validate({"error_quantiles": {"tpot": {"all": {"n": 5, "q": {"0.9": bad}}}}})


@pytest.mark.parametrize("bad", [0.4, 0.995, 1.0])
def test_a_confidence_outside_the_recorded_levels_is_refused(bad: float) -> None:
    with pytest.raises(ValueError, match="serving_confidence"):
        Settings(cluster_source="none", metrics_port=0, serving_confidence=bad)


@pytest.mark.parametrize(("raw", "got"), [
    ("vllm", "vllm"), ("SGLang", "sglang"), ("vllm/0.11.0", "vllm/0.11.0"), (" trtllm/1.3.0rc14 ", "trtllm/1.3.0rc14"),
    ("nim/1.8.0", "nim/1.8.0"), ("tgi", "tgi"), ("lmdeploy", "lmdeploy"),
])
def test_the_serving_engine_annotation_reads_the_known_engines(raw: str, got: str) -> None:
    assert spec_of(model_params="8B", serving_engine=raw).serving_engine == got


@pytest.mark.parametrize(("raw", "complaint"), [
    ("ollama", "is not one of vllm, sglang, trtllm, tgi, lmdeploy, nim"),
    ("vllm/", "the version after / must be"),
    ("vllm/0.11 beta", "the version after / must be"),
])
def test_an_unknown_serving_engine_is_refused_naming_the_known_ones(raw: str, complaint: str) -> None:
    with pytest.raises(WorkloadError, match=complaint):
        spec_of(model_params="8B", serving_engine=raw)


def test_a_named_engine_takes_its_own_distribution_when_it_has_enough_points() -> None:
    table = {"tpot": {"engine vllm": flat(1.4), "engine sglang": flat(0.9, n=MIN_GROUP_POINTS - 1),
                      "int4": flat(1.1), "all": flat(1.2)}}
    cal = ServingCalibration(error_quantiles=table)
    assert target_quantile(cal, "int4", "tpot", 0.9, 8, "vllm/0.11.0").factor == 1.4
    # Too few points of the engine: the pod's group, as if unstated.
    assert target_quantile(cal, "int4", "tpot", 0.9, 8, "sglang").group == "int4"
    assert target_quantile(cal, "int4", "tpot", 0.9, 8).group == "int4"
    # Through the filter: the engine's wider distribution refuses a target the group's meets.
    cal = default_calibration().model_copy(update={"error_quantiles": table})
    probe = spec_of(model_params="70B", precision="int4", concurrency="2")
    est = service_with(cal).placer.evaluate_nodes(probe, ["h100"])[0]["h100"].ms_per_token
    assert est is not None
    target = f"{est * 1.2:.3f}"
    plain = spec_of(model_params="70B", precision="int4", concurrency="2", max_ms_per_token=target)
    vllm = spec_of(model_params="70B", precision="int4", concurrency="2", max_ms_per_token=target,
                   serving_engine="vllm")
    assert "h100" in service_with(cal).placer.evaluate_nodes(plain, ["h100"])[0]
    assert "h100" not in service_with(cal).placer.evaluate_nodes(vllm, ["h100"])[0]


def test_corpus_rows_count_in_their_engine() -> None:
    rows = corpus.packaged()
    lmdeploy = next(r for r in rows if r.point.engine == "lmdeploy-turbomind")
    assert fit.decision_keys(lmdeploy)[0] == "engine lmdeploy"
    unstated = next(r for r in rows if r.point.engine == "unstated")
    assert not fit.decision_keys(unstated)[0].startswith("engine")


def _sweep(fa: dict[float, float]) -> list[dict[str, object]]:
    return [line for c, a in fa.items() for line in (
        {"confidence": c, "metric": "tpot", "false_accept": a, "false_refusal": 0.0},
        {"confidence": c, "metric": "ttft", "false_accept": 0.5, "false_refusal": 0.0})]


@pytest.mark.parametrize(("fa", "chosen"), [
    ({0.7: 0.025, 0.8: 0.018, 0.9: 0.015}, 0.8),  # the lowest within the budget
    ({0.7: 0.02, 0.8: 0.018}, 0.7),  # at the budget counts as within
    ({0.8: 0.018, 0.9: 0.025}, 0.8),  # a noisy higher level over the budget does not matter
    ({0.8: 0.03, 0.9: 0.021}, None),  # none within
])
def test_the_default_confidence_rule_takes_the_lowest_within_the_false_accept_budget(
        fa: dict[float, float], chosen: float | None) -> None:
    from bench.serving_decisions import confidence_by_rule

    assert confidence_by_rule(_sweep(fa)) == chosen


def test_the_shipped_default_confidence_is_the_one_the_recorded_sweep_chooses() -> None:
    """bench/results/serving_decisions.json is the leave-one-source-out run BENCHMARKS.md section 0
    shows; the default follows its rule, so a refit that moves the sweep moves the default."""
    import json
    from pathlib import Path

    from app.serving.model import DEFAULT_CONFIDENCE
    from bench.serving_decisions import confidence_by_rule

    recorded = json.loads((Path(__file__).parents[3] / "bench/results/serving_decisions.json").read_text())
    rule = confidence_by_rule(recorded["sweep"])
    assert recorded["confidence_by_rule"] == rule
    # No swept confidence meeting the budget leaves the default where it is (app/serving/model.py).
    assert rule in (None, DEFAULT_CONFIDENCE)


def test_groups_a_pod_without_an_engine_uses_come_from_estimates_without_one():
    """The pooled groups are what a pod naming no engine is judged by, so their errors are those
    of estimates made without the engine's own figures; the engine groups keep the named ones."""

    rows = corpus.packaged()
    cal = fit.fit(rows[:0], ServingCalibration()).model_copy(
        update={"engine_budget_scale": {**ServingCalibration().engine_budget_scale, "nim": 3.0}})
    named = fit.predict(rows, cal)
    unstated = fit.predict(rows, cal, engine=False)
    assert any(a.estimated != b.estimated for a, b in zip(named, unstated, strict=True))
    table = fit.error_quantiles(named, unstated)
    assert table["ttft"]["all"] == fit.error_quantiles(unstated)["ttft"]["all"]
    assert table["ttft"]["engine nim"] == fit.error_quantiles(named)["ttft"]["engine nim"]
    assert table["ttft"]["all"] != fit.error_quantiles(named)["ttft"]["all"]
