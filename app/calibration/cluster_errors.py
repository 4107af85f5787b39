"""The serving model's error on the user's own cluster, from the engines' metrics in Prometheus, and
the error distribution refitted from it (docs/stage-policy.md, "Calibrating from your cluster").

The points are the learnt profiles' own windows, read back over a look-back period: every pod's
mean time per output token (and to first token) over consecutive windows, attributed to the pod's
annotations and its node's GPU as the extender does it (``app.serving.live_profiles``). A window counts
when it has ``min_requests`` requests and agrees within ``steady_tolerance`` with the pod's window
before it, the rule that makes a learnt profile. Each such steady window is one point: measured /
estimate, in the groups the filter's target decision reads (``app.serving.model``).

The refit replaces a group's recorded quantiles with the cluster's when the cluster has at least
``MIN_GROUP_POINTS`` points of that group and metric; every other group keeps the calibration's
(a decision never rests on a few windows). The before / after verdicts judge each point at a target
set at 1.2x and at 0.75x its measurement; "after" judges each pod with a refit made without its own
points (leave one pod out), so the table does not grade the refit on its own data.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from app.base.catalog import GpuCatalog
from app.base.workload import PREFIX, Precision, WorkloadError, parse_workload
from app.calibration.fit import MET, MISSED
from app.config.policy import FeasibilityPolicy, LearnPolicy, NodeFactsPolicy
from app.serving.live_profiles import PodWindow, ServingPod
from app.serving.model import (
    MIN_GROUP_POINTS,
    QUANTILE_LEVELS,
    ErrorQuantiles,
    ServingCalibration,
    TargetQuantile,
    decision_keys,
    engine_key,
    error_group,
    serving_estimate,
    target_quantile,
)
from app.serving.sizing import size
from app.snapshot.nodes import facts_for
from app.snapshot.store import serving_spec

MAX_RANGE_POINTS = 11_000  # Prometheus refuses a range query of more points per series


class ClusterDataError(ValueError):
    """No usable data: no engine series, no pod they can be attributed to, or no steady window."""


@dataclass(frozen=True, slots=True)
class Point:
    """One steady window of one pod, for one metric."""

    pod: str  # namespace/name
    engine: str  # the metrics' engine: vllm, sglang, tgi
    metric: str  # tpot or ttft
    measured_ms: float
    estimate_ms: float
    group: str  # the narrowest error group (serving_model.narrowest_group)
    clients: int
    stated_engine: str | None  # the pod's serving-engine annotation: which distribution it is judged by

    @property
    def ratio(self) -> float:
        """measured / estimate, what the error distribution records."""
        return self.measured_ms / self.estimate_ms

    def decision_groups(self) -> tuple[str, ...]:
        """The groups this point counts in, as the calibrate command records corpus points: its
        narrowest and their parents, at one client its one-client groups first, and its engine's."""
        keys = decision_keys(self.group, 2)
        if self.clients <= 1:
            keys = decision_keys(self.group, 1)[:2] + keys
        return (engine_key(self.engine), *keys)


# --- the pods: their annotations and their node's GPU ------------------------------------------------

def pod_table(objects: Iterable[dict[str, Any]], catalog: GpuCatalog, policy: NodeFactsPolicy,
              gpu_resources: tuple[str, ...]) -> dict[str, ServingPod]:
    """namespace/name -> a running GPU serving pod's workload and GPU, from pod and node objects
    (a cluster's listing, or ``kubectl get pods,nodes -A -o yaml``); other objects are skipped."""
    nodes: dict[str, Any] = {}
    pods: list[dict[str, Any]] = []
    for obj in objects:
        kind = obj.get("kind") if isinstance(obj, dict) else None
        if kind == "Node":
            try:
                facts = facts_for(obj, catalog, policy)
            except Exception:  # an odd node is skipped, as the extender's watch does
                continue
            if facts.gpu is not None:
                nodes[facts.name] = facts.gpu
        elif kind == "Pod":
            pods.append(obj)
    out: dict[str, ServingPod] = {}
    for pod in pods:
        node = (pod.get("spec") or {}).get("nodeName")
        gpu = nodes.get(node) if isinstance(node, str) else None
        if gpu is None:
            continue
        try:
            spec = serving_spec(parse_workload(pod, gpu_resources))
        except WorkloadError:
            continue
        if spec is None:
            continue
        raw = ((pod.get("metadata") or {}).get("annotations") or {}).get(PREFIX + "assigned-precision")
        try:
            precision = Precision(raw) if isinstance(raw, str) else spec.precision
        except ValueError:
            precision = spec.precision
        out[spec.key] = ServingPod(spec, precision, gpu)
    return out


