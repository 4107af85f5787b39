"""Data gravity on a pipeline workload, what-if (simulator): ours vs kube-scheduler's default profile.

What-if only: both runs are kube-scheduler's cycle replayed in-process by app.sim.scheduler (its
integer combination: extender band x weight x 10 plus the profile's in-tree NodeResourcesFit /
BalancedAllocation points, random ties from a seeded RNG), not a real cluster's decisions.

    python bench/data_gravity.py                       # three scenarios, 48 pipelines, seed 1
    python bench/data_gravity.py --baseline most-allocated   # compare with GPU bin-packing instead
    python bench/data_gravity.py --seed 2 --json out.json
    python bench/data_gravity.py --gravity pretraining=3 --gravity alignment=3   # explore stage weights

Each pipeline is the five lifecycle stages of one model, chained by ``llm-placement.io/depends-on``:
data-prep -> pretraining -> alignment -> deployment -> serving. A discrete-event loop submits a stage
when every pod of the previous stage has finished (the producer is then a finished pod whose output
is still on its node, as in practice: a checkpoint is read after it is written); pods that do not fit
wait and are retried whenever a pod finishes. The same pods go through (a) the chart's shipped profile
with our extender (app.sim.scheduler.SimScheduler: in-tree fit, our filter, our prioritize with the
data-gravity term as a rank band, kube-scheduler's selectHost) and (b) a baseline profile without the
extender: kube-scheduler's default profile, or NodeResourcesFit MostAllocated on GPUs. Both runs
measure every edge with the same code (GravityModel.observe) at the moment the consumer is placed.

The mapping (nothing public links the stages of one model with data sizes; these are our choices):

* models: 1B / 3B / 7B / 13B parameters (P), drawn 35 / 30 / 25 / 10 %.
* data-prep: one tokenising shard per pretraining member (the shard a data-parallel rank reads).
  Output = 20 tokens per parameter (Chinchilla-optimal) x 2 bytes per token id = 40 P bytes in all.
* pretraining: a gang of 1 / 1 / 2 / 4 pods x 8 GPUs; member i reads shard i (40 P / members bytes).
  Its output, a sharded bf16 checkpoint, lies spread over the members' nodes.
* alignment (SFT): 2 / 4 / 8 / 8 GPUs; reads the bf16 weights, 2 P bytes, from the gang.
* deployment (quantise/package): reads the aligned bf16 weights (2 P bytes).
* serving: 2 replicas of 1 / 1 / 1 / 2 GPUs, int8; each reads the quantised weights (P bytes) once.
* Scenarios differ only in the GPUs of the two "CPU" stages:
  - ``cpu`` follows docs/stage-policy.md: data-prep and deployment request no GPU and run on CPU nodes,
    so three of the four edges of a pipeline join a CPU node to a GPU node; those can never share a
    node or an NVLink domain under any scheduler that keeps the stage rules (best: the same leaf);
  - ``gpu``: GPU data curation on whole 8-GPU nodes (dedup, quality classifiers) and a 1-GPU
    quantisation / engine build, so every edge can be node-local;
  - ``gpu-small``: the same with a 1-GPU curation shard, which (cheapest GPU first) lands on a 4-GPU
    node where the 8-GPU pretraining member that reads it can never follow.
* Durations (exponential) come from AcmeTrace's Kalos cluster when
  ../shared/data/acmetrace/cluster_summary.csv is present (mean GPU job 1,260 s, CPU job 118 s), else
  from the same figures built in; pretraining runs 10x the mean GPU job ("1-3% of jobs, 70-96% of
  GPU time"), serving replicas 4x. Pipelines arrive every 1,200 s on average.

Cluster (82 nodes, app.base.objects): zone-a has two spines; spine-1 holds leaf-1 and leaf-2, each 8 x
H100 (8 GPUs) + 2 CPU + 1 storage node; spine-2 holds leaf-3 (8 x A100-80GB + 2 CPU + 1 storage) and
leaf-4 (an 18-tray GB200 NVL72 rack, 4 GPUs a tray, one NVLink domain, + 2 CPU). zone-b's spine-3
holds leaf-5 (8 x H100 + 2 CPU + 1 storage) and leaf-6 (8 x L40S + 8 x L4, 4 GPUs each, + 2 CPU).

Figures per run: "co-located" = the consumer shares a node or NVLink domain with (one member of) its
producer. "when capacity allowed" = only edges where, at the moment the consumer was placed, some node
at node/NVLink distance from the producer passed the stage rules with room for it (judged on that
run's own cluster state). "cross-node GB" = data the consumer reads from another node (for a gang
producer, the shares on other members' nodes). "transfer time" = the estimate under the configured
tier bandwidths; "compute cost" = each pod's share of its node's $/hour x its run time.
"""

