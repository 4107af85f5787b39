"""One planning run: workflow + nodes -> the exact plan and both baselines, compared."""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from contextlib import suppress
from dataclasses import dataclass, field, replace
from typing import Any

from app.base.catalog import GpuCatalog
from app.config.policy import PolicySource, TierBandwidth
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
    result: SolveResult  # status, bound and gap of the whole problem (plan_problem rewrites them)
    plan: Schedule  # the exact plan, or the best baseline when the solver did not beat it in time
    baselines: list[Schedule]
    metrics: dict[str, Metrics] = field(default_factory=dict)  # by method
    problems: dict[str, list[str]] = field(default_factory=dict)  # verify() findings by method
    lower_bound: int = 0  # no plan of the whole problem finishes sooner (lower_bound())
    narrowed_to: int | None = None  # candidate nodes per task when the exact model was narrowed
    proven: bool = False  # the plan's makespan equals a bound valid for the whole problem
    skipped: list[str] = field(default_factory=list)  # baselines left out for lack of time
    model_status: str = ""  # CP-SAT's own status on the model it solved (whole or narrowed)

    @property
    def gap(self) -> float:
        """(plan - whole-problem bound) / plan: 0 only when the plan is proven optimal."""
        span = self.plan.makespan
        return 0.0 if self.proven else (span - self.lower_bound) / span if span else 0.0


# What the report costs to write, kept back from the time limit (docs/planner.md, "Time limit").
REPORT_RESERVE_S = 0.3
REPORT_RESERVE_SHARE = 0.06


def plan_problem(problem: PlanProblem, settings: PolicySource | None, *, time_limit: float = 10.0,
                 secondary: Secondary = "cost", workers: int = 2, started: float | None = None) -> PlanRun:
    """The exact plan within ``time_limit`` seconds counted from ``started`` (a ``perf_counter()``;
    default now): baselines, model build and report included. Never worse than the best valid
    baseline: when the solver ends above it, the baseline is the plan. Status, bound and gap are those
    of the whole problem: a narrowed model's optimum is not called optimal."""
    started = time.perf_counter() if started is None else started
    end = started + time_limit - REPORT_RESERVE_S - REPORT_RESERVE_SHARE * time_limit

    def left() -> float:
        return end - time.perf_counter()

    t = time.perf_counter()
    base = heft(problem)
    took = time.perf_counter() - t
    baselines = [base]
    skipped: list[str] = []
    # The other baselines only while they leave the solver a third of the limit: CPOP costs about
    # what HEFT did, the extender's replay (the filter on every node, per pod) a few times that.
    if left() - 2 * took > time_limit / 3:
        baselines.append(cpop(problem))
    else:
        skipped.append("cpop")
    if settings is not None and problem.pods:
        if left() - 5 * took > time_limit / 3:
            with suppress(GreedyError):
                baselines.append(greedy_extender(problem, settings, deadline=end - time_limit / 3))
        else:
            skipped.append("extender (one pod at a time)")
    valid = [b for b in baselines if not verify(problem, b)]
    incumbent = min(valid, key=lambda b: b.makespan, default=base)
    # Too many (task, node) pairs for the exact model within the budget: solve it over each task's
    # most promising nodes (the incumbent's always among them, so the plan is never worse), and
    # report only bounds valid for the whole problem.
    reduced = narrowed(problem, incumbent, affordable_terms(left()))
    result = solve(reduced or problem, time_limit=max(0.0, end - started), secondary=secondary,
                   hint=incumbent, workers=workers, started=started)
    if result.schedule is not None and result.schedule.makespan <= incumbent.makespan:
        plan = result.schedule
    else:
        why = "solver found no plan in time" if result.schedule is None else \
            f"solver's {result.schedule.makespan} s is above it"
        plan = Schedule(f"{incumbent.method} ({why})", dict(incumbent.slots))
    # Only a bound of the whole model holds for the whole problem.
    bound = lower_bound(problem, result.bound if reduced is None else 0)
    proven = plan.makespan <= bound
    status = "optimal" if proven else ("feasible" if plan.method == "cp-sat" else "baseline")
    whole = replace(result, status=status, bound=bound,
                    gap=0.0 if proven else (plan.makespan - bound) / plan.makespan if plan.makespan else 0.0)
    run = PlanRun(problem, whole, plan, baselines, lower_bound=bound,
                  narrowed_to=None if reduced is None else max(len(d) for d in reduced.duration.values()),
                  proven=proven, skipped=skipped, model_status=result.status)
    for s in (plan, *baselines):
        run.metrics[s.method] = metrics(problem, s)
        run.problems[s.method] = verify(problem, s)
    return run


