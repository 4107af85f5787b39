"""Soft preferences (prioritize): weighted terms in [0, 1], combined, then banded into kube-scheduler's 0-10.

Relative terms (cost, bandwidth) are normalised against the best candidate in the same request, so a
score says "how close to the best option here", not an absolute figure that drifts with prices.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from app.core.feasibility import NodeFit
from app.core.nodes import NodeClass
from app.core.policy import ScoringPolicy, StageWeights
from app.core.ranking import band_scores
from app.core.snapshot import NodeUsage
from app.core.workload import CPU_STAGES, TRAINING_STAGES, LatencyClass, Stage, WorkloadSpec

TERMS = (
    "memory_fit", "bandwidth", "cost", "separation", "packing",
    "preference", "node_class", "gravity", "precision",
)
NEUTRAL = 0.5

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


@dataclass(slots=True)
class NodeScore:
    node: str
    score: int
    total: float  # the unrounded weighted mean in [0, 1]; breaks ties in explain output
    terms: dict[str, float] = field(default_factory=dict)
    weights: dict[str, float] = field(default_factory=dict)
    # Set when the whole-node guard ranked this node below a partly used node of its shape.
    guarded_by: str | None = None
    # Set when this node's gravity was capped: the pod would open it, it has more than
    # GRAVITY_OPENS_AT_MOST times the pod's GPUs, and a partly used or smaller node fits the pod.
    gravity_capped: bool = False

    def top_terms(self, n: int = 3) -> list[tuple[str, float]]:
        contrib = {t: self.terms[t] * self.weights.get(t, 0.0) for t in self.terms}
        ranked = sorted(contrib.items(), key=lambda kv: kv[1], reverse=True)
        return [(t, self.terms[t]) for t, c in ranked[:n] if c > 0]


def _weights_for(spec: WorkloadSpec, policy: ScoringPolicy) -> StageWeights:
    stage = spec.stage.value if spec.stage else ("serving" if spec.gpus else "data-prep")
    return policy.weights[stage]


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


def _separation(spec: WorkloadSpec, usage: NodeUsage) -> float:
    if spec.stage in TRAINING_STAGES:
        return 0.0 if usage.interactive > 0 else 1.0
    if spec.stage is Stage.SERVING and spec.effective_latency_class is LatencyClass.INTERACTIVE:
        return 0.0 if usage.training > 0 else 1.0
    return 1.0


def _packing(spec: WorkloadSpec, fit: NodeFit, usage: NodeUsage) -> float:
    """Fill nodes so whole nodes stay free, without stranding GPUs behind exhausted CPUs.

    GPUs are only usable with CPU beside them. A placement that leaves a node's free GPUs with less
    than their proportional share of the free CPU strands them (the "Beware of Fragmentation" FGD
    lesson); replaying the Alibaba openb trace showed pure GPU bin-packing losing pods to that.
    """
    node = fit.node
    if node.gpu_count > 0 and node.cpu_millis > 0:
        cpu_per_gpu = node.cpu_millis / node.gpu_count
        free_after = node.gpu_count - usage.gpus - spec.gpus
        cpu_after = node.cpu_millis - usage.cpu_millis - spec.cpu_millis
        balance = 1.0 if free_after <= 0 else min(1.0, max(0.0, cpu_after) / (free_after * cpu_per_gpu))
        if spec.gpus > 0:
            return min(1.0, (usage.gpus + spec.gpus) / node.gpu_count) * (0.5 + 0.5 * balance)
        # CPU pods belong where the GPUs are already busy, then where CPU is plentiful per free GPU.
        return 1.0 if free_after <= 0 else 0.5 * balance
    if node.cpu_millis > 0:
        return min(1.0, (usage.cpu_millis + spec.cpu_millis) / node.cpu_millis)
    return NEUTRAL


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
    gpu = f.node.gpu
    if spec.stage in TRAINING_STAGES and spec.gpus > 0 and gpu is not None and gpu.bf16_tflops > 0:
        return f.pod_hourly_cost / gpu.bf16_tflops
    return f.pod_hourly_cost


def score_nodes(
    spec: WorkloadSpec,
    fits: Sequence[NodeFit],
    usage: Mapping[str, NodeUsage],
    policy: ScoringPolicy,
    gravity: GravityFn | None = None,
) -> list[NodeScore]:
    """Score every feasible node; output order follows ``fits``."""
    if not fits:
        return []
    w = _weights_for(spec, policy).model_dump()

    interactive = spec.stage is Stage.SERVING and spec.effective_latency_class is LatencyClass.INTERACTIVE
    target_ms = spec.max_ms_per_token or policy.default_interactive_ms_per_token

    def unit_cost(f: NodeFit) -> float:
        return work_cost(spec, f, interactive)

    # Relative terms need the best candidate; nodes of one shape and precision are all alike, so
    # look at one representative of each instead of every node.
    reps = list({(f.node.shape_id, f.sizing.precision): f for f in fits}.values())
    best_cost = min(unit_cost(f) for f in reps)
    ms_values = [f.ms_per_token for f in reps if f.ms_per_token]
    best_ms = min(ms_values) if ms_values else None
    max_bw = max((f.node.gpu_bandwidth_tbs for f in reps), default=0.0)
    total_w = sum(w[t] for t in TERMS)
    gpu_pod = spec.gpus > 0

    def base_terms(f: NodeFit, u: NodeUsage) -> dict[str, float]:
        cost = unit_cost(f)
        terms: dict[str, float] = {
            "memory_fit": _memory_fit(spec, f, policy.memory_headroom),
            "cost": (best_cost / cost) if cost > 0 else 1.0,
            "separation": _separation(spec, u),
            "packing": _packing(spec, f, u),
            "preference": _preference(spec, f),
            "node_class": _node_class(spec, f),
            "precision": _precision(spec, f),
        }
        terms["bandwidth"] = _bandwidth(f, interactive, target_ms, best_ms, max_bw, gpu_pod)
        terms["gravity"] = NEUTRAL
        return terms

    # Terms other than gravity depend on the node's shape and a few usage counters only, so equal
    # keys share one computation (5,000 candidate nodes typically collapse to a few dozen keys).
    def weighted(terms: dict[str, float]) -> float:
        return sum(terms[t] * w[t] for t in TERMS) / total_w if total_w > 0 else 0.0

    # The whole-node guard's two facts about a node also follow from its key: does the pod open a
    # whole node there, and may that node stand in for a whole one of its shape (see _guard).
    guard = gpu_pod and policy.whole_node_guard
    memo: dict[tuple[object, ...], tuple[dict[str, float], float, bool, bool]] = {}
    out: list[NodeScore] = []
    opening: list[tuple[NodeScore, int, int]] = []
    best_sibling: dict[int, tuple[NodeScore, int]] = {}  # shape -> its best partly used node, position
    empty = NodeUsage()
    pulls: dict[str, float | None] = {}
    caps: dict[int, float] = {}  # oversized node size -> best pull of a candidate that is not it

    def oversized(f: NodeFit, u: NodeUsage) -> bool:
        n = f.node
        return gpu_pod and n.gpu_count > GRAVITY_OPENS_AT_MOST * spec.gpus and u.gpus == 0

    if gravity is not None:
        pulls = {f.node.name: gravity(f.node.name) for f in fits}
        if spec.serving_group is None:
            sizes = {f.node.gpu_count for f in fits if oversized(f, usage.get(f.node.name) or empty)}
            for size in sizes:
                # Partly used nodes and smaller whole nodes fit the pod without opening this size.
                best = max((g for f in fits if (g := pulls[f.node.name]) is not None
                            and ((usage.get(f.node.name) or empty).gpus > 0 or f.node.gpu_count < size)),
                           default=None)
                if best is not None:
                    caps[size] = best
    for f in fits:
        node = f.node
        name = node.name
        u = usage.get(name) or empty
        key = (node.shape_id, f.sizing.precision, u.gpus, u.cpu_millis, u.training > 0, u.interactive > 0)
        hit = memo.get(key)
        if hit is None:
            terms = base_terms(f, u)
            opens = node.gpu_count > 0 and u.gpus == 0 and spec.gpus < node.gpu_count
            sibling = node.gpu_count > 0 and not opens and terms["separation"] >= 1.0
            hit = memo[key] = (terms, weighted(terms), opens, sibling)
        terms, total, opens, sibling = hit
        capped = False
        if (g := pulls.get(name)) is not None:
            cap = caps.get(node.gpu_count)
            if cap is not None and g > cap and oversized(f, u):
                capped, g = True, cap
            terms = {**terms, "gravity": g}
            total = weighted(terms)
        score = NodeScore(name, 0, total, terms, w, gravity_capped=capped)
        out.append(score)
        if guard:
            if opens:
                opening.append((score, node.shape_id, node.gpu_count))
            elif sibling:
                b = best_sibling.get(node.shape_id)
                if b is None or total > b[0].total:
                    best_sibling[node.shape_id] = (score, len(out) - 1)
    if opening and best_sibling:
        _guard(opening, best_sibling, spec.gpus, policy.stranded_idle_share)
    # The integer kube-scheduler sees is a band relative to the other candidates (app.core.ranking).
    for s, band in zip(out, band_scores([s.total for s in out], policy.score_mapping), strict=True):
        s.score = band
    return out


GUARD_GAP = 1e-6  # well above ranking.EQUAL_TOTAL, far below any difference a weight produces
# Terms in which a partly used node of another shape must be at least as good as the whole node it
# stands in for: consolidating may cost more per hour, never slower or less preferred hardware.
HARDWARE_TERMS = ("bandwidth", "preference", "precision", "node_class")


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


def _guard(opening: list[tuple[NodeScore, int, int]], best_sibling: dict[int, tuple[NodeScore, int]],
           pod_gpus: int, idle_share: float) -> None:
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
    """
    # Best first; on equal totals the earlier in request order (batch_scoring picks the same one).
    siblings = [(shape, b) for shape, (b, _) in sorted(best_sibling.items(),
                                                        key=lambda kv: (-kv[1][0].total, kv[1][1]))]
    qualifying: dict[int, list[NodeScore]] = {}
    for s, shape, gpus in opening:
        cands = qualifying.get(shape)
        if cands is None:
            cands = qualifying[shape] = [
                b for other, b in siblings
                if other == shape or consolidates(s.terms, gpus, b.terms, pod_gpus, idle_share)
            ]
        # A sibling whose CPU is nearly gone packs worse (its free GPUs would be stranded behind it,
        # the packing term's balance factor): then it does not stand in for the whole node.
        b = next((c for c in cands if c.terms["packing"] >= s.terms["packing"]), None)
        if b is not None and s.total > b.total - GUARD_GAP:
            s.total = b.total - GUARD_GAP
            s.guarded_by = b.node
