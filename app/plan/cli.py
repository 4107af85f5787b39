"""``llm-placement plan``: the command's body (app/cli.py only declares its options)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, cast

import typer
from rich.console import Console

from app.config.settings import Settings
from app.plan.cluster import ClusterFile
from app.plan.cpsat import Secondary
from app.plan.estimate import EstimateError
from app.plan.files import fail_line
from app.plan.problem import ProblemError
from app.plan.workflow import Workflow

SECONDARIES = ("cost", "transfer", "none")


def run_plan_command(
    console: Console, settings: Settings, *, workflow: Workflow, cluster: ClusterFile | None, live: bool,
    kubeconfig: str | None, time_limit: float, secondary: str, gantt: Path | None,
    annotations: Path | None, as_json: bool, started: float | None = None,
) -> None:
    """``workflow`` and ``cluster`` as read and checked (load_workflow, load_cluster; the cluster is
    None with ``live``); ``started``: the ``time.perf_counter()`` the time limit counts from."""
    import time

    from app.plan.manifest import planned_pods, to_yaml
    from app.plan.report import as_json as report_json
    from app.plan.report import render
    from app.plan.run import plan_workflow

    started = time.perf_counter() if started is None else started

    def fail(msg: str) -> typer.Exit:
        fail_line(msg)
        return typer.Exit(2)

    if secondary not in SECONDARIES:
        raise fail(f"--secondary must be one of {', '.join(SECONDARIES)}")
    wf = workflow
    used: dict[str, int] | None = None
    bandwidth = None
    cluster_size: int | None = None
    try:
        if live:
            from app.plan.live import live_nodes

            kc = kubeconfig or os.environ.get("KUBECONFIG") or _default_kubeconfig()
            nodes, used = live_nodes(kc, tuple(settings.labels.gpu_resource))
        else:
            if cluster is None:
                raise ValueError("no cluster file was read")
            nodes, cluster_size = cluster.sample(sum(t.count for t in wf.tasks)), cluster.size
            if cluster.bandwidth is not None:
                bandwidth = cluster.bandwidth.over(settings.tier_bandwidth_gbps)
    except (OSError, ValueError) as exc:
        raise fail(f"cannot read the cluster: {exc}") from None
    try:
        run = plan_workflow(wf, nodes, settings, time_limit=time_limit,
                            secondary=cast(Secondary, secondary), used_gpus=used, bandwidth=bandwidth,
                            started=started, cluster_size=cluster_size)
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
