"""How the workflow planner scales: makespan against HEFT, the lower bound and wall time, from 20 to
500 tasks on 8 to 256 nodes (docs/planner.md), with the time limit covering everything.

Instances are generated (seeded): layered DAGs of GPU and CPU tasks with data on every edge, on a
cluster of four node types (speeds 1, 1.5, 2.5 and 4) spread over leaves of eight nodes, transfers
cheap inside a node, dearer inside a leaf, dearest across. Each row also checks the plan is valid.

    python bench/plan_scale.py            # the table in BENCHMARKS.md
    python bench/plan_scale.py --quick    # three small rows
    python bench/plan_scale.py --cli      # `llm-placement plan` on generated files: wall, peak RSS
    python bench/plan_scale.py --refusals # files it refuses: exit status, wall, peak RSS

``--cli`` writes each instance as a workflow file and a cluster file (``groups`` of eight nodes of one
GPU type per fabric leaf; durations measured per node type) and runs the command as a user would, in
a fresh process, so the wall time includes the interpreter, reading the files and printing the plan.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.table import Table

from app.plan.heft import heft
from app.plan.problem import OTHER, TRAIN, PlanNode, PlanProblem, PlanTask
from app.plan.run import plan_problem
from app.plan.schedule import verify

console = Console()
SPEEDS = (1.0, 1.5, 2.5, 4.0)


def instance(tasks: int, nodes: int, seed: int, chain: bool = False) -> PlanProblem:
    rng = random.Random(seed)
    ns = [PlanNode(f"n{i}", 8, 96_000, memory_mib=1 << 20) for i in range(nodes)]
    speed = {n.name: SPEEDS[i % len(SPEEDS)] if not chain else 1.0 for i, n in enumerate(ns)}
    leaf = {n.name: i // 8 for i, n in enumerate(ns)}
    ts: list[PlanTask] = []
    width = max(1, int(tasks ** 0.5))
    for i in range(tasks):
        if chain:
            deps: tuple[str, ...] = (f"t{i - 1}",) if i else ()
        else:
            layer = i // width
            prev = [f"t{j}" for j in range(max(0, (layer - 1) * width), layer * width)]
            deps = tuple(rng.sample(prev, min(len(prev), rng.randint(1, 3)))) if prev else ()
        gpus = rng.choice((0, 1, 2, 4, 8))
        gb = float(rng.randint(1, 50))
        ts.append(PlanTask(f"t{i}", "x", gpus, 4000, deps, gb, TRAIN if gpus else OTHER))
    duration = {t.name: {n.name: max(1, round(rng.randint(60, 1800) / speed[n.name])) for n in ns}
                for t in ts}
    cost = {t: {n: d * speed[n] / 3600 for n, d in dur.items()} for t, dur in duration.items()}
    s_per_gb = {(a.name, b.name): 0.05 if a is b else (0.4 if leaf[a.name] == leaf[b.name] else 2.0)
                for a in ns for b in ns}
    return PlanProblem(ts, ns, duration, cost, s_per_gb)


ROWS = [(20, 8), (46, 32), (100, 32), (200, 64), (300, 128), (500, 256)]
QUICK = [(20, 8), (46, 32), (100, 32)]


# (group prefix, GPUs per node, product label, speed): three GPU types and CPU nodes.
TYPES = (("h100", 8, "NVIDIA-H100-80GB-HBM3", 4.0), ("a100", 8, "NVIDIA-A100-SXM4-80GB", 2.5),
         ("l40s", 4, "NVIDIA-L40S", 1.5), ("cpu", 0, None, 1.0))
CATALOG_NAME = {"h100": "H100-SXM-80GB", "a100": "A100-SXM4-80GB", "l40s": "L40S", "cpu": "cpu"}
LEAF = "fabric.topograph.run/tier-0"


def cluster_file(nodes: int, per_group: int = 8) -> dict[str, Any]:
    """``nodes`` nodes in groups of ``per_group`` identical nodes, four types per leaf, in rotation."""
    groups: list[dict[str, Any]] = []
    left, i = nodes, 0
    while left > 0:
        prefix, gpus, product, _ = TYPES[i % len(TYPES)]
        leaf = i // len(TYPES)
        g: dict[str, Any] = {"prefix": f"{prefix}-l{leaf}", "count": min(per_group, left),
                             "labels": {LEAF: f"leaf-{leaf}", "topology.kubernetes.io/zone": "zone-a"}}
        if gpus:
            g.update(gpus=gpus, product=product)
        groups.append(g)
        left -= g["count"]
        i += 1
    return {"groups": groups}


def workflow_file(tasks: int, seed: int) -> dict[str, Any]:
    """A layered DAG: GPU fine-tuning tasks (1-8 GPUs) and CPU data-prep tasks, data on every edge,
    durations measured per node type (a base time over each type's speed)."""
    rng = random.Random(seed)
    width = max(1, int(tasks ** 0.5))
    out: list[dict[str, Any]] = []
    for i in range(tasks):
        layer = i // width
        prev = [f"t{j}" for j in range(max(0, (layer - 1) * width), layer * width)]
        deps = sorted(rng.sample(prev, min(len(prev), rng.randint(1, 3)))) if prev else []
        gpus = rng.choice((0, 1, 2, 4, 8))
        base = rng.randint(60, 1800)
        if gpus:
            durations = {CATALOG_NAME[p]: f"{max(1, round(base / sp))}s"
                         for p, g, _, sp in TYPES if g >= gpus}
            t: dict[str, Any] = {"name": f"t{i}", "stage": "sft", "gpus": gpus, "memory": "64Gi",
                                 "durations": durations}
        else:
            t = {"name": f"t{i}", "stage": "data-prep", "cpu": "8", "duration": f"{base}s"}
        t["output_gb"] = rng.randint(1, 50)
        if deps:
            t["after"] = deps
        out.append(t)
    return {"name": f"scale-{tasks}", "tasks": out}


def run_cli(wf: Path, cluster: Path, time_limit: float) -> tuple[float, float, dict[str, Any] | str]:
    """(wall seconds, peak RSS MB, the JSON report or the error) of one ``plan`` in a fresh process,
    both measured by a wrapper around that process alone."""
    wrap = ("import resource, subprocess, sys, time; t = time.perf_counter(); "
            "p = subprocess.run(sys.argv[1:], capture_output=True, text=True); w = time.perf_counter() - t; "
            "sys.stdout.write(p.stdout); sys.stderr.write(p.stderr); "
            "print(w, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, file=sys.stderr); "
            "sys.exit(p.returncode)")
    cmd = [sys.executable, "-c", wrap, sys.executable, "-m", "app.cli", "plan", str(wf), "--cluster",
           str(cluster), "--time-limit", f"{time_limit:g}", "--secondary", "none", "--json"]
    p = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "COLUMNS": "200"})
    lines = p.stderr.strip().splitlines()
    wall, rss = lines[-1].split()
    if p.returncode != 0:
        return float(wall), int(rss) / 1024, " ".join(lines[:-1])[:300]
    return float(wall), int(rss) / 1024, json.loads(p.stdout)


