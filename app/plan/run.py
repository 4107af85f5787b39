"""One planning run: workflow + nodes -> the exact plan and both baselines, compared."""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from contextlib import suppress
from dataclasses import dataclass, field
from typing import Any

from app.core.catalog import GpuCatalog
from app.core.policy import PolicySource
from app.plan.cpop import cpop
from app.plan.cpsat import Secondary, SolveResult, solve
from app.plan.greedy import GreedyError, greedy_extender
from app.plan.heft import heft
from app.plan.problem import PlanProblem, build_problem, node_facts_of
from app.plan.schedule import Metrics, Schedule, metrics, verify
from app.plan.workflow import Workflow


@dataclass(slots=True)
class PlanRun:
    problem: PlanProblem
    result: SolveResult
    plan: Schedule  # the exact plan, or HEFT's when the solver found nothing in time
    baselines: list[Schedule]
    metrics: dict[str, Metrics] = field(default_factory=dict)  # by method
    problems: dict[str, list[str]] = field(default_factory=dict)  # verify() findings by method
    lower_bound: int = 0  # no plan finishes sooner (lower_bound())
    narrowed_to: int | None = None  # candidate nodes per task when the exact model was narrowed


def plan_problem(problem: PlanProblem, settings: PolicySource | None, *, time_limit: float = 10.0,
                 secondary: Secondary = "cost", workers: int = 2) -> PlanRun:
    """The exact plan within ``time_limit`` seconds (baselines and model build included), never worse
    than the best valid baseline: when the solver ends above it, the baseline is the plan."""
    started = time.perf_counter()
    base = heft(problem)
    baselines = [base, cpop(problem)]
    if settings is not None and problem.pods:
        with suppress(GreedyError):
            baselines.append(greedy_extender(problem, settings))
    valid = [b for b in baselines if not verify(problem, b)]
    incumbent = min(valid, key=lambda b: b.makespan, default=base)
    # Too many (task, node) pairs for the exact model within the budget: solve it over each task's
    # most promising nodes (the incumbent's always among them, so the plan is never worse), and
    # report only bounds valid for the whole problem.
    reduced = narrowed(problem, incumbent, MAX_MODEL_TERMS)
    result = solve(reduced or problem, time_limit=time_limit, secondary=secondary, hint=incumbent,
                   workers=workers, started=started)
    if result.schedule is not None and result.schedule.makespan <= incumbent.makespan:
        plan = result.schedule
    else:
        why = "solver found no plan in time" if result.schedule is None else \
            f"solver's {result.schedule.makespan} s is above it"
        plan = Schedule(f"{incumbent.method} ({why})", dict(incumbent.slots))
    solver_bound = result.bound if reduced is None else 0  # a narrowed model's bound is not global
    run = PlanRun(problem, result, plan, baselines, lower_bound=lower_bound(problem, solver_bound),
                  narrowed_to=None if reduced is None else max(len(d) for d in reduced.duration.values()))
    for s in (plan, *baselines):
        run.metrics[s.method] = metrics(problem, s)
        run.problems[s.method] = verify(problem, s)
    return run


# Precedence with transfer costs one term per (producer node, consumer node) pair of every edge; past
# this many the model takes longer to build than a plan is worth waiting for on a 2-core machine.
MAX_MODEL_TERMS = 40_000


def model_terms(problem: PlanProblem) -> int:
    d = problem.duration
    return sum(len(d[u]) * len(d[v]) for u, v in problem.edges()) + sum(len(x) for x in d.values())


def narrowed(problem: PlanProblem, incumbent: Schedule, max_terms: int) -> PlanProblem | None:
    """The problem over each task's best candidate nodes, or None when the whole fits ``max_terms``.

    Each task keeps the node the incumbent gave it, the nodes its producers and consumers got there
    (so co-location stays possible), and its ``k`` fastest nodes (then cheapest, then by name), with
    the largest ``k`` that keeps the model within ``max_terms``."""
    if model_terms(problem) <= max_terms:
        return None
    near: dict[str, set[str]] = {t.name: {incumbent.slots[t.name].node} for t in problem.tasks}
    for u, v in problem.edges():
        near[v].add(incumbent.slots[u].node)
        near[u].add(incumbent.slots[v].node)
    def fastest_first(t: str) -> list[str]:
        d, c = problem.duration[t], problem.cost[t]
        return sorted(d, key=lambda n: (d[n], c[n], n))

    order = {t: fastest_first(t) for t in problem.duration}

    def keep(k: int) -> PlanProblem:
        return replace_durations(problem, {
            t: {n: d[n] for n in d if n in near[t] or n in set(order[t][:k])}
            for t, d in problem.duration.items()})

    lo, hi = 1, max(len(d) for d in problem.duration.values())
    while lo < hi:  # the largest k whose model fits
        mid = (lo + hi + 1) // 2
        if model_terms(keep(mid)) <= max_terms:
            lo = mid
        else:
            hi = mid - 1
    return keep(lo)


def replace_durations(problem: PlanProblem, duration: dict[str, dict[str, int]]) -> PlanProblem:
    return PlanProblem(problem.tasks, problem.nodes, duration,
                       {t: {n: problem.cost[t][n] for n in d} for t, d in duration.items()},
                       problem.s_per_gb, problem.distance, problem.excluded, problem.pods, problem.specs,
                       problem.facts, problem.name, problem.namespace, problem.edge_data)


def lower_bound(problem: PlanProblem, solver_bound: int = 0) -> int:
    """No plan can finish sooner: the longest chain at each task's fastest duration (data local),
    each resource's total work spread over all of it, and the solver's own proven bound."""
    fastest = {t: min(d.values()) for t, d in problem.duration.items()}
    finish: dict[str, int] = {}
    for name in problem.topological():
        finish[name] = fastest[name] + max((finish[d] for d in problem.task[name].deps), default=0)
    bound = max(finish.values(), default=0)
    resources = ((lambda t: t.gpus, lambda n: n.gpus), (lambda t: t.cpu_millis, lambda n: n.cpu_millis))
    for need, have in resources:
        capacity = sum(have(n) for n in problem.nodes)
        work = sum(need(t) * fastest[t.name] for t in problem.tasks)
        if capacity > 0 and work > 0:
            bound = max(bound, math.ceil(work / capacity))
    return max(bound, solver_bound)


def plan_workflow(
    wf: Workflow, nodes: Sequence[dict[str, Any]], settings: PolicySource, *,
    catalog: GpuCatalog | None = None, time_limit: float = 10.0, secondary: Secondary = "cost",
    used_gpus: dict[str, int] | None = None, workers: int = 2,
) -> PlanRun:
    facts = node_facts_of(nodes, settings, catalog or GpuCatalog.load())
    problem = build_problem(wf, facts, settings, used_gpus)
    return plan_problem(problem, settings, time_limit=time_limit, secondary=secondary, workers=workers)
