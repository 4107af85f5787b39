"""Gang planning: plan time and optimality of the product planner vs CP-SAT alone vs the greedy.

For gangs of 8, 64 and 512 pods on 100, 1,000 and 5,000 nodes, on synthetic fleets shaped like the
NVIDIA Topograph fixtures (irregular leaves of 5-32 nodes under spines and zones, or NVL72-style
racks where a leaf is one NVLink domain), with realistic free capacity: whole leaves taken by
earlier gangs, partly used nodes, a few nodes without RDMA, one or two GPU models. Each instance
draws its per-pod GPUs from 8/8/8/4/2/1 (whole-node pretraining members are the common case).

Three planners run on the very same instance:

* ``planner``: what the extender runs (``app.gang.solver.plan``): prune, exact tree DP of the
  separable relaxation, CP-SAT certifying it (or searching from it when the relaxation is not tight);
* ``cp-sat``: CP-SAT searching alone from the greedy warm start (no DP), same time limit;
* ``greedy``: the Kueue-TAS-like topology best-fit baseline.

Quality is compared on the planners' own lexicographic objective (``assess``): domains used at each
tier, then GPU models, then fragmentation. "worse" must stay 0. Plan times are wall clock and the
process CPU time of ``plan`` (the index over all nodes included); on a shared machine the CPU column
is the load-independent one.

    python -m bench.gang_solver                       # full matrix, 30 instances per cell
    python -m bench.gang_solver --pods 512 --nodes 5000 --instances 100
"""

from __future__ import annotations

import gc
import json
import os
import random
import statistics
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from app.gang.problem import Assessment, Problem, Shape
from app.gang.solver import PlanResult, plan
from testkit.gang_synth import FleetSpec, fleet, gang_problem

console = Console(width=240)
GPUS_PER_POD = (8, 8, 8, 4, 2, 1)


