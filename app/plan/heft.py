"""HEFT (Topcuoglu, Hariri and Wu, 2002): the standard list-scheduling heuristic for DAGs on
heterogeneous machines, here with multi-GPU nodes as the machines.

Upward rank = mean duration over eligible nodes + the largest (mean transfer between distinct
nodes + rank) among its
consumers; tasks are taken in decreasing rank and each goes to the node where it finishes earliest,
inserted into a gap when one is long enough.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable
from statistics import fmean

from app.plan.problem import Links, PlanProblem
from app.plan.schedule import Schedule, Slot, earliest_start, ready_time


def upward_ranks(problem: PlanProblem) -> dict[str, float]:
    ranks: dict[str, float] = {}
    pairs = PairCosts(problem)
    for name in reversed(problem.topological()):
        w = fmean(problem.duration[name].values())
        tail = 0.0
        for s in problem.succ[name]:
            tail = max(tail, pairs.mean_transfer(name, s) + ranks[s])
        ranks[name] = w + tail
    return ranks


class PairCosts:
    """Mean transfer over pairs of distinct eligible nodes, as the paper averages communication.

    Summing every pair is edges x nodes^2 transfers (65 million for 500 tasks on 256 nodes); the
    seconds per GB take few distinct values, so each set of node pairs is counted once by value, and
    with node groups (``Links``) by pair of groups."""

    def __init__(self, problem: PlanProblem) -> None:
        self.p = problem
        self._counts: dict[tuple[frozenset[str], frozenset[str]], Counter[float]] = {}
        self._sets: dict[int, frozenset[str]] = {}
        self._rows: dict[int, object] = {}  # keeps each row alive while its id() is a key
        self._whole: dict[int, tuple[tuple[int, int], ...] | None] = {}
        self._by_groups: dict[tuple[object, object], Counter[float]] = {}

    def _nodes(self, row: dict[str, int]) -> frozenset[str]:
        if id(row) not in self._sets:
            self._rows[id(row)] = row
            self._sets[id(row)] = frozenset(row)
        return self._sets[id(row)]

    def _groups(self, row: dict[str, int]) -> tuple[tuple[int, int], ...] | None:
        """(group, nodes) of a row made of whole groups, as build_problem makes them; else None."""
        links = self.p.s_per_gb
        assert isinstance(links, Links)
        if id(row) not in self._whole:
            self._rows[id(row)] = row
            count: Counter[int] = Counter(links.group_of[x] for x in row)
            whole = all(n == links.size[g] for g, n in count.items())
            self._whole[id(row)] = tuple(sorted(count.items())) if whole else None
        return self._whole[id(row)]

    def _pairs(self, a: dict[str, int], b: dict[str, int]) -> Counter[float]:
        links = self.p.s_per_gb
        if not isinstance(links, Links):
            return Counter(links[(x, y)] for x in a for y in b if x != y)
        ga, gb = self._groups(a), self._groups(b)
        if ga is not None and gb is not None:
            if (ga, gb) not in self._by_groups:
                self._by_groups[(ga, gb)] = self._count(links, dict(ga), dict(gb), dict(ga))
            return self._by_groups[(ga, gb)]
        ca: Counter[int] = Counter(links.group_of[x] for x in a)
        cb: Counter[int] = Counter(links.group_of[y] for y in b)
        both: Counter[int] = Counter(links.group_of[x] for x in a if x in b)
        return self._count(links, ca, cb, both)

    @staticmethod
    def _count(links: Links, ca: dict[int, int], cb: dict[int, int], both: dict[int, int]) -> Counter[float]:
        """Pairs of distinct nodes by seconds per GB: na x nb per pair of groups, less each node
        paired with itself where a group is in both sets (``both``: nodes in both, per group)."""
        out: Counter[float] = Counter()
        for g, na in ca.items():
            for h, nb in cb.items():
                n = na * nb - (both.get(g, 0) if g == h and h in cb else 0)
                if n:
                    out[links.between[g][h]] += n
        return out

    def mean_transfer(self, producer: str, consumer: str) -> float:
        p = self.p
        gb = p.edge_gb(producer, consumer)
        if gb <= 0:
            return 0.0
        a, b = p.duration[producer], p.duration[consumer]
        key = (self._nodes(a), self._nodes(b))  # rows with the same nodes pair alike
        counts = self._counts.get(key)
        if counts is None:
            counts = self._counts[key] = self._pairs(a, b)
        total = sum(counts.values())
        if not total:
            return 0.0
        return sum(math.ceil(gb * s - 1e-9) * n for s, n in counts.items()) / total


def candidates(problem: PlanProblem, on_node: dict[str, list[tuple[str, Slot]]], nodes: Iterable[str]
               ) -> list[str]:
    """``nodes`` without the idle twins: of the idle nodes of one group (interchangeable, nothing
    placed yet) only the first by name can win the tie-break, so only it is tried."""
    out: list[str] = []
    idle: dict[int, str] = {}
    for n in nodes:
        g = problem.node[n].group
        if on_node[n] or g < 0:
            out.append(n)
        elif g not in idle or n < idle[g]:
            idle[g] = n
    return out + list(idle.values())


def heft(problem: PlanProblem) -> Schedule:
    ranks = upward_ranks(problem)
    index = {t.name: i for i, t in enumerate(problem.tasks)}
    topo = {n: i for i, n in enumerate(problem.topological())}
    # Ranks strictly decrease along edges (durations are >= 1 s); the topological index breaks ties.
    order = sorted(ranks, key=lambda n: (-ranks[n], topo[n], index[n]))
    slots: dict[str, Slot] = {}
    on_node: dict[str, list[tuple[str, Slot]]] = {n.name: [] for n in problem.nodes}
    for name in order:
        place(problem, slots, on_node, name, candidates(problem, on_node, problem.duration[name]))
    return Schedule("heft", slots)


def place(problem: PlanProblem, slots: dict[str, Slot], on_node: dict[str, list[tuple[str, Slot]]],
          name: str, nodes: list[str]) -> Slot:
    """Put ``name`` on the node of ``nodes`` where it finishes earliest (insertion-based), then
    cheapest, then by name; record it."""
    best: tuple[int, float, str] | None = None
    # Where none of its producers ran, a node's inputs arrive when they arrive at any node of its
    # group (Links): computed once per group.
    producers = {slots[d].node for d in problem.task[name].deps}
    ready_in: dict[int, int] = {}
    dur, cost = problem.duration[name], problem.cost[name]
    tries: list[tuple[int, float, str, int]] = []
    for node in nodes:
        g = problem.node[node].group
        if g < 0 or node in producers:
            ready = ready_time(problem, slots, name, node)
        elif g in ready_in:
            ready = ready_in[g]
        else:
            ready = ready_in[g] = ready_time(problem, slots, name, node)
        tries.append((ready + dur[node], cost[node], node, ready))
    # A node finishes no sooner than its inputs arrive plus the duration: in that order, a node whose
    # earliest possible (finish, cost, name) is already above the best found cannot win.
    tries.sort()
    for low, c, node, ready in tries:
        if best is not None and (low, c, node) > best:
            break
        start = earliest_start(problem, on_node[node], name, node, ready)
        key = (start + dur[node], c, node)
        if best is None or key < best:
            best = key
    assert best is not None
    end, _, node = best
    slot = Slot(node, end - problem.duration[name][node], end)
    slots[name] = slot
    on_node[node].append((name, slot))
    return slot
