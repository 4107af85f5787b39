"""The workflow file, the plan's outputs (pods, words, Gantt) and the command."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from app.base.catalog import GpuCatalog
from app.base.objects import expand_cluster
from app.base.workload import parse_workload
from app.cli import cli
from app.config.settings import Settings
from app.plan.explain import colocations, critical_path
from app.plan.manifest import SLOT, planned_node, planned_pods, to_yaml
from app.plan.problem import ProblemError, build_problem, node_facts_of
from app.plan.run import plan_problem
from app.plan.workflow import Workflow, WorkflowError, load_workflow, parse_duration

TRAP = Path(__file__).parents[2] / "plan_instances" / "tiny-heft-trap.yaml"


def _trap_run():  # type: ignore[no-untyped-def]
    data = yaml.safe_load(TRAP.read_text())
    s = Settings()
    facts = node_facts_of(expand_cluster(data["cluster"]), s, GpuCatalog.load())
    return plan_problem(build_problem(Workflow.model_validate(data["workflow"]), facts, s), s, time_limit=1.0)


def test_durations_and_sweeps() -> None:
    assert parse_duration("40m") == 2400
    assert parse_duration("2.5h") == 9000
    with pytest.raises(ValueError):
        parse_duration("soon")
    wf = Workflow.model_validate({"tasks": [
        {"name": "a", "stage": "data-prep", "duration": 60},
        {"name": "ft", "stage": "sft", "count": 3, "after": ["a"], "duration": 60},
        {"name": "e", "stage": "eval", "after": ["ft"], "duration": 60}]})
    names = [t.name for t in wf.expanded()]
    assert names == ["a", "ft-0", "ft-1", "ft-2", "e"]
    assert wf.expanded()[-1].after == ("ft-0", "ft-1", "ft-2")


def test_bad_workflows_name_the_problem(tmp_path: Path) -> None:
    cyc = tmp_path / "c.yaml"
    cyc.write_text(yaml.safe_dump({"tasks": [
        {"name": "a", "stage": "sft", "after": ["b"], "duration": 1},
        {"name": "b", "stage": "sft", "after": ["a"], "duration": 1}]}))
    with pytest.raises(WorkflowError, match="cycle"):
        load_workflow(cyc)
    unknown = tmp_path / "u.yaml"
    unknown.write_text(yaml.safe_dump({"tasks": [{"name": "a", "stage": "sft", "after": ["zz"]}]}))
    with pytest.raises(WorkflowError, match="zz"):
        load_workflow(unknown)


def test_task_that_fits_nowhere_is_reported() -> None:
    s = Settings()
    facts = node_facts_of(expand_cluster({"groups": [{"prefix": "cpu", "count": 1, "node_class": "cpu"}]}),
                          s, GpuCatalog.load())
    wf = Workflow.model_validate({"tasks": [{"name": "t", "stage": "sft", "gpus": 1, "duration": 5}]})
    with pytest.raises(ProblemError, match="node has no GPUs"):
        build_problem(wf, facts, s)


def test_planned_pods_carry_the_plan_and_parse_as_workloads() -> None:
    run = _trap_run()
    pods = planned_pods(run.problem, run.plan, run.result)
    assert [p["metadata"]["name"] for p in pods] == ["prep", "solve", "post"]
    for pod in pods:
        name = pod["metadata"]["name"]
        node = run.plan.slots[name].node
        assert planned_node(pod) == node
        terms = pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        assert terms["nodeSelectorTerms"][0]["matchFields"][0]["values"] == [node]
        slot = json.loads(pod["metadata"]["annotations"][SLOT])
        assert slot["start_s"] == run.plan.slots[name].start
        spec = parse_workload(pod)  # still an ordinary workload for the extender
        assert spec.depends_on == run.problem.task[name].deps
    assert len(list(yaml.safe_load_all(to_yaml(pods)))) == 3


def test_explanation_names_the_path_and_the_colocation() -> None:
    run = _trap_run()
    path = critical_path(run.problem, run.plan)
    assert [line.split()[0] for line in path] == ["prep", "solve", "post"]
    assert "2000 GB" in path[-1]
    assert all("wrote" in line for line in colocations(run.problem, run.plan))


def test_cli_plan_default_writes_gantt_and_annotations(tmp_path: Path) -> None:
    png, pods = tmp_path / "g.png", tmp_path / "p.yaml"
    res = CliRunner().invoke(cli, ["plan", "--time-limit", "3", "--json", "--gantt", str(png),
                                   "--annotations", str(pods)])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert out["solver"]["status"] in ("optimal", "feasible")
    assert out["compare"]["cp-sat"]["makespan_s"] <= out["compare"]["heft"]["makespan_s"]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(list(yaml.safe_load_all(pods.read_text()))) == len(out["plan"])


def test_cli_plan_bad_workflow_exits_2(tmp_path: Path) -> None:
    bad = tmp_path / "w.yaml"
    bad.write_text("tasks: [{name: Bad_Name, stage: sft}]")
    res = CliRunner().invoke(cli, ["plan", str(bad)])
    assert res.exit_code == 2
    assert "DNS-1123" in res.output
