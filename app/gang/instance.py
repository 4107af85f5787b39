"""Turn the cluster snapshot and a gang's members into a planning :class:`Problem` (pure).

Capacities are net of every *other* gang's reservations; the gang's own bound members are fixed on
their nodes; eligibility per member shape comes from the placer's per-node verdicts (``fits`` for
the member being filtered, :func:`app.placement.feasibility.evaluate` for other shapes).
"""

from __future__ import annotations

import hashlib
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from app.base.workload import TRAINING_STAGES, WorkloadSpec
from app.config.policy import GangPolicy
from app.gang.problem import Assignment, Candidate, Problem, Shape, fits_on
from app.placement.feasibility import NodeFit, evaluate
from app.placement.scoring import outclassed
from app.snapshot.nodes import NodeFacts, work_tflops
from app.snapshot.store import ClusterSnapshot, NodeUsage

# Nodes holding what a member reads (its producers' output): app.placement.gravity.GravityModel.data_nodes.
DataSites = Callable[[WorkloadSpec], Iterable[str]]
# Data gravity for a gang, coarse on purpose (docs/gangs.md#data-gravity): a lockstep gang is first
# kept compact by the topology tiers; among placements equal there, members go where they read their
# input locally, else over NVLink, else inside the leaf switch.
NEAR_NODE, NEAR_NVLINK, NEAR_LEAF, FAR = 0, 1, 2, 3


@dataclass(frozen=True, slots=True)
class GangInstance:
    problem: Problem
    pending: dict[str, list[WorkloadSpec]]  # shape key -> members to place (sorted by name)
    bound: dict[str, str]  # uid -> node of members already bound
    inputs: dict[str, frozenset[str]] = field(default_factory=dict)  # pending uid -> its data's nodes
    own_held: dict[str, int] = field(default_factory=dict)  # node -> GPUs pending members' claims hold


def shape_key(spec: WorkloadSpec) -> str:
    """Members with the same key are interchangeable: same resources and same placement rules.

    Tolerations and required node affinity are left out: kube-scheduler applies them (the nodes it
    offers each member), the plan does not; they are read again only at bind
    (app/base/bind_checks.py)."""
    data = spec.model_dump(exclude={"name", "uid", "node_name", "gang", "depends_on", "input_data_gb",
                                    "tolerations", "required_terms"})
    return hashlib.blake2b(repr(sorted(data.items())).encode(), digest_size=5).hexdigest()


def member_node(snapshot: ClusterSnapshot, spec: WorkloadSpec) -> str:
    """Where a member is bound ('' if pending): the watch's view first, then the pod spec."""
    placed = snapshot.pods.get(spec.uid or spec.key)
    return placed.node if placed is not None else spec.node_name


