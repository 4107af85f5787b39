"""Data gravity: pull a pod toward the data it reads (``llm-placement.io/depends-on``).

Each ``depends-on`` name is an edge to a producer: a pod or a gang, in the consumer's namespace unless
written ``ns/name``. An edge resolves to the node(s) where the producer's output sits: where it runs or
is bound, where it ran if it finished less than ``producer_memory_seconds`` ago (its output is still on
that node's disk), or where a gang's reservation plan puts it. The candidate's cost is the estimated
time to move ``input-data-gb`` from there, over the tier bandwidths of ``tier_bandwidth_gbps``.

Cost model (why a ladder of hops rather than one bandwidth per tier): a consumer always pays for
reading the producer's local copy (``same_node``); every tier it must cross adds a store-and-forward
hop at that tier's bandwidth — the NVLink domain, then each fabric tier inward to outward (leaf, spine,
block...), then the zone network, then the inter-zone link. Summing hops makes the cost strictly grow
with distance whatever bandwidths the operator configures (the default NVLink figure is faster than the
local-disk one, so a per-tier figure alone would rank "same NVLink domain" above "same node").

Serving groups (``llm-placement.io/serving-group``) reuse the same edges: a ``prefill`` pod has an edge
to the ``decode`` pods of its group and the reverse, since every request's KV cache crosses between
them; the ladder then prefers the partner's node, then its NVLink domain, then its leaf switch.

Pure: reads a ClusterSnapshot, imports no web or Kubernetes client code, and never mutates state.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any

from app.core.nodes import NodeFacts
from app.core.policy import ZONE_LABEL, GravityPolicy
from app.core.reasons import ReasonCode, Rejection, reject
from app.core.scoring import GravityFn
from app.core.snapshot import ClusterSnapshot, PlacedPod, serving_group_key
from app.core.workload import MAX_LIST_ITEMS, PREFIX, ServingRole, WorkloadSpec

# When a pod declares producers but not how much it reads, still prefer its producers' neighbourhood:
# the amount only weighs producers against each other, so any positive figure gives the same ranking.
DEFAULT_INPUT_GB = 1.0
# Namespace annotation by which a producer's namespace lets other namespaces' pods follow its pods.
SHARE_ANNOTATION = PREFIX + "share-with"


class Distance(IntEnum):
    """How far a candidate node is from a producer's data, nearest first."""

    NODE = 0
    NVLINK = 1
    FABRIC = 2
    ZONE = 3
    CROSS_ZONE = 4

    @property
    def label(self) -> str:
        """Metric label and explain value (bounded vocabulary)."""
        return _LABELS[self]


_LABELS = {
    Distance.NODE: "node",
    Distance.NVLINK: "nvlink",
    Distance.FABRIC: "fabric",
    Distance.ZONE: "zone",
    Distance.CROSS_ZONE: "cross-zone",
}
MISSING = "missing"  # the distance label of an edge whose producer could not be found

# llm-placement.io/colocation levels (the parser maps "required" to "node").
LEVELS: dict[str, Distance] = {
    "node": Distance.NODE,
    "nvlink": Distance.NVLINK,
    "leaf": Distance.FABRIC,
    "fabric": Distance.FABRIC,
    "zone": Distance.ZONE,
}
# Levels that accept only the inner-most fabric tiers: "leaf" is the same NVLink domain or the same
# tier-0 domain (leaf switch), where a prefill/decode pair's KV-cache transfers stay one hop.
_MAX_RUNG = {"leaf": 0}
_LEVEL_WORDS = {"node": "node", "nvlink": "NVLink domain", "leaf": "NVLink domain or leaf switch",
                "fabric": "fabric tier", "zone": "zone"}
SERVING_GROUP = "serving-group"  # Edge.kind of a serving group's partner pods


def within_level(level: str, distance: Distance, rung: int) -> bool:
    """Does a pair at ``distance`` (and, for FABRIC, inner-most shared ``rung``) satisfy ``level``?"""
    if distance > LEVELS[level]:
        return False
    cap = _MAX_RUNG.get(level)
    return cap is None or distance is not Distance.FABRIC or rung <= cap


