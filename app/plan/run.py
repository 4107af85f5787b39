"""One planning run: workflow + nodes -> the exact plan and both baselines, compared."""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import suppress
from dataclasses import dataclass, field
from typing import Any

from app.config import Settings
from app.core.catalog import GpuCatalog
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


def plan_problem(problem: PlanProblem, settings: Settings | None, *, time_limit: float = 10.0,
                 secondary: Secondary = "cost", workers: int = 2) -> PlanRun:
    base = heft(problem)
    baselines = [base]
    if settings is not None and problem.pods:
        with suppress(GreedyError):
            baselines.append(greedy_extender(problem, settings))
    result = solve(problem, time_limit=time_limit, secondary=secondary, hint=base, workers=workers)
    plan = result.schedule or Schedule("heft (solver found no plan in time)", dict(base.slots))
    run = PlanRun(problem, result, plan, baselines)
    for s in (plan, *baselines):
        run.metrics[s.method] = metrics(problem, s)
        run.problems[s.method] = verify(problem, s)
    return run


def plan_workflow(
    wf: Workflow, nodes: Sequence[dict[str, Any]], settings: Settings, *, catalog: GpuCatalog | None = None,
    time_limit: float = 10.0, secondary: Secondary = "cost", used_gpus: dict[str, int] | None = None,
    workers: int = 2,
) -> PlanRun:
    facts = node_facts_of(nodes, settings, catalog or GpuCatalog.load())
    problem = build_problem(wf, facts, settings, used_gpus)
    return plan_problem(problem, settings, time_limit=time_limit, secondary=secondary, workers=workers)