def build(
    snapshot: ClusterSnapshot,
    policy: GangPolicy,
    gang: str,
    members: Sequence[WorkloadSpec],
    eligible: Callable[[str, WorkloadSpec, str], bool],
    candidates: Iterable[str],
    reserved: Callable[[str], int],
    excluded: set[str] | frozenset[str] = frozenset(),
    data_sites: DataSites | None = None,
    own_shape: str | None = None,
) -> GangInstance:
    """The problem for ``members`` of ``gang`` over ``candidates`` (the nodes kube-scheduler offered).

    ``eligible(shape, spec, node)``: may one member of that shape run on the node on its own;
    ``reserved(node)`` is what other gangs hold there; ``data_sites(member)``: where the data a
    member reads sits (data gravity; None: no pull); ``own_shape``: the shape of the member
    kube-scheduler is filtering, whose offered nodes already passed its own selector.
    """
    pending: dict[str, list[WorkloadSpec]] = defaultdict(list)
    bound: dict[str, str] = {}
    fixed: dict[str, int] = defaultdict(int)
    for m in sorted(members, key=lambda s: s.key):
        node = member_node(snapshot, m)
        if node:
            bound[m.uid or m.key] = node
            fixed[node] += 1
        else:
            pending[shape_key(m)].append(m)
    shapes = tuple(Shape(k, len(v), v[0].gpus, v[0].cpu_millis, v[0].memory_bytes)
                   for k, v in pending.items())
    first = next(iter(pending.values()), list(members))[0]
    offered = set(candidates) - set(excluded)
    pinned: dict[str, str] = {}
    for key, specs in pending.items():
        if (at := claim_node(snapshot, specs[0])) is not None:
            pinned[key] = at
    # GPUs a pending member's allocated claims hold count as busy on their node (docs/dra.md), and
    # the plan charges the member its GPUs there again: they are the gang's own.
    own_held: dict[str, int] = defaultdict(int)
    for key, at in pinned.items():
        own_held[at] += sum(s.held_gpus for s in pending[key])
    # The offered nodes stand for every member alike only when nothing of the filtered member's
    # own narrowed them: a member whose claims are allocated is offered their node alone.
    alike = offered if own_shape not in pinned else None
    allowed: dict[str, set[str]] = {}
    by_label: dict[str, dict[str, set[str]]] = {}
    for key, specs in pending.items():
        pool = ({pinned[key]} - set(excluded) if key in pinned
                else _pool(snapshot, offered, alike, specs[0], key == own_shape, excluded, by_label))
        allowed[key] = {n for n in pool if n in snapshot.nodes and eligible(key, specs[0], n)}
    # Training is priced per unit of work, as the scorer prices it (docs/scoring.md, "Cost"): an
    # hour of a GPU three times slower is not a third of the price of the work.
    per_work = first.stage in TRAINING_STAGES and first.gpus > 0
    prices = sorted({_price(f, per_work) for f in snapshot.nodes.values() if f.has_gpus})
    rank = {p: i for i, p in enumerate(prices)}
    wanted_gpus = any(s.gpus for s in shapes) or not shapes
    inputs: dict[str, frozenset[str]] = {}
    if data_sites is not None:
        for specs in pending.values():
            for m in specs:
                if m.depends_on or m.serving_group:
                    inputs[m.uid or m.key] = frozenset(n for n in data_sites(m) if n in snapshot.nodes)
    near = near_rank(snapshot, frozenset().union(*inputs.values()))
    if per_work and inputs:
        near = _not_onto_outclassed(snapshot, set().union(*allowed.values()), near)
    nodes: list[Candidate] = []
    for name, facts in snapshot.nodes.items():
        usable = {k for k, names in allowed.items() if name in names}
        if not usable and not fixed.get(name) and not (facts.has_gpus and wanted_gpus):
            continue  # neither a candidate nor context for GPU domain figures
        free_gpus, free_cpu, free_memory = _free(snapshot, name, facts, reserved)
        nodes.append(Candidate(
            name=name,
            path=(facts.nvlink_domain, *facts.fabric),
            free_gpus=free_gpus + own_held.get(name, 0),
            total_gpus=facts.gpu_count,
            free_cpu=free_cpu,
            free_memory=free_memory,
            gpu_model=facts.gpu.name if facts.gpu else (facts.gpu_product or ""),
            rdma=facts.rdma,
            cost_rank=rank.get(_price(facts, per_work), 0),
            pref_rank=_pref_rank(first, facts),
            near_rank=near(facts),
            shapes=frozenset(usable),
            required=facts.domain_at(first.topology_required) if first.topology_required else None,
            preferred=facts.domain_at(first.topology_preferred) if first.topology_preferred else None,
            fixed=fixed.get(name, 0),
        ))
    problem = Problem(gang, shapes, tuple(nodes), policy.tier_names,
                      first.topology_required, first.topology_preferred)
    return GangInstance(problem, dict(pending), bound, inputs, dict(own_held))


def near_rank(snapshot: ClusterSnapshot, data: frozenset[str]) -> Callable[[NodeFacts], int]:
    """A node's nearness to any of the ``data`` nodes (every node is NEAR_NODE when there are none)."""
    if not data:
        return lambda facts: NEAR_NODE
    sites = [snapshot.nodes[n] for n in data if n in snapshot.nodes]
    domains = {f.nvlink_domain for f in sites}
    leaves = {f.fabric[0] for f in sites if f.fabric and f.fabric[0]}

    def rank(facts: NodeFacts) -> int:
        if facts.name in data:
            return NEAR_NODE
        if facts.nvlink_domain in domains:
            return NEAR_NVLINK
        if facts.fabric and facts.fabric[0] in leaves:
            return NEAR_LEAF
        return FAR

    return rank


NEAR_WORDS = {NEAR_NODE: "on this node", NEAR_NVLINK: "in this node's NVLink domain",
              NEAR_LEAF: "behind this node's leaf switch", FAR: "further away"}


def input_note(snapshot: ClusterSnapshot, data: frozenset[str] | None, node: str) -> str:
    """Where a member's input lies as seen from its planned node, for its GangPlanned event."""
    facts = snapshot.nodes.get(node)
    if not data or facts is None or not all(n in snapshot.nodes for n in data):
        return ""
    return f"; its input data is {NEAR_WORDS[near_rank(snapshot, data)(facts)]}"