@dataclass(frozen=True, slots=True)
class Site:
    """One place a producer's output sits, with the share of the edge's data found there."""

    node: str
    state: str  # "bound" (running or bound), "finished", "planned" (gang reservation)
    share: float


@dataclass(frozen=True, slots=True)
class Edge:
    """One resolved ``depends-on`` entry."""

    producer: str  # ns/name
    kind: str  # "pod", "gang" or "missing"
    gb: float  # data this edge carries (the pod's input-data-gb split over its edges)
    sites: tuple[Site, ...] = ()
    note: str = ""

    @property
    def found(self) -> bool:
        return bool(self.sites)


@dataclass(frozen=True, slots=True)
class EdgeAt:
    """An edge evaluated at one candidate node."""

    producer: str
    distance: str  # Distance.label, or MISSING
    seconds: float  # estimated transfer time
    cross_node_gb: float  # the part of the edge's data that lives on other nodes
    gb: float


@dataclass(slots=True)
class _Memo:
    generation: int = -1
    finished_gangs: dict[str, list[PlacedPod]] = field(default_factory=dict)


class GravityModel:
    """Implements the placer's GravityHook over a ClusterSnapshot.

    ``planned`` returns the planned node of every member of a gang that holds a reservation (one entry
    per member), or nothing; the gang ledger supplies it when present. ``clock`` is injectable so the
    simulator and tests can move time.
    """

    def __init__(
        self,
        snapshot: ClusterSnapshot,
        policy: GravityPolicy,
        *,
        planned: Callable[[str], Sequence[str]] | None = None,
        clock: Callable[[], float] = time.time,
        default_input_gb: float = DEFAULT_INPUT_GB,
    ) -> None:
        self.snapshot = snapshot
        self.policy = policy
        self.planned = planned
        self.clock = clock
        self.default_input_gb = default_input_gb
        self._memo = _Memo()
        # Fabric tiers that are really the zone label are "same zone", not "same fabric tier".
        tiers = policy.fabric_tiers
        self._fabric_index = [i for i, keys in enumerate(tiers) if ZONE_LABEL not in keys]
        bw = policy.tier_bandwidth
        hops = [1 / bw.same_node, 1 / bw.same_nvlink_domain]
        hops += [1 / bw.same_fabric_tier] * len(self._fabric_index)
        hops += [1 / bw.same_zone, 1 / bw.cross_zone]
        ladder = [sum(hops[: i + 1]) for i in range(len(hops))]
        nf = len(self._fabric_index)
        self._node_s = ladder[0]
        self._nvlink_s = ladder[1]
        self._fabric_s = ladder[2 : 2 + nf]  # by rung: the inner-most shared fabric tier
        self._zone_s = ladder[2 + nf]
        self._cross_s = ladder[3 + nf]

    # --- distance and cost -----------------------------------------------------------------------
    def distance(self, a: NodeFacts, b: NodeFacts) -> tuple[Distance, int]:
        """Distance between two nodes, and for FABRIC the rung of the inner-most shared tier."""
        if a.name == b.name:
            return Distance.NODE, -1
        if a.nvlink_domain == b.nvlink_domain:
            return Distance.NVLINK, -1
        return self._far(a.fabric, a.zone, b.fabric, b.zone)

    def _far(
        self, fa: tuple[str, ...], za: str, fb: tuple[str, ...], zb: str
    ) -> tuple[Distance, int]:
        """Distance between nodes known to be in different NVLink domains: fabric ids and zone only."""
        for rung, i in enumerate(self._fabric_index):
            x = fa[i] if i < len(fa) else ""
            if x and fb[i:i + 1] == (x,):
                return Distance.FABRIC, rung
        # Two nodes without zone labels are taken to share the (single, unlabelled) site.
        if za == zb:
            return Distance.ZONE, -1
        return Distance.CROSS_ZONE, -1

    def _far_s(self, fa: tuple[str, ...], za: str, fb: tuple[str, ...], zb: str) -> float:
        """Seconds per GB of ``_far`` without building the enum (the prioritize hot path)."""
        for rung, i in enumerate(self._fabric_index):
            x = fa[i] if i < len(fa) else ""
            if x and fb[i:i + 1] == (x,):
                return self._fabric_s[rung]
        return self._zone_s if za == zb else self._cross_s

    def seconds_per_gb(self, distance: Distance, rung: int = 0) -> float:
        if distance is Distance.NODE:
            return self._node_s
        if distance is Distance.NVLINK:
            return self._nvlink_s
        if distance is Distance.FABRIC:
            return self._fabric_s[max(0, min(rung, len(self._fabric_s) - 1))]
        if distance is Distance.ZONE:
            return self._zone_s
        return self._cross_s

    # --- resolution ------------------------------------------------------------------------------
    def _fresh(self, pod: PlacedPod, now: float) -> bool:
        return pod.finished_at is None or now - pod.finished_at <= self.policy.producer_memory_seconds

    def _finished_gang_members(self, gang: str) -> list[PlacedPod]:
        # Finished pods are indexed by name only; build a gang index once per snapshot generation.
        memo = self._memo
        if memo.generation != self.snapshot.generation:
            index: dict[str, list[PlacedPod]] = {}
            for p in self.snapshot.finished.values():
                if p.gang:
                    index.setdefault(p.gang, []).append(p)
            memo.finished_gangs = index
            memo.generation = self.snapshot.generation
        return memo.finished_gangs.get(gang, [])

    def _resolve_one(self, key: str, gb: float, now: float) -> Edge:
        snap = self.snapshot
        window = self.policy.producer_memory_seconds
        forgotten = ""
        at = snap.node_of(key)
        if at is not None:
            node, finished = at
            pod = snap.finished.get(key) if finished else None
            if pod is None or self._fresh(pod, now):
                if node not in snap.nodes:
                    return Edge(key, "missing", gb, note=f"producer {key} ran on {node}, no longer a node")
                return Edge(key, "pod", gb, (Site(node, "finished" if finished else "bound", 1.0),))
            forgotten = f"producer {key} finished more than {window:g}s ago; its node is forgotten"
        # A gang: live bound members, members that finished within the window, else the plan.
        located: list[tuple[str, str]] = [(n, "bound") for n in snap.gang_nodes(key)]
        located += [(p.node, "finished") for p in self._finished_gang_members(key) if self._fresh(p, now)]
        if not located and self.planned is not None:
            located = [(n, "planned") for n in self.planned(key)]
        lost = {n for n, _ in located if n not in snap.nodes}
        located = [(n, s) for n, s in located if n not in lost]
        if located:
            # A gang's output (a sharded checkpoint) is spread over its members: each member's node
            # holds its share, so a consumer next to one member still reads the others' shares remotely.
            counts = Counter(located)
            total = sum(counts.values())
            sites = tuple(Site(n, s, c / total) for (n, s), c in sorted(counts.items()))
            return Edge(key, "gang", gb, sites)
        if lost:
            return Edge(key, "missing", gb, note=f"producer {key} ran on nodes no longer in the cluster")
        note = forgotten or (
            f"producer {key} not found (not running, bound, planned, or finished in the last {window:g}s)"
        )
        return Edge(key, "missing", gb, note=note)

    def resolve(self, spec: WorkloadSpec) -> list[Edge]:
        """Every distinct producer the pod names, resolved; never raises."""
        # A dict keeps first-seen order and de-duplicates in linear time (the parser bounds the list
        # at MAX_LIST_ITEMS, docs/annotations.md; the slice keeps specs built elsewhere bounded too).
        keys: dict[str, None] = {}
        for raw in spec.depends_on[:MAX_LIST_ITEMS]:
            ns, sep, name = raw.partition("/")
            key = raw if sep and ns and name else f"{spec.namespace}/{raw.strip('/')}"
            if key != spec.key:
                keys.setdefault(key)
        group = self._serving_group_edge(spec)
        if not keys:
            return [group] if group is not None else []
        # input-data-gb is what the pod reads from all of them together.
        per_edge = (spec.input_data_gb or self.default_input_gb) / len(keys)
        now = self.clock()
        edges = [self._resolve_one(k, per_edge, now) if self.shared(k, spec.namespace)
                 else self._unshared(k, spec.namespace, per_edge) for k in keys]
        return [*edges, group] if group is not None else edges

    def _serving_group_edge(self, spec: WorkloadSpec) -> Edge | None:
        """The placed partners of a prefill or decode pod: its group's pods of the other role.

        The group is looked up in the pod's own namespace only. Until a partner is placed the edge has
        no sites: it pulls nowhere and, unlike a missing producer, blocks nothing (the first pod of a
        pair goes where it fits best, the second follows it). Its weight is ``default_input_gb``, the
        figure of a producer of unknown size: the pull ranks partners' neighbourhoods, not GB.
        """
        if spec.serving_group is None or spec.serving_role is ServingRole.BOTH:
            return None
        want = ServingRole.DECODE if spec.serving_role is ServingRole.PREFILL else ServingRole.PREFILL
        key = serving_group_key(spec)
        located: list[str] = []
        for peer in self.snapshot.serving_group_members(key):
            if peer.serving_role is not want or peer.key == spec.key:
                continue
            at = self.snapshot.node_of(peer.key)
            if at is not None and not at[1] and at[0] in self.snapshot.nodes:
                located.append(at[0])
        label = f"{key} ({want.value})"
        if not located:
            return Edge(label, SERVING_GROUP, self.default_input_gb,
                        note=f"no {want.value} pod of serving-group {key} is placed yet")
        counts = Counter(located)
        sites = tuple(Site(n, "bound", c / len(located)) for n, c in sorted(counts.items()))
        return Edge(label, SERVING_GROUP, self.default_input_gb, sites)

    def shared(self, key: str, consumer_namespace: str) -> bool:
        """May a pod of ``consumer_namespace`` follow producer ``key`` (docs/data-gravity.md)?

        Its own namespace always; another only when that namespace opts in with the annotation
        ``llm-placement.io/share-with`` naming the consumer's namespace (or ``*``).
        """
        producer_ns = key.partition("/")[0]
        if producer_ns == consumer_namespace:
            return True
        allowed = self.snapshot.namespace_shares.get(producer_ns, frozenset())
        return "*" in allowed or consumer_namespace in allowed

    @staticmethod
    def _unshared(key: str, consumer_namespace: str, gb: float) -> Edge:
        # Never looked up: the same answer whether the producer exists or not, so a tenant cannot
        # use depends-on to learn what runs in a namespace that does not share with it, or where.
        return Edge(key, "missing", gb, note=f"producer {key} not found or its namespace does not "
                    f"share with {consumer_namespace} ({SHARE_ANNOTATION})")

    # --- per candidate ---------------------------------------------------------------------------
    def edge_at(self, edge: Edge, node: NodeFacts) -> EdgeAt:
        if not edge.found:
            return EdgeAt(edge.producer, MISSING, 0.0, 0.0, edge.gb)
        seconds = 0.0
        cross = 0.0
        nearest = Distance.CROSS_ZONE
        for site in edge.sites:
            facts = self.snapshot.nodes.get(site.node)
            if facts is None:  # vanished since resolution; resolve() filters these out normally
                continue
            d, rung = self.distance(node, facts)
            seconds += edge.gb * site.share * self.seconds_per_gb(d, rung)
            if d is not Distance.NODE:
                cross += edge.gb * site.share
            nearest = min(nearest, d)
        return EdgeAt(edge.producer, nearest.label, seconds, cross, edge.gb)

    def cost(self, edges: Sequence[Edge], node: str) -> float | None:
        """Estimated seconds to read every found edge's data onto ``node`` (None: unknown node)."""
        return self.cost_fn(edges)(node)

    def cost_fn(self, edges: Sequence[Edge]) -> Callable[[str], float | None]:
        """``cost`` for many candidates at once (the prioritize hot path, up to thousands of nodes).

        Beyond its own NVLink domain a candidate sees producers only through fabric ids and zone, so
        candidates share one computation per (fabric, zone) and the producers' data is pre-summed per
        (fabric, zone): a 64-member gang costs about what one pod does. Producers inside the
        candidate's own NVLink domain (its node included) are then re-priced at their nearer rung.
        """
        found = [e for e in edges if e.found]
        nodes = self.snapshot.nodes
        far_gb: dict[tuple[tuple[str, ...], str], float] = {}
        by_domain: dict[str, list[tuple[str, tuple[str, ...], str, float]]] = {}
        for e in found:
            for s in e.sites:
                if (f := nodes.get(s.node)) is not None:
                    key = (f.fabric, f.zone)
                    far_gb[key] = far_gb.get(key, 0.0) + e.gb * s.share
                    near = (f.name, f.fabric, f.zone, e.gb * s.share)
                    by_domain.setdefault(f.nvlink_domain, []).append(near)
        memo: dict[tuple[tuple[str, ...], str], float] = {}

        def far_cost(fabric: tuple[str, ...], zone: str) -> float:
            total = 0.0
            for (fb, zb), gb in far_gb.items():
                total += gb * self._far_s(fabric, zone, fb, zb)
            return total

        def fn(node: str) -> float | None:
            facts = nodes.get(node)
            if facts is None:
                return None
            key = (facts.fabric, facts.zone)
            c = memo.get(key)
            if c is None:
                c = memo[key] = far_cost(*key)
            near = by_domain.get(facts.nvlink_domain)
            if near:
                # Producers in this node's NVLink domain were priced as if a fabric tier away:
                # re-price their share at the node or NVLink rung.
                for name, fb, zb, gb in near:
                    c -= gb * self._far_s(key[0], key[1], fb, zb)
                    c += gb * (self._node_s if name == node else self._nvlink_s)
            return c

        return fn

    # --- GravityHook -----------------------------------------------------------------------------
    def hard_rejections(self, spec: WorkloadSpec, nodes: Iterable[str]) -> dict[str, Rejection]:
        level = spec.colocation_required
        if level is None or level not in LEVELS or not (spec.depends_on or spec.serving_group):
            return {}
        # A serving group without a placed partner constrains nothing (see _serving_group_edge).
        edges = [e for e in self.resolve(spec) if e.found or e.kind != SERVING_GROUP]
        if not edges:
            return {}
        missing = [e.producer for e in edges if not e.found]
        if missing:
            # Resolvable: the producer may appear (be created, bound or planned) and the pod retried.
            who = missing[0] + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else "")
            r = reject(ReasonCode.GRAVITY, f"producer {who} not found; colocation required",
                       unresolvable=False)
            return dict.fromkeys(nodes, r)
        limit = LEVELS[level]
        who = "its producer" if spec.depends_on else "its serving-group partner"
        r = reject(ReasonCode.GRAVITY, f"must run in the same {_LEVEL_WORDS[level]} as {who}")
        # Per producer, the domains a candidate may share with it at the level: a few set lookups per
        # node instead of a distance per (node, member) pair. Level flags are hoisted out of the loop.
        nvlink_ok, fabric_ok, zone_ok = (limit >= Distance.NVLINK, limit >= Distance.FABRIC,
                                         limit >= Distance.ZONE)
        max_rung = _MAX_RUNG.get(level)
        checks: list[tuple[set[str], set[str], list[tuple[int, set[str]]], set[str] | None]] = []
        for e in edges:
            d_names, d_nvlink, d_fabric, d_zones = self._domains(e)
            if max_rung is not None:
                d_fabric = d_fabric[: max_rung + 1]
            d_tiers = [(i, ids) for i, ids in d_fabric if ids] if fabric_ok else []
            checks.append((d_names, d_nvlink if nvlink_ok else set(), d_tiers, d_zones if zone_ok else None))
        out: dict[str, Rejection] = {}
        nodes_of = self.snapshot.nodes
        for n in nodes:
            facts = nodes_of.get(n)
            if facts is None:
                continue  # the placer reports uncached nodes itself
            # Every producer must be within the level; for a gang, any member's node will do.
            for names, nvlink, tiers, zones in checks:
                if n in names or facts.nvlink_domain in nvlink:
                    continue
                fab = facts.fabric
                if any(i < len(fab) and fab[i] in ids for i, ids in tiers):
                    continue
                if zones is not None and facts.zone in zones:
                    continue
                out[n] = r
                break
        return out

    def _domains(self, edge: Edge) -> tuple[set[str], set[str], list[tuple[int, set[str]]], set[str]]:
        """A producer's nodes, NVLink domains, non-empty non-zone fabric ids per tier, and zones."""
        names: set[str] = set()
        nvlink: set[str] = set()
        fabric: list[tuple[int, set[str]]] = [(i, set()) for i in self._fabric_index]
        zones: set[str] = set()
        for s in edge.sites:
            f = self.snapshot.nodes.get(s.node)
            if f is None:
                continue
            names.add(f.name)
            nvlink.add(f.nvlink_domain)
            for i, ids in fabric:
                if i < len(f.fabric) and f.fabric[i]:
                    ids.add(f.fabric[i])
            zones.add(f.zone)
        return names, nvlink, fabric, zones

    def term(self, spec: WorkloadSpec, nodes: Sequence[str] | None = None) -> GravityFn | None:
        """Score term in [0, 1]: best cost among ``nodes`` / this node's cost (None: no opinion).

        Normalising against the best candidate of this request (like the cost term) keeps a CPU->GPU
        edge, which can never be same-node, pulling as hard toward the producer's fabric tier as a
        GPU->GPU edge pulls toward its node. Without ``nodes`` the reference is the ideal, all-local cost.
        """
        if not spec.depends_on and spec.serving_group is None:
            return None
        edges = [e for e in self.resolve(spec) if e.found]
        if not edges:
            return None  # producer unknown: neutral, never fatal (explain says why)
        cost = self.cost_fn(edges)
        if nodes is None:
            best = sum(e.gb for e in edges) * self._node_s
            return lambda n: _ratio(best, cost(n))
        costs = {n: cost(n) for n in nodes}
        known = [c for c in costs.values() if c is not None]
        if not known:
            return None
        best = min(known)
        return lambda n: _ratio(best, costs[n] if n in costs else cost(n))

    # --- reporting -------------------------------------------------------------------------------
    def observe(self, spec: WorkloadSpec, node: str) -> list[EdgeAt]:
        """The pod's edges as bound on ``node`` (for metrics); missing producers included."""
        facts = self.snapshot.nodes.get(node)
        out: list[EdgeAt] = []
        for e in self.resolve(spec):
            if e.kind == SERVING_GROUP and not e.found:
                continue  # a partner not placed yet is not a lost producer
            if facts is None or not e.found:
                out.append(EdgeAt(e.producer, MISSING, 0.0, 0.0, e.gb))
            else:
                out.append(self.edge_at(e, facts))
        return out

    def explain(
        self, spec: WorkloadSpec, nodes: Sequence[str], candidates: Sequence[str] | None = None
    ) -> dict[str, Any]:
        """Edges, where each producer is, and the cost at every node (JSON-ready); the term is relative
        to ``candidates`` (the feasible nodes, as in prioritize), default ``nodes``."""
        edges = self.resolve(spec)
        detail: dict[str, Any] = {
            "colocation_required": spec.colocation_required,
            "input_data_gb": spec.input_data_gb or (self.default_input_gb if edges else 0.0),
            "edges": [],
            "notes": [e.note for e in edges if e.note],
            "nodes": {},
        }
        if not edges:
            return detail
        for e in edges:
            sites = []
            for s in e.sites:
                f = self.snapshot.nodes.get(s.node)
                sites.append({
                    "node": s.node, "state": s.state, "share": round(s.share, 4),
                    "nvlink_domain": f.nvlink_domain if f else None,
                    "fabric": [x for x in f.fabric if x] if f else [], "zone": f.zone if f else None,
                })
            detail["edges"].append({"producer": e.producer, "kind": e.kind, "gb": round(e.gb, 3),
                                    "sites": sites})
        found = [e for e in edges if e.found]
        term = self.term(spec, nodes if candidates is None else candidates) if found else None
        for n in nodes:
            facts = self.snapshot.nodes.get(n)
            if facts is None:
                continue
            at = [self.edge_at(e, facts) for e in edges]
            detail["nodes"][n] = {
                "seconds": round(sum(a.seconds for a in at), 3),
                "cross_node_gb": round(sum(a.cross_node_gb for a in at), 3),
                "term": None if term is None else _round(term(n)),
                "edges": [{"producer": a.producer, "distance": a.distance, "seconds": round(a.seconds, 3)}
                          for a in at],
            }
        return detail


def _ratio(best: float, cost: float | None) -> float | None:
    if cost is None:
        return None
    return 1.0 if cost <= 0 else min(1.0, best / cost)


def _round(v: float | None) -> float | None:
    return None if v is None else round(v, 4)