from __future__ import annotations

import copy
import csv
import heapq
import json
import random
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

import typer
from rich.console import Console
from rich.table import Table

from app.base.catalog import GpuCatalog
from app.base.objects import expand_cluster, pod_object
from app.base.workload import WorkloadError, WorkloadSpec, parse_workload, pod_resources
from app.config.settings import Settings
from app.placement.feasibility import pod_hourly_cost
from app.placement.gravity import GravityModel
from app.placement.placer import Placer
from app.sim.profile import SchedulerProfile, default_profile, most_allocated_profile, shipped_profile
from app.sim.scheduler import WHAT_IF, Placement, SimScheduler, in_tree_fits
from app.snapshot.nodes import node_facts
from app.snapshot.store import ClusterSnapshot

ANN = "llm-placement.io/"
ACME = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "acmetrace" / "cluster_summary.csv"
STAGES = ("data-prep", "pretraining", "alignment", "deployment", "serving")
EDGE_NAMES = {
    "pretraining": "prep->pretrain",
    "alignment": "pretrain->align",
    "deployment": "align->deploy",
    "serving": "deploy->serve",
}
EDGE_ORDER = list(EDGE_NAMES.values())
BASELINES: dict[str, Callable[[], SchedulerProfile]] = {
    "default": default_profile,
    "most-allocated": most_allocated_profile,
}
GPU_RESOURCES = ("nvidia.com/gpu",)
console = Console(width=110)


# --- cluster -------------------------------------------------------------------------------------
def _leaf(zone: str, spine: str, leaf: str) -> dict[str, str]:
    return {"topology.kubernetes.io/zone": zone, "fabric.topograph.run/tier-1": spine,
            "fabric.topograph.run/tier-0": leaf}


def cluster_spec() -> dict[str, Any]:
    h100 = "NVIDIA-H100-80GB-HBM3"
    groups: list[dict[str, Any]] = []
    for zone, spine, leaf, n in (("zone-a", "spine-1", "leaf-1", 8), ("zone-a", "spine-1", "leaf-2", 8),
                                 ("zone-b", "spine-3", "leaf-5", 8)):
        groups.append({"prefix": f"h100-{leaf}", "count": n, "gpus": 8, "product": h100, "rdma": True,
                       "labels": _leaf(zone, spine, leaf)})
    groups.append({"prefix": "a100-leaf-3", "count": 8, "gpus": 8, "product": "NVIDIA-A100-SXM4-80GB",
                   "rdma": True, "labels": _leaf("zone-a", "spine-2", "leaf-3")})
    groups.append({"prefix": "gb200-leaf-4", "count": 18, "gpus": 4, "product": "NVIDIA-GB200", "rdma": True,
                   "labels": {**_leaf("zone-a", "spine-2", "leaf-4"), "nvidia.com/gpu.clique": "nvl72-a"}})
    groups.append({"prefix": "l40s-leaf-6", "count": 8, "gpus": 4, "product": "NVIDIA-L40S",
                   "labels": _leaf("zone-b", "spine-3", "leaf-6")})
    groups.append({"prefix": "l4-leaf-6", "count": 8, "gpus": 4, "product": "NVIDIA-L4",
                   "labels": _leaf("zone-b", "spine-3", "leaf-6")})
    leaves = [("zone-a", "spine-1", "leaf-1", True), ("zone-a", "spine-1", "leaf-2", True),
              ("zone-a", "spine-2", "leaf-3", True), ("zone-a", "spine-2", "leaf-4", False),
              ("zone-b", "spine-3", "leaf-5", True), ("zone-b", "spine-3", "leaf-6", False)]
    for zone, spine, leaf, storage in leaves:
        labels = _leaf(zone, spine, leaf)
        groups.append({"prefix": f"cpu-{leaf}", "count": 2, "cpu": "64", "memory": "512Gi",
                       "node_class": "cpu", "labels": labels})
        if storage:
            groups.append({"prefix": f"storage-{leaf}", "count": 1, "cpu": "32", "memory": "256Gi",
                           "node_class": "storage", "labels": labels})
    return {"groups": groups}