def match_inputs(snapshot: ClusterSnapshot, members: Sequence[WorkloadSpec], slots: Sequence[str],
                 inputs: Mapping[str, frozenset[str]]) -> list[tuple[WorkloadSpec, str]]:
    """Hand out a shape's planned ``slots`` (one node per member) so each member gets the nearest
    slot to its own input data: the plan counts members per node, not which member goes where.

    Runs under the service lock at commit, for gangs of hundreds: free slots are indexed by node,
    NVLink domain and leaf, so each member costs the size of its own input, not of the gang.
    """
    free: dict[str, int] = defaultdict(int)
    by_domain: dict[str, set[str]] = defaultdict(set)
    by_leaf: dict[str, set[str]] = defaultdict(set)
    nodes = snapshot.nodes
    for n in slots:
        free[n] += 1
        if (f := nodes.get(n)) is not None:
            by_domain[f.nvlink_domain].add(n)
            if f.fabric and f.fabric[0]:
                by_leaf[f.fabric[0]].add(n)

    def take(n: str) -> str:
        free[n] -= 1
        if not free[n] and (f := nodes.get(n)) is not None:
            by_domain[f.nvlink_domain].discard(n)
            if f.fabric and f.fabric[0]:
                by_leaf[f.fabric[0]].discard(n)
        return n

    def sites(m: WorkloadSpec) -> list[NodeFacts]:
        return [nodes[n] for n in sorted(inputs.get(m.uid or m.key, ())) if n in nodes]

    out: list[tuple[WorkloadSpec, str]] = []
    left = list(members)
    levels: list[Callable[[list[NodeFacts]], str | None]] = [
        lambda fs: next((f.name for f in fs if free[f.name] > 0), None),
        lambda fs: min((n for f in fs for n in by_domain[f.nvlink_domain]), default=None),
        lambda fs: min((n for f in fs if f.fabric and f.fabric[0] for n in by_leaf[f.fabric[0]]),
                       default=None),
    ]
    for pick in levels:
        rest: list[WorkloadSpec] = []
        for m in left:
            spot = pick(sites(m))
            if spot is None:
                rest.append(m)
            else:
                out.append((m, take(spot)))
        left = rest
    remaining: list[str] = []
    for n in dict.fromkeys(slots):
        remaining += [n] * free[n]
    out += zip(left, remaining, strict=True)
    return out


def unfit_nodes(
    snapshot: ClusterSnapshot, problem: Problem, assignment: Assignment, reserved: Callable[[str], int],
    own_held: Mapping[str, int] | None = None,
) -> list[str]:
    """Nodes of ``assignment`` that can no longer take what it puts there (by today's snapshot).

    A plan solved without the lock is checked with this before it is installed: pods bound or
    gangs planned during the solve may have used the room it counted on. ``own_held``: GPUs the
    gang's pending members' allocated claims hold, per node (:attr:`GangInstance.own_held`).
    """
    shapes = {s.key: s for s in problem.shapes}
    out = []
    for name, placed in sorted(assignment.items()):
        facts = snapshot.nodes.get(name)
        if facts is None or facts.unschedulable:
            out.append(name)
            continue
        gpus, cpu, memory = _free(snapshot, name, facts, reserved)
        gpus += (own_held or {}).get(name, 0)
        now = Candidate(name, (), gpus, facts.gpu_count, cpu, memory)
        if not fits_on(now, placed, shapes):
            out.append(name)
    return out


def _free(snapshot: ClusterSnapshot, name: str, facts: NodeFacts, reserved: Callable[[str], int]
          ) -> tuple[int, float, float]:
    """Free GPUs (net of other gangs' reservations), CPU and memory of a node; inf when unknown."""
    usage = snapshot.usage.get(name) or NodeUsage()
    return (
        snapshot.free_gpus(name) - reserved(name),
        facts.cpu_millis - usage.cpu_millis if facts.cpu_millis else float("inf"),
        facts.memory_bytes - usage.memory_bytes if facts.memory_bytes else float("inf"),
    )


def _price(f: NodeFacts, per_work: bool = False) -> float:
    """Per GPU-hour, or (training) per GPU-hour over the GPU's dense BF16 throughput, rounded so
    GPUs priced alike share a rank."""
    if not f.gpu_count:
        return 0.0
    hourly = f.hourly_cost / f.gpu_count
    if per_work:
        # Every GPU has a throughput to divide by: a product the catalog lacks is inferred or
        # penalised (docs/node-facts.md, "Throughput"), never ranked by its hourly price beside
        # per-work prices (that made unknown GPUs look cheapest).
        return round(1000 * hourly / work_tflops(f), 4)
    return round(hourly, 2)


