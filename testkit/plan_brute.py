"""Exhaustive search for tiny instances: every assignment of tasks to eligible nodes x every
topological order, each scheduled by the serial schedule-generation scheme (each task at its earliest
precedence- and capacity-feasible start, gaps allowed). Every active schedule is produced this way and
some optimal schedule is active, so the minimum is the optimum. Used by the tests to check CP-SAT.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

from app.plan.problem import PlanProblem
from app.plan.schedule import Schedule, Slot, earliest_start, ready_time

MAX_COMBINATIONS = 2_000_000


def topological_orders(problem: PlanProblem) -> Iterator[list[str]]:
    deps = {t.name: set(t.deps) for t in problem.tasks}

    def extend(done: list[str], left: set[str]) -> Iterator[list[str]]:
        if not left:
            yield list(done)
            return
        placed = set(done)
        for n in sorted(left):
            if deps[n] <= placed:
                done.append(n)
                yield from extend(done, left - {n})
                done.pop()

    yield from extend([], set(deps))


def serial_schedule(problem: PlanProblem, order: list[str], assign: dict[str, str]) -> Schedule:
    slots: dict[str, Slot] = {}
    on_node: dict[str, list[tuple[str, Slot]]] = {}
    for name in order:
        node = assign[name]
        placed = on_node.setdefault(node, [])
        start = earliest_start(problem, placed, name, node, ready_time(problem, slots, name, node))
        slots[name] = Slot(node, start, start + problem.duration[name][node])
        placed.append((name, slots[name]))
    return Schedule("brute-force", slots)


def brute_force(problem: PlanProblem) -> Schedule:
    names = [t.name for t in problem.tasks]
    orders = list(topological_orders(problem))
    choices = [problem.eligible(n) for n in names]
    total = len(orders)
    for c in choices:
        total *= len(c)
    if total > MAX_COMBINATIONS:
        raise ValueError(f"{total} combinations: too many for brute force")
    best: Schedule | None = None
    for combo in itertools.product(*choices):
        assign = dict(zip(names, combo, strict=True))
        for order in orders:
            s = serial_schedule(problem, order, assign)
            if best is None or s.makespan < best.makespan:
                best = s
    assert best is not None
    return best
