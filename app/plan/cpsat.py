"""The exact planner: OR-Tools CP-SAT over interval variables (docs/planner.md).

* Each task has a start and an end and one optional interval per eligible node (its duration there);
  exactly one is present: the node it runs on.
* Capacity: per node, a cumulative constraint over GPUs and one over CPU.
* Interactive serving never overlaps training on one node (the filter's separation rule).
* Precedence with transfer: for a producer u on node n, ``start(v) >= end(u) + sum_m T(n, m) x[v, m]``
  enforced by ``x[u, n]``; the sum is the transfer to v's node, since exactly one ``x[v, m]`` holds.
* Objective, lexicographic: minimise the makespan; then, with the makespan held at the value found,
  minimise cost (dollars) or the GB read across nodes, warm-started from the first solution.

The makespan's optimality gap is CP-SAT's own bound: ``(found - bound) / found``, 0 when proven.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Literal

from ortools.sat.python import cp_model

from app.plan.problem import SERVE, TRAIN, PlanProblem, PlanTask
from app.plan.schedule import Schedule, Slot

Secondary = Literal["cost", "transfer", "none"]
_STATUS = {cp_model.OPTIMAL: "optimal", cp_model.FEASIBLE: "feasible", cp_model.INFEASIBLE: "infeasible",
           cp_model.MODEL_INVALID: "invalid", cp_model.UNKNOWN: "unknown"}


@dataclass(frozen=True, slots=True)
class SolveResult:
    schedule: Schedule | None
    status: str  # of the makespan phase: optimal, feasible, unknown, ...
    makespan: int | None
    bound: int  # proven lower bound on the makespan
    gap: float | None  # (makespan - bound) / makespan
    secondary: Secondary
    secondary_status: str
    seconds: float  # wall time of both phases
    variables: int
    constraints: int


class _OutOfTime(Exception):
    """Building the model passed its deadline."""


class _Model:
    def __init__(self, problem: PlanProblem, deadline: float | None = None) -> None:
        def check() -> None:
            if deadline is not None and time.perf_counter() > deadline:
                raise _OutOfTime
        p = problem
        self.p = p
        m = self.m = cp_model.CpModel()
        horizon = sum(max(d.values()) for d in p.duration.values())
        horizon += sum(max(p.transfer(u, a, b, v) for a in p.duration[u] for b in p.duration[v])
                       for u, v in p.edges())
        self.horizon = horizon
        self.start = {t.name: m.new_int_var(0, horizon, f"s[{t.name}]") for t in p.tasks}
        self.end = {t.name: m.new_int_var(0, horizon, f"e[{t.name}]") for t in p.tasks}
        self.x: dict[tuple[str, str], cp_model.IntVar] = {}
        self.iv: dict[tuple[str, str], cp_model.IntervalVar] = {}
        self.alt: dict[tuple[str, str], tuple[cp_model.IntVar, cp_model.IntVar]] = {}
        for t in p.tasks:
            check()
            for n, d in p.duration[t.name].items():
                x = self.x[(t.name, n)] = m.new_bool_var(f"x[{t.name},{n}]")
                # Each alternative has its own start and end, tied to the task's when chosen: with
                # the task's own variables shared by every optional interval, CP-SAT 9.15's presolve
                # proved a 6-step makespan optimal where 3 was feasible (tests/unit/plan/test_plan_solver.py).
                s_alt = m.new_int_var(0, horizon, f"s[{t.name},{n}]")
                e_alt = m.new_int_var(0, horizon, f"e[{t.name},{n}]")
                self.alt[(t.name, n)] = (s_alt, e_alt)
                self.iv[(t.name, n)] = m.new_optional_interval_var(s_alt, d, e_alt, x, f"iv[{t.name},{n}]")
                m.add(self.start[t.name] == s_alt).only_enforce_if(x)
                m.add(self.end[t.name] == e_alt).only_enforce_if(x)
            m.add_exactly_one(self.x[(t.name, n)] for n in p.duration[t.name])
            m.add(self.end[t.name] >= self.start[t.name] + min(p.duration[t.name].values()))
        on: dict[str, list[PlanTask]] = {n.name: [] for n in p.nodes}
        for t in p.tasks:
            for n in p.duration[t.name]:
                on[n].append(t)
        for node in p.nodes:
            here = on[node.name]
            if not here:
                continue
            resources = [(lambda t: t.gpus, node.gpus), (lambda t: t.cpu_millis, node.cpu_millis)]
            if node.memory_mib:
                resources.append((lambda t: t.memory_mib, node.memory_mib))
            for demand, cap in resources:
                users = [t for t in here if demand(t) > 0]
                if sum(demand(t) for t in users) > cap:
                    m.add_cumulative([self.iv[(t.name, node.name)] for t in users],
                                     [demand(t) for t in users], cap)
            serve = [t for t in here if t.kind == SERVE]
            train = [t for t in here if t.kind == TRAIN]
            for s in serve:
                for tr in train:
                    m.add_no_overlap([self.iv[(s.name, node.name)], self.iv[(tr.name, node.name)]])
        for u, v in p.edges():
            check()
            targets = p.duration[v]
            for a in p.duration[u]:
                lags = {b: p.transfer(u, a, b, v) for b in targets}
                low = min(lags.values())
                expr = sum((lag - low) * self.x[(v, b)] for b, lag in lags.items() if lag > low)
                m.add(self.start[v] >= self.end[u] + low + expr).only_enforce_if(self.x[(u, a)])
        self.makespan = m.new_int_var(0, horizon, "makespan")
        m.add_max_equality(self.makespan, list(self.end.values()))

    def hint(self, schedule: Schedule) -> None:
        self.m.clear_hints()
        for t in self.p.tasks:
            s = schedule.slots[t.name]
            self.m.add_hint(self.start[t.name], s.start)
            self.m.add_hint(self.end[t.name], s.end)
            for n, d in self.p.duration[t.name].items():
                self.m.add_hint(self.x[(t.name, n)], n == s.node)
                # Every variable hinted: an incomplete hint is only a suggestion CP-SAT may drop,
                # and then the plan could come out worse than the baseline it started from.
                s_alt, e_alt = self.alt[(t.name, n)]
                self.m.add_hint(s_alt, s.start if n == s.node else 0)
                self.m.add_hint(e_alt, s.end if n == s.node else d)
        self.m.add_hint(self.makespan, schedule.makespan)

    def read(self, solver: cp_model.CpSolver, method: str) -> Schedule:
        slots = {}
        for t in self.p.tasks:
            node = next(n for n in self.p.duration[t.name] if solver.boolean_value(self.x[(t.name, n)]))
            slots[t.name] = Slot(node, solver.value(self.start[t.name]), solver.value(self.end[t.name]))
        return Schedule(method, slots)

    def secondary_objective(self, kind: Secondary) -> cp_model.LinearExprT:
        p = self.p
        if kind == "cost":
            # Millidollars: integer coefficients, fine enough to order plans by cost.
            return sum(round(p.cost[t][n] * 1000) * x for (t, n), x in self.x.items())
        same = []
        for u, v in p.edges():
            mb = round(p.edge_gb(u, v) * 1000)
            if mb <= 0:
                continue
            for n in set(p.duration[u]) & set(p.duration[v]):
                z = self.m.new_bool_var(f"same[{u},{v},{n}]")
                self.m.add_implication(z, self.x[(u, n)])
                self.m.add_implication(z, self.x[(v, n)])
                same.append(mb * z)
        return -sum(same) if same else 0  # fewer MB across nodes = more MB read locally


def _solver(limit: float, workers: int, seed: int) -> cp_model.CpSolver:
    s = cp_model.CpSolver()
    s.parameters.max_time_in_seconds = max(0.05, limit)
    s.parameters.num_workers = workers
    s.parameters.random_seed = seed
    return s


def solve(
    problem: PlanProblem, *, time_limit: float = 10.0, secondary: Secondary = "cost",
    hint: Schedule | None = None, workers: int = 2, seed: int = 0, started: float | None = None,
) -> SolveResult:
    """Minimise the makespan within ``time_limit`` seconds in all, counted from ``started`` (default:
    now) so building the model is inside the budget: 70% up to the end of the makespan phase, the
    rest and whatever it left over for the secondary objective."""
    t0 = time.perf_counter() if started is None else started
    share = 0.7 if secondary != "none" else 1.0
    if time_limit * share - (time.perf_counter() - t0) < 0.1:
        return SolveResult(None, "timeout (no time left for the model)", None, 0, None, secondary,
                           "skipped", time.perf_counter() - t0, 0, 0)
    try:
        model = _Model(problem, deadline=t0 + time_limit * share - 0.1)
    except _OutOfTime:
        return SolveResult(None, "timeout (building the model took the budget)", None, 0, None, secondary,
                           "skipped", time.perf_counter() - t0, 0, 0)
    proto = model.m.proto
    size = (len(proto.variables), len(proto.constraints))
    first_phase = time_limit * share - (time.perf_counter() - t0)
    if first_phase < 0.05:
        return SolveResult(None, "timeout (building the model took the budget)", None, 0, None, secondary,
                           "skipped", time.perf_counter() - t0, *size)
    if hint is not None:
        model.hint(hint)
    model.m.minimize(model.makespan)
    solver = _solver(first_phase, workers, seed)
    status = solver.solve(model.m)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return SolveResult(None, _STATUS.get(status, "unknown"), None, int(solver.best_objective_bound),
                           None, secondary, "skipped", time.perf_counter() - t0, *size)
    best = round(solver.objective_value)
    bound = round(solver.best_objective_bound)
    first = model.read(solver, "cp-sat")
    name = _STATUS[status]
    gap = 0.0 if status == cp_model.OPTIMAL else (best - bound) / best if best else 0.0
    if secondary == "none":
        return SolveResult(first, name, best, bound, gap, secondary, "skipped",
                           time.perf_counter() - t0, *size)
    model.m.add(model.makespan <= best)
    model.hint(first)
    model.m.minimize(model.secondary_objective(secondary))
    left = time_limit - (time.perf_counter() - t0)
    solver2 = _solver(max(left, 0.1), workers, seed)
    status2 = solver2.solve(model.m)
    schedule = model.read(solver2, "cp-sat") if status2 in (cp_model.OPTIMAL, cp_model.FEASIBLE) else first
    return SolveResult(schedule, name, schedule.makespan, bound, gap, secondary,
                       _STATUS.get(status2, "unknown"), time.perf_counter() - t0, *size)
