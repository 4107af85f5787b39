"""Dollars spent with uncatalogued GPUs in the cluster against the same cluster without them
(what-if, simulator).

A GPU product the catalog lacks is priced for training by the throughput node facts infer from its
labels, an operator's declared figure, or else the penalty figure (docs/node-facts.md,
"Throughput"). This measures what that does to the bill: the same pods run through the simulator of
kube-scheduler's cycle (``app.sim.scheduler``) twice, once on the cluster as it is and once with every
node of an uncatalogued product removed, and the dollars each run spent are compared.

Run model (both runs alike): pods arrive at their times and wait in a FIFO queue until a cycle places
them (retried at every arrival and every finish, as kube-scheduler retries unschedulable pods on
cluster events); a placed pod runs the harness's run time on the GPU it got
(``kubeharness/runtime.PodRuntime``: measured training and batch-serving speeds; a
product the catalog lacks runs training at the dense BF16 figure the scenario states as its truth,
which the extender may or may not have been told) and then leaves. Dollars spent: each pod's share of
its node's list price (``app.placement.feasibility.pod_hourly_cost``) x the hours it ran, the figure
``bench/replay.py`` reports as "dollars spent". Misplaced: a pod placed on an uncatalogued GPU while a
catalogued node that passed kube-scheduler's resource fit and the extender's filter at that moment
would truly have run it for less (what mispricing looks like, apart from capacity a busy cluster buys).

Scenarios (``--scenario``):
* ``fresh``: catalogued H100 / A100 / L40S / L4 nodes next to five uncatalogued products: declared
  fast (annotation, true), inferred from GFD compute capability and memory (true figure equals the
  inference), nothing known but truly slow (the trap the mixed price units fell into), nothing known
  but truly fast (left unused: the penalty is conservative), and declared slow. A seeded stream of
  pretraining, alignment and serving pods, with and without model sizes.
* ``openb``: the openb trace replay of ``bench/trace_sim.py`` (Alibaba "Beware of Fragmentation",
  read in place from ``--data``), whose G2 / G3 nodes (588 of 1,213) are products the catalog lacks.
  Its pods carry no stage: they are priced by the hour and run their trace durations anywhere, and the
  trace's first ``--limit`` pods are replayed with their arrival times and durations.

    python -m bench.uncatalogued_spend --scenario fresh --seed 1 --seed 2 --seed 3
    python -m bench.uncatalogued_spend --scenario openb --data ../shared/data/alibaba-gpu-v2023 --limit 2000
"""

from __future__ import annotations

import csv
import heapq
import random
import statistics
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.table import Table

from app.base.catalog import GpuCatalog
from app.base.objects import node_object, pod_object
from app.base.workload import WorkloadError, parse_workload
from app.config.settings import Settings
from app.extender.service import ExtenderService
from app.placement.feasibility import pod_hourly_cost
from app.sim.profile import default_profile, shipped_profile
from app.sim.scheduler import WHAT_IF, SimScheduler, in_tree_fits
from kubeharness.runtime import PodRuntime, uncatalogued

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "alibaba-gpu-v2023"
TFLOPS = "llm-placement.io/gpu-bf16-tflops"
CC = "nvidia.com/gpu.compute."
console = Console(width=140)

# Catalogued nodes of the fresh scenario: (product label, nodes), 8 GPUs each.
KNOWN = [("NVIDIA-H100-80GB-HBM3", 3), ("NVIDIA-A100-SXM4-80GB", 3), ("NVIDIA-L40S", 3), ("NVIDIA-L4", 3)]
# Uncatalogued products of the fresh scenario: (product, nodes, labels, annotations, true dense BF16).
UNKNOWN: list[tuple[str, int, dict[str, str], dict[str, str], float]] = [
    ("ACME-Declared-Fast", 2, {}, {TFLOPS: "1200"}, 1200.0),
    ("ACME-GFD-Hopperish", 2, {CC + "major": "9", CC + "minor": "0", "nvidia.com/gpu.memory": "81559"}, {},
     756.0),
    ("ACME-Unlabelled-Slow", 2, {}, {}, 60.0),
    ("ACME-Unlabelled-Fast", 2, {}, {}, 900.0),
    ("ACME-Declared-Slow", 2, {}, {TFLOPS: "150"}, 150.0),
]


@dataclass(frozen=True, slots=True)
class Job:
    pod: dict[str, Any]
    arrival: float  # seconds
    duration: float  # seconds on the reference GPU (the trace's duration)

    @property
    def manifest(self) -> dict[str, Any]:  # PodRuntime's pod protocol
        return self.pod


