"""Fit the serving model's free parameters to measurements, and say how good the fit is.

The fit minimises the squared log ratio estimate / measured over every decode (per output token)
and first-token measurement, with a robust loss so one odd row cannot drag a whole group, and a
weak pull of each parameter toward its physical default so a parameter the data says nothing about
keeps a sensible value. How good the model is, is judged by leaving each *source* out in turn:
fit on the others, predict the left-out source (docs/stage-policy.md, "How good the estimate is").
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from app.base.workload import ServingEngine
from app.calibration.corpus import Measurement
from app.serving.model import (
    MISS,
    QUANTILE_LEVELS,
    ErrorQuantiles,
    ServingCalibration,
    engine_key,
    engine_name,
    estimate,
    narrowest_group,
    target_quantile,
    weight_kind,
)
from app.serving.model import (
    decision_keys as serving_decision_keys,
)

# Bounds per parameter family: shares of a peak figure, or times.
_BOUNDS = {
    "bandwidth_efficiency": (0.05, 1.0),
    "kv_bandwidth_efficiency": (0.05, 1.0),
    "decode_compute_efficiency": (0.02, 1.0),
    "prefill_efficiency": (0.02, 2.5),  # fp8 or int8 tensor cores against the BF16 peak
    "step_floor_ms": (0.01, 50.0),
    "layer_overhead_us": (0.01, 500.0),
    "allreduce_latency_us": (0.1, 2000.0),
    "interleave": (0.01, 5.0),
    "ttft_floor_ms": (0.1, 2000.0),
    "prefill_token_budget": (512.0, 131072.0),
    "pcie_allreduce_share": (0.1, 1.0),
    "expert_layer_prefill_us": (0.1, 20000.0),
    "sequence_overhead_us": (0.01, 2000.0),
    "engine_budget_scale": (0.05, 20.0),
    "engine_ttft_floor_scale": (0.05, 50.0),
    "engine_decode_scale": (0.3, 3.0),
    "vendor_efficiency": (0.1, 2.0),
}
PRIOR_WEIGHT = 0.1  # log-units of residual per log-unit away from the default
LOSS_SCALE = 0.25  # soft-L1 knee, in log ratio: rows off by more than ~1.3x count linearly


def _bounds(name: str) -> tuple[float, float]:
    return _BOUNDS[name.split(".", 1)[0]]


@dataclass(frozen=True, slots=True)
class Ratio:
    """One prediction judged against its measurement."""

    row: Measurement
    metric: str  # "tpot" or "ttft"
    estimated: float
    measured: float

    @property
    def ratio(self) -> float:
        return self.estimated / self.measured


def per_token(row: Measurement, ms_per_token: float, ttft_ms: float) -> float:
    """The estimate in the row's own terms: per output token, or whole request / output tokens."""
    if row.point.tpot_stat == "e2e":
        return (ttft_ms + row.point.output_tokens * ms_per_token) / row.point.output_tokens
    return ms_per_token


def predict(rows: Iterable[Measurement], cal: ServingCalibration, *, engine: bool = True) -> list[Ratio]:
    """Each row's estimates against its measurements; ``engine=False``: as a pod that does not name
    its engine is estimated (the pooled engine figures)."""
    out = []
    for row in rows:
        case = row.case()
        est = estimate(case if engine else dataclasses.replace(case, engine=None), cal)
        if row.point.tpot_ms is not None:
            out.append(Ratio(row, "tpot", per_token(row, est.ms_per_token, est.ttft_ms), row.point.tpot_ms))
        if row.point.ttft_ms is not None:
            out.append(Ratio(row, "ttft", est.ttft_ms, row.point.ttft_ms))
    return out