# --- workload ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Durations:
    gpu_mean_s: float = 1259.689  # Kalos avg_run_time_gpu
    cpu_mean_s: float = 118.352  # Kalos avg_run_time_cpu
    source: str = "built-in (AcmeTrace Kalos figures)"


def load_durations() -> Durations:
    if not ACME.is_file():
        return Durations()
    with ACME.open() as fh:
        for row in csv.DictReader(fh):
            if row.get("id") == "Kalos":
                return Durations(float(row["avg_run_time_gpu"]), float(row["avg_run_time_cpu"]),
                                 "AcmeTrace data/cluster_summary.csv, row Kalos")
    return Durations()


@dataclass(frozen=True)
class Model:
    name: str
    params: float
    members: int
    align_gpus: int
    serve_gpus: int


MODELS = (Model("1B", 1e9, 1, 2, 1), Model("3B", 3e9, 1, 4, 1), Model("7B", 7e9, 2, 8, 1),
          Model("13B", 13e9, 4, 8, 2))
MODEL_WEIGHTS = (0.35, 0.30, 0.25, 0.10)


@dataclass
class PodPlan:
    pipeline: int
    stage: str
    manifest: dict[str, Any]
    duration: float

    @property
    def name(self) -> str:
        return str(self.manifest["metadata"]["name"])


@dataclass
class Pipeline:
    index: int
    arrive: float
    model: Model
    stages: list[list[PodPlan]] = field(default_factory=list)


SCENARIOS = {  # GPUs of one data-prep shard, GPUs of the deployment (quantise) pod
    "cpu": (0, 0),
    "gpu": (8, 1),
    "gpu-small": (1, 1),
}


def make_pipelines(n: int, seed: int, scenario: str, d: Durations, arrival_s: float) -> list[Pipeline]:
    """The same seed gives the same models, arrivals and durations in every scenario."""
    rng = random.Random(seed)
    prep_gpus, deploy_gpus = SCENARIOS[scenario]
    out: list[Pipeline] = []
    t = 0.0
    for i in range(n):
        t += rng.expovariate(1 / arrival_s)
        m = rng.choices(MODELS, MODEL_WEIGHTS)[0]
        gb = m.params / 1e9  # bytes per parameter -> GB
        p = Pipeline(i, t, m)

        def pod(name: str, stage: str, gpus: int, mean: float, ann: dict[str, str], idx: int = i,
                model: Model = m, **kw: Any) -> PodPlan:
            annotations = {ANN + "model-params": model.name, **ann}
            manifest = pod_object(name, namespace="pipelines", stage=stage, gpus=gpus,
                                  annotations=annotations, **kw)
            return PodPlan(idx, stage, manifest, rng.expovariate(1 / mean))

        def reads(producer: str, size_gb: float) -> dict[str, str]:
            return {ANN + "depends-on": producer, ANN + "input-data-gb": f"{size_gb:g}"}

        p.stages.append([pod(f"p{i}-prep-{k}", "data-prep", prep_gpus, d.cpu_mean_s, {}, cpu="16",
                             memory="64Gi") for k in range(m.members)])
        gang = {"scheduling.x-k8s.io/pod-group": f"p{i}-pretrain"}
        p.stages.append([
            pod(f"p{i}-pretrain-{k}", "pretraining", 8, 10 * d.gpu_mean_s,
                {**reads(f"p{i}-prep-{k}", 40 * gb / m.members), ANN + "gang-size": str(m.members)},
                cpu="32", memory="256Gi", labels=gang)
            for k in range(m.members)])
        p.stages.append([pod(f"p{i}-sft", "alignment", m.align_gpus, d.gpu_mean_s,
                             reads(f"p{i}-pretrain", 2 * gb), cpu="16", memory="128Gi")])
        p.stages.append([pod(f"p{i}-quantize", "deployment", deploy_gpus, d.cpu_mean_s,
                             reads(f"p{i}-sft", 2 * gb), cpu="16", memory="64Gi")])
        p.stages.append([pod(f"p{i}-serve-{k}", "serving", m.serve_gpus, 4 * d.gpu_mean_s,
                             {**reads(f"p{i}-quantize", gb), ANN + "precision": "int8"}, cpu="8",
                             memory="32Gi")
                         for k in range(2)])
        out.append(p)
    return out


# --- simulation ----------------------------------------------------------------------------------
class Scheduler(Protocol):
    def admit(self, pods: list[dict[str, Any]]) -> None: ...

    def schedule(self, pod: dict[str, Any]) -> Placement: ...


