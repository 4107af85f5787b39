"""The gang placement problem, independent of Kubernetes: what must be placed, where it may go, how
placements compare.

Both planners (``greedy`` and the CP-SAT ``solver``) read a :class:`Problem` and answer with an
:class:`Assignment` (pods of each shape per node); :func:`assess` scores any assignment the same way
so the two can be compared, and so the benchmark reports domains used and stranded GPUs for both.

Why the objective looks the way it does (highest priority first, compared lexicographically):

1. ``preferred``: domains of ``topology-preferred-placement`` used (the user said so explicitly);
2. one entry per topology tier, **outer to inner** (zone, spine, leaf, NVLink domain) and finally the
   number of nodes: fewest domains at each tier, a cross-spine hop costing more than any number of
   extra leaves, the way Kueue's and KAI's topology-aware schedulers think about it;
3. ``bottom``: the rest, in GPU units: best fit (free GPUs of every domain/node touched, so holes get
   filled and big free blocks stay big), pristine structures broken open (whole free nodes/domains
   are what the next large gang needs), the GPU model (preference order, then price) and a penalty
   for mixing GPU models in one lockstep gang.

Domain ids are qualified by their outer path so tiers always nest (a leaf named "leaf-1" under two
spines is two leaves), which makes the pruning in :func:`prune` exact.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

# Weights inside the bottom group, in GPU units. A member on a less preferred / pricier GPU model
# costs about one GPU of fragmentation per GPU it uses and rank step; mixing GPU models costs like
# breaking two whole 8-GPU nodes, because the gang runs at the speed of the slowest model.
TYPE_WEIGHT = 1
MODEL_MIX_WEIGHT = 16
NODE_TIER = "node"


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
    shapes: frozenset[str] | None = None  # shapes allowed here (None: every shape); empty: context only
    required: str | None = None  # domain of the required-topology label (None: unlabelled)
    preferred: str | None = None  # domain of the preferred-topology label
    fixed: int = 0  # gang members already bound here (replans after a partial bind or restart)

    def allows(self, shape: str) -> bool:
        return self.shapes is None or shape in self.shapes


@dataclass(frozen=True, slots=True)
class Problem:
    gang: str
    shapes: tuple[Shape, ...]
    nodes: tuple[Candidate, ...]
    tier_names: tuple[str, ...] = ()  # one per path entry, inner -> outer (messages, reports)
    required_key: str | None = None
    preferred_key: str | None = None

    @property
    def pods(self) -> int:
        return sum(s.count for s in self.shapes)

    @property
    def gpus(self) -> int:
        return sum(s.count * s.gpus for s in self.shapes)

    @property
    def fixed_nodes(self) -> tuple[Candidate, ...]:
        return tuple(n for n in self.nodes if n.fixed)


# node name -> shape key -> pods of that shape placed there
Assignment = dict[str, dict[str, int]]


def capacity(node: Candidate, shape: Shape) -> int:
    """How many pods of ``shape`` fit on ``node`` on their own (0 if not allowed)."""
    if not node.allows(shape.key):
        return 0
    cap = shape.count
    if shape.gpus:
        cap = min(cap, node.free_gpus // shape.gpus)
    if shape.cpu_millis > 0:
        cap = min(cap, int(node.free_cpu // shape.cpu_millis))
    if shape.memory_bytes > 0:
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


# --- topology ---------------------------------------------------------------------------------------
@dataclass(slots=True)
class Tier:
    """One non-trivial topology tier: its qualified domains and which node is in which."""

    name: str
    domain_of: dict[str, str]  # node -> qualified domain id
    free: dict[str, int] = field(default_factory=dict)  # domain -> free GPUs (all nodes in it)
    total: dict[str, int] = field(default_factory=dict)  # domain -> GPUs
    pristine: dict[str, bool] = field(default_factory=dict)  # no GPU in use anywhere in it


def qualified_paths(problem: Problem) -> dict[str, tuple[str, ...]]:
    """Per node, domain ids made unique by their outer path; unlabelled -> a domain of its own."""
    depth = max((len(n.path) for n in problem.nodes), default=0)
    labelled = [any(t < len(n.path) and n.path[t] for n in problem.nodes) for t in range(depth)]
    out: dict[str, tuple[str, ...]] = {}
    for n in problem.nodes:
        raw = [n.path[t] if t < len(n.path) else "" for t in range(depth)]
        ids: list[str] = []
        for t in range(depth):
            if not labelled[t]:
                ids.append("")  # nobody labels this tier: no information, dropped below
                continue
            # Unknown locality is assumed to be the worst: a domain of its own.
            own = raw[t] or f"?{n.name}"
            outer = "/".join(raw[u] or "?" for u in range(depth - 1, t, -1) if labelled[u])
            ids.append(f"{outer}/{own}" if outer else own)
        out[n.name] = tuple(ids)
    return out


def tiers_of(problem: Problem) -> list[Tier]:
    """The tiers that can tell placements apart, **outer to inner**, ending with the node tier.

    A tier whose domains are single nodes duplicates the node tier, and a tier that partitions the
    nodes exactly like the tier above it adds nothing; both are dropped so the model stays small and
    the lexicographic weights stay modest.
    """
    paths = qualified_paths(problem)
    depth = max((len(p) for p in paths.values()), default=0)
    names = list(problem.tier_names) + [f"tier-{t}" for t in range(len(problem.tier_names), depth)]
    tiers: list[Tier] = []
    seen_partitions: set[frozenset[frozenset[str]]] = set()
    node_partition = frozenset(frozenset([n.name]) for n in problem.nodes)
    for t in range(depth - 1, -1, -1):
        domain_of = {name: p[t] for name, p in paths.items() if p[t]}
        if len(domain_of) < len(problem.nodes):
            continue
        groups: dict[str, set[str]] = defaultdict(set)
        for name, d in domain_of.items():
            groups[d].add(name)
        partition = frozenset(frozenset(g) for g in groups.values())
        if partition in seen_partitions or partition == node_partition:
            continue
        seen_partitions.add(partition)
        tiers.append(Tier(names[t], domain_of))
    tiers.append(Tier(NODE_TIER, {n.name: n.name for n in problem.nodes}))
    by_name = {n.name: n for n in problem.nodes}
    for tier in tiers:
        for name, d in tier.domain_of.items():
            n = by_name[name]
            tier.free[d] = tier.free.get(d, 0) + max(n.free_gpus, 0)
            tier.total[d] = tier.total.get(d, 0) + n.total_gpus
            tier.pristine[d] = tier.pristine.get(d, True) and _pristine(n)
    return tiers


def _pristine(n: Candidate) -> bool:
    return n.total_gpus > 0 and n.free_gpus >= n.total_gpus and not n.fixed


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
        return (self.preferred, *(c for _, c in self.tier_counts), self.bottom)

    def domains(self, tier: str) -> int:
        return dict(self.tier_counts).get(tier, 0)


def node_bottom(n: Candidate) -> int:
    """Per node used: best fit (its free GPUs) plus pristine penalty (all its GPUs)."""
    return max(n.free_gpus, 0) + (n.total_gpus if _pristine(n) else 0)


def domain_bottom(tier: Tier, d: str) -> int:
    return max(tier.free.get(d, 0), 0) + (tier.total.get(d, 0) if tier.pristine.get(d) else 0)


def type_cost(n: Candidate, models: int) -> int:
    """Per GPU placed on ``n``: preference rank first, then price rank (ranks are small integers)."""
    return TYPE_WEIGHT * (n.pref_rank * (models + 1) + n.cost_rank)


def assess(problem: Problem, assignment: Assignment, tiers: list[Tier] | None = None) -> Assessment:
    """Check an assignment against every hard rule and score it with the planners' objective."""
    tiers = tiers if tiers is not None else tiers_of(problem)
    by_name = {n.name: n for n in problem.nodes}
    shapes = {s.key: s for s in problem.shapes}
    placed: dict[str, int] = defaultdict(int)
    problems: list[str] = []
    used = {n.name for n in problem.nodes if n.fixed}
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
    for s in problem.shapes:
        if placed.get(s.key, 0) != s.count:
            problems.append(f"{placed.get(s.key, 0)}/{s.count} pods of shape {s.key} placed")
    if problem.required_key is not None:
        doms = {by_name[u].required for u in used if u in by_name}
        if None in doms or len(doms) > 1:
            problems.append(f"not in one {problem.required_key} domain")
    if len(used) > 1 and not all(by_name[u].rdma for u in used if u in by_name):
        problems.append("spans nodes without RDMA")
    preferred = 0
    if problem.preferred_key is not None:
        preferred = len({by_name[u].preferred or f"?{u}" for u in used})
    counts = tuple((t.name, len({t.domain_of[u] for u in used if u in t.domain_of})) for t in tiers)
    models = len({by_name[u].gpu_model for u in used if by_name[u].gpu_model})
    n_models = max((n.cost_rank for n in problem.nodes), default=0) + 1
    bottom = 0
    stranded = 0
    opened = 0
    for u in used:
        n = by_name[u]
        bottom += node_bottom(n)
        per_shape = assignment.get(u, {})
        gpus_here = sum(shapes[k].gpus * c for k, c in per_shape.items())
        bottom += gpus_here * type_cost(n, n_models)
        left = n.free_gpus - gpus_here
        if left > 0 and (gpus_here or n.fixed):
            stranded += left
        if _pristine(n) and gpus_here:
            opened += 1
    for t in tiers[:-1]:
        for d in {t.domain_of[u] for u in used if u in t.domain_of}:
            bottom += domain_bottom(t, d)
    bottom += MODEL_MIX_WEIGHT * max(models - 1, 0)
    return Assessment(not problems, "; ".join(problems), preferred, counts, bottom, stranded, opened, models)