# --- the range of windows read back (app.cluster.prometheus_history reads them) ----------------------

def range_bounds(end: float, lookback_s: float, window_s: float) -> tuple[float, float]:
    """(start, end) of the range query, refused when it would ask more points than Prometheus serves."""
    if lookback_s < 2 * window_s:
        raise ValueError(f"the look-back ({lookback_s:g} s) must be at least two windows "
                         f"({2 * window_s:g} s): a steady window needs the one before it")
    if lookback_s / window_s > MAX_RANGE_POINTS:
        raise ValueError(f"{lookback_s:g} s of {window_s:g} s windows is {lookback_s / window_s:.0f} "
                         f"points a series; Prometheus serves at most {MAX_RANGE_POINTS}: a longer "
                         "window or a shorter look-back")
    return end - lookback_s, end


# --- steady windows -> points -------------------------------------------------------------------------

def _ms(w: PodWindow, metric: str) -> float | None:
    s = w.tpot_s if metric == "tpot" else w.ttft_s
    return s * 1000.0 if s is not None and math.isfinite(s) and s > 0 else None


def clients_held(facts: ServingPod, defaults: FeasibilityPolicy) -> int | None:
    """The clients the pod's KV cache holds at once on its GPU, as the filter judges its latency at
    (app.placement.feasibility): the rest queue. None when nothing limits them."""
    sizing = size(facts.spec, facts.precision, default_context=defaults.default_context_tokens,
                  default_concurrency=defaults.default_concurrency,
                  alignment_extra_headroom=defaults.alignment_extra_headroom)
    usable = facts.gpu.memory_gb * (1 - defaults.memory_headroom)
    return sizing.clients_held(usable, facts.spec.gpus) or None


def steady_points(history: Mapping[tuple[str, str], Mapping[float, PodWindow]],
                  pods: Callable[[str], ServingPod | None], defaults: FeasibilityPolicy,
                  policy: LearnPolicy) -> list[Point]:
    """One point per pod, metric and steady window (requests enough, the window before agreeing)."""
    out: list[Point] = []
    step = policy.window_seconds
    for (ns, name), windows in sorted(history.items()):
        facts = pods(f"{ns}/{name}")
        if facts is None:
            continue
        spec = facts.spec
        held = clients_held(facts, defaults)
        clients = held or spec.concurrency or defaults.default_concurrency
        group = error_group(spec, facts.precision, clients)
        times = sorted(windows)
        for t in times:
            w = windows[t]
            before = windows.get(round(t - step, 3))
            if before is None or not (w.requests >= policy.min_requests
                                      and before.requests >= policy.min_requests):
                continue
            for metric in ("tpot", "ttft"):
                now, prev = _ms(w, metric), _ms(before, metric)
                if now is None or prev is None or abs(now - prev) > policy.steady_tolerance * max(now, prev):
                    continue
                # The first token is estimated at the prompts the engine really saw, when it says.
                judged = spec
                if metric == "ttft" and w.prompt_tokens and w.prompt_tokens >= 1:
                    judged = spec.model_copy(update={"prompt_tokens": max(1, round(w.prompt_tokens))})
                est = serving_estimate(judged, facts.precision, facts.gpu, facts.gpu.hbm_bandwidth_tbs,
                                       defaults, held)
                estimate = est.ms_per_token if metric == "tpot" else est.ttft_ms
                if not (estimate > 0 and math.isfinite(estimate)):
                    continue
                out.append(Point(f"{ns}/{name}", w.engine, metric, now, estimate, group, clients,
                                 spec.serving_engine))
    return out


# --- the refit ----------------------------------------------------------------------------------------

def quantiles_of(values: Sequence[float]) -> ErrorQuantiles:
    """Quantiles at QUANTILE_LEVELS, rounded up to a thousandth as the calibrate command records them."""
    got = np.quantile(np.asarray(values, dtype=float), QUANTILE_LEVELS)
    return ErrorQuantiles(n=len(values), q={f"{p:g}": math.ceil(float(v) * 1000 - 1e-9) / 1000
                                            for p, v in zip(QUANTILE_LEVELS, got, strict=True)})


