"""The filter's target check applies each corpus group's margin to estimates (docs/stage-policy.md,
"Target margin"); the calibrate command makes the margins from the fit's own errors."""

from __future__ import annotations

from typing import Any

import pytest

from app.calibration import corpus, fit
from app.config import Settings
from app.core.catalog import GpuCatalog
from app.core.serving_model import MISS, ServingCalibration, default_calibration, target_margin
from app.core.workload import parse_workload
from app.objects import node_object, pod_object
from app.service import ExtenderService
from app.wiring import build_core

ANN = "llm-placement.io/"


def spec_of(**ann: str) -> Any:
    pod = pod_object("p", stage="serving", gpus=1,
                     annotations={ANN + k.replace("_", "-"): v for k, v in ann.items()})
    return parse_workload(pod)


def service_with(cal: ServingCalibration) -> ExtenderService:
    settings = Settings(cluster_source="none", metrics_port=0)
    svc = build_core(settings, GpuCatalog.load())
    policy = svc.placer.policy.feasibility
    object.__setattr__(policy, "serving", cal)
    svc.absorb_node(node_object("h100", gpus=8, product="NVIDIA-H100-80GB-HBM3"))
    return svc


def test_an_estimate_just_under_the_target_is_refused_when_its_group_needs_a_margin() -> None:
    plain = default_calibration().model_copy(update={"target_margin": {}})
    svc = service_with(plain)
    probe = spec_of(model_params="70B", precision="int4", concurrency="1")
    fits, _ = svc.placer.evaluate_nodes(probe, ["h100"])
    est = fits["h100"].ms_per_token
    assert est is not None
    target = f"{est * 1.1:.3f}"  # met by the bare estimate, missed with a 1.2 margin
    spec = spec_of(model_params="70B", precision="int4", concurrency="1", max_ms_per_token=target)
    fits, _ = svc.placer.evaluate_nodes(spec, ["h100"])
    assert "h100" in fits
    guarded = plain.model_copy(update={"target_margin": {"tpot": {"int4": 1.2, "all": 1.0}}})
    fits, rejections = service_with(guarded).placer.evaluate_nodes(spec, ["h100"])
    assert "h100" not in fits
    assert "x margin 1.2" in rejections["h100"].message
    # Another group's margin does not apply to this pod.
    other = plain.model_copy(update={"target_margin": {"tpot": {"moe": 2.0, "all": 1.0}}})
    fits, _ = service_with(other).placer.evaluate_nodes(spec, ["h100"])
    assert "h100" in fits


def test_margins_are_the_smallest_factor_that_keeps_every_verdict_right() -> None:
    rows = corpus.packaged()
    cal = fit.fit(rows)
    ratios = fit.predict(rows, cal)
    table = fit.margins(ratios)
    for r in ratios:
        m = table[r.metric][fit.group_of(r.row)]
        assert r.ratio * m >= 1 / MISS - 1e-9
    # The smallest: some group's margin is set by a point at exactly the limit (rounded up).
    tight = [r for r in ratios if table[r.metric][fit.group_of(r.row)] > 1.0
             and r.ratio * table[r.metric][fit.group_of(r.row)] < 1 / MISS + 0.01]
    assert tight
    for metric, groups in table.items():
        assert groups["all"] == max(groups.values())
        assert all(v >= 1.0 for v in groups.values()), metric


def test_the_shipped_calibration_accepts_no_target_a_corpus_measurement_misses() -> None:
    rows = corpus.packaged()
    shipped = default_calibration()
    ratios = fit.predict(rows, shipped)
    for v in fit.verdicts(ratios, shipped):
        assert v.accepted_but_misses == 0, v
    # Without its margins the same estimates would accept some.
    bare = shipped.model_copy(update={"target_margin": {}})
    assert sum(v.accepted_but_misses for v in fit.verdicts(ratios, bare) if v.group == "all") > 0


def test_a_group_without_a_margin_takes_the_widest() -> None:
    cal = ServingCalibration(target_margin={"tpot": {"int4": 1.3, "all": 1.3, "dense": 1.0}})
    assert target_margin(cal, "dense") == 1.0
    assert target_margin(cal, "moe") == 1.3
    assert target_margin(cal, "moe", "ttft") == 1.0  # nothing recorded for the metric


@pytest.mark.parametrize("bad", [0.5, float("inf"), 1001.0])
def test_a_margin_out_of_range_is_refused(bad: float) -> None:
    with pytest.raises(ValueError):
        ServingCalibration(target_margin={"tpot": {"all": bad}})
