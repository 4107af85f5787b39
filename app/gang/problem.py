"""The gang placement problem, independent of Kubernetes: what must be placed, where it may go, how
placements compare.

Every planner (``greedy``, the tree ``dp`` and the CP-SAT ``solver``) reads a :class:`Problem` through
one :class:`Index` and answers with an :class:`Assignment` (pods of each shape per node); :func:`assess`
scores any assignment the same way so planners can be compared, and so the benchmark reports domains
used and stranded GPUs for each of them.

Why the objective looks the way it does (highest priority first, compared lexicographically):

1. ``preferred``: domains of ``topology-preferred-placement`` used (the user said so explicitly);
2. one entry per topology tier, **outer to inner** (zone, spine, leaf, NVLink domain) and finally the
   number of nodes: fewest domains at each tier, a cross-spine hop costing more than any number of
   extra leaves, the way Kueue's and KAI's topology-aware schedulers think about it;
3. ``models``: GPU models mixed in the gang (a lockstep gang runs at the speed of its slowest one);
4. ``bottom``: the rest, in GPU units: best fit (free GPUs of every domain/node touched, so holes get
   filled and big free blocks stay big), pristine structures broken open (whole free nodes/domains
   are what the next large gang needs) and the GPU model (preference order, then price).

Domain ids are qualified by their outer path so tiers always nest (a leaf named "leaf-1" under two
spines is two leaves); nesting is what makes :func:`prune` and the tree DP exact.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

# Weight of the GPU type inside the bottom group, in GPU units: a member on a less preferred /
# pricier GPU model costs about one GPU of fragmentation per GPU it uses and rank step.
TYPE_WEIGHT = 1
NODE_TIER = "node"
# Above this the weighted sum would lose integer precision in CP-SAT's LP; weights then stop being
# strictly lexicographic and pruning is switched off (never reached on realistic fleets).
MAX_WEIGHT = 2**50


@dataclass(frozen=True, slots=True)
class Shape:
    """Identical members to place: ``count`` pods, each needing these resources."""

    key: str
    count: int
    gpus: int
    cpu_millis: float = 0.0
    memory_bytes: float = 0.0


@dataclass(frozen=True, slots=True)
class Candidate:
    """One node as the planners see it. Capacities are already net of other gangs' reservations."""

    name: str
    path: tuple[str, ...]  # domain id per tier, inner -> outer ("" where the tier is unlabelled)
    free_gpus: int
    total_gpus: int
    free_cpu: float = math.inf
    free_memory: float = math.inf
    gpu_model: str = ""
    rdma: bool = False
    cost_rank: int = 0  # 0 = cheapest GPU model among the candidates
    pref_rank: int = 0  # position in the gang's gpu-preference list (0 = first or no preference)
    near_rank: int = 0  # data gravity: 0 = holds members' input data (or none reads any); instance.near_rank
    shapes: frozenset[str] | None = None  # shapes allowed here (None: every shape); empty: context only
    required: str | None = None  # domain of the required-topology label (None: unlabelled)
    preferred: str | None = None  # domain of the preferred-topology label
    fixed: int = 0  # gang members already bound here (replans after a partial bind or restart)

    def allows(self, shape: str) -> bool:
        return self.shapes is None or shape in self.shapes

    @property
    def pristine(self) -> bool:
        return self.total_gpus > 0 and self.free_gpus >= self.total_gpus and not self.fixed


@dataclass(frozen=True, slots=True)
class Problem:
    gang: str
    shapes: tuple[Shape, ...]
    nodes: tuple[Candidate, ...]  # candidates, context nodes (shapes=frozenset()) and fixed nodes
    tier_names: tuple[str, ...] = ()  # one per path entry, inner -> outer (messages, reports)
    required_key: str | None = None
    preferred_key: str | None = None

    @property
    def pods(self) -> int:
        return sum(s.count for s in self.shapes)

    @property
    def gpus(self) -> int:
        return sum(s.count * s.gpus for s in self.shapes)