def refit(cal: ServingCalibration, points: Iterable[Point], min_points: int = MIN_GROUP_POINTS
          ) -> tuple[ServingCalibration, list[tuple[str, str, int]]]:
    """``cal`` with the cluster's distribution in every group (per metric) where the cluster has
    ``min_points``; returns it and the (metric, group, points) replaced."""
    grouped: dict[str, dict[str, list[float]]] = {}
    for p in points:
        for key in p.decision_groups():
            grouped.setdefault(p.metric, {}).setdefault(key, []).append(p.ratio)
    table = {m: dict(groups) for m, groups in cal.error_quantiles.items()}
    replaced: list[tuple[str, str, int]] = []
    for metric, groups in sorted(grouped.items()):
        for key, values in sorted(groups.items()):
            if len(values) >= min_points:
                table.setdefault(metric, {})[key] = quantiles_of(values)
                replaced.append((metric, key, len(values)))
    return cal.model_copy(update={"error_quantiles": table}), replaced


# --- verdicts -----------------------------------------------------------------------------------------

def decision(cal: ServingCalibration, p: Point, confidence: float) -> TargetQuantile:
    """The quantile the filter would multiply this pod's estimate by."""
    return target_quantile(cal, p.group, p.metric, confidence, p.clients, p.stated_engine)


@dataclass(frozen=True, slots=True)
class Judged:
    point: Point
    quantile: TargetQuantile

    @property
    def false_refusal(self) -> bool:
        """A target the hardware meets with 20 % to spare, refused."""
        return self.point.estimate_ms * self.quantile.factor > MET * self.point.measured_ms

    @property
    def false_accept(self) -> bool:
        """A target the hardware misses by a third, accepted."""
        return self.point.estimate_ms * self.quantile.factor <= MISSED * self.point.measured_ms


def judge_before(cal: ServingCalibration, points: Sequence[Point], confidence: float) -> list[Judged]:
    return [Judged(p, decision(cal, p, confidence)) for p in points]


def judge_after(cal: ServingCalibration, points: Sequence[Point], confidence: float,
                min_points: int = MIN_GROUP_POINTS) -> list[Judged]:
    """Each pod judged by a refit made from the other pods' points (leave one pod out)."""
    out: list[Judged] = []
    for pod in sorted({p.pod for p in points}):
        others, _ = refit(cal, (p for p in points if p.pod != pod), min_points)
        out.extend(Judged(p, decision(others, p, confidence)) for p in points if p.pod == pod)
    return out


@dataclass(frozen=True, slots=True)
class Row:
    metric: str
    group: str
    points: int
    pods: int
    before: str  # the quantile used, e.g. "q70 1.04 (all, 394)"
    before_refusals: float
    before_accepts: float
    after: str
    after_refusals: float
    after_accepts: float


def _shown(judged: Sequence[Judged]) -> str:
    """The quantile most of these points were judged with (and how many others there were)."""
    counts: dict[tuple[str, float, int], int] = {}
    for j in judged:
        q = j.quantile
        k = (q.group, round(q.factor, 2), q.n)
        counts[k] = counts.get(k, 0) + 1
    (group, factor, n), _ = max(counts.items(), key=lambda kv: kv[1])
    conf = judged[0].quantile.confidence
    text = f"q{conf * 100:g} {factor:.2f} ({group}, {n})" if n else "none (bare estimate)"
    return text + (f" +{len(counts) - 1} more" if len(counts) > 1 else "")


def rows(before: Sequence[Judged], after: Sequence[Judged]) -> list[Row]:
    """Per metric: each narrowest group present, then every point ("all")."""
    out: list[Row] = []
    for metric in ("tpot", "ttft"):
        b = [j for j in before if j.point.metric == metric]
        a = [j for j in after if j.point.metric == metric]
        if not b:
            continue
        groups = sorted({j.point.group for j in b})
        for group in ([*groups, "all"] if len(groups) > 1 else ["all"]):
            bb = [j for j in b if group in ("all", j.point.group)]
            aa = [j for j in a if group in ("all", j.point.group)]
            n = len(bb)
            out.append(Row(metric, group if group == "all" else f"{group} (narrowest)", n,
                           len({j.point.pod for j in bb}), _shown(bb),
                           sum(j.false_refusal for j in bb) / n, sum(j.false_accept for j in bb) / n,
                           _shown(aa), sum(j.false_refusal for j in aa) / n,
                           sum(j.false_accept for j in aa) / n))
    return out