def _not_onto_outclassed(snapshot: ClusterSnapshot, candidates: set[str],
                         near: Callable[[NodeFacts], int]) -> Callable[[NodeFacts], int]:
    """Nearness to the data as the scorer counts it for training (docs/data-gravity.md, "Never onto
    slower, dearer training hardware"): a node whose GPU another candidate's beats on price per unit
    of work and on speed is no nearer than the nearest candidate not beaten so."""
    beaten = outclassed({f.gpu.name: (_price(f, True), f.gpu.bf16_tflops) for n in candidates
                         if (f := snapshot.nodes.get(n)) is not None and f.gpu is not None})
    if not beaten:
        return near
    floor = min((near(f) for n in candidates if (f := snapshot.nodes.get(n)) is not None
                 and (f.gpu is None or f.gpu.name not in beaten)), default=None)
    if floor is None:
        return near

    def rank(facts: NodeFacts) -> int:
        r = near(facts)
        return max(r, floor) if facts.gpu is not None and facts.gpu.name in beaten else r

    return rank


def _pref_rank(spec: WorkloadSpec, facts: NodeFacts) -> int:
    """Position of the node's GPU in the member's gpu-preference list (the scorer's rule)."""
    if not spec.gpu_preference:
        return 0
    names = {n.lower() for n in (facts.gpu_product, facts.gpu.name if facts.gpu else None) if n}
    if facts.gpu:
        names |= {a.lower() for a in facts.gpu.aliases}
    for i, want in enumerate(spec.gpu_preference):
        if want.lower() in names:
            return i
    return len(spec.gpu_preference)


def claim_node(snapshot: ClusterSnapshot, spec: WorkloadSpec) -> str | None:
    """The node a pending member's allocated claims tie it to (a bind that failed after
    kube-scheduler's PreBind keeps the allocation: docs/gangs.md, "Gangs with DRA claims")."""
    if not spec.held_gpus:
        return None
    return next((node for claim, _ in spec.claim_gpus if snapshot.dra.is_allocated(claim)
                 and (node := snapshot.dra.claim_node(claim))), None)


def _pool(snapshot: ClusterSnapshot, offered: set[str], alike: set[str] | None, spec: WorkloadSpec,
          own: bool, excluded: set[str] | frozenset[str], by_label: dict[str, dict[str, set[str]]]
          ) -> Iterable[str]:
    """Nodes a pending shape may be planned on. kube-scheduler offers the nodes that passed its
    filters for the member it is filtering; members alike would be offered the same (``alike``),
    so they share that set. A member with a nodeSelector of its own (each member of a Kueue TAS
    gang is pinned to its node) would be offered other nodes: its own selector decides, over the
    whole cluster; so does the lack of one when the offered nodes stand for the filtered member
    alone (``alike`` None).

    ``by_label`` (label key -> value -> nodes) is filled once per key a selector names, so a gang
    of hundreds of members pinned one per node costs one pass over the nodes, not one per member."""
    if own:
        return offered
    if not spec.node_selector:
        return alike if alike is not None else set(snapshot.nodes) - set(excluded)
    sets = []
    for k, v in spec.node_selector:
        if k not in by_label:
            values: dict[str, set[str]] = defaultdict(set)
            for n, f in snapshot.nodes.items():
                if k in f.labels:
                    values[f.labels[k]].add(n)
            by_label[k] = values
        sets.append(by_label[k].get(v, set()))
    return set.intersection(*sets) - set(excluded)


def evaluator(
    snapshot: ClusterSnapshot, policy: GangPolicy, fits: Mapping[str, NodeFit] | None, spec_key: str | None,
    reserved: Callable[[str], int],
) -> Callable[[str, WorkloadSpec, str], bool]:
    """Per-node eligibility: the placer's verdicts for the filtered member's shape, else evaluate."""
    cache: dict[tuple[str, str], bool] = {}

    def eligible(key: str, spec: WorkloadSpec, node: str) -> bool:
        if fits is not None and key == spec_key:
            return node in fits
        hit = cache.get((key, node))
        if hit is None:
            facts = snapshot.nodes.get(node)
            if facts is None or facts.unschedulable:
                hit = False
            else:
                free = snapshot.free_gpus(node) - reserved(node)
                verdict = evaluate(spec, facts, snapshot.usage.get(node) or NodeUsage(), free,
                                   policy.feasibility)
                hit = isinstance(verdict, NodeFit)
            cache[(key, node)] = hit
        return hit

    return eligible