def fit(rows: Sequence[Measurement], start: ServingCalibration | None = None,
        provenance: dict[str, object] | None = None) -> ServingCalibration:
    """The calibration that best matches ``rows`` (unchanged parameters where they have no say)."""
    start = start or ServingCalibration()
    names = list(start.free_parameters())
    x0 = np.log([start.free_parameters()[n] for n in names])
    lo = np.log([_bounds(n)[0] for n in names])
    hi = np.log([_bounds(n)[1] for n in names])
    x0 = np.clip(x0, lo + 1e-9, hi - 1e-9)
    prior = ServingCalibration().free_parameters()
    p0 = np.log([min(max(prior[n], _bounds(n)[0]), _bounds(n)[1]) for n in names])
    targets = [(r, m, math.log(v)) for r in rows
               for m, v in (("tpot", r.point.tpot_ms), ("ttft", r.point.ttft_ms)) if v is not None]
    cases = [r.case() for r in rows]
    index = {id(r): i for i, r in enumerate(rows)}

    def residuals(x: np.ndarray) -> np.ndarray:
        cal = start.with_parameters(dict(zip(names, np.exp(x).tolist(), strict=True)))
        memo: dict[int, tuple[float, float]] = {}
        res = []
        for row, metric, logged in targets:
            i = index[id(row)]
            if i not in memo:
                e = estimate(cases[i], cal)
                memo[i] = (per_token(row, e.ms_per_token, e.ttft_ms), e.ttft_ms)
            value = memo[i][0] if metric == "tpot" else memo[i][1]
            res.append(math.log(value) - logged)
        return np.concatenate([np.asarray(res), PRIOR_WEIGHT * (x - p0)])

    if not targets:
        return start
    from scipy.optimize import least_squares  # only the calibrate command needs scipy loaded

    got = least_squares(residuals, x0, bounds=(lo, hi), loss="soft_l1", f_scale=LOSS_SCALE,
                        max_nfev=400)
    values = centre_engines(dict(zip(names, np.exp(got.x).tolist(), strict=True)), rows)
    fitted = start.with_parameters({n: float(f"{v:.4g}") for n, v in values.items()}, provenance)
    return fitted.model_copy(update={"decode_scale_unnamed": unnamed_decode_scale(fitted, rows)})


def unnamed_decode_scale(cal: ServingCalibration, rows: Sequence[Measurement]) -> dict[str, float]:
    """Per weight kind, the geometric mean of the decode scales of the engines whose per-token rows
    store weights that way ("all": of every engine with per-token rows). Per kind, not one centre:
    a kind measured with one engine only (int8 with vLLM) is known at that engine's rate, and
    moving it to the centre of engines never measured with it would be a guess."""
    engines: dict[str, set[str]] = {}
    for r in rows:
        name = engine_name(r.point.engine)
        if name is not None and r.point.tpot_ms is not None and name in cal.engine_decode_scale:
            engines.setdefault(weight_kind(r.point.precision, r.gpu), set()).add(name)
            engines.setdefault("all", set()).add(name)
    centre = {kind: math.exp(sum(math.log(cal.engine_decode_scale[e]) for e in names) / len(names))
              for kind, names in engines.items()}
    return {kind: float(f"{value:.4g}") for kind, value in centre.items()}


# Per-engine figures, each a multiple of a pooled one, and which rows tell the fit about them.
_ENGINE_SCALES = {
    "engine_budget_scale": ("prefill_token_budget",
                            lambda r: r.point.load != "static" and r.point.concurrency > 1
                            and r.point.ttft_ms is not None),
    "engine_ttft_floor_scale": ("ttft_floor_ms", lambda r: r.point.ttft_ms is not None),
}


def centre_engines(values: dict[str, float], rows: Sequence[Measurement]) -> dict[str, float]:
    """The same estimates for every engine the rows show, with the pooled figure moved to their
    centre (the geometric mean of those engines' own figures) and their scales divided by it.

    A pooled figure times a per-engine scale is identified only as the product for each engine the
    rows show; the pooled figure alone is what a pod that names no engine (and an engine the rows do
    not show) is estimated with, and the fit would leave it wherever the weak prior and the rows
    without an engine put it (a few folds of the cross-validation found 1,400 tokens per step,
    others 100,000). The centre of the engines measured is the estimate for an engine not named."""
    out = dict(values)
    for family, (pooled, informs) in _ENGINE_SCALES.items():
        shown = sorted({name for r in rows if informs(r) and (name := engine_name(r.point.engine))})
        keys = [f"{family}.{e}" for e in shown if f"{family}.{e}" in out]
        if not keys or pooled not in out:
            continue
        centre = math.exp(sum(math.log(out[k]) for k in keys) / len(keys))
        out[pooled] *= centre
        for key in keys:  # an engine the rows do not show keeps scale 1: the centre
            out[key] /= centre
    return out


MAX_FOLDS = 16  # up to 16 sources each is left out alone; more are grouped into 16 folds
CV_BUDGET_S = 300.0  # the default wall-clock budget of the cross-validation


