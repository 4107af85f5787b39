"""What `llm-placement plan` promises whatever the solver does: a plan never worse than the best
baseline it was given, a valid lower bound, the time limit covering the model build, host memory as a
resource, and bad files refused with one line and exit status 2 (docs/planner.md)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from typer.testing import CliRunner

from app.cli import cli
from app.plan.heft import heft
from app.plan.problem import OTHER, PlanNode, PlanProblem, PlanTask
from app.plan.run import lower_bound, plan_problem
from app.plan.schedule import verify
from testkit.plan_brute import brute_force
from tests.unit.plan.test_plan_solver import problems


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problems())
def test_the_plan_is_never_worse_than_heft_and_the_bound_is_valid(problem: PlanProblem) -> None:
    run = plan_problem(problem, None, time_limit=0.3, secondary="none", workers=1)
    assert verify(problem, run.plan) == []
    assert run.plan.makespan <= heft(problem).makespan
    assert all(verify(problem, b) == [] for b in run.baselines)  # HEFT and CPOP
    assert run.plan.makespan <= min(b.makespan for b in run.baselines)
    best = brute_force(problem).makespan
    assert run.lower_bound <= best <= run.plan.makespan


def wide() -> PlanProblem:
    """40 independent-ish tasks on 16 nodes: the model takes longer to build than a 10 ms budget."""
    nodes = [PlanNode(f"n{i}", 8, 64000) for i in range(16)]
    tasks = [PlanTask(f"t{i}", "x", 1 + i % 4, 1000, (f"t{i - 1}",) if i % 5 else (), 1.0, OTHER)
             for i in range(40)]
    duration = {t.name: {n.name: 10 + (i * 7 + j) % 13 for j, n in enumerate(nodes)}
                for i, t in enumerate(tasks)}
    cost = {t: dict.fromkeys(d, 1.0) for t, d in duration.items()}
    s_per_gb = {(a.name, b.name): 0.0 if a is b else 2.0 for a in nodes for b in nodes}
    return PlanProblem(tasks, nodes, duration, cost, s_per_gb)


def test_a_budget_spent_building_the_model_still_returns_the_best_baseline() -> None:
    problem = wide()
    run = plan_problem(problem, None, time_limit=0.01, secondary="none", workers=1)
    assert run.result.schedule is None and "timeout" in run.model_status
    assert run.result.status == "baseline" and not run.proven
    assert run.plan.method.startswith("heft") and verify(problem, run.plan) == []
    assert run.plan.makespan == heft(problem).makespan


def test_lower_bound_covers_the_critical_path_and_the_work() -> None:
    nodes = [PlanNode("a", 1, 1000), PlanNode("b", 1, 1000)]
    chain = [PlanTask("p", "x", 1, 0, (), 0.0), PlanTask("c", "x", 1, 0, ("p",), 0.0)]
    dur = {"p": {"a": 5, "b": 9}, "c": {"a": 7, "b": 4}}
    p = PlanProblem(chain, nodes, dur, {k: dict.fromkeys(v, 1.0) for k, v in dur.items()},
                    {(x.name, y.name): 0.0 for x in nodes for y in nodes})
    assert lower_bound(p) == 5 + 4
    many = [PlanTask(f"t{i}", "x", 1, 0, (), 0.0) for i in range(6)]
    dur2 = {t.name: {"a": 10, "b": 10} for t in many}
    p2 = PlanProblem(many, nodes, dur2, {k: dict.fromkeys(v, 1.0) for k, v in dur2.items()},
                     {(x.name, y.name): 0.0 for x in nodes for y in nodes})
    assert lower_bound(p2) == 6 * 10 // 2


BOMB = "\n".join(
    [f'{c}: &{c} [{",".join([f"*{p}"] * 9)}]' for p, c in zip("abcdefgh", "bcdefghi", strict=True)]
) + "\n"

BAD_WORKFLOWS = {
    "bomb": ('a: &a ["x","x","x","x","x","x","x","x","x"]\n' + BOMB
             + "tasks:\n  - {name: x, stage: data-prep, duration: 10s, annotations: {k: *i}}\n",
             "aliases (*a) are not accepted"),
    "sweep-clash": ("tasks:\n  - {name: a, stage: data-prep, duration: 10s, count: 2}\n"
                    "  - {name: a-0, stage: data-prep, duration: 10s}\n",
                    "task names repeat once sweeps (count) are expanded: ['a-0']"),
    "tokens": ("tasks:\n  - {name: a, stage: pretraining, model_params: 7B, gpus: 8, tokens: 9e15}\n",
               "tasks.a.tokens"),
    "years": ("tasks:\n  - {name: a, stage: pretraining, model_params: 7B, gpus: 8, tokens: 9e14}\n",
              "years on"),
    "memory": ("tasks:\n  - {name: a, stage: data-prep, duration: 10s, memory: 100Ti}\n",
               "not enough host memory"),
    "bad-task": ("tasks:\n  - {name: a, stage: data-prep, duration: -3}\n", "tasks.a.duration"),
}


@pytest.mark.parametrize("case", sorted(BAD_WORKFLOWS))
def test_bad_workflows_are_refused_with_one_clear_line(case: str, tmp_path: Path) -> None:
    text, expected = BAD_WORKFLOWS[case]
    path = tmp_path / "wf.yaml"
    path.write_text(text)
    res = CliRunner().invoke(cli, ["plan", str(path), "--time-limit", "2"])
    out = " ".join(res.output.split())
    assert res.exit_code == 2, out
    assert expected in out
    assert "Traceback" not in out and "at least 1 item" not in out


BAD_CLUSTERS = {
    "no-prefix": ("groups:\n  - {count: 2, gpus: 8, product: NVIDIA-H100-80GB-HBM3}\n", "field 'prefix'"),
    "huge-count": ("groups:\n  - {prefix: h, count: 100000000, gpus: 8}\n", "field 'count'"),
    "malformed": ("groups: [ {prefix: h\n", "not valid YAML"),
    "not-a-mapping": ("- just\n- a list\n", "expected a mapping"),
}


@pytest.mark.parametrize("case", sorted(BAD_CLUSTERS))
def test_bad_cluster_files_are_refused_with_one_clear_line(case: str, tmp_path: Path) -> None:
    text, expected = BAD_CLUSTERS[case]
    path = tmp_path / "cluster.yaml"
    path.write_text(text)
    res = CliRunner().invoke(cli, ["plan", "--cluster", str(path), "--time-limit", "2"])
    out = " ".join(res.output.split())
    assert res.exit_code == 2, out
    assert expected in out and "Traceback" not in out


def test_a_model_too_large_is_narrowed_around_the_incumbent_and_still_never_worse() -> None:
    from app.plan.run import MAX_MODEL_TERMS, model_terms, narrowed

    nodes = [PlanNode(f"n{i}", 8, 64000) for i in range(300)]
    tasks = [PlanTask(f"t{i}", "x", 8, 1000, (f"t{i - 1}",) if i else (), 20.0, OTHER) for i in range(10)]
    duration = {t.name: {n.name: 100 + (i * 37 + j * 11) % 500 for j, n in enumerate(nodes)}
                for i, t in enumerate(tasks)}
    cost = {t: dict.fromkeys(d, 1.0) for t, d in duration.items()}
    s_per_gb = {(a.name, b.name): 0.0 if a is b else 3.0 for a in nodes for b in nodes}
    problem = PlanProblem(tasks, nodes, duration, cost, s_per_gb)
    assert model_terms(problem) > MAX_MODEL_TERMS
    h = heft(problem)
    small = narrowed(problem, h, MAX_MODEL_TERMS)
    assert small is not None and model_terms(small) <= MAX_MODEL_TERMS
    # Every task keeps the node the incumbent gave it: the incumbent stays a solution of the narrowed model.
    assert all(h.slots[t].node in small.duration[t] for t in small.duration)
    # The narrowed model is one the solver handles: given room, it returns a plan of its own.
    from app.plan.cpsat import solve

    got = solve(small, time_limit=20.0, secondary="none", hint=h, workers=1)
    assert got.schedule is not None and verify(problem, got.schedule) == []
    # Whatever the solver manages within a short limit, the run's plan is valid and never worse.
    run = plan_problem(problem, None, time_limit=2.0, secondary="none", workers=1)
    assert run.narrowed_to is not None
    assert verify(problem, run.plan) == [] and run.plan.makespan <= h.makespan
    assert run.lower_bound <= run.plan.makespan


def test_measured_durations_per_node_type_and_per_edge_reads(tmp_path: Path) -> None:
    from app.config.settings import Settings
    from app.plan.cluster import cluster_nodes
    from app.plan.run import plan_workflow
    from app.plan.workflow import load_workflow

    path = tmp_path / "wf.yaml"
    path.write_text(
        "tasks:\n"
        "  - {name: prep, stage: data-prep, duration: 5m, output_gb: 400}\n"
        "  - {name: ft, stage: alignment, model_params: 7B, gpus: 8, after: [prep], reads: {prep: 2},\n"
        "     durations: {NVIDIA-H100-80GB-HBM3: 10m, A100-SXM4-80GB: 25m}}\n")
    run = plan_workflow(load_workflow(path), cluster_nodes(), Settings(cluster_source="none", metrics_port=0),
                        time_limit=2.0, secondary="none")
    p = run.problem
    by_gpu = {p.facts[n].gpu.name: d for n, d in p.duration["ft"].items()}  # type: ignore[union-attr]
    # Only the measured types, at their measured times (alias accepted); other GPUs are excluded.
    assert by_gpu == {"H100-SXM-80GB": 600, "A100-SXM4-80GB": 1500}
    assert any(r == "no measured duration for this node type" for r in p.excluded["ft"].values())
    # The consumer reads 2 GB of the producer's 400: the edge is priced by what is read.
    assert p.edge_gb("prep", "ft") == 2.0
    assert verify(p, run.plan) == []


def test_durations_naming_an_unknown_node_type_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "wf.yaml"
    path.write_text("tasks:\n  - {name: ft, stage: alignment, model_params: 7B, gpus: 8,"
                    " durations: {Z9000: 10m}}\n")
    res = CliRunner().invoke(cli, ["plan", str(path), "--time-limit", "2"])
    assert res.exit_code == 2 and "Z9000" in res.output and "catalog" in res.output


def test_a_list_nested_too_deeply_is_refused_in_one_line(tmp_path: Path) -> None:
    path = tmp_path / "deep.yaml"
    path.write_text("tasks: " + "[" * 100_000 + "]" * 100_000 + "\n")
    res = CliRunner().invoke(cli, ["plan", str(path), "--time-limit", "2"])
    out = " ".join(res.output.split())
    assert res.exit_code == 2 and "nested too deeply" in out and "Traceback" not in out
