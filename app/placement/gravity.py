"""Data gravity: pull a pod toward the data it reads (``llm-placement.io/depends-on``).

Where the data sits comes from app.placement.producers (producers and serving-group partners), what a GB
costs at each distance from app.placement.distance (a ladder of hops over the tier bandwidths of
``tier_bandwidth_gbps``). This module turns both into the placer's hook: the gravity term per
candidate, the hard ``colocation`` rule, the bind-time observation and explain's breakdown.

Pure: reads a ClusterSnapshot, imports no web or Kubernetes client code, and never mutates state.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from app.base.reasons import ReasonCode, Rejection, reject, shown
from app.base.workload import WorkloadSpec
from app.config.policy import GravityPolicy
from app.placement.distance import LEVEL_WORDS, LEVELS, MAX_RUNG, MISSING, Distance, HopLadder, within_level
from app.placement.producers import (
    DEFAULT_INPUT_GB,
    SERVING_GROUP,
    SHARE_ANNOTATION,
    Edge,
    ProducerResolver,
    Site,
)
from app.placement.scoring import GravityFn
from app.snapshot.nodes import NodeFacts
from app.snapshot.store import ClusterSnapshot

__all__ = ["LEVELS", "MISSING", "SERVING_GROUP", "SHARE_ANNOTATION", "Distance", "Edge", "EdgeAt",
           "GravityModel", "Site", "within_level"]


@dataclass(frozen=True, slots=True)
class EdgeAt:
    """An edge evaluated at one candidate node."""

    producer: str
    distance: str  # Distance.label, or MISSING
    seconds: float  # estimated transfer time
    cross_node_gb: float  # the part of the edge's data that lives on other nodes
    gb: float


class GravityModel:
    """Implements the placer's GravityHook over a ClusterSnapshot (``planned`` and ``clock``: see
    app.placement.producers.ProducerResolver)."""

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
        self.ladder = HopLadder(policy.fabric_tiers, policy.tier_bandwidth)
        self.producers = ProducerResolver(snapshot, policy.producer_memory_seconds, planned, clock,
                                          default_input_gb)

    @property
    def planned(self) -> Callable[[str], Sequence[str]] | None:
        return self.producers.planned

    def distance(self, a: NodeFacts, b: NodeFacts) -> tuple[Distance, int]:
        return self.ladder.distance(a, b)

    def seconds_per_gb(self, distance: Distance, rung: int = 0) -> float:
        return self.ladder.seconds_per_gb(distance, rung)

    def resolve(self, spec: WorkloadSpec) -> list[Edge]:
        """Every distinct producer the pod names (and its serving-group partners), resolved."""
        return self.producers.resolve(spec)

    def shared(self, key: str, consumer_namespace: str) -> bool:
        return self.producers.shared(key, consumer_namespace)

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
                total += gb * self.ladder.far_s(fabric, zone, fb, zb)
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
                    c -= gb * self.ladder.far_s(key[0], key[1], fb, zb)
                    c += gb * (self.ladder.node_s if name == node else self.ladder.nvlink_s)
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
            who = shown(missing[0]) + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else "")
            r = reject(ReasonCode.GRAVITY, f"producer {who} not found; colocation required",
                       unresolvable=False)
            return dict.fromkeys(nodes, r)
        limit = LEVELS[level]
        who = "its producer" if spec.depends_on else "its serving-group partner"
        r = reject(ReasonCode.GRAVITY, f"must run in the same {LEVEL_WORDS[level]} as {who}")
        # Per producer, the domains a candidate may share with it at the level: a few set lookups per
        # node instead of a distance per (node, member) pair. Level flags are hoisted out of the loop.
        nvlink_ok, fabric_ok, zone_ok = (limit >= Distance.NVLINK, limit >= Distance.FABRIC,
                                         limit >= Distance.ZONE)
        max_rung = MAX_RUNG.get(level)
        checks: list[tuple[set[str], set[str], list[tuple[int, set[str]]], set[str] | None]] = []
        nodes_of = self.snapshot.nodes
        for e in edges:
            d_names, d_nvlink, d_fabric, d_zones = _domains(e, nodes_of, self.ladder.fabric_index)
            if max_rung is not None:
                d_fabric = d_fabric[: max_rung + 1]
            d_tiers = [(i, ids) for i, ids in d_fabric if ids] if fabric_ok else []
            checks.append((d_names, d_nvlink if nvlink_ok else set(), d_tiers, d_zones if zone_ok else None))
        out: dict[str, Rejection] = {}
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

    def term(self, spec: WorkloadSpec, nodes: Sequence[str] | None = None) -> GravityFn | None:
        """Score term in [0, 1]: best cost among ``nodes`` / this node's cost (None: no opinion).

        Normalising against the best candidate of this request (like the cost term) keeps a CPU->GPU
        edge, which can never be same-node, pulling as hard toward the producer's fabric tier as a
        GPU->GPU edge pulls toward its node. Without ``nodes`` the reference is the ideal, all-local cost.
        ``negligible_seconds`` is added to both sides: a pure ratio would make one second against two
        as strong a pull as one hour against two, and a consumer of a few GB would then open a whole
        GPU node next to its finished producer rather than pack beside other work.
        """
        if not spec.depends_on and spec.serving_group is None:
            return None
        edges = [e for e in self.resolve(spec) if e.found]
        if not edges:
            return None  # producer unknown: neutral, never fatal (explain says why)
        cost = self.cost_fn(edges)
        # A serving group's edge is not a one-time read: it ranks partners' neighbourhoods with a
        # nominal 1 GB (docs/data-gravity.md), so no transfer time is negligible for it.
        t0 = 0.0 if any(e.kind == SERVING_GROUP for e in edges) else self.policy.negligible_seconds
        if nodes is None:
            best = sum(e.gb for e in edges) * self.ladder.node_s
            return lambda n: _ratio(best, cost(n), t0)
        costs = {n: cost(n) for n in nodes}
        known = [c for c in costs.values() if c is not None]
        if not known:
            return None
        best = min(known)
        return lambda n: _ratio(best, costs[n] if n in costs else cost(n), t0)

    def data_nodes(self, spec: WorkloadSpec) -> list[str]:
        """Nodes holding what ``spec`` reads (its producers bound, finished or planned there): the
        gang planner's pull toward the data (docs/gangs.md#data-gravity)."""
        return [s.node for e in self.resolve(spec) for s in e.sites if s.share > 0]

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
            "input_data_gb": spec.input_data_gb or (self.producers.default_input_gb if edges else 0.0),
            "edges": [],
            "notes": [e.note for e in edges if e.note],
            "nodes": {},
        }
        if not edges:
            return detail
        detail["edges"] = [_edge_detail(e, self.snapshot.nodes) for e in edges]
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


