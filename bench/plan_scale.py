"""How the workflow planner scales: makespan against HEFT, the lower bound and wall time, from 20 to
500 tasks on 8 to 256 nodes (docs/planner.md), with the time limit covering everything.

Instances are generated (seeded): layered DAGs of GPU and CPU tasks with data on every edge, on a
cluster of four node types (speeds 1, 1.5, 2.5 and 4) spread over leaves of eight nodes, transfers
cheap inside a node, dearer inside a leaf, dearest across. Each row also checks the plan is valid.

    python bench/plan_scale.py            # the table in BENCHMARKS.md
    python bench/plan_scale.py --quick    # three small rows
"""

from __future__ import annotations

import random
import time

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


def main(quick: bool = False, time_limit: float = 10.0, seed: int = 1) -> None:
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