@dataclass
class Outcome:
    dollars: float = 0.0
    placed: int = 0
    never_ran: int = 0
    gpu_hours: Counter[str] = field(default_factory=Counter)  # by product label
    dollars_by_product: Counter[str] = field(default_factory=Counter)
    waits: list[float] = field(default_factory=list)
    completions: list[float] = field(default_factory=list)
    where: dict[str, str] = field(default_factory=dict)  # pod -> product it ran on
    spent: dict[str, float] = field(default_factory=dict)  # pod -> dollars
    # Placements on an uncatalogued GPU while a catalogued node that passed every filter at that
    # moment would truly have run the pod for less, and the dollars that cost: the mispricing this
    # benchmark is after, apart from capacity bought when every cheaper node was busy.
    misplaced: int = 0
    misplaced_dollars: float = 0.0
    misplaced_pods: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def row(self) -> dict[str, Any]:
        return {"dollars": round(self.dollars, 2), "placed": self.placed, "never_ran": self.never_ran,
                "misplaced": self.misplaced, "misplaced_dollars": round(self.misplaced_dollars, 2),
                "wait_mean_s": round(statistics.mean(self.waits), 1) if self.waits else 0.0,
                "completion_mean_s": round(statistics.mean(self.completions), 1) if self.completions else 0.0,
                "gpu_hours": {k: round(v, 1) for k, v in sorted(self.gpu_hours.items())}}