# Precedence with transfer costs one term per (producer node, consumer node) pair of every edge; past
# this many the model takes longer to build than a plan is worth waiting for on a 2-core machine.
MAX_MODEL_TERMS = 40_000
# Terms the model build (and CP-SAT's presolve of it) handles per second on a 2-core machine, and the
# share of the time left it may take: past that the model is narrowed further.
TERMS_PER_SECOND = 10_000
BUILD_SHARE = 0.3


def affordable_terms(seconds_left: float) -> int:
    return max(0, min(MAX_MODEL_TERMS, int(seconds_left * BUILD_SHARE * TERMS_PER_SECOND)))


def model_terms(problem: PlanProblem) -> int:
    d = problem.duration
    return sum(len(d[u]) * len(d[v]) for u, v in problem.edges()) + sum(len(x) for x in d.values())


def narrowed(problem: PlanProblem, incumbent: Schedule, max_terms: int) -> PlanProblem | None:
    """The problem over each task's best candidate nodes, or None when the whole fits ``max_terms``.

    Each task keeps the node the incumbent gave it, the nodes its producers and consumers got there
    (so co-location stays possible), and its ``k`` fastest nodes (then cheapest, then by name), with
    the largest ``k`` that keeps the model within ``max_terms`` (at least 1)."""
    if model_terms(problem) <= max_terms:
        return None
    near: dict[str, set[str]] = {t.name: {incumbent.slots[t.name].node} for t in problem.tasks}
    for u, v in problem.edges():
        near[v].add(incumbent.slots[u].node)
        near[u].add(incumbent.slots[v].node)
    # Identical tasks share one row of durations (build_problem): sort each row once.
    by_row: dict[int, list[str]] = {}

    def fastest_first(t: str) -> list[str]:
        d, c = problem.duration[t], problem.cost[t]
        if id(d) not in by_row:
            by_row[id(d)] = sorted(d, key=lambda n: (d[n], c[n], n))
        return by_row[id(d)]

    order = {t: fastest_first(t) for t in problem.duration}
    edges = problem.edges()

    def kept(k: int) -> dict[str, set[str]]:
        return {t: near[t].union(order[t][:k]) for t in order}

    def terms(keep: dict[str, set[str]]) -> int:
        return sum(len(keep[u]) * len(keep[v]) for u, v in edges) + sum(len(x) for x in keep.values())

    lo, hi = 1, max(len(d) for d in problem.duration.values())
    while lo < hi:  # the largest k whose model fits
        mid = (lo + hi + 1) // 2
        if terms(kept(mid)) <= max_terms:
            lo = mid
        else:
            hi = mid - 1
    final = kept(lo)
    return replace_durations(problem, {t: {n: d[n] for n in d if n in final[t]}
                                       for t, d in problem.duration.items()})


def replace_durations(problem: PlanProblem, duration: dict[str, dict[str, int]]) -> PlanProblem:
    return PlanProblem(problem.tasks, problem.nodes, duration,
                       {t: {n: problem.cost[t][n] for n in d} for t, d in duration.items()},
                       problem.s_per_gb, problem.distance, problem.excluded, problem.pods, problem.specs,
                       problem.facts, problem.name, problem.namespace, problem.edge_data,
                       problem.cluster_nodes)


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
    used_gpus: dict[str, int] | None = None,
    workers: int = 2, bandwidth: TierBandwidth | None = None, started: float | None = None,
    cluster_size: int | None = None,
) -> PlanRun:
    """``started``: when the clock of ``time_limit`` started (``time.perf_counter()``; default now):
    the command passes its own start, so reading the files counts too. ``cluster_size``: the
    cluster's node count where ``nodes`` is a sample of it (ClusterFile.sample)."""
    started = time.perf_counter() if started is None else started
    catalog = catalog or GpuCatalog.load()
    # Past twice the limit before the problem is even built there is no plan worth the wait: stop
    # and say so. Short of that, HEFT's plan comes late rather than not at all.
    facts = node_facts_of(nodes, settings, catalog)
    problem = build_problem(wf, facts, settings, used_gpus, catalog=catalog, bandwidth=bandwidth,
                            deadline=started + 2 * time_limit)
    if cluster_size is not None:
        problem.cluster_nodes = cluster_size
    return plan_problem(problem, settings, time_limit=time_limit, secondary=secondary, workers=workers,
                        started=started)
