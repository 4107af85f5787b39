"""``llm-placement plan``: the command's body (app/cli.py only declares its options)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, cast

import typer
from rich.console import Console

from app.config import Settings
from app.plan.cpsat import Secondary
from app.plan.estimate import EstimateError
from app.plan.problem import ProblemError
from app.plan.workflow import WorkflowError, load_workflow

SECONDARIES = ("cost", "transfer", "none")


def run_plan_command(
    console: Console, settings: Settings, *, workflow: Path | None, cluster: Path | None, live: bool,
    kubeconfig: str | None, time_limit: float, secondary: str, gantt: Path | None,
    annotations: Path | None, as_json: bool,
) -> None:
    from app.plan.cluster import cluster_nodes
    from app.plan.manifest import planned_pods, to_yaml
    from app.plan.report import as_json as report_json
    from app.plan.report import render
    from app.plan.run import plan_workflow

    def fail(msg: str) -> typer.Exit:
        console.print(f"[red]{msg}[/red]")
        return typer.Exit(2)

    if secondary not in SECONDARIES:
        raise fail(f"--secondary must be one of {', '.join(SECONDARIES)}")
    if live and cluster is not None:
        raise fail("give --cluster or --live, not both")
    try:
        wf = load_workflow(workflow)
    except WorkflowError as exc:
        raise fail(str(exc)) from None
    used: dict[str, int] | None = None
    try:
        if live:
            from app.plan.live import live_nodes

            kc = kubeconfig or os.environ.get("KUBECONFIG") or _default_kubeconfig()
            nodes, used = live_nodes(kc, tuple(settings.labels.gpu_resource))
        else:
            nodes = cluster_nodes(cluster)
    except (OSError, ValueError) as exc:
        raise fail(f"cannot read the cluster: {exc}") from None
    try:
        run = plan_workflow(wf, nodes, settings, time_limit=time_limit,
                            secondary=cast(Secondary, secondary), used_gpus=used)
    except (ProblemError, EstimateError) as exc:
        raise fail(str(exc)) from None
    out: dict[str, Any] = {}
    if gantt is not None:
        from app.plan.gantt import gantt as draw

        draw(run.problem, [run.plan, *run.baselines], gantt)
        out["gantt"] = str(gantt)
    if annotations is not None:
        annotations.write_text(to_yaml(planned_pods(run.problem, run.plan, run.result)))
        out["annotations"] = str(annotations)
    if as_json:
        print(json.dumps({**report_json(run), **out}, indent=2))
        return
    render(run, console)
    for what, path in out.items():
        console.print(f"{what} written to {path}")


def _default_kubeconfig() -> str | None:
    p = Path.home() / ".kube" / "config"
    return str(p) if p.exists() else None