# ----- scenarios -----------------------------------------------------------------------------------
def fresh_nodes() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The nodes the extender sees, and the same nodes with every uncatalogued product's true dense
    BF16 figure annotated (what the run-time model runs it at)."""
    seen: list[dict[str, Any]] = []
    truth: list[dict[str, Any]] = []
    for product, count in KNOWN:
        for i in range(count):
            n = node_object(f"{product.lower()}-{i}", gpus=8, product=product, cpu="128", memory="1024Gi")
            seen.append(n)
            truth.append(n)
    for product, count, labels, ann, true_tflops in UNKNOWN:
        for i in range(count):
            name = f"{product.lower()}-{i}"
            seen.append(node_object(name, gpus=8, product=product, cpu="128", memory="1024Gi",
                                    labels=labels, annotations=ann))
            truth.append(node_object(name, gpus=8, product=product, cpu="128", memory="1024Gi",
                                     labels=labels, annotations={**ann, TFLOPS: f"{true_tflops:g}"}))
    return seen, truth


def fresh_jobs(seed: int, count: int = 160, hours: float = 96.0) -> list[Job]:
    """A seeded stream of LLM pods arriving over ``hours``; durations are run times on an H100."""
    rng = random.Random(seed)
    jobs: list[Job] = []
    for i in range(count):
        t = rng.uniform(0, hours * 3600)
        kind = rng.choices(["pretraining", "alignment", "batch", "interactive"], [3, 4, 2, 2])[0]
        ann: dict[str, str] = {}
        params = rng.choice(["7B", "13B", "30B", None])
        if kind == "pretraining":
            stage, gpus = "pretraining", 8
            duration = rng.uniform(2, 8) * 3600
        elif kind == "alignment":
            # Sizes whose full fine-tune fits 80 GB GPUs (the extender's memory rule).
            stage = "alignment"
            params, gpus = rng.choice([(None, 1), (None, 2), (None, 4), (None, 8), ("7B", 4), ("7B", 8),
                                       ("13B", 8)])
            duration = rng.uniform(0.5, 4) * 3600
        else:
            stage, gpus = "serving", rng.choice([1, 2])
            ann["llm-placement.io/latency-class"] = "batch" if kind == "batch" else "interactive"
            params = params or "7B"
            duration = rng.uniform(1, 6) * 3600
        if params is not None:
            ann["llm-placement.io/model-params"] = params
        pod = pod_object(f"{kind}-{i}", stage=stage, gpus=gpus, cpu="8", memory="64Gi", annotations=ann,
                         uid=f"{kind}-{i}")
        jobs.append(Job(pod, t, duration))
    jobs.sort(key=lambda j: (j.arrival, j.pod["metadata"]["name"]))
    return jobs


def openb_nodes(data: Path) -> list[dict[str, Any]]:
    with (data / "openb_node_list_gpu_node.csv").open() as f:
        return [node_object(r["sn"], gpus=int(r["gpu"]), product=r["model"], cpu=f"{int(r['cpu_milli'])}m",
                            memory=f"{int(r['memory_mib'])}Mi") for r in csv.DictReader(f)]


def openb_jobs(data: Path, trace: str, limit: int) -> list[Job]:
    """Whole-GPU and CPU pods of the trace (GPU-sharing pods left out, as in bench/trace_sim.py), the
    first ``limit`` by arrival; a pod without a deletion time runs to the last event of the trace."""
    rows = []
    with (data / f"openb_pod_list_{trace}.csv").open() as f:
        for r in csv.DictReader(f):
            gpus, milli = int(r["num_gpu"]), int(r["gpu_milli"] or 0)
            if gpus and milli < 1000:
                continue
            rows.append(r)
    end = max(int(r.get("deletion_time") or r.get("creation_time") or 0) for r in rows)
    rows.sort(key=lambda r: (int(r.get("creation_time") or 0), r["name"]))
    jobs = []
    for r in rows[:limit]:
        created = int(r.get("creation_time") or 0)
        gone = int(r.get("deletion_time") or end)
        pod = pod_object(r["name"], gpus=int(r["num_gpu"]), cpu=f"{int(r['cpu_milli'])}m",
                         memory=f"{int(r['memory_mib'])}Mi", uid=r["name"])
        jobs.append(Job(pod, float(created), float(max(0, gone - created))))
    return jobs


def without_uncatalogued(nodes: list[dict[str, Any]], catalog: GpuCatalog) -> list[dict[str, Any]]:
    gone = uncatalogued(nodes, catalog)
    return [n for n in nodes if n["metadata"]["name"] not in gone]


# ----- the run -------------------------------------------------------------------------------------
def simulate(nodes: list[dict[str, Any]], truth: list[dict[str, Any]], jobs: Iterable[Job], *,
             extender: bool = True, seed: int = 1, catalog: GpuCatalog | None = None) -> Outcome:
    """Replay ``jobs`` on ``nodes`` (module docstring); ``truth`` gives the run-time model the true
    figures of uncatalogued products."""
    catalog = catalog or GpuCatalog.load()
    service = ExtenderService(Settings(cluster_source="none", metrics_port=0), catalog)
    for n in nodes:
        service.absorb_node(n)
    if extender:
        scheduler = SimScheduler(service.placer, shipped_profile(), seed=seed)
    else:
        scheduler = SimScheduler(None, default_profile(), snapshot=service.snapshot, seed=seed)
    names = {n["metadata"]["name"] for n in nodes}
    runtime = PodRuntime([n for n in truth if n["metadata"]["name"] in names], catalog=catalog)
    product = {n["metadata"]["name"]: str(n["metadata"]["labels"].get("nvidia.com/gpu.product", "cpu"))
               for n in nodes}
    unknown = set(uncatalogued(nodes, catalog))
    known = sorted(names - unknown)

    def true_cost(job: Job, spec: Any, node: str) -> float:
        return pod_hourly_cost(spec, service.snapshot.nodes[node]) * runtime(job, node, {}) / 3600
    out = Outcome()
    t0 = time.perf_counter()
    events: list[tuple[float, int, int, Job]] = []  # (time, 0 finish / 1 arrival, seq, job)
    seq = 0
    for job in jobs:
        heapq.heappush(events, (job.arrival, 1, seq, job))
        seq += 1
    pending: list[Job] = []

    def start(now: float) -> None:
        nonlocal seq
        still: list[Job] = []
        for job in pending:
            gpus = _gpus(job.pod)
            if gpus and max((service.snapshot.free_gpus(n) for n in names), default=0) < gpus:
                still.append(job)
                continue
            placed = scheduler.schedule(job.pod)
            if placed.node is None:
                still.append(job)
                continue
            ran = runtime(job, placed.node, {})
            try:
                spec = parse_workload(job.pod)
            except WorkloadError:
                spec = None
            facts = service.snapshot.nodes[placed.node]
            dollars = (pod_hourly_cost(spec, facts) if spec is not None else 0.0) * ran / 3600
            if spec is not None and placed.node in unknown:
                # Catalogued nodes the pod fitted at this moment, by kube-scheduler's resource fit and
                # the extender's filter (the chosen node's assumption does not touch them), priced at
                # their true run time.
                fits, _ = service.placer.evaluate_nodes(spec, known)
                best = min((true_cost(job, spec, n) for n in fits if in_tree_fits(service.snapshot, spec, n)),
                           default=None)
                if best is not None and best < dollars * 0.99:
                    out.misplaced += 1
                    out.misplaced_dollars += dollars - best
                    out.misplaced_pods.append(job.pod["metadata"]["name"])
            p = product[placed.node]
            out.placed += 1
            out.dollars += dollars
            out.dollars_by_product[p] += dollars
            out.gpu_hours[p] += gpus * ran / 3600
            out.waits.append(now - job.arrival)
            out.completions.append(now + ran - job.arrival)
            out.where[job.pod["metadata"]["name"]] = p
            out.spent[job.pod["metadata"]["name"]] = dollars
            heapq.heappush(events, (now + ran, 0, seq, job))
            seq += 1
        pending[:] = still

    while events:
        now, kind, _, job = heapq.heappop(events)
        if kind == 1:
            pending.append(job)
        else:
            service.snapshot.finish(job.pod["metadata"]["uid"])
        if not events or events[0][0] > now:  # every event at this instant is in: one pass
            start(now)
    out.never_ran = len(pending)
    out.seconds = time.perf_counter() - t0
    return out


def _gpus(pod: dict[str, Any]) -> int:
    return int(pod["spec"]["containers"][0]["resources"]["requests"].get("nvidia.com/gpu", 0))


def compare(nodes: list[dict[str, Any]], truth: list[dict[str, Any]], jobs: list[Job], *,
            extender: bool = True, seed: int = 1) -> tuple[Outcome, Outcome]:
    """(as is, every uncatalogued product's nodes removed), same pods and seed."""
    catalog = GpuCatalog.load()
    as_is = simulate(nodes, truth, jobs, extender=extender, seed=seed, catalog=catalog)
    removed = simulate(without_uncatalogued(nodes, catalog), truth, jobs, extender=extender, seed=seed,
                       catalog=catalog)
    return as_is, removed


def common_dollars(a: Outcome, b: Outcome) -> tuple[float, float, int]:
    """Dollars of the pods that ran in both runs (each run's), and how many there are."""
    both = set(a.spent) & set(b.spent)
    return sum(a.spent[p] for p in both), sum(b.spent[p] for p in both), len(both)


def main(
    scenario: str = typer.Option("fresh", help="fresh | openb"),
    seed: list[int] = typer.Option([1], help="seed(s): the fresh scenario's pods and the tie-break"),
    jobs: int = typer.Option(160, help="fresh: pods per seed"),
    hours: float = typer.Option(96.0, help="fresh: pods arrive over this many hours (fewer: heavier load)"),
    data: Path = typer.Option(DATA, help="openb: folder with the openb CSV files"),
    trace: str = typer.Option("default", help="openb: pod list suffix"),
    limit: int = typer.Option(2000, help="openb: the trace's first N pods"),
    baseline: bool = typer.Option(True, help="also run kube-scheduler's default profile (no extender)"),
) -> None:
    if scenario not in ("fresh", "openb"):
        raise typer.BadParameter(f"unknown scenario {scenario!r}: fresh or openb")
    table = Table(title=f"{WHAT_IF}: dollars spent with uncatalogued GPUs vs. with them removed ({scenario})")
    for col in ("seed", "scheduler", "run", "pods run", "never ran", "dollars", "dollars, pods run in both",
                "wait mean h", "completion mean h", "GPU-hours on uncatalogued", "misplaced (dollars)",
                "seconds"):
        table.add_column(col, justify="left" if col in ("scheduler", "run") else "right")
    catalog = GpuCatalog.load()
    for s in seed:
        if scenario == "fresh":
            nodes, truth = fresh_nodes()
            work = fresh_jobs(s, jobs, hours)
        else:
            if not (data / "openb_node_list_gpu_node.csv").exists():
                console.print(f"[yellow]openb data not found at {data}[/yellow]")
                raise typer.Exit(1)
            nodes = openb_nodes(data)
            truth = nodes
            work = openb_jobs(data, trace, limit)
        unknown = set(uncatalogued(nodes, catalog).values())
        for ext in ([True, False] if baseline else [True]):
            as_is, removed = compare(nodes, truth, work, extender=ext, seed=s)
            a_common, r_common, n_common = common_dollars(as_is, removed)
            who = "ours (shipped profile + extender)" if ext else "default profile, no extender"
            for label, o, common in (("as is", as_is, a_common), ("uncatalogued removed", removed, r_common)):
                table.add_row(str(s), who, label, str(o.placed), str(o.never_ran), f"{o.dollars:,.0f}",
                              f"{common:,.0f} ({n_common})",
                              f"{statistics.mean(o.waits or [0]) / 3600:.2f}",
                              f"{statistics.mean(o.completions or [0]) / 3600:.2f}",
                              f"{sum(v for k, v in o.gpu_hours.items() if k in unknown):,.0f}",
                              f"{o.misplaced} ({o.misplaced_dollars:,.0f})", f"{o.seconds:.1f}")
            change = 100 * (as_is.dollars / removed.dollars - 1) if removed.dollars else 0.0
            console.print(
                f"seed {s}, {who}: dollars as is / removed {as_is.dollars:,.0f} / {removed.dollars:,.0f} "
                f"({change:+.1f} %); completion mean h {statistics.mean(as_is.completions or [0]) / 3600:.2f}"
                f" / {statistics.mean(removed.completions or [0]) / 3600:.2f}; pods run {as_is.placed} / "
                f"{removed.placed}; misplaced as is {as_is.misplaced} (${as_is.misplaced_dollars:,.0f}); "
                f"GPU-hours as is {dict(sorted((k, round(v)) for k, v in as_is.gpu_hours.items()))}")
    console.print(table)


if __name__ == "__main__":
    typer.run(main)