def _domains(edge: Edge, nodes: Mapping[str, NodeFacts], fabric_index: Iterable[int],
             ) -> tuple[set[str], set[str], list[tuple[int, set[str]]], set[str]]:
    """A producer's nodes, NVLink domains, non-empty non-zone fabric ids per tier, and zones."""
    names: set[str] = set()
    nvlink: set[str] = set()
    fabric: list[tuple[int, set[str]]] = [(i, set()) for i in fabric_index]
    zones: set[str] = set()
    for s in edge.sites:
        f = nodes.get(s.node)
        if f is None:
            continue
        names.add(f.name)
        nvlink.add(f.nvlink_domain)
        for i, ids in fabric:
            if i < len(f.fabric) and f.fabric[i]:
                ids.add(f.fabric[i])
        zones.add(f.zone)
    return names, nvlink, fabric, zones


def _edge_detail(edge: Edge, nodes: Mapping[str, NodeFacts]) -> dict[str, Any]:
    """One edge for explain: the producer and where each share of its data is."""
    sites = []
    for s in edge.sites:
        f = nodes.get(s.node)
        sites.append({
            "node": s.node, "state": s.state, "share": round(s.share, 4),
            "nvlink_domain": f.nvlink_domain if f else None,
            "fabric": [x for x in f.fabric if x] if f else [], "zone": f.zone if f else None,
        })
    return {"producer": edge.producer, "kind": edge.kind, "gb": round(edge.gb, 3), "sites": sites}


def _ratio(best: float, cost: float | None, t0: float = 0.0) -> float | None:
    if cost is None:
        return None
    return 1.0 if cost + t0 <= 0 else min(1.0, (best + t0) / (cost + t0))


def _round(v: float | None) -> float | None:
    return None if v is None else round(v, 4)