CLI_ROWS = [(200, 256, 10.0), (500, 256, 10.0), (2000, 1000, 30.0), (100, 20_000, 10.0)]


def cli_table(time_limit: float | None, seed: int) -> None:
    table = Table(title=f"llm-placement plan on generated files (seed {seed}; wall includes the interpreter)")
    cols = ("tasks x nodes", "limit s", "wall s", "wall/limit", "peak RSS MB", "HEFT", "plan",
            "vs HEFT", "bound", "gap", "proven", "plan from")
    for col in cols:
        table.add_column(col, justify="right")
    with tempfile.TemporaryDirectory() as tmp:
        for tasks, nodes, limit in CLI_ROWS:
            limit = time_limit or limit
            wf, cl = Path(tmp) / f"wf-{tasks}.yaml", Path(tmp) / f"cluster-{nodes}.yaml"
            import yaml

            wf.write_text(yaml.safe_dump(workflow_file(tasks, seed), sort_keys=False))
            cl.write_text(yaml.safe_dump(cluster_file(nodes, per_group=8 if nodes <= 1000 else nodes // 12),
                                         sort_keys=False))
            wall, rss, rep = run_cli(wf, cl, limit)
            if isinstance(rep, str):
                table.add_row(f"{tasks} x {nodes}", f"{limit:g}", f"{wall:.1f}", f"{wall / limit:.2f}",
                              f"{rss:.0f}", "", "", "", "", "", "", rep)
                continue
            s, cmp_ = rep["solver"], rep["compare"]
            h = cmp_["heft"]["makespan_s"]
            span = max(x["end_s"] for x in rep["plan"])
            table.add_row(f"{tasks} x {nodes}", f"{limit:g}", f"{wall:.1f}", f"{wall / limit:.2f}",
                          f"{rss:.0f}", f"{h:,}", f"{span:,}", f"{span / h:.3f}", f"{s['bound_s']:,}",
                          f"{s['gap']:.1%}", "yes" if s["proven_optimal"] else "no", s["plan_from"])
    console.print(table)


GROUP = "{prefix: h100, count: 2, gpus: 8, product: NVIDIA-H100-80GB-HBM3}"
REFUSALS = {  # what, (which file, its text)
    "`gpu: 8` for `gpus: 8` in a group": ("cluster", "groups:\n  - {prefix: h100, count: 2, gpu: 8}\n"),
    "two groups of 15,000 nodes": ("cluster", "groups:\n  - {prefix: a, count: 15000}\n"
                                              "  - {prefix: b, count: 15000}\n"),
    "600,000 groups (3.6 MB)": ("cluster", "groups:\n" + "- {prefix: a}\n" * 600_000),
    "800,000 empty tasks (4.0 MB)": ("workflow", "tasks:\n" + "- {}\n" * 800_000),
    "`gpu: 1` in a task": ("workflow", "tasks:\n  - {name: a, stage: sft, gpu: 1, duration: 1m}\n"),
}


def refusals_table() -> None:
    """Each refusal's exit status, wall time and peak RSS, beside a bare start (``plan --help``)."""
    wrap = ("import resource, subprocess, sys, time; t = time.perf_counter(); "
            "p = subprocess.run(sys.argv[1:], capture_output=True, text=True); w = time.perf_counter() - t; "
            "print(p.returncode, w, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)")
    table = Table(title="files `llm-placement plan` refuses (wall includes the interpreter)")
    for col in ("file", "exit", "wall s", "peak RSS MB"):
        table.add_column(col, justify="right")
    with tempfile.TemporaryDirectory() as tmp:
        cases: list[tuple[str, list[str]]] = [("none: `plan --help` (a bare start)", ["--help"])]
        for what, (which, text) in REFUSALS.items():
            path = Path(tmp) / f"{len(cases)}.yaml"
            path.write_text(text)
            cases.append((what, [str(path)] if which == "workflow" else ["--cluster", str(path)]))
        for what, args in cases:
            out = subprocess.run([sys.executable, "-c", wrap, sys.executable, "-m", "app.cli", "plan", *args,
                                  "--json"], capture_output=True, text=True).stdout.split()
            table.add_row(what, out[0], f"{float(out[1]):.2f}", f"{int(out[2]) / 1024:.0f}")
    console.print(table)


def main(quick: bool = False, time_limit: float = 10.0, seed: int = 1, cli: bool = False,
         cli_limit: float | None = None, refusals: bool = False) -> None:
    if cli:
        cli_table(cli_limit, seed)
        return
    if refusals:
        refusals_table()
        return
    table = Table(title=f"planner scale (time limit {time_limit:g} s, build included; seed {seed})")
    cols = ("tasks x nodes", "HEFT", "plan", "vs HEFT", "lower bound", "gap", "method", "wall s", "valid")
    for col in cols:
        table.add_column(col, justify="right")
    cases = [(t, n, False) for t, n in (QUICK if quick else ROWS)] + [(10, 300, True)]
    for tasks, nodes, chain in cases:
        p = instance(tasks, nodes, seed, chain)
        h = heft(p).makespan
        t0 = time.perf_counter()
        run = plan_problem(p, None, time_limit=time_limit, secondary="none", workers=2)
        wall = time.perf_counter() - t0
        span = run.plan.makespan
        gap = (span - run.lower_bound) / span if span else 0.0
        table.add_row(f"{tasks} x {nodes}" + (" chain" if chain else ""), f"{h:,}", f"{span:,}",
                      f"{span / h:.3f}", f"{run.lower_bound:,}", f"{gap:.1%}",
                      run.plan.method.split(" ")[0] + (", narrowed" if run.narrowed_to else ""),
                      f"{wall:.1f}", "yes" if not verify(p, run.plan) else "NO")
    console.print(table)


if __name__ == "__main__":
    typer.run(main)
