"""Soft preferences (prioritize): weighted terms in [0, 1], combined, then banded into kube-scheduler's 0-10.

One scorer for every caller (prioritize, filter_to_best, explain, gangs, the planner and the
simulator). Each term is defined once: terms that follow from a node's shape and the pod's fit there
are computed once per class of identical nodes; terms that follow from live usage are element-wise
over columns, one entry per candidate. At 5,000 candidates a Python loop per node cost tens of
milliseconds per request (bench/extender_latency.py; current figures in BENCHMARKS.md, section 1).

Relative terms (cost, bandwidth) are normalised against the best candidate in the same request, so a
score says "how close to the best option here", not an absolute figure that drifts with prices.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

import numpy as np
import numpy.typing as npt

from app.base.small_ints import distinct
from app.base.workload import CPU_STAGES, TRAINING_STAGES, LatencyClass, Stage, WorkloadSpec
from app.config.policy import ScoringPolicy, StageWeights
from app.placement.feasibility import NodeFit
from app.placement.score_list import Floats, Ints, NodeScore, ScoreList
from app.snapshot.nodes import NodeClass, work_tflops
from app.snapshot.store import NodeUsage

__all__ = [
    "GRAVITY_OPENS_AT_MOST",
    "TERMS",
    "GravityFn",
    "NodeScore",
    "ScoreList",
    "Usage",
    "consolidates",
    "outclassed",
    "score_batch",
    "score_nodes",
    "work_cost",
]

TERMS = (
    "memory_fit", "bandwidth", "cost", "separation", "packing",
    "preference", "node_class", "gravity", "precision",
)
NEUTRAL = 0.5
K = TypeVar("K")

# A term function for data gravity, supplied by the caller: node name -> value in [0, 1] or None.
GravityFn = Callable[[str], float | None]
# Data gravity may make a GPU pod open a whole node of at most this many times its GPUs. Beyond,
# such a node's pull is capped at the best pull among candidates that fit the pod without opening a
# node that big (partly used nodes, smaller whole nodes). Replayed through kube-scheduler, a 1-2 GPU
# fine-tune or quantisation following its checkpoint onto the 8-GPU node its gang had just left
# opened that node, stranding six or seven GPUs for the step to save a read of seconds to minutes.
# Among nodes of one size gravity ranks as usual. Serving groups are exempt (their partners' pull
# is not a one-time read). docs/data-gravity.md.
GRAVITY_OPENS_AT_MOST = 2
GUARD_GAP = 1e-6  # well above ranking.EQUAL_TOTAL, far below any difference a weight produces
# Terms in which a partly used node of another shape must be at least as good as the whole node it
# stands in for: consolidating may cost more per hour, never slower or less preferred hardware.
HARDWARE_TERMS = ("bandwidth", "preference", "precision", "node_class")


@dataclass(frozen=True, slots=True)
class Usage:
    """Live usage of each candidate, as columns in request order."""

    gpus: Ints
    cpu_millis: Floats
    training: Ints  # training pods on the node
    interactive: Ints  # interactive serving pods on the node

    @classmethod
    def of(cls, names: Sequence[str], usage: Mapping[str, NodeUsage]) -> Usage:
        empty = NodeUsage()
        us = [usage.get(n) or empty for n in names]
        return cls(np.array([u.gpus for u in us], dtype=np.int64),
                   np.array([u.cpu_millis for u in us], dtype=np.float64),
                   np.array([u.training for u in us], dtype=np.int64),
                   np.array([u.interactive for u in us], dtype=np.int64))


# Terms of a class of identical nodes (the pod's fit on one of them).

def _weights_for(spec: WorkloadSpec, policy: ScoringPolicy) -> StageWeights:
    stage = spec.stage.value if spec.stage else ("serving" if spec.gpus else "data-prep")
    return policy.weights[stage]


# StageWeights are frozen: each one's term -> weight dict is made once, not on every scoring call
# (read only; kept with the object its key names by id).
_WEIGHT_DICTS: dict[int, tuple[StageWeights, dict[str, float]]] = {}


def _weight_dict(weights: StageWeights) -> dict[str, float]:
    hit = _WEIGHT_DICTS.get(id(weights))
    if hit is not None and hit[0] is weights:
        return hit[1]
    if len(_WEIGHT_DICTS) >= 256:
        _WEIGHT_DICTS.clear()
    got = weights.model_dump()
    _WEIGHT_DICTS[id(weights)] = (weights, got)
    return got


def _memory_fit(spec: WorkloadSpec, fit: NodeFit, headroom: float) -> float:
    node = fit.node
    if fit.sizing.per_gpu_gb > 0 and node.gpu_memory_gb > 0:
        return min(1.0, fit.sizing.per_gpu_gb / (node.gpu_memory_gb * (1 - headroom)))
    if fit.sizing.host_memory_gb > 0 and node.memory_bytes > 0:
        return min(1.0, fit.sizing.host_memory_gb / (node.memory_bytes / 1e9))
    if spec.gpus == 0 and node.has_gpus:
        return 0.0  # a CPU pod on a GPU node wastes the most expensive memory in the building
    return NEUTRAL


def _node_class(spec: WorkloadSpec, fit: NodeFit) -> float:
    cls = fit.node.node_class
    if spec.gpus > 0:
        return 1.0 if cls is NodeClass.GPU else 0.0
    if spec.stage is Stage.DATA_PREP:
        return {NodeClass.STORAGE: 1.0, NodeClass.CPU: 0.7, NodeClass.GPU: 0.0}[cls]
    if spec.stage in CPU_STAGES or spec.stage is Stage.SERVING:
        return {NodeClass.CPU: 1.0, NodeClass.STORAGE: 0.6, NodeClass.GPU: 0.0}[cls]
    return 0.0 if cls is NodeClass.GPU else 1.0


def _preference(spec: WorkloadSpec, fit: NodeFit) -> float:
    if not spec.gpu_preference:
        return NEUTRAL
    names = {n.lower() for n in (fit.node.gpu_product, fit.node.gpu.name if fit.node.gpu else None) if n}
    if fit.node.gpu:
        names |= {a.lower() for a in fit.node.gpu.aliases}
    for i, want in enumerate(spec.gpu_preference):
        if want.lower() in names:
            return 1.0 - i / len(spec.gpu_preference)
    return 0.0


def _bandwidth(f: NodeFit, interactive: bool, target_ms: float, best_ms: float | None, max_bw: float,
               gpu_pod: bool) -> float:
    """Interactive serving: meeting the target is enough; otherwise relative to the best candidate."""
    if interactive and f.ms_per_token:
        return min(1.0, target_ms / f.ms_per_token)
    if best_ms is not None and f.ms_per_token:
        return best_ms / f.ms_per_token
    if gpu_pod and max_bw > 0:
        return f.node.gpu_bandwidth_tbs / max_bw
    return NEUTRAL


def _precision(spec: WorkloadSpec, fit: NodeFit) -> float:
    order = spec.precisions
    return 1.0 / (1 + order.index(fit.sizing.precision))


def work_cost(spec: WorkloadSpec, f: NodeFit, interactive: bool) -> float:
    """What the pod's work costs on this fit's node, in units comparable across its candidates.

    Interactive serving has a fixed demand (its users), so any node that meets the latency target
    serves it equally well and the cheapest hour wins; extra speed earns nothing. Batch serving is
    elastic throughput, so it is priced per token (hourly share x time per token). Training is a
    fixed amount of work done at the GPUs' speed, so it is priced per unit of work: hourly share /
    dense BF16 peak. An hour of a GPU three times slower is not a third of the price of the work
    (docs/scoring.md, "Cost").
    """
    if spec.stage is Stage.SERVING and not interactive and f.ms_per_token:
        return f.pod_hourly_cost * f.ms_per_token
    # Every GPU node has a throughput: a product the catalog lacks gets an inferred or penalty
    # figure (docs/node-facts.md, "Throughput"), never its hourly price beside others' per-work prices.
    if spec.stage in TRAINING_STAGES and spec.gpus > 0 and (tflops := work_tflops(f.node)) > 0:
        return f.pod_hourly_cost / tflops
    return f.pod_hourly_cost


def _class_terms(spec: WorkloadSpec, class_fits: Sequence[NodeFit], present: list[int],
                 policy: ScoringPolicy) -> list[dict[str, float]]:
    """The terms that follow from the class alone, for each class present (others stay empty)."""
    interactive = spec.stage is Stage.SERVING and spec.effective_latency_class is LatencyClass.INTERACTIVE
    target_ms = spec.max_ms_per_token or policy.default_interactive_ms_per_token
    # Relative terms need the best candidate; one representative per shape and precision suffices.
    reps = list({(class_fits[c].node.shape_id, class_fits[c].sizing.precision): class_fits[c]
                 for c in present}.values())
    best_cost = min((work_cost(spec, f, interactive) for f in reps), default=0.0)
    ms_values = [f.ms_per_token for f in reps if f.ms_per_token]
    best_ms = min(ms_values) if ms_values else None
    max_bw = max((f.node.gpu_bandwidth_tbs for f in reps), default=0.0)
    out: list[dict[str, float]] = [{} for _ in class_fits]
    for c in present:
        f = class_fits[c]
        cost = work_cost(spec, f, interactive)
        out[c] = {
            "memory_fit": _memory_fit(spec, f, policy.memory_headroom),
            "cost": (best_cost / cost) if cost > 0 else 1.0,
            "preference": _preference(spec, f),
            "node_class": _node_class(spec, f),
            "precision": _precision(spec, f),
            "bandwidth": _bandwidth(f, interactive, target_ms, best_ms, max_bw, spec.gpus > 0),
        }
    return out


# Terms of live usage, over columns.

def _separation(spec: WorkloadSpec, usage: Usage) -> Floats:
    """Training stays off nodes serving interactive traffic, and interactive serving off training."""
    if spec.stage in TRAINING_STAGES:
        return np.where(usage.interactive > 0, 0.0, 1.0)
    if spec.stage is Stage.SERVING and spec.effective_latency_class is LatencyClass.INTERACTIVE:
        return np.where(usage.training > 0, 0.0, 1.0)
    return np.ones(len(usage.gpus))


def _packing(spec: WorkloadSpec, cap_gpus: Ints, cap_cpu: Floats, usage: Usage) -> Floats:
    """Fill nodes so whole nodes stay free, without stranding GPUs behind exhausted CPUs.

    GPUs are only usable with CPU beside them. A placement that leaves a node's free GPUs with less
    than their proportional share of the free CPU strands them (the "Beware of Fragmentation" FGD
    lesson); replaying the Alibaba openb trace showed pure GPU bin-packing losing pods to that.
    CPU pods belong where the GPUs are already busy, then where CPU is plentiful per free GPU.
    """
    with np.errstate(divide="ignore", invalid="ignore"):
        gpu_node = (cap_gpus > 0) & (cap_cpu > 0)
        cpu_per_gpu = np.where(gpu_node, cap_cpu / np.where(cap_gpus > 0, cap_gpus, 1), 1.0)
        free_after = cap_gpus - usage.gpus - spec.gpus
        cpu_after = cap_cpu - usage.cpu_millis - spec.cpu_millis
        ratio = np.minimum(1.0, np.maximum(0.0, cpu_after) / (free_after * cpu_per_gpu))
        balance = np.where(free_after <= 0, 1.0, ratio)
        if spec.gpus > 0:
            gpu_term = np.minimum(1.0, (usage.gpus + spec.gpus) / np.where(cap_gpus > 0, cap_gpus, 1)) * (
                0.5 + 0.5 * balance)
        else:
            gpu_term = np.where(free_after <= 0, 1.0, 0.5 * balance)
        cpu_term = np.minimum(1.0, (usage.cpu_millis + spec.cpu_millis) / np.where(cap_cpu > 0, cap_cpu, 1.0))
        return np.where(gpu_node, gpu_term, np.where(cap_cpu > 0, cpu_term, NEUTRAL))


def outclassed(options: Mapping[K, tuple[float, float]]) -> set[K]:
    """Of ``options`` (key -> (cost per unit of work, speed)), those another option beats on both
    counts: cheaper per unit of work and at least as fast. The scorer and the gang planner both keep
    data gravity from pulling training onto them (docs/data-gravity.md)."""
    return {k for k, (cost, speed) in options.items() if speed > 0 and any(
        o_speed >= speed and o_cost < cost * (1 - 1e-9)
        for j, (o_cost, o_speed) in options.items() if j != k)}


def _outclassed(spec: WorkloadSpec, class_fits: Sequence[NodeFit], present: list[int]) -> set[int]:
    """Training: the classes whose GPU another candidate's beats on price per unit of work
    (``work_cost``) and speed (dense BF16 peak)."""
    if spec.stage not in TRAINING_STAGES or spec.gpus <= 0:
        return set()
    speed = {c: work_tflops(class_fits[c].node) for c in present}
    return outclassed({c: (work_cost(spec, class_fits[c], False), speed[c]) for c in present})


def _cap_right_sizing(class_terms: list[dict[str, float]], outclassed: set[int], present: list[int]) -> None:
    """Right-sizing never sends training to a GPU another candidate beats on price per unit of work
    and speed: an outclassed class's memory_fit is capped at the best among the others. Replayed
    with run time from the GPUs' speed, alignment's right-sizing sent LoRA SFT to L4s that an L40S
    beats on both (23 % cheaper per unit of work, 3x faster by dense BF16), and the pipelines
    finished later for no dollar saved (BENCHMARKS.md, section 4)."""
    others = [class_terms[c]["memory_fit"] for c in present if c not in outclassed]
    if not outclassed or not others:
        return
    best = max(others)
    for c in outclassed:
        if class_terms[c]["memory_fit"] > best:
            class_terms[c]["memory_fit"] = best


def _gravity(spec: WorkloadSpec, gravity: Floats | None, cap_gpus: Ints, usage: Usage,
             outclassed: npt.NDArray[np.bool_] | None = None) -> tuple[Floats, dict[int, str]]:
    """The data-gravity column (NaN: no pull, neutral) and why each capped position's pull was capped.

    ``outclassed``: a boolean column, True where training would run on a GPU another candidate beats
    on price per unit of work and speed. Reading inputs a few seconds or minutes faster never pays
    for a training job that runs for hours on the slower, dearer GPU (replayed through kube-scheduler
    with run time from measured throughput, pretraining members followed their data-prep shards onto
    A100 nodes, where MPT-7B trains 2.3x slower than on H100, and ours spent more than plain GPU
    bin-packing): such a node's pull is capped at the best pull among the candidates that are not
    outclassed. docs/data-gravity.md.
    """
    n = len(cap_gpus)
    if gravity is None:
        return np.full(n, NEUTRAL), {}
    grav = np.where(np.isnan(gravity), NEUTRAL, gravity)
    capped: dict[int, str] = {}
    if outclassed is not None and outclassed.any():
        others = gravity[~outclassed & ~np.isnan(gravity)]
        if others.size:
            these = outclassed & (gravity > others.max())
            capped.update(dict.fromkeys(np.flatnonzero(these).tolist(), "outclassed"))
            grav = np.where(these, others.max(), grav)
    if spec.gpus > 0 and n and spec.serving_group is None:
        # GRAVITY_OPENS_AT_MOST: no pull toward opening a node far bigger than the pod beyond the
        # best pull of a candidate that fits it otherwise.
        oversized = (cap_gpus > GRAVITY_OPENS_AT_MOST * spec.gpus) & (usage.gpus == 0) & ~np.isnan(gravity)
        for size in distinct(cap_gpus[oversized]):
            # Partly used nodes and smaller whole nodes fit the pod without opening this size.
            others = grav[((usage.gpus > 0) | (cap_gpus < size)) & ~np.isnan(gravity)]
            if others.size:
                cap = others.max()
                these = oversized & (cap_gpus == size) & (grav > cap)
                capped.update(dict.fromkeys(np.flatnonzero(these).tolist(), "opens"))
                grav = np.where(these, cap, grav)
    return grav, capped


def score_batch(
    spec: WorkloadSpec,
    names: list[str],
    class_fits: Sequence[NodeFit],
    class_of: Ints,
    usage: Usage,
    policy: ScoringPolicy,
    gravity: Floats | None = None,
) -> ScoreList:
    """Score feasible candidates given as columns (one entry per node, request order).

    ``class_fits[c]``: the pod's fit on a node of class ``c`` (same shape, so same fit); ``class_of``:
    each node's class; ``usage``: the nodes' live counters. ``gravity``: the data-gravity term per
    node, NaN where it has none (neutral).
    """
    w = _weight_dict(_weights_for(spec, policy))
    present = distinct(class_of)
    class_terms = _class_terms(spec, class_fits, present, policy)
    dominated = _outclassed(spec, class_fits, present)
    _cap_right_sizing(class_terms, dominated, present)
    facts = [(f.node.gpu_count, f.node.cpu_millis, f.node.shape_id) if class_terms[c] else (0, 0.0, -1)
             for c, f in enumerate(class_fits)]
    cap_gpus = np.array([g for g, _, _ in facts], dtype=np.int64)[class_of]
    cap_cpu = np.array([cpu for _, cpu, _ in facts], dtype=np.float64)[class_of]
    shape = np.array([s for _, _, s in facts], dtype=np.int64)[class_of]
    separation = _separation(spec, usage)
    packing = _packing(spec, cap_gpus, cap_cpu, usage)
    outclassed = np.isin(class_of, list(dominated)) if dominated and gravity is not None else None
    grav, capped = _gravity(spec, gravity, cap_gpus, usage, outclassed)
    columns = {"separation": separation, "packing": packing, "gravity": grav}
    # The weighted mean, term by term in TERMS order.
    acc = np.zeros(len(names))
    for term in TERMS:
        if term in columns:
            acc = acc + columns[term] * w[term]
        else:
            per_class = np.array([t.get(term, 0.0) for t in class_terms], dtype=np.float64)
            acc = acc + per_class[class_of] * w[term]
    total_w = sum(w[t] for t in TERMS)
    totals = acc / total_w if total_w > 0 else np.zeros(len(names))
    guarded: dict[int, str] = {}
    if spec.gpus > 0 and policy.whole_node_guard and len(names):
        guarded = _guard(names, totals, packing, separation, shape, cap_gpus, usage.gpus, spec.gpus,
                         class_of, class_terms, policy.stranded_idle_share)
    return ScoreList(names, totals, None, class_of, class_terms, columns, w, guarded, capped,
                     policy.score_mapping)


def score_nodes(
    spec: WorkloadSpec,
    fits: Sequence[NodeFit],
    usage: Mapping[str, NodeUsage],
    policy: ScoringPolicy,
    gravity: GravityFn | None = None,
) -> ScoreList:
    """Score nodes given as their fits (explain, gangs, the planner, the simulator); order follows
    ``fits``. Nodes of one shape at one precision share a class."""
    if not fits:
        return ScoreList.empty()
    names = [f.node.name for f in fits]
    classes: dict[tuple[int, object], int] = {}
    class_fits: list[NodeFit] = []
    class_of = np.empty(len(fits), dtype=np.int64)
    for i, f in enumerate(fits):
        key = (f.node.shape_id, f.sizing.precision)
        c = classes.get(key)
        if c is None:
            c = classes[key] = len(class_fits)
            class_fits.append(f)
        class_of[i] = c
    column = None
    if gravity is not None:
        column = np.array([np.nan if (g := gravity(n)) is None else g for n in names], dtype=np.float64)
    return score_batch(spec, names, class_fits, class_of, Usage.of(names, usage), policy, column)


def consolidates(whole: Mapping[str, float], whole_gpus: int, partly: Mapping[str, float], pod_gpus: int,
                 idle_share: float) -> bool:
    """May a partly used node of another shape take the pod instead of a whole node being opened?

    Opening a whole node of ``whole_gpus`` strands its other ``whole_gpus - pod_gpus`` GPUs until
    more work of that shape arrives; ``idle_share`` is the share of their price that idling is
    assumed to cost. The partly used node is worth it when its price premium over the whole node,
    for the pod's GPUs, is below that: price ratio <= 1 + (whole_gpus - pod_gpus) x idle_share /
    pod_gpus (docs/scoring.md, "Across shapes"). It must be at least as good on every hardware
    term, so consolidating never trades the pod's speed, precision or requested GPU for packing.
    """
    if idle_share <= 0 or pod_gpus <= 0 or partly["cost"] <= 0:
        return False
    if any(partly[t] < whole[t] - 1e-12 for t in HARDWARE_TERMS):
        return False
    # The cost term is best / cost, so price(partly) / price(whole) = whole term / partly term.
    ratio = whole["cost"] / partly["cost"]
    return ratio <= 1.0 + (whole_gpus - pod_gpus) * idle_share / pod_gpus + 1e-12


def _guard(names: list[str], totals: Floats, packing: Floats, separation: Floats, shape: Ints,
           cap_gpus: Ints, gpus_used: Ints, pod_gpus: int, class_of: Ints,
           class_terms: list[dict[str, float]], idle_share: float) -> dict[int, str]:
    """Never open a whole GPU node while a partly used node that may stand in for it can take the pod.

    The weighted mean trades packing against gravity and cost, and through the real kube-scheduler
    that trade left slightly more stranded GPUs and fewer whole nodes than plain GPU bin-packing
    (MostAllocated) on the pipeline replays (docs/scoring.md). Within one shape the trade is never
    worth it: the sibling is the same hardware at the same price, and the whole node is what the next
    8-GPU job needs. Across shapes (``consolidates``) it is worth it when the partly used node is at
    least as good hardware and its price premium is below the expected idle cost of the GPUs the
    whole node would strand. A pod that fills a whole node exactly does not open it. A sibling whose
    tenants the stage must keep apart from (separation) does not count: isolation is worth a whole
    node. Nor does one that packs worse than the whole node (CPU exhausted beside its free GPUs).
    Lowers ``totals`` in place; returns position -> the node that outranked it.
    """
    opens = (cap_gpus > 0) & (gpus_used == 0) & (pod_gpus < cap_gpus)
    sibling = (cap_gpus > 0) & ~opens & (separation >= 1.0)
    guarded: dict[int, str] = {}
    if not opens.any() or not sibling.any():
        return guarded
    original = totals.copy()  # siblings are judged on their own totals, before any lowering
    # Each shape's best partly used node (first of the best in request order), best first; on
    # equal totals the earlier in request order.
    best: list[int] = []
    for s in distinct(shape[sibling]):
        sib = np.flatnonzero(sibling & (shape == s))
        best.append(int(sib[np.argmax(original[sib])]))
    best.sort(key=lambda b: (-float(original[b]), b))
    for s in distinct(shape[opens]):
        at = np.flatnonzero(opens & (shape == s))
        whole_terms = class_terms[int(class_of[at[0]])]
        whole_gpus = int(cap_gpus[at[0]])
        cands = [b for b in best if int(shape[b]) == s or consolidates(
            whole_terms, whole_gpus, class_terms[int(class_of[b])], pod_gpus, idle_share)]
        left = at
        for b in cands:  # each opening node stands behind the best candidate packing at least as well
            fits = packing[b] >= packing[left]
            hit = left[fits & (original[left] > original[b] - GUARD_GAP)]
            if len(hit):
                totals[hit] = original[b] - GUARD_GAP
                guarded.update(dict.fromkeys(hit.tolist(), names[b]))
            left = left[~fits]
            if not len(left):
                break
    return guarded
