"""HEFT (Topcuoglu, Hariri and Wu, 2002): the standard list-scheduling heuristic for DAGs on
heterogeneous machines, here with multi-GPU nodes as the machines.

Upward rank = mean duration over eligible nodes + the largest (mean transfer between distinct
nodes + rank) among its
consumers; tasks are taken in decreasing rank and each goes to the node where it finishes earliest,
inserted into a gap when one is long enough.
"""

from __future__ import annotations

from statistics import fmean

from app.plan.problem import PlanProblem
from app.plan.schedule import Schedule, Slot, earliest_start, ready_time


def upward_ranks(problem: PlanProblem) -> dict[str, float]:
    ranks: dict[str, float] = {}
    for name in reversed(problem.topological()):
        w = fmean(problem.duration[name].values())
        tail = 0.0
        for s in problem.succ[name]:
            # The mean over pairs of distinct nodes: the paper's average communication cost; a local
            # read costs nothing and is not part of the average.
            pairs = [problem.transfer(name, a, b, s)
                     for a in problem.duration[name] for b in problem.duration[s] if a != b]
            comm = fmean(pairs) if pairs else 0.0
            tail = max(tail, comm + ranks[s])
        ranks[name] = w + tail
    return ranks


def heft(problem: PlanProblem) -> Schedule:
    ranks = upward_ranks(problem)
    index = {t.name: i for i, t in enumerate(problem.tasks)}
    topo = {n: i for i, n in enumerate(problem.topological())}
    # Ranks strictly decrease along edges (durations are >= 1 s); the topological index breaks ties.
    order = sorted(ranks, key=lambda n: (-ranks[n], topo[n], index[n]))
    slots: dict[str, Slot] = {}
    on_node: dict[str, list[tuple[str, Slot]]] = {n.name: [] for n in problem.nodes}
    for name in order:
        best: tuple[int, float, str] | None = None
        for node in problem.duration[name]:
            start = earliest_start(problem, on_node[node], name, node, ready_time(problem, slots, name, node))
            key = (start + problem.duration[name][node], problem.cost[name][node], node)
            if best is None or key < best:
                best = key
        assert best is not None
        end, _, node = best
        slot = Slot(node, end - problem.duration[name][node], end)
        slots[name] = slot
        on_node[node].append((name, slot))
    return Schedule("heft", slots)