@dataclass(frozen=True, slots=True)
class CrossValidation:
    """Held-out predictions: each fold (a source, or a group of sources when there are more than
    ``MAX_FOLDS``) predicted by a fit to every other fold."""

    ratios: list[Ratio]
    folds: int
    done: int
    sources: int
    cut: tuple[str, ...] = ()  # sources never held out: the budget ran out first
    # The same held-out rows estimated as a pod that does not name its engine is.
    unstated: tuple[Ratio, ...] = ()

    @property
    def grouped(self) -> bool:
        return self.folds < self.sources

    def describe(self) -> str:
        """One line on how the cross-validation was made, and what it left out."""
        how = (f"{self.sources} sources in {self.folds} folds of about {self.sources / self.folds:.0f}"
               if self.grouped else f"{self.sources} sources, each left out in turn")
        if not self.cut:
            return f"cross-validation: {how}"
        return (f"cross-validation: {how}; the time budget ran out after {self.done} of {self.folds} "
                f"folds; not held out ({len(self.cut)} sources): {', '.join(self.cut[:5])}"
                + (", ..." if len(self.cut) > 5 else ""))


def folds_of(rows: Sequence[Measurement], max_folds: int = MAX_FOLDS) -> list[list[str]]:
    """Sources, one per fold, or dealt round-robin (in name order) into ``max_folds`` folds."""
    sources = sorted({r.source.id for r in rows})
    n = min(len(sources), max_folds)
    return [sources[i::n] for i in range(n)] if n else []


def cross_validation(rows: Sequence[Measurement], start: ServingCalibration | None = None, *,
                     budget_s: float | None = CV_BUDGET_S, max_folds: int = MAX_FOLDS,
                     progress: Callable[[str], None] | None = None,
                     clock: Callable[[], float] = time.monotonic) -> CrossValidation:
    """One fit per fold (at most ``max_folds``), stopped once ``budget_s`` has passed: its cost
    grows with the folds, not with the sources."""
    folds = folds_of(rows, max_folds)
    began = clock()
    ratios: list[Ratio] = []
    unstated: list[Ratio] = []
    done = 0
    for fold in folds:
        if budget_s is not None and done and clock() - began >= budget_s:
            break
        if progress is not None:
            progress(", ".join(fold))
        members = set(fold)
        held = [r for r in rows if r.source.id in members]
        rest = [r for r in rows if r.source.id not in members]
        cal = fit(rest, start)
        ratios.extend(predict(held, cal))
        unstated.extend(predict(held, cal, engine=False))
        done += 1
    cut = tuple(sorted(s for fold in folds[done:] for s in fold))
    return CrossValidation(ratios, len(folds), done, sum(len(f) for f in folds), cut, tuple(unstated))


def cross_validate(rows: Sequence[Measurement], start: ServingCalibration | None = None,
                   progress: Callable[[str], None] | None = None) -> list[Ratio]:
    """Each source (or group of sources) predicted by a fit to every other."""
    return cross_validation(rows, start, budget_s=None, progress=progress).ratios


GROUPS: dict[str, Callable[[Ratio], bool]] = {
    "dense": lambda r: not r.row.moe,
    "int4": lambda r: r.row.point.precision.value == "int4",
    "int8/fp8": lambda r: r.row.point.precision.value in ("int8", "fp8"),
    "moe": lambda r: r.row.moe,
    "tp>=4": lambda r: r.row.point.tp >= 4,
    "concurrency>=16": lambda r: r.row.point.concurrency >= 16,
    "all": lambda r: True,
}


@dataclass(frozen=True, slots=True)
class GroupStats:
    group: str
    metric: str
    n: int
    median: float
    p10: float
    p90: float
    worst: float  # the ratio furthest from 1, either way
    optimistic: int  # a target at the estimate would be accepted and missed by more than MISS
    pessimistic: int  # a target the measurement meets would be refused (estimate > MISS x measured)
    within: float  # share of points within 0.7-1.4


def table(ratios: Sequence[Ratio], metric: str) -> list[GroupStats]:
    out = []
    for name, member in GROUPS.items():
        vals = np.asarray([r.ratio for r in ratios if r.metric == metric and member(r)])
        if vals.size == 0:
            continue
        worst = float(vals[np.argmax(np.abs(np.log(vals)))])
        out.append(GroupStats(name, metric, int(vals.size), float(np.median(vals)),
                              float(np.percentile(vals, 10)), float(np.percentile(vals, 90)), worst,
                              int(np.sum(vals < 1 / MISS)), int(np.sum(vals > MISS)),
                              float(np.mean((vals >= 0.7) & (vals <= 1.4)))))
    return out