@dataclass
class EdgeRecord:
    pipeline: int
    edge: str
    consumer: str
    distance: str
    gb: float
    cross_node_gb: float
    seconds: float
    capacity_allowed: bool
    same_class: bool  # the stage rules let consumer and producer share a node (both GPU or both CPU)


@dataclass
class RunResult:
    name: str
    edges: list[EdgeRecord] = field(default_factory=list)
    placed: int = 0
    unplaced: int = 0
    makespan_h: float = 0.0
    wall_s: float = 0.0
    dollars: float = 0.0  # sum over pods of (share of the node's $/hour) x run time


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def simulate(name: str, pipelines: list[Pipeline], settings: Settings, seed: int,
             baseline: str = "default") -> RunResult:
    catalog = GpuCatalog.load()
    snap = ClusterSnapshot()
    for node in expand_cluster(cluster_spec()):
        snap.upsert_node(node_facts(node, catalog, settings.labels, settings.default_cpu_hourly_cost))
    clock = Clock()
    # One gravity model per run: it scores in our run and only measures in the baseline's.
    gravity = GravityModel(snap, settings.policies().gravity, clock=clock)
    placement = settings.policies().placement
    probe = Placer(placement, snap)  # the stage rules without gravity, for "capacity allows"
    sched: Scheduler
    if name == "ours":
        sched = SimScheduler(Placer(placement, snap, gravity=gravity), shipped_profile(), seed=seed)
    else:
        sched = SimScheduler(None, BASELINES[baseline](), snapshot=snap, seed=seed)
    result = RunResult(name)
    t0 = time.perf_counter()

    events: list[tuple[float, int, str, Any]] = []
    seq = 0

    def push(at: float, kind: str, data: Any) -> None:
        nonlocal seq
        heapq.heappush(events, (at, seq, kind, data))
        seq += 1

    for p in pipelines:
        push(p.arrive, "stage", (p, 0))
    remaining: dict[tuple[int, int], int] = {}
    pending: list[tuple[PodPlan, WorkloadSpec, int]] = []

    def colocatable(spec: WorkloadSpec, manifest: dict[str, Any]) -> bool:
        near: set[str] = set()
        for e in gravity.resolve(spec):
            for s in e.sites:
                home = snap.nodes.get(s.node)
                if home is None:
                    continue
                near |= {n for n, f in snap.nodes.items()
                         if n == s.node or f.nvlink_domain == home.nvlink_domain}
        candidates = sorted(n for n in near if in_tree_fits(snap, spec, n))
        return bool(candidates) and bool(probe.filter(manifest, candidates).passed)

    def same_class(plan: PodPlan, spec: WorkloadSpec, k: int) -> bool:
        # Under docs/stage-policy.md's rules GPU pods run on GPU nodes and CPU-only LLM stages on CPU
        # nodes, so a consumer can share its producer's node only if both request GPUs or neither
        # does. Judged from the pods, not from where a run put them, so both runs count the same edges.
        producer = pipelines[plan.pipeline].stages[k - 1][0]
        return (spec.gpus > 0) == (pod_resources(producer.manifest, GPU_RESOURCES)[0] > 0)

    def attempt(items: list[tuple[PodPlan, WorkloadSpec, int]]) -> list[tuple[PodPlan, WorkloadSpec, int]]:
        left = []
        for plan, spec, k in items:
            allowed = colocatable(spec, plan.manifest) if spec.depends_on else False
            same = same_class(plan, spec, k) if spec.depends_on and k > 0 else False
            placed = sched.schedule(plan.manifest)
            if placed.node is None:
                left.append((plan, spec, k))
                continue
            result.placed += 1
            result.dollars += pod_hourly_cost(spec, snap.nodes[placed.node]) * plan.duration / 3600
            for e in gravity.observe(spec, placed.node):
                result.edges.append(EdgeRecord(plan.pipeline, EDGE_NAMES.get(plan.stage, plan.stage),
                                               plan.name, e.distance, e.gb, e.cross_node_gb, e.seconds,
                                               allowed, same))
            push(clock.t + plan.duration, "finish", (plan, spec, k))
        return left

    while events:
        at, _, kind, data = heapq.heappop(events)
        clock.t = at
        if kind == "stage":
            p, k = data
            plans = [copy.deepcopy(pp) for pp in p.stages[k]]
            sched.admit([pp.manifest for pp in plans])
            remaining[(p.index, k)] = len(plans)
            new = []
            for pp in plans:
                try:
                    new.append((pp, parse_workload(pp.manifest), k))
                except WorkloadError as exc:  # a bug in this generator, not a scheduling outcome
                    raise SystemExit(f"{pp.name}: {exc}") from exc
            pending.extend(attempt(new))
        else:
            plan, spec, k = data
            snap.untrack_spec(spec.uid)
            snap.finish(spec.uid, now=at)
            remaining[(plan.pipeline, k)] -= 1
            if remaining[(plan.pipeline, k)] == 0 and k + 1 < len(STAGES):
                push(at, "stage", (pipelines[plan.pipeline], k + 1))
            pending = attempt(pending)
        result.makespan_h = at / 3600
    result.unplaced = len(pending)
    result.wall_s = time.perf_counter() - t0
    return result


