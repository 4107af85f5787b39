"""The prioritize terms for every candidate at once: per class of node where a term depends on the
node's shape and the pod's fit there, per node (numpy columns) where it depends on live usage.

``app.core.scoring.score_nodes`` is the readable definition, one node at a time; this computes the
same totals, bands and whole-node guard with the same float operations in the same order, so both
rank identically (tests/unit/test_batch_scoring.py checks that on generated clusters). The filter
and prioritize hot path uses this one: at 5,000 candidates a Python loop per node cost tens of
milliseconds per request (bench/extender_latency.py; current figures in BENCHMARKS.md, section 1).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import cast, overload

import numpy as np
import numpy.typing as npt

from app.core.feasibility import NodeFit
from app.core.policy import ScoringPolicy
from app.core.ranking import EQUAL_TOTAL, MAX_EXTENDER_PRIORITY, Agreement, ScoreMapping
from app.core.scoring import (
    GRAVITY_OPENS_AT_MOST,
    GUARD_GAP,
    NEUTRAL,
    TERMS,
    NodeScore,
    _bandwidth,
    _memory_fit,
    _node_class,
    _precision,
    _preference,
    _weights_for,
    consolidates,
    work_cost,
)
from app.core.workload import TRAINING_STAGES, LatencyClass, Stage, WorkloadSpec

Floats = npt.NDArray[np.float64]
Ints = npt.NDArray[np.int64]
Bools = npt.NDArray[np.bool_]
USAGE_TERMS = ("separation", "packing", "gravity")  # the terms that vary within a class


class ScoreList(Sequence[NodeScore]):
    """Scores of one request's candidates, in request order; ``NodeScore`` objects on demand.

    Holds columns, not objects: a bind or explain asks about one or a few nodes, and building 5,000
    objects per scheduling cycle to answer that was measurable.
    """

    def __init__(self, names: list[str], totals: Floats, bands: Ints, class_of: Ints,
                 class_terms: list[dict[str, float]], columns: dict[str, Floats],
                 weights: dict[str, float], guarded_by: dict[int, str]) -> None:
        self.names = names
        self.totals = totals
        self.bands = bands
        self._class_of = class_of
        self._class_terms = class_terms
        self._columns = columns
        self._weights = weights
        self._guarded_by = guarded_by  # position -> the partly used node that outranked it
        self._pos: dict[str, int] | None = None

    def __len__(self) -> int:
        return len(self.names)

    @overload
    def __getitem__(self, i: int) -> NodeScore: ...

    @overload
    def __getitem__(self, i: slice) -> list[NodeScore]: ...

    def __getitem__(self, i: int | slice) -> NodeScore | list[NodeScore]:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        if i < 0:
            i += len(self)
        terms = {**self._class_terms[int(self._class_of[i])],
                 **{t: float(col[i]) for t, col in self._columns.items()}}
        return NodeScore(self.names[i], int(self.bands[i]), float(self.totals[i]), terms,
                         self._weights, self._guarded_by.get(i))

    def __iter__(self) -> Iterator[NodeScore]:
        return (self[i] for i in range(len(self)))

    def position(self, node: str) -> int | None:
        if self._pos is None:
            self._pos = {n: i for i, n in enumerate(self.names)}
        return self._pos.get(node)

    def get(self, node: str) -> NodeScore | None:
        i = self.position(node)
        return None if i is None else self[i]

    def take(self, names: Sequence[str]) -> ScoreList | None:
        """The scores of ``names``, in that order; None when one of them was not scored here."""
        if len(names) == len(self.names) and names == self.names:
            return self
        found = [self.position(n) for n in names]
        if any(p is None for p in found):
            return None
        pos = cast(list[int], found)
        idx = np.array(pos, dtype=np.int64)
        guarded = {k: self._guarded_by[i] for k, i in enumerate(pos) if i in self._guarded_by}
        return ScoreList(list(names), self.totals[idx], self.bands[idx], self._class_of[idx],
                         self._class_terms, {t: c[idx] for t, c in self._columns.items()},
                         self._weights, guarded)

    def best_positions(self) -> Ints:
        """Positions whose total equals the best one (within ``EQUAL_TOTAL``), in request order."""
        if not len(self.names):
            return np.zeros(0, dtype=np.int64)
        return np.flatnonzero(self.totals.max() - self.totals <= EQUAL_TOTAL)

    def agreement(self, node: str) -> Agreement:
        i = self.position(node)
        if i is None:
            return Agreement.UNRANKED
        best = self.best_positions()
        if self.totals.max() - self.totals[i] > EQUAL_TOTAL:
            return Agreement.LOWER
        return Agreement.TOP if len(best) == 1 else Agreement.TIED_TOP


def bands_for(totals: Floats, mapping: ScoreMapping) -> Ints:
    """``app.core.ranking.band_scores`` over a column."""
    if mapping is ScoreMapping.LINEAR:
        return np.clip(np.round(MAX_EXTENDER_PRIORITY * totals), 0, MAX_EXTENDER_PRIORITY).astype(np.int64)
    distinct = np.unique(totals)[::-1]  # descending
    band_of = np.zeros(len(distinct), dtype=np.int64)
    band, previous = MAX_EXTENDER_PRIORITY, None
    for k, value in enumerate(distinct.tolist()):
        if previous is not None and previous - value > EQUAL_TOTAL:
            band -= 1
            if band <= 0:
                break  # the rest stay 0
        band_of[k] = band
        previous = value
    # Map each total to its distinct value's index (``distinct`` is descending).
    idx = len(distinct) - 1 - np.searchsorted(distinct[::-1], totals)
    return band_of[idx]


def score_batch(
    spec: WorkloadSpec,
    names: list[str],
    class_fits: Sequence[NodeFit],
    class_of: Ints,
    gpus_used: Ints,
    cpu_used: Floats,
    training: Ints,
    interactive: Ints,
    policy: ScoringPolicy,
    gravity: Floats | None = None,
) -> ScoreList:
    """Score feasible candidates given as columns (one entry per node, request order).

    ``class_fits[c]``: the pod's fit on a node of class ``c`` (same shape, so same fit); ``class_of``:
    each node's class; the usage columns are the node's live counters. ``gravity``: the data-gravity
    term per node, NaN where it has none (neutral).
    """
    w = _weights_for(spec, policy).model_dump()
    interactive_pod = spec.stage is Stage.SERVING and spec.effective_latency_class is LatencyClass.INTERACTIVE
    target_ms = spec.max_ms_per_token or policy.default_interactive_ms_per_token
    present = sorted(set(class_of.tolist()))

    def unit_cost(f: NodeFit) -> float:
        return work_cost(spec, f, interactive_pod)

    reps = list({(class_fits[c].node.shape_id, class_fits[c].sizing.precision): class_fits[c]
                 for c in present}.values())
    best_cost = min(unit_cost(f) for f in reps) if reps else 0.0
    ms_values = [f.ms_per_token for f in reps if f.ms_per_token]
    best_ms = min(ms_values) if ms_values else None
    max_bw = max((f.node.gpu_bandwidth_tbs for f in reps), default=0.0)
    total_w = sum(w[t] for t in TERMS)
    gpu_pod = spec.gpus > 0

    # Terms that follow from the class alone.
    class_terms: list[dict[str, float]] = [{} for _ in class_fits]
    for c in present:
        f = class_fits[c]
        cost = unit_cost(f)
        t = {
            "memory_fit": _memory_fit(spec, f, policy.memory_headroom),
            "cost": (best_cost / cost) if cost > 0 else 1.0,
            "preference": _preference(spec, f),
            "node_class": _node_class(spec, f),
            "precision": _precision(spec, f),
        }
        t["bandwidth"] = _bandwidth(f, interactive_pod, target_ms, best_ms, max_bw, gpu_pod)
        class_terms[c] = t

    n = len(names)
    # Per-node columns of the class's node facts.
    cap_gpus = np.array([class_fits[c].node.gpu_count if class_terms[c] else 0
                         for c in range(len(class_fits))], dtype=np.int64)[class_of]
    cap_cpu = np.array([class_fits[c].node.cpu_millis if class_terms[c] else 0.0
                        for c in range(len(class_fits))], dtype=np.float64)[class_of]
    shape = np.array([class_fits[c].node.shape_id if class_terms[c] else -1
                      for c in range(len(class_fits))], dtype=np.int64)[class_of]

    # separation (app.core.scoring._separation)
    if spec.stage in TRAINING_STAGES:
        separation = np.where(interactive > 0, 0.0, 1.0)
    elif interactive_pod:
        separation = np.where(training > 0, 0.0, 1.0)
    else:
        separation = np.ones(n)

    # packing (app.core.scoring._packing), the same arithmetic per element
    packing = _packing(spec, cap_gpus, cap_cpu, gpus_used, cpu_used)
    grav = np.full(n, NEUTRAL) if gravity is None else np.where(np.isnan(gravity), NEUTRAL, gravity)
    if gravity is not None and gpu_pod and n and spec.serving_group is None:
        # app.core.scoring.GRAVITY_OPENS_AT_MOST: no pull toward opening a node far bigger than the
        # pod beyond the best pull of a candidate that fits it otherwise.
        oversized = (cap_gpus > GRAVITY_OPENS_AT_MOST * spec.gpus) & (gpus_used == 0) & ~np.isnan(gravity)
        for size in np.unique(cap_gpus[oversized]).tolist():
            # Partly used nodes and smaller whole nodes fit the pod without opening this size.
            others = gravity[((gpus_used > 0) | (cap_gpus < size)) & ~np.isnan(gravity)]
            if others.size:
                these = oversized & (cap_gpus == size)
                grav = np.where(these, np.minimum(grav, others.max()), grav)

    columns = {"separation": separation, "packing": packing, "gravity": grav}
    # Weighted mean, summed term by term in TERMS order exactly as score_nodes' ``weighted`` does.
    acc: Floats | None = None
    for term in TERMS:
        if term in columns:
            col = columns[term] * w[term]
        else:
            col = np.array([class_terms[c].get(term, 0.0) if class_terms[c] else 0.0
                            for c in range(len(class_fits))], dtype=np.float64)[class_of] * w[term]
        acc = col if acc is None else acc + col
    totals = acc / total_w if acc is not None and total_w > 0 else np.zeros(n)

    guarded: dict[int, str] = {}
    if gpu_pod and policy.whole_node_guard and n:
        guarded = _guard(names, totals, packing, separation, shape, cap_gpus, gpus_used, spec.gpus,
                         class_of, class_terms, policy.stranded_idle_share)
    return ScoreList(names, totals, bands_for(totals, policy.score_mapping), class_of, class_terms,
                     columns, w, guarded)


def _packing(spec: WorkloadSpec, cap_gpus: Ints, cap_cpu: Floats, gpus_used: Ints,
             cpu_used: Floats) -> Floats:
    with np.errstate(divide="ignore", invalid="ignore"):
        gpu_node = (cap_gpus > 0) & (cap_cpu > 0)
        cpu_per_gpu = np.where(gpu_node, cap_cpu / np.where(cap_gpus > 0, cap_gpus, 1), 1.0)
        free_after = cap_gpus - gpus_used - spec.gpus
        cpu_after = cap_cpu - cpu_used - spec.cpu_millis
        ratio = np.minimum(1.0, np.maximum(0.0, cpu_after) / (free_after * cpu_per_gpu))
        balance = np.where(free_after <= 0, 1.0, ratio)
        if spec.gpus > 0:
            gpu_term = np.minimum(1.0, (gpus_used + spec.gpus) / np.where(cap_gpus > 0, cap_gpus, 1)) * (
                0.5 + 0.5 * balance)
        else:
            gpu_term = np.where(free_after <= 0, 1.0, 0.5 * balance)
        cpu_term = np.minimum(1.0, (cpu_used + spec.cpu_millis) / np.where(cap_cpu > 0, cap_cpu, 1.0))
        return np.where(gpu_node, gpu_term, np.where(cap_cpu > 0, cpu_term, NEUTRAL))


def _guard(names: list[str], totals: Floats, packing: Floats, separation: Floats, shape: Ints,
           cap_gpus: Ints, gpus_used: Ints, pod_gpus: int, class_of: Ints,
           class_terms: list[dict[str, float]], idle_share: float) -> dict[int, str]:
    """``app.core.scoring._guard`` over columns; lowers ``totals`` in place, returns who guarded."""
    opens = (cap_gpus > 0) & (gpus_used == 0) & (pod_gpus < cap_gpus)
    sibling = (cap_gpus > 0) & ~opens & (separation >= 1.0)
    guarded: dict[int, str] = {}
    if not opens.any() or not sibling.any():
        return guarded
    original = totals.copy()  # siblings are judged on their own totals, before any lowering
    # Each shape's best partly used node (first of the best in request order), best first; on
    # equal totals the earlier in request order, as score_nodes orders them.
    best: list[int] = []
    for s in np.unique(shape[sibling]).tolist():
        sib = np.flatnonzero(sibling & (shape == s))
        best.append(int(sib[np.argmax(original[sib])]))
    best.sort(key=lambda b: (-float(original[b]), b))
    for s in np.unique(shape[opens]).tolist():
        at = np.flatnonzero(opens & (shape == s))
        whole_terms = class_terms[int(class_of[at[0]])]
        whole_gpus = int(cap_gpus[at[0]])
        cands = [b for b in best if int(shape[b]) == s or consolidates(
            whole_terms, whole_gpus, class_terms[int(class_of[b])], pod_gpus, idle_share)]
        left = at
        for b in cands:  # each opening node stands behind the best candidate packing at least as well
            b_total, b_packing = original[b], packing[b]
            fits = b_packing >= packing[left]
            hit = left[fits & (original[left] > b_total - GUARD_GAP)]
            if len(hit):
                totals[hit] = b_total - GUARD_GAP
                guarded.update(dict.fromkeys(hit.tolist(), names[b]))
            left = left[~fits]
            if not len(left):
                break
    return guarded
