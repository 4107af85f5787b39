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
        self._counts: dict[tuple[int, int], Counter[float]] = {}
        self._rows: dict[int, object] = {}  # keeps each row alive while its id() is a key

    def _pairs(self, a: dict[str, int], b: dict[str, int]) -> Counter[float]:
        links = self.p.s_per_gb
        if not isinstance(links, Links):
            return Counter(links[(x, y)] for x in a for y in b if x != y)
        ca: Counter[int] = Counter(links.group_of[x] for x in a)
        cb: Counter[int] = Counter(links.group_of[y] for y in b)
        both: Counter[int] = Counter(links.group_of[x] for x in a if x in b)
        out: Counter[float] = Counter()
        for g, na in ca.items():
            for h, nb in cb.items():
                n = na * nb - (both[g] if g == h else 0)
                if n:
                    out[links.between[g][h]] += n
        return out

    def mean_transfer(self, producer: str, consumer: str) -> float:
        p = self.p
        gb = p.edge_gb(producer, consumer)
        if gb <= 0:
            return 0.0
        a, b = p.duration[producer], p.duration[consumer]
        key = (id(a), id(b))
        counts = self._counts.get(key)
        if counts is None:
            self._rows[id(a)], self._rows[id(b)] = a, b
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
    for node in nodes:
        start = earliest_start(problem, on_node[node], name, node, ready_time(problem, slots, name, node))
        key = (start + problem.duration[name][node], problem.cost[name][node], node)
        if best is None or key < best:
            best = key
    assert best is not None
    end, _, node = best
    slot = Slot(node, end - problem.duration[name][node], end)
    slots[name] = slot
    on_node[node].append((name, slot))
    return slot
