"""Trace-driven placement quality, what-if (simulator): the Alibaba "openb" GPU trace replayed through
the simulator of kube-scheduler's cycle (app.sim.scheduler) under several profiles, in the same run.

What-if only: every row is kube-scheduler's combination replayed in-process (integer extender band x
weight x 10 plus the profile's in-tree NodeResourcesFit / BalancedAllocation points, random ties from
a seeded RNG), not a real cluster's decisions. Runs (``--run``):
* ``default``: the default profile, no extender (LeastAllocated + BalancedAllocation);
* ``most-allocated``: NodeResourcesFit MostAllocated on ``nvidia.com/gpu``, no extender (the
  bin-packing an operator configures without us);
* ``ours``: the chart's shipped profile (helm/llm-placement/files/scheduler-config.yaml) with our
  extender and rank bands;
* ``ours-linear-w12``: the previous chart: default profile, extender weight 12, ``round(10 x total)``.

Data: ../shared/data/alibaba-gpu-v2023 (ATC'23 "Beware of Fragmentation"; read in place, never
copied). 1,213 GPU nodes of 7 models; pods arrive at ``creation_time`` and leave at
``deletion_time``. Mapping chosen here (the trace has no LLM stages):
* pods asking for whole GPUs (``gpu_milli`` = 1000) keep ``num_gpu``; GPU-sharing pods
  (``gpu_milli`` < 1000) are left out and counted, because neither scheduler here shares GPUs;
* CPU-only pods are kept (they compete for the GPU nodes' CPUs, as in the trace);
* ``gpu_spec`` type constraints are ignored for both schedulers alike.
Both schedulers see identical pods in identical order; an unplaceable pod fails (no retry).

Measured: pods placed, GPU-pods failed, and fragmentation sampled at every 1% of the arrivals:
stranded GPUs (free GPUs on partly used nodes: the ones an 8-GPU job cannot use) as a share of free
GPUs, and whole free 8-GPU nodes (capacity left for the next big job).

    python bench/trace_sim.py --trace default --trace multigpu50
    python bench/trace_sim.py --trace multigpu50 --run ours --run ours-linear-w12 --seed 2
"""

from __future__ import annotations

import csv
import statistics
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from app.base.catalog import GpuCatalog
from app.base.objects import node_object, pod_object
from app.config.settings import Settings
from app.extender.service import ExtenderService
from app.placement.ranking import ScoreMapping
from app.sim.profile import SchedulerProfile, default_profile, most_allocated_profile, shipped_profile
from app.sim.scheduler import WHAT_IF, SimScheduler
from app.snapshot.store import ClusterSnapshot

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "alibaba-gpu-v2023"
console = Console()


@dataclass
class Outcome:
    placed: int = 0
    gpu_failed: int = 0
    gpus_failed: int = 0  # GPUs asked for by the pods that failed: an 8-GPU job lost is 8x a 1-GPU one
    gpus_placed: int = 0
    cpu_failed: int = 0
    stranded_share: list[float] = field(default_factory=list)
    free_whole_nodes: list[int] = field(default_factory=list)
    seconds: float = 0.0


def load_nodes(data: Path) -> list[dict[str, Any]]:
    nodes = []
    with (data / "openb_node_list_gpu_node.csv").open() as f:
        for row in csv.DictReader(f):
            nodes.append(node_object(
                row["sn"], gpus=int(row["gpu"]), product=row["model"],
                cpu=f"{int(row['cpu_milli'])}m", memory=f"{int(row['memory_mib'])}Mi",
            ))
    return nodes


def load_events(data: Path, trace: str) -> tuple[list[tuple[int, int, dict[str, Any]]], int]:
    """(time, kind, pod) with kind 0 = leave before 1 = arrive at equal times; and skipped count."""
    events: list[tuple[int, int, dict[str, Any]]] = []
    skipped = 0
    with (data / f"openb_pod_list_{trace}.csv").open() as f:
        for row in csv.DictReader(f):
            gpus, milli = int(row["num_gpu"]), int(row["gpu_milli"] or 0)
            if gpus and milli < 1000:
                skipped += 1
                continue
            pod = pod_object(row["name"], gpus=gpus, cpu=f"{int(row['cpu_milli'])}m",
                             memory=f"{int(row['memory_mib'])}Mi", uid=row["name"])
            created = int(row.get("creation_time") or 0)
            events.append((created, 1, pod))
            if row.get("deletion_time"):
                events.append((int(row["deletion_time"]), 0, pod))
    events.sort(key=lambda e: (e[0], e[1], e[2]["metadata"]["name"]))
    return events, skipped


def fragmentation(snap: ClusterSnapshot) -> tuple[float, int]:
    free = stranded = whole = 0
    for name, facts in snap.nodes.items():
        if not facts.gpu_count:
            continue
        f = snap.free_gpus(name)
        free += f
        if 0 < f < facts.gpu_count:
            stranded += f
        if facts.gpu_count == 8 and f == 8:
            whole += 1
    return (stranded / free if free else 0.0), whole


RUNS: dict[str, tuple[SchedulerProfile, bool, ScoreMapping]] = {  # profile, extender?, mapping
    "default": (default_profile(), False, ScoreMapping.RANK),
    "most-allocated": (most_allocated_profile(), False, ScoreMapping.RANK),
    "ours": (shipped_profile(), True, ScoreMapping.RANK),
    # The previous chart: every default score plugin, extender weight 12, all nodes scored.
    "ours-linear-w12": (replace(default_profile(extender_weight=12), percentage_of_nodes_to_score=100), True,
                        ScoreMapping.LINEAR),
}


