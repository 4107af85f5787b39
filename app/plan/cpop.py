"""CPOP, Critical-Path-on-a-Processor (Topcuoglu, Hariri and Wu, 2002), a second published baseline.

Priority = upward rank + downward rank; the tasks whose priority equals the entry task's form the
critical path, and all of them go to the one node that runs the whole path fastest. Every other task
is taken by priority once its producers are placed and goes where it finishes earliest, like HEFT.
"""

from __future__ import annotations

import heapq
from statistics import fmean

from app.plan.heft import PairCosts, candidates, place, upward_ranks
from app.plan.problem import PlanProblem
from app.plan.schedule import Schedule, Slot

TIE = 1e-6  # priorities equal up to float noise lie on the critical path


def downward_ranks(problem: PlanProblem) -> dict[str, float]:
    pairs = PairCosts(problem)
    ranks: dict[str, float] = {}
    for name in problem.topological():
        ranks[name] = max((ranks[d] + fmean(problem.duration[d].values()) + pairs.mean_transfer(d, name)
                           for d in problem.task[name].deps), default=0.0)
    return ranks


def critical_path(problem: PlanProblem, priority: dict[str, float]) -> list[str]:
    """From the entry of highest priority, each step to a consumer of the same priority."""
    entries = [t.name for t in problem.tasks if not t.deps]
    cur = max(entries, key=lambda n: priority[n])
    cp_value = priority[cur]
    path = [cur]
    while True:
        nxt = [s for s in problem.succ[cur] if abs(priority[s] - cp_value) <= TIE * max(1.0, cp_value)]
        if not nxt:
            return path
        cur = nxt[0]
        path.append(cur)


def cpop(problem: PlanProblem) -> Schedule:
    up, down = upward_ranks(problem), downward_ranks(problem)
    priority = {n: up[n] + down[n] for n in up}
    path = critical_path(problem, priority)
    on_path = set(path)
    # The critical-path node: eligible for every task of the path, fastest over it in total.
    common = set.intersection(*(set(problem.duration[t]) for t in path))
    cp_node = min(common, key=lambda n: (sum(problem.duration[t][n] for t in path), n)) if common else None
    slots: dict[str, Slot] = {}
    on_node: dict[str, list[tuple[str, Slot]]] = {n.name: [] for n in problem.nodes}
    waiting = {t.name: len(t.deps) for t in problem.tasks}
    index = {t.name: i for i, t in enumerate(problem.tasks)}
    ready = [(-priority[n], index[n], n) for n, k in waiting.items() if k == 0]
    heapq.heapify(ready)
    while ready:
        _, _, name = heapq.heappop(ready)
        nodes = [cp_node] if name in on_path and cp_node is not None else candidates(
            problem, on_node, problem.duration[name])
        place(problem, slots, on_node, name, nodes)
        for s in problem.succ[name]:
            waiting[s] -= 1
            if waiting[s] == 0:
                heapq.heappush(ready, (-priority[s], index[s], s))
    return Schedule("cpop", slots)
