"""Soak with faults on the real control plane: thousands of pods while components are killed.

    python -m bench.soak                       # the full run (make soak): ~3,000 pods, 3 fault rounds
    python -m bench.soak --pods 150 --rounds 1 # the size tests/integration/test_soak.py runs in CI

etcd + kube-apiserver + kube-scheduler (the chart's configuration) + the extender on loopback, kwok
for every node; each bound pod Succeeds after its few seconds (the soak writes that status). Every
``--interval`` seconds one of the extender, kube-scheduler, kube-apiserver and etcd is killed with
SIGKILL and restarted ``--down`` seconds later; poison pods (``nvidia.com/gpu: "1e400"``, an
invalid ``model-params``) are present throughout. The workload, the admission rule that makes
"capacity exists" exact, and every invariant checked are described in
kubeharness/soak.py. Figures go to ``bench/results/soak-<pods>.json``; the exit code
is 1 if any invariant was violated.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from kubeharness import ControlPlane, find_binaries
from kubeharness.kwok import Kwok, build_kwok
from kubeharness.soak import SoakResult, SoakShape, run_soak

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"
console = Console(width=120)


def report(result: SoakResult) -> Table:
    t = Table(title=f"soak: {result.pods} pods, {sum(result.faults.values())} faults, {result.wall_s:.0f} s")
    t.add_column("figure")
    t.add_column("value", justify="right")
    rows = [
        ("pods created (non-poison)", result.pods),
        ("jobs / gangs / pipelines", f"{result.jobs} / {result.gangs} / {result.pipelines}"),
        ("pods placed", result.placed),
        ("pods completed (Succeeded)", result.completed),
        ("faults injected", ", ".join(f"{k} {v}" for k, v in result.faults.items()) or "none"),
        ("time to bind p50 / p99 (s)", f"{result.p50_time_to_bind_s:.1f} / {result.p99_time_to_bind_s:.1f}"),
        ("longest Pending (s)", f"{result.max_pending_s:.1f}"),
        ("reserved GPUs at the end", result.reserved_gpus_end),
        ("pod watch relists (outages seen)", result.tracker_relists),
    ]
    rows += [(f"violations: {k}", v) for k, v in result.violations.items()]
    rows.append(("violations: total", result.total_violations))
    for k, v in rows:
        t.add_row(k, str(v))
    return t


def main(
    pods: int = typer.Option(3000, help="non-poison pods (gangs count each member)"),
    rounds: int = typer.Option(3, help="fault rounds (each kills extender, kube-scheduler, apiserver, etcd)"),
    interval: float = typer.Option(30.0, help="seconds between faults"),
    down: float = typer.Option(3.0, help="seconds a killed component stays down"),
    scale: int = typer.Option(4, help="node pools x this (1: 4 H100, 2 L4, 2 A100, 2 CPU nodes)"),
    pending_bound: float = typer.Option(120.0, help="a pod Pending longer than this is a violation"),
    seed: int = typer.Option(12),
    timeout: float = typer.Option(3600.0, help="seconds for the whole run"),
    out: Path = typer.Option(RESULTS, help="where the JSON goes"),
) -> None:
    shape = replace(
        SoakShape(), h100_nodes=4 * scale, l4_nodes=2 * scale, a100_nodes=2 * scale, cpu_nodes=2 * scale,
        pods=pods, fault_rounds=rounds, fault_interval_s=interval, down_s=down,
        pending_bound_s=pending_bound, seed=seed, timeout_s=timeout)
    workdir = Path(tempfile.mkdtemp(prefix="llmp-soak-", dir=os.environ.get("LLMP_TEST_WORKDIR")))
    console.print(f"soak: control plane and logs in {workdir}")
    cp = ControlPlane(workdir, find_binaries(build=True))
    t0 = time.monotonic()
    cp.start()
    kwok = Kwok(build_kwok(), cp.admin_kubeconfig, workdir, pod_stages=False)
    kwok.start()
    startup = time.monotonic() - t0
    ok = False
    try:
        with Progress(TextColumn("[progress.description]{task.description}"), BarColumn(),
                      MofNCompleteColumn(), TimeElapsedColumn(), console=console) as progress:
            task = progress.add_task("pods created", total=pods)
            result = run_soak(cp, kwok, "soak", shape, log=progress.console.print,
                              on_progress=lambda done, total: progress.update(task, completed=done,
                                                                               total=total))
        console.print(report(result))
        for line in result.examples:
            console.print(f"  {line}")
        out.mkdir(parents=True, exist_ok=True)
        path = out / f"soak-{pods}.json"
        doc = {**result.to_json(), "startup_s": round(startup, 1),
               "cores": os.cpu_count(), "load_avg_end": os.getloadavg()}
        path.write_text(json.dumps(doc, indent=2, default=str) + "\n")
        shown = path.relative_to(REPO) if path.is_relative_to(REPO) else path
        console.print(f"soak: figures written to {shown}")
        ok = result.total_violations == 0
    finally:
        kwok.stop()
        cp.stop()
        if ok and os.environ.get("LLMP_KEEP_LOGS") != "1":
            shutil.rmtree(workdir, ignore_errors=True)
        else:
            console.print(f"soak: logs kept in {workdir / 'logs'}")
    if not ok:
        raise typer.Exit(1)


if __name__ == "__main__":
    typer.run(main)
