"""A schedule (task -> node, start, end), the checker every planner's output must pass, the metrics the
report compares, and the earliest-start rule shared by the list schedulers (HEFT, greedy, brute force).

Time is whole seconds from the workflow's start. A task holds its GPUs and CPU from its start to its
end; data transfer is a lag between the producer's end and the consumer's start (the consumer's pod is
not yet holding resources while its input is copied: the plan starts it once the data is there).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from app.plan.problem import SERVE, TRAIN, PlanProblem


@dataclass(frozen=True, slots=True)
class Slot:
    node: str
    start: int
    end: int


@dataclass(slots=True)
class Schedule:
    method: str
    slots: dict[str, Slot] = field(default_factory=dict)

    @property
    def makespan(self) -> int:
        return max((s.end for s in self.slots.values()), default=0)


def ready_time(problem: PlanProblem, slots: dict[str, Slot], task: str, node: str) -> int:
    """Earliest start on ``node`` allowed by the producers' ends and their data's transfer."""
    t = problem.task[task]
    return max((slots[d].end + problem.transfer(d, slots[d].node, node, task) for d in t.deps), default=0)


def _conflict(problem: PlanProblem, a: str, b: str) -> bool:
    ka, kb = problem.task[a].kind, problem.task[b].kind
    return {ka, kb} == {SERVE, TRAIN}


def fits_at(problem: PlanProblem, placed: Sequence[tuple[str, Slot]], task: str, node: str,
            start: int, end: int) -> bool:
    """Could ``task`` hold ``node`` over [start, end) beside ``placed`` (tasks already on that node)?"""
    t, n = problem.task[task], problem.node[node]
    overlapping = [(o, s) for o, s in placed if s.start < end and start < s.end]
    if any(_conflict(problem, task, o) for o, _ in overlapping):
        return False
    # Usage is piecewise constant and only rises at a start: checking [start, end) at ``start`` and
    # at every overlapping task's start is enough.
    for at in {start, *(s.start for _, s in overlapping if s.start > start)}:
        gpus = t.gpus + sum(problem.task[o].gpus for o, s in overlapping if s.start <= at < s.end)
        cpu = t.cpu_millis + sum(problem.task[o].cpu_millis for o, s in overlapping if s.start <= at < s.end)
        mem = t.memory_mib + sum(problem.task[o].memory_mib for o, s in overlapping if s.start <= at < s.end)
        if gpus > n.gpus or cpu > n.cpu_millis or (n.memory_mib and mem > n.memory_mib):
            return False
    return True


def earliest_start(problem: PlanProblem, placed: Sequence[tuple[str, Slot]], task: str, node: str,
                   ready: int) -> int:
    """The first time >= ``ready`` at which ``task`` fits on ``node`` for its whole duration
    (insertion: it may go into a gap before tasks already placed there)."""
    d = problem.duration[task][node]
    for t in sorted({ready, *(s.end for _, s in placed if s.end > ready)}):
        if fits_at(problem, placed, task, node, t, t + d):
            return t
    raise AssertionError("a task always fits once everything else on the node has ended")


def verify(problem: PlanProblem, schedule: Schedule) -> list[str]:
    """Every broken rule, in words; empty for a valid schedule."""
    out: list[str] = []
    slots = schedule.slots
    missing = [t.name for t in problem.tasks if t.name not in slots]
    if missing:
        return [f"unscheduled: {missing}"]
    for t in problem.tasks:
        s = slots[t.name]
        if s.node not in problem.duration[t.name]:
            out.append(f"{t.name} on {s.node}, where it is not eligible")
            continue
        if s.end - s.start != problem.duration[t.name][s.node] or s.start < 0:
            out.append(f"{t.name}: interval {s.start}-{s.end} does not match its duration")
        r = ready_time(problem, slots, t.name, s.node)
        if s.start < r:
            out.append(f"{t.name} starts at {s.start} before its inputs arrive at {r}")
    by_node: dict[str, list[tuple[str, Slot]]] = {}
    for name, s in slots.items():
        by_node.setdefault(s.node, []).append((name, s))
    for placed in by_node.values():
        for i, (name, s) in enumerate(placed):
            if not fits_at(problem, placed[:i] + placed[i + 1:], name, s.node, s.start, s.end):
                out.append(f"{name} on {s.node} at {s.start}-{s.end}: over capacity or beside a conflict")
    return out


@dataclass(frozen=True, slots=True)
class Metrics:
    makespan_s: int
    cross_node_gb: float  # data read from another node
    transfer_s: int  # sum of all transfer lags (local reads included)
    cost_usd: float
    gpu_hours: float


def metrics(problem: PlanProblem, schedule: Schedule) -> Metrics:
    slots = schedule.slots
    cross = 0.0
    lag = 0
    for u, v in problem.edges():
        a, b = slots[u].node, slots[v].node
        lag += problem.transfer(u, a, b, v)
        if a != b:
            cross += problem.edge_gb(u, v)
    cost = sum(problem.cost[t][s.node] for t, s in slots.items())
    gpu_h = sum(problem.task[t].gpus * (s.end - s.start) for t, s in slots.items()) / 3600.0
    return Metrics(schedule.makespan, cross, lag, cost, gpu_h)