# --- report --------------------------------------------------------------------------------------
CO = ("node", "nvlink")


def summary(r: RunResult) -> dict[str, Any]:
    found = [e for e in r.edges if e.distance != "missing"]
    allowed = [e for e in found if e.capacity_allowed]
    by_edge: dict[str, list[EdgeRecord]] = defaultdict(list)
    for e in found:
        by_edge[e.edge].append(e)
    return {
        "edges": len(r.edges),
        "missing": len(r.edges) - len(found),
        "colocated_all": sum(e.distance in CO for e in found) / max(1, len(found)),
        "edges_capacity_allowed": len(allowed),
        "colocated_when_allowed": sum(e.distance in CO for e in allowed) / max(1, len(allowed)),
        "gb_total": sum(e.gb for e in found),
        "cross_node_gb": sum(e.cross_node_gb for e in found),
        "cross_node_gb_same_class": sum(e.cross_node_gb for e in found if e.same_class),
        "transfer_h": sum(e.seconds for e in found) / 3600,
        "placed": r.placed,
        "unplaced": r.unplaced,
        "makespan_h": r.makespan_h,
        "dollars": r.dollars,
        "wall_s": r.wall_s,
        "by_edge": {k: {"edges": len(v), "colocated": sum(e.distance in CO for e in v) / len(v),
                        "allowed": sum(e.capacity_allowed for e in v),
                        "colocated_when_allowed": _share([e.distance in CO for e in v if e.capacity_allowed]),
                        "cross_node_gb": sum(e.cross_node_gb for e in v),
                        "distances": dict(sorted(_count(e.distance for e in v).items()))}
                    for k, v in sorted(by_edge.items(), key=lambda kv: EDGE_ORDER.index(kv[0]))},
    }


def _share(flags: list[bool]) -> float:
    return sum(flags) / len(flags) if flags else 0.0


def _count(xs: Any) -> dict[str, int]:
    out: dict[str, int] = defaultdict(int)
    for x in xs:
        out[x] += 1
    return out


def _ratio(a: float, b: float) -> float:
    return a / b if b else 0.0


def render(scenario: str, ours: dict[str, Any], base: dict[str, Any], baseline: str = "default") -> None:
    t = Table(title=f"{WHAT_IF} scenario {scenario}: ours vs {baseline} (same pods)")
    t.add_column("metric")
    t.add_column("ours", justify="right")
    t.add_column(baseline, justify="right")
    pct: Callable[[float], str] = lambda x: f"{100 * x:.1f}%"  # noqa: E731
    rows = [
        ("dependency edges (found / missing)", lambda s: f"{s['edges'] - s['missing']} / {s['missing']}"),
        ("co-located node/NVLink, all edges", lambda s: pct(s["colocated_all"])),
        ("  edges where capacity allowed it", lambda s: str(s["edges_capacity_allowed"])),
        ("co-located node/NVLink, when capacity allowed", lambda s: pct(s["colocated_when_allowed"])),
        ("data read by consumers, GB", lambda s: f"{s['gb_total']:,.0f}"),
        ("cross-node GB", lambda s: f"{s['cross_node_gb']:,.0f}"),
        ("  of it on edges the stage rules let share a node",
         lambda s: f"{s['cross_node_gb_same_class']:,.0f}"),
        ("est. transfer time, h", lambda s: f"{s['transfer_h']:.2f}"),
        ("pods placed / never placed", lambda s: f"{s['placed']} / {s['unplaced']}"),
        ("makespan, h", lambda s: f"{s['makespan_h']:.1f}"),
        ("est. compute cost, $ (node share x run time)", lambda s: f"{s['dollars']:,.0f}"),
    ]
    for label, fn in rows:
        t.add_row(label, fn(ours), fn(base))
    t.add_row("[b]per edge[/b]: co-located all | when allowed (n) | cross-node GB", "", "")
    for edge in ours["by_edge"]:
        o, b = ours["by_edge"][edge], base["by_edge"].get(edge, {})

        def cell(x: dict[str, Any]) -> str:
            return (f"{pct(x.get('colocated', 0))} | {pct(x.get('colocated_when_allowed', 0))} "
                    f"({x.get('allowed', 0)}) | {x.get('cross_node_gb', 0):,.0f}")

        t.add_row(f"  {edge}", cell(o), cell(b))
    ratio = _ratio(ours["cross_node_gb"], base["cross_node_gb"])
    same = _ratio(ours["cross_node_gb_same_class"], base["cross_node_gb_same_class"])
    t.add_row(f"cross-node GB, ours / {baseline}", pct(ratio), "")
    t.add_row("  on edges the rules let share a node", pct(same), "")
    transfer = _ratio(ours["transfer_h"], base["transfer_h"])
    t.add_row(f"est. transfer time, ours / {baseline}", pct(transfer), "")
    console.print(t)
    ok_co = ours["colocated_when_allowed"] >= 0.9
    ok_gb = ratio <= 0.25
    console.print(f"  target >= 90% co-located when capacity allows: {'MET' if ok_co else 'NOT MET'} "
                  f"({pct(ours['colocated_when_allowed'])});  target cross-node GB <= 25% of {baseline}: "
                  f"{'MET' if ok_gb else 'NOT MET'} ({pct(ratio)})")