# node name -> shape key -> pods of that shape placed there
Assignment = dict[str, dict[str, int]]


def capacity(node: Candidate, shape: Shape) -> int:
    """How many pods of ``shape`` fit on ``node`` on their own (0 if not allowed)."""
    if not node.allows(shape.key):
        return 0
    cap = shape.count
    if shape.gpus:
        cap = min(cap, node.free_gpus // shape.gpus)
    # (inf // x is nan in Python: an unknown capacity simply does not limit)
    if shape.cpu_millis > 0 and not math.isinf(node.free_cpu):
        cap = min(cap, int(node.free_cpu // shape.cpu_millis))
    if shape.memory_bytes > 0 and not math.isinf(node.free_memory):
        cap = min(cap, int(node.free_memory // shape.memory_bytes))
    return max(cap, 0)


def fits_on(node: Candidate, placed: Mapping[str, int], shapes: Mapping[str, Shape]) -> bool:
    """Do these pods fit on ``node`` together (every resource, not just each shape alone)?"""
    gpus = cpu = mem = 0.0
    for key, n in placed.items():
        s = shapes[key]
        if n and not node.allows(key):
            return False
        gpus += s.gpus * n
        cpu += s.cpu_millis * n
        mem += s.memory_bytes * n
    return gpus <= node.free_gpus and cpu <= node.free_cpu and mem <= node.free_memory


def first_fit(nodes: Sequence[Candidate], shapes: Sequence[Shape], counts: Mapping[str, int] | None = None
              ) -> Assignment | None:
    """Pack pods onto ``nodes`` in order, each shape in order, first node with room for every
    resource; ``counts``: pods per shape (default each shape's count). None when one does not fit."""
    free = {n.name: [float(n.free_gpus), n.free_cpu, n.free_memory] for n in nodes}
    out: Assignment = {}
    for s in shapes:
        for _ in range(s.count if counts is None else counts.get(s.key, 0)):
            spot = next((n for n in nodes if n.allows(s.key) and free[n.name][0] >= s.gpus
                         and free[n.name][1] >= s.cpu_millis and free[n.name][2] >= s.memory_bytes), None)
            if spot is None:
                return None
            f = free[spot.name]
            f[0] -= s.gpus
            f[1] -= s.cpu_millis
            f[2] -= s.memory_bytes
            per = out.setdefault(spot.name, {})
            per[s.key] = per.get(s.key, 0) + 1
    return out


# --- topology ---------------------------------------------------------------------------------------
@dataclass(slots=True)
class Tier:
    """One topology tier that can tell placements apart: its qualified domains, per node."""

    name: str
    domain_of: dict[str, str]  # node -> qualified domain id
    free: dict[str, int] = field(default_factory=dict)  # domain -> free GPUs (all nodes in it)
    total: dict[str, int] = field(default_factory=dict)  # domain -> GPUs
    pristine: dict[str, bool] = field(default_factory=dict)  # no GPU in use anywhere in it


@dataclass(slots=True)
class NodeClass:
    """Nodes no constraint or objective term can tell apart (a count variable in the models)."""

    nodes: list[Candidate]
    caps: dict[str, int]  # shape -> pods per node
    domains: tuple[str, ...]  # qualified domain per kept tier, outer -> inner (node tier excluded)

    @property
    def k(self) -> int:
        return len(self.nodes)

    @property
    def first(self) -> Candidate:
        return self.nodes[0]

    def capacity(self, shape: str) -> int:
        return self.caps.get(shape, 0) * len(self.nodes)


class Index:
    """Everything the planners derive from a problem, computed once: tiers, domains, node classes.

    One pass over the nodes; all later work is on classes and domains (a few hundred even on 5,000
    nodes), which is what keeps planning inside the latency budget.
    """

    def __init__(self, problem: Problem) -> None:
        self.problem = problem
        self.shapes = {s.key: s for s in problem.shapes}
        self.by_name = {n.name: n for n in problem.nodes}
        self.fixed = [n for n in problem.nodes if n.fixed]
        self.tiers = self._tiers()
        self.classes = self._classes()

    def _tiers(self) -> list[Tier]:
        """Tiers outer -> inner that can tell placements apart, then the node tier.

        Dropped: tiers nobody labels, tiers with one domain (a constant), tiers whose domains are
        single nodes (the node tier already counts those) and tiers that partition the nodes exactly
        like the tier outside them (nested, so the same domain count means the same partition).
        Work is done per distinct outer path (a few hundred), not per node, except for tier 0.
        """
        nodes = self.problem.nodes
        depth = max((len(n.path) for n in nodes), default=0)
        labelled = [any(t < len(n.path) and n.path[t] for n in nodes) for t in range(depth)]
        given = self.problem.tier_names
        names = [given[t] if t < len(given) else f"tier-{t}" for t in range(depth)]
        ids: list[dict[str, str]] = [{} for _ in range(depth)]
        stats: list[dict[str, list[int]]] = [{} for _ in range(depth)]  # domain -> [free, total, pristine]
        outer_cache: dict[tuple[str, ...], tuple[str, ...]] = {}

        def qualify(raw: tuple[str, ...], own: str) -> tuple[str, ...]:
            """Qualified ids for tiers 1..depth-1 (index 0 unused), outer first; cached per path."""
            got = outer_cache.get(raw)
            if got is None:
                out = [""] * depth
                prefix = ""
                for t in range(depth - 1, 0, -1):
                    if labelled[t]:
                        # Unknown locality is assumed to be the worst: a domain of its own.
                        part = raw[t - 1] or f"?{own}"
                        prefix = f"{prefix}/{part}" if prefix else part
                        out[t] = prefix
                got = tuple(out)
                if "" not in (raw[t - 1] for t in range(1, depth) if labelled[t]):
                    outer_cache[raw] = got
            return got

        # Group nodes by their outer path: tiers 1.. are computed once per group.
        group_of: dict[str, tuple[str, ...]] = {}
        group_stats: dict[tuple[str, ...], list[int]] = {}
        for n in nodes:
            path = n.path if len(n.path) == depth else (*n.path, *([""] * (depth - len(n.path))))
            q = qualify(tuple(path[1:]), n.name) if depth > 1 else ("",)
            group_of[n.name] = q
            free, total, pristine = max(n.free_gpus, 0), n.total_gpus, int(n.pristine)
            _accumulate(group_stats, q, free, total, pristine)
            if labelled[0]:
                own = path[0] or f"?{n.name}"
                outer = next((q[u] for u in range(1, depth) if labelled[u]), "")
                d = f"{outer}/{own}" if outer else own
                ids[0][n.name] = d
                _accumulate(stats[0], d, free, total, pristine)
        for t in range(1, depth):
            if not labelled[t]:
                continue
            for q, (free, total, pristine) in group_stats.items():
                _accumulate(stats[t], q[t], free, total, pristine)
        return _kept_tiers(nodes, labelled, names, ids, stats, group_of)

    def _classes(self) -> list[NodeClass]:
        shapes = self.problem.shapes
        inner = self.tiers[:-1]
        groups: dict[tuple[object, ...], NodeClass] = {}
        for n in sorted(self.problem.nodes, key=lambda n: n.name):
            caps = {s.key: capacity(n, s) for s in shapes}
            if not any(caps.values()) and not n.fixed:
                continue  # context only: counted in domain figures, hosts nothing
            doms = tuple(t.domain_of[n.name] for t in inner)
            if n.fixed:
                key: tuple[object, ...] = ("node", n.name)
            else:
                key = (doms, n.free_gpus, n.total_gpus, n.gpu_model, n.rdma, n.cost_rank, n.pref_rank,
                       n.near_rank, tuple(caps[s.key] for s in shapes), n.required, n.preferred)
            c = groups.get(key)
            if c is None:
                groups[key] = NodeClass([n], caps, doms)
            else:
                c.nodes.append(n)
        return list(groups.values())

    @cached_property
    def n_cost_ranks(self) -> int:
        return max((n.cost_rank for n in self.problem.nodes), default=0) + 1

    def node_bottom(self, n: Candidate) -> int:
        """Per node used: best fit (its free GPUs) plus pristine penalty (all its GPUs)."""
        return max(n.free_gpus, 0) + (n.total_gpus if n.pristine else 0)

    @staticmethod
    def domain_bottom(tier: Tier, d: str) -> int:
        return max(tier.free.get(d, 0), 0) + (tier.total.get(d, 0) if tier.pristine.get(d) else 0)

    @cached_property
    def n_near_ranks(self) -> int:
        return max((n.near_rank for n in self.problem.nodes), default=0) + 1

    def type_cost(self, n: Candidate) -> int:
        """Per GPU placed on ``n``: preference rank first, then nearness to the data, then price
        (small integers; without data gravity ``n_near_ranks`` is 1 and nearness drops out)."""
        return TYPE_WEIGHT * ((n.pref_rank * self.n_near_ranks + n.near_rank) * (self.n_cost_ranks + 1)
                              + n.cost_rank)


# --- objective weights ------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Weights:
    """Weights of the lexicographic groups in one sum. ``tiers`` is outer -> inner, node tier last."""

    preferred: int
    tiers: tuple[int, ...]
    models: int
    exact: bool  # False when capped at MAX_WEIGHT (then not strictly lexicographic)


def weights(index: Index, allowed: set[int] | None = None) -> Weights:
    """Lexicographic weights from per-instance bounds: each group outweighs everything below it.

    With W_0 > max(bottom) and W_{i+1} = W_i * (range_i + 1), a solution better by one unit in a
    group beats any difference in all lower groups together. Ranges are counted over the candidate
    classes (``allowed``), so they stay small and CP-SAT's LP stays numerically comfortable.
    """
    problem = index.problem
    classes = [c for i, c in enumerate(index.classes) if allowed is None or i in allowed]
    pods = problem.pods
    fixed = len(index.fixed)
    free_classes = [c for c in classes if not c.first.fixed]
    n_nodes = sum(c.k for c in free_classes)
    max_node = max((index.node_bottom(c.first) for c in free_classes), default=0)
    bound = min(pods, n_nodes) * max_node
    bound += problem.gpus * max((index.type_cost(c.first) for c in classes), default=0)
    models = {c.first.gpu_model for c in classes if c.first.gpu_model}
    ranges: list[int] = []  # per tier: how many values its domain count can take
    for ti, tier in enumerate(index.tiers[:-1]):
        pinned = {tier.domain_of[n.name] for n in index.fixed}
        doms = {c.domains[ti] for c in classes} - pinned
        bound += min(pods, len(doms)) * max((index.domain_bottom(tier, d) for d in doms), default=0)
        # count in [max(1, |pinned|), |pinned| + min(pods, new domains)]
        ranges.append(min(pods, len(doms)) + (1 if pinned else 0))
    best = max((c.caps[s.key] for c in classes for s in problem.shapes), default=1) or 1
    node_lb = fixed if fixed else math.ceil(pods / best)
    node_range = max(0, min(pods, n_nodes) + fixed - node_lb)
    w_models = bound + 1
    w = w_models * max(len(models), 1)  # models used lie in [1, len(models)]
    out = [w]
    w = w * (node_range + 1)
    for r in reversed(ranges):  # inner -> outer
        out.append(min(w, MAX_WEIGHT))
        w = min(w * max(r, 1), MAX_WEIGHT)  # a tier's count lies in [1, r]: range r - 1, hence the factor r
    exact = w < MAX_WEIGHT
    return Weights(preferred=w, tiers=tuple(reversed(out)), models=w_models, exact=exact)


# --- scoring any assignment -------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Assessment:
    """How good an assignment is; ``key`` orders assignments (smaller is better)."""

    feasible: bool
    problem: str  # why not feasible ("" if feasible)
    preferred: int
    tier_counts: tuple[tuple[str, int], ...]  # outer -> inner, node tier last
    bottom: int
    stranded_after: int  # free GPUs left on partly used nodes the gang touched
    pristine_nodes_opened: int
    gpu_models: int

    @property
    def key(self) -> tuple[int, ...]:
        return (self.preferred, *(c for _, c in self.tier_counts), self.gpu_models, self.bottom)

    def domains(self, tier: str) -> int:
        return dict(self.tier_counts).get(tier, 0)


def assess(index: Index, assignment: Assignment) -> Assessment:
    """Check an assignment against every hard rule and score it with the planners' objective."""
    problem, by_name, shapes = index.problem, index.by_name, index.shapes
    placed: dict[str, int] = defaultdict(int)
    problems: list[str] = []
    used = {n.name for n in index.fixed}
    for node, per_shape in assignment.items():
        n = by_name.get(node)
        if n is None:
            problems.append(f"unknown node {node}")
            continue
        if not fits_on(n, per_shape, shapes):
            problems.append(f"over capacity on {node}")
        for key, cnt in per_shape.items():
            placed[key] += cnt
        if sum(per_shape.values()) > 0:
            used.add(node)
    used_nodes = [by_name[u] for u in sorted(used) if u in by_name]
    for s in problem.shapes:
        if placed.get(s.key, 0) != s.count:
            problems.append(f"{placed.get(s.key, 0)}/{s.count} pods of shape {s.key} placed")
    if problem.required_key is not None:
        doms = {n.required for n in used_nodes}
        if None in doms or len(doms) > 1:
            problems.append(f"not in one {problem.required_key} domain")
    if len(used_nodes) > 1 and not all(n.rdma for n in used_nodes):
        problems.append("spans nodes without RDMA")
    preferred = len({n.preferred or f"?{n.name}" for n in used_nodes}) if problem.preferred_key else 0
    counts = tuple((t.name, len({t.domain_of[n.name] for n in used_nodes})) for t in index.tiers)
    models = len({n.gpu_model for n in used_nodes if n.gpu_model})
    bottom = stranded = opened = 0
    for n in used_nodes:
        bottom += index.node_bottom(n)
        gpus_here = sum(shapes[k].gpus * c for k, c in assignment.get(n.name, {}).items())
        bottom += gpus_here * index.type_cost(n)
        left = n.free_gpus - gpus_here
        if left > 0:
            stranded += left
        if n.pristine and gpus_here:
            opened += 1
    for t in index.tiers[:-1]:
        for d in {t.domain_of[n.name] for n in used_nodes}:
            bottom += index.domain_bottom(t, d)
    return Assessment(not problems, "; ".join(problems), preferred, counts, bottom, stranded, opened, models)


# --- pruning ----------------------------------------------------------------------------------------
def prune(index: Index, exact_weights: bool = True) -> set[int]:
    """Class indices that can be in an optimal plan (exact for the lexicographic objective).

    With tiers compared outer-first and nested domains, if some single tier-t domain can hold the
    whole gang, the optimum uses one domain at tier t and above, and it is one of the tier-t domains
    that fit. So only the *innermost* tier with a fitting domain matters, and only its fitting
    domains (intersected with the required domain, when there is one) stay candidates. The same
    argument applies first to the preferred-topology domains. Members already bound pin the domain:
    a candidate domain must contain every bound member's node. With several member shapes "fits"
    is a relaxation (each shape's count and the total GPUs), which can only keep more domains.
    """
    problem = index.problem
    classes = index.classes
    everything = set(range(len(classes)))
    if not exact_weights:
        return everything
    shapes = problem.shapes
    fixed = index.fixed
    pool = [i for i, c in enumerate(classes)
            if (any(c.caps.values()) or c.first.fixed)
            and (problem.required_key is None or c.first.required is not None)]
    if not pool:
        return everything

    def relaxed(members: list[int]) -> bool:
        return (all(sum(classes[i].capacity(s.key) for i in members) >= s.count for s in shapes)
                and sum(max(classes[i].first.free_gpus, 0) * classes[i].k for i in members) >= problem.gpus)

    def one_node(c: NodeClass) -> bool:
        if fixed and {n.name for n in fixed} != {c.first.name}:
            return False
        return fits_on(c.first, {s.key: s.count for s in shapes}, index.shapes)

    def fits(members: list[int]) -> bool:
        if any(one_node(classes[i]) for i in members):
            return True
        if not all(n.rdma for n in fixed):
            return False  # a bound member on a node without RDMA: the gang cannot span nodes
        return relaxed([i for i in members if classes[i].first.rdma])

    def holds_fixed(members: list[int], domain_of: dict[str, str] | None) -> bool:
        if not fixed:
            return True
        first = classes[members[0]].first
        if any(n.required != first.required for n in fixed):
            return False
        if domain_of is None:
            return True
        d = domain_of[first.name]
        return all(domain_of[n.name] == d for n in fixed)

    if problem.preferred_key is not None:
        by_pref: dict[tuple[str | None, str], list[int]] = defaultdict(list)
        for i in pool:
            first = classes[i].first
            by_pref[(first.required, first.preferred or f"?{first.name}")].append(i)
        keep = [i for members in by_pref.values()
                if fits(members) and all(n.preferred == classes[members[0]].first.preferred for n in fixed)
                and holds_fixed(members, None)
                for i in members]
        if not keep:
            return everything  # the preferred count decides first and no single domain fits
        pool = keep
    # Node tier first (one node holding everything), then tiers inner -> outer.
    singles = [i for i in pool if one_node(classes[i])]
    if singles:
        return set(singles)
    for ti in range(len(index.tiers) - 2, -1, -1):
        tier = index.tiers[ti]
        cells: dict[tuple[str | None, str], list[int]] = defaultdict(list)
        for i in pool:
            c = classes[i]
            cells[(c.first.required, c.domains[ti])].append(i)
        keep = [i for members in cells.values()
                if holds_fixed(members, tier.domain_of) and fits(members) for i in members]
        if keep:
            return set(keep)
    return set(pool)


def _accumulate(stats: dict[Any, list[int]], key: Any, free: int, total: int, pristine: int) -> None:
    """Add one node's (or group's) GPUs to its domain: free and total summed, pristine only if all are."""
    st = stats.get(key)
    if st is None:
        stats[key] = [free, total, pristine]
    else:
        st[0] += free
        st[1] += total
        st[2] &= pristine


def _kept_tiers(nodes: Sequence[Candidate], labelled: list[bool], names: list[str], ids: list[dict[str, str]],
                stats: list[dict[str, list[int]]], group_of: dict[str, tuple[str, ...]]) -> list[Tier]:
    """The tiers that tell placements apart, outer first, then the node tier (rules: ``_tiers``)."""
    tiers: list[Tier] = []
    last_count = 1
    for t in range(len(labelled) - 1, -1, -1):
        if not labelled[t]:
            continue
        count = len(stats[t])
        if count <= last_count or count >= len(nodes):
            continue
        last_count = count
        st_t = stats[t]
        if t > 0:
            ids[t] = {name: q[t] for name, q in group_of.items()}
        tiers.append(Tier(names[t], ids[t], {d: v[0] for d, v in st_t.items()},
                          {d: v[1] for d, v in st_t.items()}, {d: bool(v[2]) for d, v in st_t.items()}))
    node_tier = Tier(NODE_TIER, {n.name: n.name for n in nodes})
    for n in nodes:
        node_tier.free[n.name] = max(n.free_gpus, 0)
        node_tier.total[n.name] = n.total_gpus
        node_tier.pristine[n.name] = n.pristine
    tiers.append(node_tier)
    return tiers