# --- pruning ----------------------------------------------------------------------------------------
def prune(problem: Problem, tiers: list[Tier] | None = None) -> Problem:
    """Drop candidates that cannot be in an optimal plan (exact for the objective above).

    With tiers compared outer-first and nested domains, if some single tier-t domain can hold the
    whole gang, the optimum uses one domain at tier t and above, and it is one of the tier-t domains
    that fit. So only the *innermost* tier with a fitting domain matters, and only its fitting
    domains (intersected with the required domain, when there is one) stay candidates. The same
    argument applies first to the preferred-topology domains. Gangs with several shapes or with
    members already bound are left alone: there, capacity is not a single number.
    """
    if len(problem.shapes) != 1 or problem.fixed_nodes:
        return problem
    shape = problem.shapes[0]
    need = shape.count
    tiers = tiers if tiers is not None else tiers_of(problem)
    cap = {n.name: capacity(n, shape) for n in problem.nodes}
    eligible = [n for n in problem.nodes if cap[n.name] > 0]
    if problem.required_key is not None:
        eligible = [n for n in eligible if n.required is not None]

    def fitting_cells(group: Iterable[Candidate], key: str) -> list[set[str]]:
        """Cells (domain at tier ``key`` within one required domain) that hold the whole gang."""
        cells: dict[tuple[str | None, str], list[Candidate]] = defaultdict(list)
        tier = next((t for t in tiers if t.name == key), None)
        for n in group:
            d = tier.domain_of.get(n.name, n.name) if tier else n.name
            cells[(n.required, d)].append(n)
        out = []
        for members in cells.values():
            rdma_cap = sum(cap[n.name] for n in members if n.rdma)
            if rdma_cap >= need or max(cap[n.name] for n in members) >= need:
                out.append({n.name for n in members})
        return out

    pool = eligible
    if problem.preferred_key is not None:
        by_pref: dict[tuple[str | None, str], list[Candidate]] = defaultdict(list)
        for n in eligible:
            by_pref[(n.required, n.preferred or f"?{n.name}")].append(n)
        keep: set[str] = set()
        for members in by_pref.values():
            rdma_cap = sum(cap[n.name] for n in members if n.rdma)
            if rdma_cap >= need or max(cap[n.name] for n in members) >= need:
                keep |= {n.name for n in members}
        if not keep:
            return problem  # the preferred count decides first and no single domain fits: no pruning
        pool = [n for n in eligible if n.name in keep]
    for tier in reversed(tiers):  # inner (node) -> outer
        cells = fitting_cells(pool, tier.name)
        if cells:
            keep_names = set().union(*cells)
            break
    else:
        return problem if pool is eligible else _restrict(problem, {n.name for n in pool})
    return _restrict(problem, keep_names)


def _restrict(problem: Problem, keep: set[str]) -> Problem:
    """Non-candidates stay as context (domain free/pristine figures) but may host nothing."""
    empty: frozenset[str] = frozenset()
    nodes = tuple(n if n.name in keep else replace(n, shapes=empty) for n in problem.nodes)
    return replace(problem, nodes=nodes)