def main(
    pipelines: int = typer.Option(48, help="pipelines (five stages each)"),
    seed: int = typer.Option(1, help="workload and tie-break seed"),
    scenario: str = typer.Option("all", help="cpu, gpu, gpu-small or all"),
    arrival: float = typer.Option(1200.0, help="mean seconds between pipeline arrivals"),
    gravity: list[str] = typer.Option(
        [], help="override a stage's gravity weight, e.g. --gravity alignment=3 (repeatable)"
    ),
    json_out: Path | None = typer.Option(None, "--json", help="write the figures here"),
    baseline: str = typer.Option("default", help=f"profile without the extender: {', '.join(BASELINES)}"),
) -> None:
    if baseline not in BASELINES:
        raise typer.BadParameter(f"baseline {baseline!r}: expected one of {list(BASELINES)}")
    settings = Settings(cluster_source="none", metrics_port=0)
    # Stage weights are configuration (docs/stage-policy.md); this option only explores them.
    weights = dict(settings.weights)
    for item in gravity:
        stage, _, value = item.partition("=")
        if stage not in weights:
            raise typer.BadParameter(f"{item}: expected STAGE=WEIGHT with a stage of {list(weights)}")
        weights[stage] = weights[stage].model_copy(update={"gravity": float(value)})
    settings = Settings(cluster_source="none", metrics_port=0, weights=weights)
    console.print(f"[b]{WHAT_IF}[/b]: kube-scheduler's cycle replayed in-process (seed {seed})")
    console.print(f"  ours: {shipped_profile().describe()}")
    console.print(f"  {baseline}: {BASELINES[baseline]().describe()}")
    console.print("gravity weights: " + ", ".join(f"{k} {w.gravity:g}" for k, w in settings.weights.items()))
    d = load_durations()
    console.print(f"durations from {d.source}: GPU job mean {d.gpu_mean_s:.0f}s, "
                  f"CPU job mean {d.cpu_mean_s:.0f}s")
    if scenario != "all" and scenario not in SCENARIOS:
        raise typer.BadParameter(f"scenario {scenario!r}: expected one of {[*SCENARIOS, 'all']}")
    scenarios = tuple(SCENARIOS) if scenario == "all" else (scenario,)
    report: dict[str, Any] = {"pipelines": pipelines, "seed": seed, "arrival_s": arrival,
                              "durations": asdict(d),
                              "gravity_weights": {k: w.gravity for k, w in settings.weights.items()}}
    for sc in scenarios:
        pl = make_pipelines(pipelines, seed, sc, d, arrival)
        ours = summary(simulate("ours", pl, settings, seed))
        base = summary(simulate(baseline, pl, settings, seed, baseline))
        render(sc, ours, base, baseline)
        report[sc] = {"ours": ours, baseline: base, "what_if": WHAT_IF}
    if json_out is not None:
        json_out.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    typer.run(main)