def instance(nodes: int, pods: int, seed: int, launcher: bool = False) -> tuple[Problem, str]:
    rng = random.Random(seed * 7919 + nodes * 31 + pods)
    shape = rng.choice(["hgx", "hgx", "irregular", "nvl72"])
    models = ("H100",) if rng.random() < 0.7 else ("H100", "A100")
    busy = rng.uniform(0.1, 0.45)
    spec = {
        "hgx": FleetSpec(nodes, 8, (16, 32), 8, 4, busy, rng.uniform(0.1, 0.35), rng.uniform(0.1, 0.3),
                         0.03, False, models),
        "irregular": FleetSpec(nodes, 8, (5, 16), 16, 2, busy, rng.uniform(0.1, 0.35), rng.uniform(0.1, 0.3),
                               0.05, False, models),
        "nvl72": FleetSpec(nodes, 4, (18, 18), 8, 4, busy, rng.uniform(0.1, 0.35), rng.uniform(0.1, 0.3),
                           0.0, True, models),
    }[shape]
    gpus = min(rng.choice(GPUS_PER_POD), spec.gpus_per_node)
    problem = gang_problem(fleet(spec, rng), pods, gpus)
    if launcher:
        # Two shapes: one launcher with fewer GPUs, the rest workers (the DP no longer applies).
        small = Shape("launcher", 1, max(gpus // 4, 1) if gpus > 1 else 0, 4000)
        problem = replace(problem, shapes=(small, replace(problem.shapes[0], count=pods - 1)),
                          nodes=tuple(replace(n, shapes=None) for n in problem.nodes))
    return problem, f"{shape}/{gpus}gpu"


@dataclass
class Cell:
    pods: int
    nodes: int
    feasible: int = 0
    infeasible: int = 0
    agree_infeasible: int = 0
    times: dict[str, list[float]] = field(default_factory=lambda: {"planner": [], "cp-sat": [], "greedy": []})
    good: dict[str, int] = field(default_factory=lambda: {"planner": 0, "cp-sat": 0})
    certified: int = 0
    worse_than_greedy: int = 0
    better_than_greedy: int = 0
    leaves: dict[str, list[int]] = field(default_factory=lambda: {"planner": [], "greedy": []})
    spines: dict[str, list[int]] = field(default_factory=lambda: {"planner": [], "greedy": []})
    stranded: dict[str, list[int]] = field(default_factory=lambda: {"planner": [], "greedy": []})
    gaps: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)  # planner CPU time (ms): load-independent


def tier_count(a: Assessment, name: str) -> int:
    return a.domains(name)


def pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    s = sorted(xs)
    return s[min(len(s) - 1, round(q * (len(s) - 1)))]


def good(r: PlanResult) -> bool:
    return r.assignment is not None and (r.status == "optimal" or r.gap <= 0.01)


def run_cell(cell: Cell, instances: int, time_limit: float, workers: int, cp_sat_alone: bool,
             launcher: bool, progress: Progress, task: Any) -> None:
    for seed in range(instances):
        p, _label = instance(cell.nodes, cell.pods, seed, launcher)
        # The previous instance's garbage is not this plan's cost (the extender freezes its
        # long-lived cache out of the collector's sight, see app.extender.wiring).
        gc.collect()
        cpu = time.process_time()
        ours = plan(p, time_limit=time_limit, workers=workers)  # the index is built inside: timed
        cell.cpu.append((time.process_time() - cpu) * 1000)
        base = plan(p, use_cp_sat=False)
        alone = plan(p, time_limit=time_limit, workers=workers, use_dp=False) if cp_sat_alone else None
        cell.times["planner"].append(ours.seconds * 1000)
        cell.times["greedy"].append(base.seconds * 1000)
        if alone is not None:
            cell.times["cp-sat"].append(alone.seconds * 1000)
        if ours.assignment is None:
            cell.infeasible += 1
            cell.agree_infeasible += int(base.assignment is None and ours.status == "infeasible")
            progress.advance(task)
            continue
        cell.feasible += 1
        cell.good["planner"] += int(good(ours))
        cell.certified += int(ours.method == "dp")
        cell.gaps.append(ours.gap)
        if alone is not None:
            cell.good["cp-sat"] += int(good(alone))
        a = ours.assessment
        assert a is not None and a.feasible
        leaf, spine = "fabric-tier-0", "fabric-tier-1"
        cell.leaves["planner"].append(tier_count(a, leaf))
        cell.spines["planner"].append(tier_count(a, spine))
        cell.stranded["planner"].append(a.stranded_after)
        g = base.assessment
        if g is not None:
            cell.worse_than_greedy += int(a.key > g.key)
            cell.better_than_greedy += int(a.key < g.key)
            cell.leaves["greedy"].append(tier_count(g, leaf))
            cell.spines["greedy"].append(tier_count(g, spine))
            cell.stranded["greedy"].append(g.stranded_after)
        progress.advance(task)


def mean(xs: list[int]) -> str:
    return f"{statistics.fmean(xs):.1f}" if xs else "-"


def main(
    pods: Annotated[str, typer.Option(help="Gang sizes (pods), comma separated.")] = "8,64,512",
    nodes: Annotated[str, typer.Option(help="Cluster sizes (nodes), comma separated.")] = "100,1000,5000",
    instances: Annotated[int, typer.Option(help="Random instances per cell.")] = 30,
    time_limit: Annotated[float, typer.Option(help="Planner time limit, seconds (the extender's "
                                                   "solver_time_limit_seconds).")] = 0.5,
    workers: Annotated[int, typer.Option(help="CP-SAT workers.")] = 2,
    cp_sat_alone: Annotated[bool, typer.Option(help="Also run CP-SAT alone (greedy hint, no DP).")] = True,
    launcher: Annotated[bool, typer.Option(help="Two member shapes: a smaller launcher + workers.")] = False,
    json_out: Annotated[Path | None, typer.Option("--json", help="Write the raw figures here.")] = None,
) -> None:
    cells = [Cell(int(p), int(n)) for n in nodes.split(",") for p in pods.split(",")]
    load = os.getloadavg()[0]
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task("planning", total=len(cells) * instances)
        for cell in cells:
            progress.update(task, description=f"{cell.pods} pods on {cell.nodes} nodes")
            run_cell(cell, instances, time_limit, workers, cp_sat_alone, launcher, progress, task)
    kind = " (launcher + workers)" if launcher else ""
    t = Table(title=f"Gang planning{kind} ({instances} instances per cell, time limit {time_limit:g}s, "
                    f"{workers} CP-SAT workers, load avg {load:.1f} on {os.cpu_count()} CPUs)")
    for col in ("pods", "nodes", "feasible", "planner p50 / p99 ms", "planner CPU p50 / p99 ms",
                "optimal or <=1%", "DP-exact",
                "cp-sat alone p50 / p99 ms", "cp-sat alone optimal or <=1%", "greedy p50 ms",
                "leaves ours / greedy", "spines ours / greedy", "stranded GPUs ours / greedy",
                "better / worse than greedy"):
        t.add_column(col, justify="right")
    for c in cells:
        n = max(c.feasible, 1)
        alone = c.times["cp-sat"]
        t.add_row(
            str(c.pods), str(c.nodes),
            f"{c.feasible} (+{c.infeasible} infeasible, {c.agree_infeasible} agreed)",
            f"{pct(c.times['planner'], .5):.1f} / {pct(c.times['planner'], .99):.1f}",
            f"{pct(c.cpu, .5):.1f} / {pct(c.cpu, .99):.1f}",
            f"{100 * c.good['planner'] / n:.0f}%", f"{100 * c.certified / n:.0f}%",
            f"{pct(alone, .5):.0f} / {pct(alone, .99):.0f}" if alone else "-",
            f"{100 * c.good['cp-sat'] / n:.0f}%" if alone else "-",
            f"{pct(c.times['greedy'], .5):.1f}",
            f"{mean(c.leaves['planner'])} / {mean(c.leaves['greedy'])}",
            f"{mean(c.spines['planner'])} / {mean(c.spines['greedy'])}",
            f"{mean(c.stranded['planner'])} / {mean(c.stranded['greedy'])}",
            f"{c.better_than_greedy} / {c.worse_than_greedy}",
        )
    console.print(t)
    all_feasible = sum(c.feasible for c in cells)
    all_good = sum(c.good["planner"] for c in cells)
    worse = sum(c.worse_than_greedy for c in cells)
    console.print(f"planner: optimal or <=1% gap on {all_good}/{all_feasible} feasible instances "
                  f"({100 * all_good / max(all_feasible, 1):.1f}%); worse than greedy on {worse}.")
    for c in cells:
        if c.pods == 512 and c.nodes == 5000:
            console.print(f"target cell 512 pods / 5,000 nodes: p99 plan time "
                          f"{pct(c.times['planner'], .99):.1f} ms wall, {pct(c.cpu, .99):.1f} ms CPU "
                          f"(target <= 200 ms)")
    if json_out is not None:
        json_out.write_text(json.dumps([{
            "pods": c.pods, "nodes": c.nodes, "feasible": c.feasible, "infeasible": c.infeasible,
            "times_ms": c.times, "cpu_ms": c.cpu, "good": c.good, "certified": c.certified, "gaps": c.gaps,
            "better": c.better_than_greedy, "worse": c.worse_than_greedy, "leaves": c.leaves,
            "spines": c.spines, "stranded": c.stranded,
        } for c in cells], indent=1))


if __name__ == "__main__":
    typer.run(main)