def group_of(row: Measurement) -> str:
    """The one group whose margin the filter would apply to this configuration."""
    p = row.point
    return narrowest_group(row.moe, p.precision, p.gpus, p.concurrency)


def decision_keys(row: Measurement) -> tuple[str, ...]:
    """The error-distribution groups a measurement counts in: its narrowest and its parents, and a
    one-client measurement also in its one-client groups (so the narrow groups of pods under load
    keep every point of their kind, and a pod alone gets the tighter one-client figures)."""
    keys = serving_decision_keys(group_of(row), 2)
    if row.point.concurrency <= 1:
        keys = serving_decision_keys(group_of(row), 1)[:2] + keys
    engine = row.point.engine
    return (engine_key(engine), *keys) if engine.split("-", 1)[0] in ENGINES else keys


def error_quantiles(ratios: Sequence[Ratio], unstated: Sequence[Ratio] | None = None
                    ) -> dict[str, dict[str, ErrorQuantiles]]:
    """Per metric and group, quantiles of measured / estimate at QUANTILE_LEVELS (rounded up to a
    thousandth, so a recorded quantile never claims more than the points show). ``unstated``: the
    same rows estimated without their engine, which the groups a pod that names no engine uses
    are taken from (the engine groups from ``ratios``)."""
    grouped: dict[str, dict[str, list[float]]] = {}
    for r in ratios:
        keys = decision_keys(r.row)
        if unstated is not None:
            keys = tuple(k for k in keys if k.startswith("engine "))
        for key in keys:
            grouped.setdefault(r.metric, {}).setdefault(key, []).append(r.measured / r.estimated)
    for r in unstated or ():
        for key in decision_keys(r.row):
            if not key.startswith("engine "):
                grouped.setdefault(r.metric, {}).setdefault(key, []).append(r.measured / r.estimated)
    out: dict[str, dict[str, ErrorQuantiles]] = {}
    for metric, groups in grouped.items():
        for key, values in groups.items():
            got = np.quantile(np.asarray(values), QUANTILE_LEVELS)
            out.setdefault(metric, {})[key] = ErrorQuantiles(
                n=len(values), q={f"{p:g}": math.ceil(float(v) * 1000 - 1e-9) / 1000
                                  for p, v in zip(QUANTILE_LEVELS, got, strict=True)})
    return out


ENGINES = frozenset(e.value for e in ServingEngine)

# A target the hardware meets with this much to spare, and one it misses by this much: refusing
# the first and accepting the second are the decision's two errors (docs/stage-policy.md).
MET, MISSED = 1.2, 0.75


@dataclass(frozen=True, slots=True)
class Verdicts:
    """How the filter's target check fares on the points of one group."""

    group: str
    metric: str
    n: int
    factor: float  # the median factor applied in the group
    false_accepts: int  # estimate x factor within a target at MISSED x measured
    false_refusals: int  # estimate x factor over a target at MET x measured


def verdicts(ratios: Sequence[Ratio], factor: Callable[[Ratio], float]) -> list[Verdicts]:
    """Verdict counts per group, each point's estimate multiplied by ``factor``."""
    out = []
    for metric in ("tpot", "ttft"):
        for name, member in GROUPS.items():
            rows = [r for r in ratios if r.metric == metric and member(r)]
            if not rows:
                continue
            judged = sorted((r.ratio * factor(r), factor(r)) for r in rows)
            out.append(Verdicts(name, metric, len(rows), float(np.median([f for _, f in judged])),
                                sum(1 for v, _ in judged if v <= MISSED),
                                sum(1 for v, _ in judged if v > MET)))
    return out


def quantile_factor(cal: ServingCalibration, confidence: float) -> Callable[[Ratio], float]:
    """The filter's factor for a corpus point: its group's quantile at ``confidence``."""
    return lambda r: target_quantile(cal, group_of(r.row), r.metric, confidence,
                                     r.row.point.concurrency).factor


def engine_factor(cal: ServingCalibration, confidence: float) -> Callable[[Ratio], float]:
    """The same, for a pod that names its engine (the corpus row's)."""
    return lambda r: target_quantile(cal, group_of(r.row), r.metric, confidence, r.row.point.concurrency,
                                     r.row.point.engine).factor
