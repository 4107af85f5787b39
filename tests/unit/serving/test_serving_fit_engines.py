"""A pod that names no engine is estimated with the centre of the engines the corpus measured
(docs/stage-policy.md, "The serving model"): the fit's pooled first-token figures are the
geometric mean of the per-engine ones, each measured engine keeps its own estimate, and each
engine decodes at its own share of the bandwidth efficiencies."""

from __future__ import annotations

import dataclasses
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.calibration import corpus, fit
from app.serving.model import ServingCalibration, estimate, weight_kind

SCALE = st.floats(min_value=0.05, max_value=20.0, allow_nan=False)


def loaded_rows(*engines: str) -> list[corpus.Measurement]:
    """Corpus rows of these engines whose first token depends on the prefill budget."""
    return [r for r in corpus.packaged() if r.point.engine in engines and r.point.load != "static"
            and r.point.concurrency > 1 and r.point.ttft_ms is not None]


@settings(max_examples=50, deadline=None)
@given(vllm=SCALE, sglang=SCALE, budget=st.floats(min_value=512, max_value=131072), floor=SCALE)
def test_centring_keeps_each_measured_engine_and_moves_the_pooled_figure_to_their_centre(
        vllm: float, sglang: float, budget: float, floor: float) -> None:
    rows = loaded_rows("vllm", "sglang")
    values = {**ServingCalibration().free_parameters(), "prefill_token_budget": budget,
              "engine_budget_scale.vllm": vllm, "engine_budget_scale.sglang": sglang,
              "engine_ttft_floor_scale.vllm": floor}
    got = fit.centre_engines(values, rows)
    for engine in ("vllm", "sglang"):  # the product each measured engine is estimated with
        key = f"engine_budget_scale.{engine}"
        assert got["prefill_token_budget"] * got[key] == pytest.approx(budget * values[key])
    assert got["prefill_token_budget"] == pytest.approx(budget * math.sqrt(vllm * sglang))
    # An engine the rows do not show is estimated at the centre too.
    assert got["engine_budget_scale.tgi"] == 1.0


def test_a_pod_without_an_engine_is_estimated_between_the_engines_measured() -> None:
    rows = loaded_rows("vllm", "sglang")
    assert {r.point.engine for r in rows} == {"vllm", "sglang"}
    cal = fit.fit(rows[:12], ServingCalibration())
    budgets = [cal.prefill_token_budget * cal.engine_budget_scale[e] for e in ("vllm", "sglang")]
    floors = [cal.ttft_floor_ms * cal.engine_ttft_floor_scale[e] for e in ("vllm", "sglang")]
    assert cal.prefill_token_budget == pytest.approx(math.sqrt(budgets[0] * budgets[1]), rel=1e-3)
    assert cal.ttft_floor_ms == pytest.approx(math.sqrt(floors[0] * floors[1]), rel=1e-3)
    # Hence its first token lies between the two engines' (same deployment, same load).
    case = rows[0].case()
    unnamed = estimate(dataclasses.replace(case, engine=None), cal).ttft_ms
    named = sorted(estimate(dataclasses.replace(case, engine=e), cal).ttft_ms for e in ("vllm", "sglang"))
    assert named[0] * 0.999 <= unnamed <= named[1] * 1.001



def test_an_engine_that_reads_weights_faster_is_estimated_faster_per_token() -> None:
    cal = ServingCalibration(engine_decode_scale={"trtllm": 1.25, "vllm": 0.8},
                             decode_scale_unnamed={"w16": 1.0, "all": 1.1})
    case = next(r for r in corpus.packaged() if r.point.engine == "trtllm" and r.point.concurrency == 1
                and r.point.tpot_ms is not None and r.point.precision.value == "fp16").case()
    per_token = {e: estimate(dataclasses.replace(case, engine=e), cal).ms_per_token
                 for e in ("trtllm", "vllm", None)}
    assert per_token["trtllm"] < per_token[None] < per_token["vllm"]


def test_an_unnamed_engine_decodes_at_the_centre_of_the_engines_measured_with_its_weights() -> None:
    rows = [r for r in corpus.packaged() if r.point.tpot_ms is not None]
    scales = {"vllm": 0.8, "sglang": 1.1, "trtllm": 1.2, "tgi": 1.5, "lmdeploy": 1.0, "nim": 0.9}
    got = fit.unnamed_decode_scale(ServingCalibration(engine_decode_scale=scales), rows)
    for kind in ("w16", "fp8", "int8", "int4"):
        engines = {e for r in rows if weight_kind(r.point.precision, r.gpu) == kind
                   and (e := r.point.engine.split("-", 1)[0]) in scales}
        centre = math.exp(sum(math.log(scales[e]) for e in engines) / len(engines))
        assert got[kind] == pytest.approx(centre, rel=1e-3), kind
    # int8 is measured with vLLM alone: an unnamed int8 pod decodes at vLLM's rate, not the centre's.
    assert got["int8"] == pytest.approx(scales["vllm"], rel=1e-3)
    assert got["all"] == pytest.approx(math.exp(sum(map(math.log, scales.values())) / 6), rel=1e-3)


def test_the_fit_finds_which_engine_decodes_faster() -> None:
    # LMDeploy's TurboMind and TensorRT-LLM on the same A100 and Llama-2 models at one client: with
    # an engine's own share the two sources' per-token residuals move closer.
    rows = [r for r in corpus.packaged() if r.point.tpot_ms is not None and r.point.concurrency == 1
            and r.gpu.name == "A100-SXM4-80GB" and r.point.engine in ("lmdeploy-turbomind", "trtllm")
            and r.point.precision.value == "fp16"]

    def spread(cal: ServingCalibration) -> float:
        mean = {}
        for engine in ("lmdeploy-turbomind", "trtllm"):
            logs = [math.log(r.point.tpot_ms / estimate(r.case(), cal).ms_per_token) for r in rows
                    if r.point.engine == engine and r.point.tpot_ms is not None]
            mean[engine] = sum(logs) / len(logs)
        return abs(mean["trtllm"] - mean["lmdeploy-turbomind"])

    plain = fit.fit(rows, ServingCalibration(engine_decode_scale={}))
    scaled = fit.fit(rows, ServingCalibration())
    assert spread(scaled) < spread(plain)