def replay(kind: str, nodes: list[dict[str, Any]], events: list[tuple[int, int, dict[str, Any]]],
           progress: Progress, seed: int = 1) -> Outcome:
    profile, extender, mapping = RUNS[kind]
    settings = Settings(cluster_source="none", metrics_port=0,
                        feature_gates={"ScoreRankBands": mapping is ScoreMapping.RANK})
    service = ExtenderService(settings, GpuCatalog.load())
    for n in nodes:
        service.absorb_node(n)
    if extender:
        scheduler = SimScheduler(service.placer, profile, seed=seed)
    else:
        scheduler = SimScheduler(None, profile, snapshot=service.snapshot, seed=seed)
    out = Outcome()
    arrivals = sum(1 for e in events if e[1] == 1)
    every = max(1, arrivals // 100)
    placed_uids: set[str] = set()
    task = progress.add_task(f"{kind}", total=len(events))
    t0 = time.perf_counter()
    seen = 0
    for _, what, pod in events:
        progress.advance(task)
        uid = pod["metadata"]["uid"]
        if what == 0:
            if uid in placed_uids:
                service.snapshot.finish(uid)
            continue
        seen += 1
        res = scheduler.schedule(pod)
        gpus = int(pod["spec"]["containers"][0]["resources"]["requests"].get("nvidia.com/gpu", 0))
        if res.node is not None:
            out.placed += 1
            out.gpus_placed += gpus
            placed_uids.add(uid)
        elif gpus:
            out.gpu_failed += 1
            out.gpus_failed += gpus
        else:
            out.cpu_failed += 1
        if seen % every == 0:
            share, whole = fragmentation(service.snapshot)
            out.stranded_share.append(share)
            out.free_whole_nodes.append(whole)
    out.seconds = time.perf_counter() - t0
    return out


def main(
    trace: list[str] = typer.Option(["default"], help="openb pod list suffix(es): default, multigpu50, ..."),
    data: Path = typer.Option(DATA, help="Folder with the openb CSV files."),
    run: list[str] = typer.Option(["default", "most-allocated", "ours"], help=f"profiles: {', '.join(RUNS)}"),
    seed: int = typer.Option(1, help="seed of kube-scheduler's random tie-break"),
) -> None:
    if not (data / "openb_node_list_gpu_node.csv").exists():
        console.print(f"[yellow]trace data not found at {data}; nothing to measure[/yellow]")
        raise typer.Exit(1)
    unknown = [r for r in run if r not in RUNS]
    if unknown:
        raise typer.BadParameter(f"unknown run(s) {unknown}: expected {list(RUNS)}")
    nodes = load_nodes(data)
    console.print(f"[b]{WHAT_IF}[/b]: kube-scheduler's cycle replayed in-process (seed {seed}); profiles:")
    for r in run:
        console.print(f"  {r}: {RUNS[r][0].describe()}" + (f", score mapping {RUNS[r][2].value}"
                                                            if RUNS[r][1] else ""))
    title = f"{WHAT_IF}: openb trace replay on {len(nodes)} GPU nodes"
    table = Table(title=title)
    for col in ("trace", "scheduler", "pods placed", "GPU pods failed", "GPUs placed", "GPUs failed",
                "stranded/free GPUs (mean)",
                "free whole 8-GPU nodes (mean)", "seconds"):
        table.add_column(col, justify="right" if col not in ("trace", "scheduler") else "left")
    for t in trace:
        events, skipped = load_events(data, t)
        results = {}
        with Progress(console=console, transient=True) as progress:
            for kind in run:
                o = results[kind] = replay(kind, nodes, events, progress, seed)
                # Printed as each run ends: a long replay that is stopped keeps what it measured.
                console.print(f"{WHAT_IF} {t} {kind}: placed {o.placed}, GPU pods failed {o.gpu_failed}, "
                              f"GPUs placed {o.gpus_placed}, GPUs failed {o.gpus_failed}, stranded/free mean "
                              f"{statistics.mean(o.stranded_share or [0]):.3f}, whole 8-GPU nodes mean "
                              f"{statistics.mean(o.free_whole_nodes or [0]):.1f}, {o.seconds:.0f}s")
        for kind, o in results.items():
            table.add_row(t, kind, str(o.placed), str(o.gpu_failed), str(o.gpus_placed), str(o.gpus_failed),
                          f"{statistics.mean(o.stranded_share or [0]):.3f}",
                          f"{statistics.mean(o.free_whole_nodes or [0]):.1f}", f"{o.seconds:.1f}")
        console.print(f"{t}: {skipped} GPU-sharing pods left out")
        if "ours" in results:
            o = results["ours"]
            for kind, b in results.items():
                if kind == "ours":
                    continue
                ratio = (statistics.mean(o.stranded_share or [0])
                         / max(1e-9, statistics.mean(b.stranded_share or [0])))
                console.print(f"  ours vs {kind}: GPUs placed {o.gpus_placed}/{b.gpus_placed} "
                              f"({100 * (o.gpus_placed / max(1, b.gpus_placed) - 1):+.1f}%), GPU pods failed "
                              f"{o.gpu_failed}/{b.gpu_failed}, mean stranded share ratio {ratio:.2f}")
    console.print(table)


if __name__ == "__main__":
    typer.run(main)
