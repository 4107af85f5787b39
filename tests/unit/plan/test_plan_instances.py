"""The planner on the instance library (tests/plan_instances): brute-force-checked optima on the tiny
ones, proven optimality on the small ones, never worse than HEFT, every schedule valid."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from app.base.catalog import GpuCatalog
from app.base.objects import expand_cluster
from app.config.settings import Settings
from app.plan.cluster import cluster_nodes
from app.plan.problem import PlanProblem, build_problem, node_facts_of
from app.plan.run import PlanRun, plan_problem
from app.plan.schedule import metrics, verify
from app.plan.workflow import Workflow, load_workflow
from testkit.plan_brute import brute_force

INSTANCES = Path(__file__).parents[2] / "plan_instances"
FILES = sorted(INSTANCES.glob("*.yaml"))
TINY = [f for f in FILES if f.name.startswith("tiny-")]
SMALL = [f for f in FILES if f.name.startswith("small-")]
SETTINGS = Settings()
CATALOG = GpuCatalog.load()


def _problem(path: Path) -> PlanProblem:
    data: dict[str, Any] = yaml.safe_load(path.read_text())
    facts = node_facts_of(expand_cluster(data["cluster"]), SETTINGS, CATALOG)
    return build_problem(Workflow.model_validate(data["workflow"]), facts, SETTINGS)


def _run(path: Path, limit: float) -> PlanRun:
    return plan_problem(_problem(path), SETTINGS, time_limit=limit)


def test_library_has_each_kind() -> None:
    names = {f.stem for f in FILES}
    assert {"tiny-chain", "tiny-fanout", "tiny-hpc", "small-lifecycle", "small-sweep", "small-hpc"} <= names


@pytest.mark.parametrize("path", TINY, ids=lambda p: p.stem)
def test_tiny_optimum_matches_brute_force(path: Path) -> None:
    run = _run(path, 1.0)
    best = brute_force(run.problem)
    assert not verify(run.problem, best)
    assert run.result.status == "optimal"
    assert run.plan.makespan == best.makespan


@pytest.mark.parametrize("path", SMALL, ids=lambda p: p.stem)
def test_small_instances_proven_optimal(path: Path) -> None:
    run = _run(path, 5.0)
    assert run.result.status == "optimal"
    assert run.result.gap == 0.0
    assert run.result.bound == run.plan.makespan


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
def test_plan_beats_or_ties_heft_and_every_schedule_is_valid(path: Path) -> None:
    run = _run(path, 5.0 if path in SMALL else 1.0)
    assert {"heft", run.plan.method} <= set(run.metrics)
    assert run.metrics[run.plan.method].makespan_s <= run.metrics["heft"].makespan_s
    assert [b.method for b in run.baselines][:2] == ["heft", "cpop"] and len(run.baselines) == 3  # + the extender
    for method, found in run.problems.items():
        assert found == [], method
        assert run.metrics[method].makespan_s >= run.plan.makespan  # nobody beats a proven optimum


def test_heft_trap_is_strictly_better() -> None:
    run = _run(INSTANCES / "tiny-heft-trap.yaml", 1.0)
    assert run.plan.makespan < run.metrics["heft"].makespan_s
    # The plan keeps the big result in the home zone: the solve runs on the slower GPUs at home.
    assert run.plan.slots["solve"].node.startswith("l40s")
    assert run.metrics["heft"].makespan_s > 0


def test_bundled_workflow_on_demo_cluster() -> None:
    facts = node_facts_of(cluster_nodes(), SETTINGS, CATALOG)
    problem = build_problem(load_workflow(), facts, SETTINGS)
    run = plan_problem(problem, SETTINGS, time_limit=5.0)
    assert run.result.status in ("optimal", "feasible")
    assert run.metrics[run.plan.method].makespan_s <= run.metrics["heft"].makespan_s
    assert all(not p for p in run.problems.values())
    # Stage rules hold: CPU stages on CPU nodes, GPU stages on GPU nodes.
    for name, slot in run.plan.slots.items():
        facts_of = problem.facts[slot.node]
        assert (problem.task[name].gpus > 0) == (facts_of.gpu_count > 0), name


def test_secondary_objective_never_costs_makespan() -> None:
    problem = _problem(INSTANCES / "small-lifecycle.yaml")
    plain = plan_problem(problem, None, time_limit=2.0, secondary="none")
    cheap = plan_problem(problem, None, time_limit=2.0, secondary="cost")
    local = plan_problem(problem, None, time_limit=2.0, secondary="transfer")
    assert cheap.plan.makespan == local.plan.makespan == plain.plan.makespan
    assert metrics(problem, cheap.plan).cost_usd <= metrics(problem, local.plan).cost_usd + 1e-6
    assert metrics(problem, local.plan).cross_node_gb <= metrics(problem, cheap.plan).cross_node_gb + 1e-6
