"""Placement quality through the real control plane: traces replayed through etcd + kube-apiserver +
kube-scheduler (+ our extender) onto kwok-managed nodes, ours vs the baselines an operator would run.

    python -m bench.replay --trace multigpu50 --trace default           # openb traces, ~minutes each
    python -m bench.replay --gravity cpu --gravity gpu --gravity gpu-small --load 1.0  # pipeline mixes
    python -m bench.replay --synthetic 200                              # a generated smoke trace
    python -m bench.replay --gangs 40 --variants ours                   # gangs queueing for GPUs
    python -m bench.replay --llm-jobs 240 --load 1.0 --load 1.3         # LLM-cluster mix vs Kueue

Everything runs in one control plane (kubeharness, the integration suite's binaries,
PKI and RBAC) with one kwok (kubeharness/kwok.py) for every node. For each workload the
same nodes and the same pod manifests go through every variant in turn, kube-scheduler restarted on
the variant's configuration (kubeharness/replay.py ``variant_config``):

* ``ours``: the Helm chart's scheduler configuration as shipped, with the extender;
* ``default``: kube-scheduler's default profile, nothing configured;
* ``mostalloc``: default profile, NodeResourcesFit ``MostAllocated`` on ``nvidia.com/gpu``, every
  node scored: the bin-packing an operator would configure instead of us;
* ``affinity`` (pipelines only): default profile, each consumer carrying a preferred podAffinity
  (weight 100, same node) to its producer's pods;
* ``mostalloc-sep`` (on request): ``mostalloc`` with interactive serving pods carrying a required
  podAntiAffinity to training pods: bin-packing that keeps the training/serving separation of
  docs/stage-policy.md, which plain ``mostalloc`` ignores;
* ``kueue`` and ``kueue-tas`` (gangs and the LLM-cluster mix): ``mostalloc`` behind real Kueue
  (kubeharness/kueue.py, built by scripts/build-kueue.sh), every pod in one LocalQueue
  and each gang one pod group, admitted all-or-nothing on a quota equal to the cluster; ``kueue-tas``
  with Kueue's topology-aware scheduling, which also checks that the group fits node by node and
  pins each pod to its node. What an operator who wants gangs whole runs instead of us.

Traces (openb: ATC'23 "Beware of Fragmentation", 1,213 GPU nodes, read in place from
../shared/data/alibaba-gpu-v2023, never copied):

* traces with times (``default``): pods arrive at ``creation_time``, run ``deletion_time -
  creation_time`` from the moment they are bound and complete through kwok; a pod waits in
  kube-scheduler's queue until placed.
* traces without times (``multigpu50`` and the other inflated mixes): every pod arrives in file
  order and none leaves (the cluster fills up, as in the paper's own simulator); pods that do not
  fit stay pending and count as failed at the end.
* GPU-sharing pods (``gpu_milli`` < 1000): ``--sharing whole`` (default) gives each one a whole
  GPU (``nvidia.com/gpu: 1``), which is what such a pod gets on a cluster without GPU sharing;
  ``--sharing skip`` leaves them out, as bench/trace_sim.py does. CPU-only pods are kept.
  ``gpu_spec`` constraints are ignored by every variant alike.
* Arrivals are paced by back-pressure (at most ``--window`` created pods undecided), so a burst
  the scheduler cannot absorb is delayed, not reordered.

Pipelines: bench/data_gravity.py's generator and 82-node cluster (same seed, scenarios cpu, gpu,
gpu-small); stage k+1 of a pipeline is created when every pod of stage k has Succeeded.

The trace clock (``--clock``, kubeharness/replay.py): ``virtual`` (default) is
event-driven: it stands still while kube-scheduler, the extender or kwok are busy and jumps to the
next arrival or the next end of a running pod (bind time + duration), where the driver has kwok
finish the pod; every variant then runs on the same load, however fast it decides, and kube-
scheduler's retry backoff is set to 1 s for every variant alike. ``wall`` runs ``span /
(--minutes x 60)`` (openb) or ``--gravity-speed`` (pipelines) trace seconds per wall second, kwok
finishing pods on wall time: a variant that decides more slowly keeps fewer pods running at once.

LLM-cluster mix (``--llm-jobs N --load X``): N jobs with the shares of the Kalos cluster in the
AcmeTrace study (evaluation at 1 GPU, fine-tuning at 8, pretraining gangs of 2-6 whole 8-GPU nodes
holding about three quarters of the GPU time) on 8 H100 + 8 A100-80GB nodes, arriving over the span
that makes demand X times capacity at H100 speed. Training runs at the measured speed of the GPU it
got, a gang at its slowest member's.

Gangs (``--gangs N``): N generated gangs (2-4 members of 2, 4 or 8 GPUs, pretraining) arriving
over 600 trace seconds on 8 RDMA-capable 8-GPU nodes, about three times what fits at once, so most
gangs wait for others to end. For ``ours`` the replay also reads the extender's solver counter
(``llm_placement_solver_runs_total``) and CPU time before and after: solver runs per gang that had
to wait is what docs/gangs.md ("Cannot place") bounds.

Run time (virtual clock, kubeharness/runtime.py and datapath.py; never the
extender's own estimates): a training pod's trace duration is its run on an H100 and it runs its
work at the measured training throughput of the GPU it got (bench/data/training_throughput.yaml); a
batch serving pod runs its tokens at the GPU's measured per-token time relative to the H100's
(median over serving-corpus points measured alike on both GPUs); a GPU without measurements is
scaled by its datasheet peak or bandwidth, a product the catalog lacks by the dense BF16 figure its
nodes declare (``llm-placement.io/gpu-bf16-tflops``), else it runs at the H100's speed; every GPU
is named with where its speed comes from in the result's ``meta.runtime``, and each variant's
summary lists under ``fallback_speed_gpus`` the GPUs its pods ran on at a speed not measured. A pod with
``depends-on`` first reads its ``input-data-gb`` from where its producers ran, over the tier the
two nodes share, at the single-stream bandwidth bench/data/data_path.yaml states with its source.
Interactive serving is judged by the serving corpus's measured per-token time for its model size,
precision and GPU count on the GPU it got; where the corpus cannot judge it, it is counted as such.

Measured, per variant: GPUs allocated and stranded (free GPUs on partly used GPU nodes) and whole
free nodes, sampled at every 1 % of created pods and (virtual clock) averaged over trace time
between events, each state weighted by how long it lasted; stranded GPU-hours per node, priced, and
the part beyond what perfect packing of the same partly used work would strand; pods placed /
failed; over-commits (must be none); gangs run whole, deadlocks, GPU-hours held idle by partial
gangs; per gang, when it could first have started on free whole nodes of one GPU model, when it
did and why it waited (held for a larger gang, queue order, or nothing started meanwhile:
kubeharness/replay.py, ``GangWaits``), printed for the longest waits; queueing delay
and job / pipeline completion; with Kueue, the times the clock moved on without Kueue's word
(``admission_settle_timeouts``, 0 in a clean run); dollars spent (each pod's share of its node's
list price from app/base/catalog.py x the hours it really ran); GB read per data-path tier; for
pipelines, co-location of each consumer with its producer (same node or NVLink domain); for
``ours``, the extender's agreement counter
(``llm_placement_scheduler_agreement_total``) when it exports one. Figures go to
``bench/results/replay-*.json`` and PNG plots next to them.
"""

from __future__ import annotations

import csv
import json
import os
import shutil
import statistics
import tempfile
import time
from collections import defaultdict
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import typer
from kubernetes.client.rest import ApiException
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from app.base.catalog import GpuCatalog
from app.base.objects import expand_cluster, node_object, pod_object
from app.base.workload import LatencyClass, Stage, parse_workload
from app.config.settings import Settings
from app.placement.feasibility import pod_hourly_cost
from app.snapshot.nodes import node_facts
from bench.replay_report import attainment, common_window
from kubeharness import (
    ControlPlane,
    create_nodes,
    delete_all_pods,
    ensure_namespace,
    find_binaries,
    gpu_node,
    llm_pod,
)
from kubeharness.kueue import Kueue, build_kueue, cluster_quota, queued
from kubeharness.kwok import Kwok, build_kwok, kwok_node_labels
from kubeharness.replay import (
    CLOCKS,
    ReplayPod,
    ReplayResult,
    pod_gang,
    replay,
    restart_scheduler_with,
    synthetic_trace,
    variant_config,
    with_retry_backoff,
)
from kubeharness.runtime import Inputs, PodRuntime, ServingJudge, node_gpus

REPO = Path(__file__).resolve().parents[1]

DATA = REPO.parent / "shared" / "data" / "alibaba-gpu-v2023"
RESULTS = REPO / "bench" / "results"
console = Console(width=120)
POD_LABEL = "replay.llm-placement.io/pod"
GANG_LABEL = "scheduling.x-k8s.io/pod-group"
# Virtual clock: kube-scheduler's retry backoff for every variant alike (seconds), so a pod it
# retries after a change is retried within a second and the clock moves on soon after.
RETRY_BACKOFF_S = 1
COLORS = {"ours": "tab:green", "default": "tab:gray", "mostalloc": "tab:blue", "affinity": "tab:orange",
          "mostalloc-sep": "tab:purple", "kueue": "tab:red", "kueue-tas": "tab:brown"}
KUEUE_VARIANTS = ("kueue", "kueue-tas")


# ----- openb -------------------------------------------------------------------------------------
def openb_nodes(data: Path) -> list[dict[str, Any]]:
    nodes = []
    with (data / "openb_node_list_gpu_node.csv").open() as f:
        for row in csv.DictReader(f):
            n = node_object(row["sn"], gpus=int(row["gpu"]), product=row["model"],
                            cpu=f"{int(row['cpu_milli'])}m", memory=f"{int(row['memory_mib'])}Mi",
                            labels=kwok_node_labels())
            nodes.append(n)
    return nodes


def openb_trace(
    data: Path, trace: str, sharing: str, minutes: float
) -> tuple[list[ReplayPod], dict[str, Any]]:
    pods: list[ReplayPod] = []
    shared = skipped = 0
    timed = False
    with (data / f"openb_pod_list_{trace}.csv").open() as f:
        for row in csv.DictReader(f):
            gpus, milli = int(row["num_gpu"]), int(row["gpu_milli"] or 0)
            if gpus and milli < 1000:
                shared += 1
                if sharing == "skip":
                    skipped += 1
                    continue
            m = pod_object(row["name"], gpus=gpus, cpu=f"{int(row['cpu_milli'])}m",
                           memory=f"{int(row['memory_mib'])}Mi", labels={POD_LABEL: row["name"]})
            created = row.get("creation_time")
            deleted = row.get("deletion_time")
            if created not in (None, "") and deleted not in (None, ""):
                timed = True
                c, d = float(created), float(deleted)
                # No deadline: compressed lifetimes are milliseconds of wall time, shorter than one
                # scheduling cycle, so a pod waits in kube-scheduler's queue as it would in a cluster.
                pods.append(ReplayPod(m, arrive=c, duration=max(0.0, d - c)))
            else:
                pods.append(ReplayPod(m))
    pods.sort(key=lambda p: p.arrive)  # stable: file order at equal times
    span = (max(p.arrive for p in pods) - min(p.arrive for p in pods)) if timed else 0.0
    speed = span / (minutes * 60) if timed and span > 0 else 1.0
    meta = {"trace": trace, "pods": len(pods), "gpu_sharing_pods": shared, "sharing": sharing,
            "skipped": skipped, "timed": timed, "trace_span_s": span, "speed": speed}
    return pods, meta


# ----- pipelines ---------------------------------------------------------------------------------
def gravity_workload(scenario: str, pipelines: int, seed: int, load: float | None = None
                     ) -> tuple[list[dict[str, Any]], list[ReplayPod], dict[str, Any]]:
    """The pipeline mix on bench/data_gravity.py's 82-node cluster. ``load``: arrivals compressed or
    spread (the same pipelines, models and durations) so that GPU demand at H100 speed is ``load``
    times the cluster's GPUs over the arrival span; None keeps one arrival per 1,200 s on average."""
    from bench.data_gravity import cluster_spec, load_durations, make_pipelines

    d = load_durations()
    nodes = expand_cluster(cluster_spec())
    for n in nodes:
        n["metadata"]["labels"].update(kwok_node_labels())
    arrival_s = 1200.0
    capacity = sum(int(n["status"]["capacity"].get("nvidia.com/gpu", 0)) for n in nodes)
    plans = make_pipelines(pipelines, seed, scenario, d, arrival_s)
    gpu_s = sum(parse_workload(pl.manifest).gpus * pl.duration
                for p in plans for stage in p.stages for pl in stage)
    span = max(p.arrive for p in plans) if plans else 0.0
    if load is not None and span > 0:
        arrival_s *= gpu_s / (capacity * load * span)
        plans = make_pipelines(pipelines, seed, scenario, d, arrival_s)
        span = max(p.arrive for p in plans)
    pods: list[ReplayPod] = []
    for p in plans:
        prev: tuple[str, ...] = ()
        for stage in p.stages:
            names = []
            for plan in stage:
                m = plan.manifest
                m["metadata"]["labels"][POD_LABEL] = plan.name
                pods.append(ReplayPod(m, arrive=p.arrive, duration=plan.duration, after=prev))
                names.append(plan.name)
            prev = tuple(names)
    meta = {"scenario": scenario, "pipelines": pipelines, "seed": seed, "durations": asdict(d),
            "mean_arrival_s": arrival_s, "gpus": capacity, "gpu_hours_at_trace_durations": gpu_s / 3600,
            "load": gpu_s / (capacity * span) if span else None}
    return nodes, pods, meta


def gang_workload(gangs: int, seed: int) -> tuple[list[dict[str, Any]], list[ReplayPod], dict[str, Any]]:
    """``gangs`` pretraining gangs on 8 RDMA-capable 8-GPU nodes (64 GPUs), Poisson arrivals over
    600 s, exponential run times (mean 300 s): about three times what fits at once."""
    import random

    rng = random.Random(seed)
    nodes = [gpu_node(f"gang-{i:02d}", "H100", gpus=8, rdma=True, labels=kwok_node_labels(), index=i)
             for i in range(8)]
    pods: list[ReplayPod] = []
    arrivals = sorted(rng.uniform(0.0, 600.0) for _ in range(gangs))
    for g, arrive in enumerate(arrivals):
        size, gpus = rng.choice((2, 3, 4)), rng.choice((2, 4, 8))
        duration = min(900.0, rng.expovariate(1 / 300.0)) + 30.0
        for i in range(size):
            m = llm_pod(f"g{g:03d}-{i}", stage="pretraining", model_params="1B", gpus=gpus, cpu="2",
                        memory="8Gi", annotations={"llm-placement.io/gang-name": f"g{g:03d}",
                                                   "llm-placement.io/gang-size": str(size)})
            pods.append(ReplayPod(m, arrive=arrive, duration=duration))
    return nodes, pods, {"gangs": gangs, "seed": seed, "nodes": len(nodes), "gpus": 8 * len(nodes)}


# The LLM-cluster mix: job classes and their shares, scaled from the Kalos cluster of the AcmeTrace
# study (Shanghai AI Lab, NSDI'24; InternLM/AcmeTrace @ 6d6ac9cd15f3, data/cluster_summary.csv, row
# Kalos, and the study's README; read in place, never copied): GPU jobs there have a median of 1
# GPU and a median run of 124 s (mean 1,260 s);
# evaluation is most jobs at 1 GPU; pretraining is 1-3 % of jobs but most GPU time, on whole 8-GPU
# nodes. Scaled to 16 nodes: pretraining gangs of 2-6 whole nodes, the rest single pods.
LLM_MIX = (
    # (class, share of jobs, members, GPUs per member, stage, median run s on an H100, log-sd)
    ("eval", 0.80, 1, 1, "serving", 124.0, 1.0),
    ("sft", 0.17, 1, 8, "alignment", 1200.0, 0.8),
    ("pretrain", 0.03, 0, 8, "pretraining", 6000.0, 0.5),
)


def llm_cluster_workload(jobs: int, seed: int, load: float) -> tuple[list[dict[str, Any]], list[ReplayPod],
                                                                        dict[str, Any]]:
    """``jobs`` jobs of the LLM-cluster mix on 8 H100 and 8 A100-80GB nodes (RDMA, 128 GPUs),
    arriving (Poisson) over the span that makes GPU demand ``load`` times capacity at H100 speed
    (1.0: demand about equal to capacity; A100s run training slower, so real demand is higher)."""
    import math
    import random

    rng = random.Random(seed)
    nodes = [gpu_node(f"llm-{gpu.lower()}-{i:02d}", gpu, gpus=8, rdma=True, labels=kwok_node_labels(),
                      index=300 + k * 8 + i)
             for k, gpu in enumerate(("H100", "A100")) for i in range(8)]
    classes = rng.choices(LLM_MIX, weights=[c[1] for c in LLM_MIX], k=jobs)
    specs = []
    for j, (cls, _share, members, gpus, stage, median, sd) in enumerate(classes):
        size = members or rng.randint(2, 6)
        run = min(median * math.exp(rng.gauss(0.0, sd)), 8 * median)
        specs.append((f"{cls[0]}{j:04d}", size, gpus, stage, run))
    gpu_s = sum(size * gpus * run for _n, size, gpus, _st, run in specs)
    span = gpu_s / (8 * len(nodes) * load)
    arrivals = sorted(rng.uniform(0.0, span) for _ in specs)
    pods: list[ReplayPod] = []
    for (name, size, gpus, stage, run), arrive in zip(specs, arrivals, strict=True):
        ann = ({"llm-placement.io/gang-name": name, "llm-placement.io/gang-size": str(size)}
               if size > 1 else {})
        if stage == "serving":
            ann["llm-placement.io/latency-class"] = "batch"
        for i in range(size):
            m = llm_pod(f"{name}-{i}", stage=stage, model_params="7B", gpus=gpus, cpu="4", memory="32Gi",
                        annotations=dict(ann))
            pods.append(ReplayPod(m, arrive=arrive, duration=run))
    meta = {"jobs": jobs, "seed": seed, "load": load, "nodes": len(nodes), "gpus": 8 * len(nodes),
            "span_s": span, "gpu_hours_at_h100_speed": gpu_s / 3600,
            "jobs_by_class": {c[0]: sum(1 for x in classes if x[0] == c[0]) for c in LLM_MIX}}
    return nodes, pods, meta


def solver_counters(bench: Bench) -> dict[str, float]:
    """The extender's solver runs by status, solver seconds and process CPU seconds."""
    from kubeharness.controlplane import metric_value

    text = bench.cp.extender_metrics()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("llm_placement_solver_runs_total{"):
            status = line.split('status="', 1)[1].split('"', 1)[0]
            out[f"runs_{status}"] = float(line.rsplit(" ", 1)[1])
    out["solver_s"] = metric_value(text, "llm_placement_solver_duration_seconds_sum") or 0.0
    pid = bench.cp.extender.pid if bench.cp.extender else None
    if pid is not None:  # utime + stime of the extender process, in clock ticks
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        out["cpu_s"] = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return out


def gang_waits(pods: list[ReplayPod], r: ReplayResult) -> dict[str, float]:
    """Per gang: trace seconds from its last member's creation to its start (virtual clock)."""
    members: dict[str, list[str]] = defaultdict(list)
    for p in pods:
        members[p.name.split("-", 1)[0]].append(p.name)
    out = {}
    for g, ns in members.items():
        if all(n in r.started_at and n in r.created_at for n in ns):
            out[g] = max(r.started_at[n] for n in ns) - max(r.created_at[n] for n in ns)
    return out


def with_producer_affinity(pods: list[ReplayPod]) -> list[ReplayPod]:
    """The ``affinity`` variant: each consumer prefers (weight 100) the node of its producer's pods."""
    out = []
    for p in pods:
        m = json.loads(json.dumps(p.manifest))
        dep = (m["metadata"].get("annotations") or {}).get("llm-placement.io/depends-on")
        if dep:
            terms = []
            for producer in dep.split(","):
                key = GANG_LABEL if producer.endswith("-pretrain") else POD_LABEL
                terms.append({"weight": 100, "podAffinityTerm": {
                    "labelSelector": {"matchLabels": {key: producer}},
                    "topologyKey": "kubernetes.io/hostname"}})
            pref = {"preferredDuringSchedulingIgnoredDuringExecution": terms}
            m["spec"]["affinity"] = {"podAffinity": pref}
        out.append(ReplayPod(m, p.arrive, p.duration, p.deadline, p.after))
    return out


ROLE_LABEL = "replay.llm-placement.io/role"


def with_separation(pods: list[ReplayPod]) -> list[ReplayPod]:
    """The ``mostalloc-sep`` variant: each pod labelled with its role as the extender reads it, and
    interactive serving given a required podAntiAffinity to training pods on the same node.
    kube-scheduler also applies an existing pod's required anti-affinity to newcomers, so training
    stays off nodes running interactive serving too (stricter than docs/stage-policy.md, which only
    scores training away from serving)."""
    out = []
    for p in pods:
        m = json.loads(json.dumps(p.manifest))
        role = p.role
        if role:
            m["metadata"].setdefault("labels", {})[ROLE_LABEL] = role
        if role == "interactive":
            term = {"labelSelector": {"matchLabels": {ROLE_LABEL: "training"}},
                    "topologyKey": "kubernetes.io/hostname"}
            m["spec"].setdefault("affinity", {})["podAntiAffinity"] = {
                "requiredDuringSchedulingIgnoredDuringExecution": [term]}
        out.append(ReplayPod(m, p.arrive, p.duration, p.deadline, p.after))
    return out


def variant_pods(variant: str, pods: list[ReplayPod]) -> list[ReplayPod]:
    if variant == "affinity":
        return with_producer_affinity(pods)
    if variant == "mostalloc-sep":
        return with_separation(pods)
    if variant in KUEUE_VARIANTS:
        tas = variant == "kueue-tas"
        return [replace(p, manifest=queued(p.manifest, pod_gang(p.manifest), tas=tas)) for p in pods]
    return pods


def run_meta(meta: dict[str, Any], nodes: list[dict[str, Any]], pods: list[ReplayPod], clock: str
             ) -> dict[str, Any]:
    """A run's description, with (virtual clock) each GPU's run-time ratios and where they come
    from, and the fewest dollars any placement could spend on the trace."""
    if clock != "virtual":
        return {**meta, "clock": clock}
    runtime = PodRuntime(nodes)
    return {**meta, "clock": clock, "runtime": runtime.facts(),
            "dollars_floor": dollars_floor(nodes, pods, runtime),
            "completion_floor": completion_floor(nodes, pods, runtime)}


def _node_shapes(nodes: list[dict[str, Any]]) -> list[tuple[str, Any]]:
    """One (node name, facts) per distinct node shape (GPU, count, CPU, memory, price)."""
    settings = Settings(cluster_source="none", metrics_port=0)
    catalog = GpuCatalog.load()
    shapes: dict[tuple[Any, ...], tuple[str, Any]] = {}
    for n in nodes:
        f = node_facts(n, catalog, settings.labels, settings.default_cpu_hourly_cost)
        shapes.setdefault((f.gpu_product, f.gpu_count, f.cpu_millis, f.memory_bytes, f.hourly_cost),
                          (n["metadata"]["name"], f))
    return list(shapes.values())


def _groups(pods: list[ReplayPod]) -> list[list[ReplayPod]]:
    """Each gang's members together, every other pod alone."""
    groups: dict[str, list[ReplayPod]] = defaultdict(list)
    for p in pods:
        gang = pod_gang(p.manifest)
        groups[gang[0] if gang else p.name].append(p)
    return list(groups.values())


def _fitting(shapes: list[tuple[str, Any]], members: list[ReplayPod]) -> list[tuple[str, Any]]:
    specs = [parse_workload(m.manifest) for m in members]
    return [(name, f) for name, f in shapes
            if all(s.gpus <= f.gpu_count and s.cpu_millis <= f.cpu_millis for s in specs)]


def dollars_floor(nodes: list[dict[str, Any]], pods: list[ReplayPod], runtime: PodRuntime) -> float:
    """What the trace costs if every pod, and every gang on one node shape, runs where its work
    costs least, as if that shape were always free and inputs were already local: what a variant
    spends above it is what its placements (or waiting for room) cost. (Spreading one gang over
    shapes by its members' run times could come in lower; a placement cannot know them.)"""
    shapes = _node_shapes(nodes)
    total = 0.0
    for members in _groups(pods):
        specs = [parse_workload(m.manifest) for m in members]
        costs = [sum(pod_hourly_cost(s, f) for s in specs) * max(runtime(m, name, {}) for m in members) / 3600
                 for name, f in _fitting(shapes, members)]
        total += min(costs, default=0.0)
    return total


def completion_floor(nodes: list[dict[str, Any]], pods: list[ReplayPod], runtime: PodRuntime
                     ) -> dict[str, float | None]:
    """Pipeline completion (first arrival to last end of the pods sharing a name prefix ``p<i>-``,
    as measured) if every pod, and every gang on one node shape, started the moment its inputs
    were done, on the shape where it runs fastest, with its inputs already local: what a variant
    takes above it is queueing, slower GPUs and reads. Mean, p50 and p95 over pipelines."""
    shapes = _node_shapes(nodes)
    fastest: dict[str, float] = {}
    group_of: dict[str, list[ReplayPod]] = {}
    for members in _groups(pods):
        best = min((max(runtime(m, name, {}) for m in members) for name, _ in _fitting(shapes, members)),
                   default=max(m.duration or 0.0 for m in members))
        for m in members:
            fastest[m.name], group_of[m.name] = best, members
    by_name = {p.name: p for p in pods}
    end: dict[str, float] = {}

    def finish(name: str) -> float:
        if name not in end:
            start = max(max([by_name[m.name].arrive] + [finish(d) for d in by_name[m.name].after
                                                        if d in by_name])
                        for m in group_of[name])
            for m in group_of[name]:
                end[m.name] = start + fastest[name]
        return end[name]

    pipes: dict[str, list[str]] = defaultdict(list)
    for p in pods:
        pipes[p.name.split("-", 1)[0]].append(p.name)
    done = [max(finish(n) for n in ns) - min(by_name[n].arrive for n in ns) for ns in pipes.values()]
    return {"mean_s": statistics.mean(done) if done else None, "p50_s": _pct(done, 0.5),
            "p95_s": _pct(done, 0.95)}


def gravity_figures(nodes: list[dict[str, Any]], pods: list[ReplayPod], r: ReplayResult) -> dict[str, Any]:
    settings = Settings(cluster_source="none", metrics_port=0)
    catalog = GpuCatalog.load()
    facts = {n["metadata"]["name"]: node_facts(n, catalog, settings.labels, settings.default_cpu_hourly_cost)
             for n in nodes}
    labels = {n["metadata"]["name"]: n["metadata"]["labels"] for n in nodes}
    gangs: dict[str, list[str]] = defaultdict(list)
    by_name = {p.name: p for p in pods}
    for p in pods:
        g = (p.manifest["metadata"].get("labels") or {}).get(GANG_LABEL)
        if g:
            gangs[g].append(p.name)
    cost: dict[str, float] = defaultdict(float)
    spent: dict[str, float] = defaultdict(float)
    edges: dict[str, list[dict[str, Any]]] = defaultdict(list)
    feasibility = settings.policies().placement.feasibility
    judge, gpus = ServingJudge.load(), node_gpus(nodes, catalog)
    inputs = Inputs(nodes, pods)
    moved: dict[str, float] = defaultdict(float)  # GB read per tier (data path, bench/data/data_path.yaml)
    read_s = 0.0
    interactive = 0
    off_target: list[float] = []  # measured ms/token of interactive pods placed off their target
    unjudged: list[str] = []  # interactive pods on a GPU, size and width the corpus has not measured
    judged_how: dict[str, int] = defaultdict(int)
    for p in pods:
        node = r.placements.get(p.name)
        spec = parse_workload(p.manifest)
        stage = spec.stage.value if spec.stage else "none"
        if node is None:
            continue
        cost[stage] += pod_hourly_cost(spec, facts[node]) * (p.duration or 0.0) / 3600
        # What was really paid: the hours the pod ran on the node it got (its measured run time
        # there; a gang member, its gang's), not the trace's duration.
        spent[stage] += pod_hourly_cost(spec, facts[node]) * r.ran_s.get(p.name, p.duration or 0.0) / 3600
        if spec.stage is Stage.SERVING and spec.effective_latency_class is LatencyClass.INTERACTIVE:
            interactive += 1
            # Judged by measurement (the serving corpus), never by the extender's estimate.
            judged = judge.judge(spec, gpus.get(node))
            target = spec.max_ms_per_token or feasibility.default_interactive_ms_per_token
            # A bound from a larger measured model proves a target met, never one missed.
            if judged is None or (judged.how == "bounded" and judged.ms_per_token > target):
                unjudged.append(f"{spec.model_params or 0:.0e} x{spec.gpus} on {gpus.get(node)}")
            else:
                judged_how[judged.how] += 1
                if judged.ms_per_token > target:
                    off_target.append(judged.ms_per_token)
        for tier, read in inputs.reads(p.manifest, node, r.placements).items():
            moved[tier] += read.gb
            read_s += read.seconds
        for producer in spec.depends_on:
            members = gangs.get(producer) or [producer]
            sites = [r.placements[m] for m in members if m in r.placements]
            if not sites:
                continue
            same_node = node in sites
            clique = labels[node].get("nvidia.com/gpu.clique")
            same_nvlink = same_node or (clique is not None and any(
                labels[s].get("nvidia.com/gpu.clique") == clique for s in sites))
            leaf = labels[node].get("fabric.topograph.run/tier-0")
            same_leaf = any(labels[s].get("fabric.topograph.run/tier-0") == leaf for s in sites)
            off = sum(1 for s in sites if s != node) / len(sites)
            # Whether the stage rules let the two share a node at all (both use GPUs or neither does);
            # judged from the pods, so every variant counts the same edges.
            first = by_name.get(members[0])
            same_class = first is not None and (spec.gpus > 0) == (_gpus(first) > 0)
            edges[stage].append({"colocated": same_nvlink, "same_node": same_node, "same_leaf": same_leaf,
                                 "gb": spec.input_data_gb, "cross_node_gb": spec.input_data_gb * off,
                                 "same_class": same_class})
    all_edges = [e for v in edges.values() for e in v]
    same = [e for e in all_edges if e["same_class"]]
    # What the stranded GPUs cost while they wait: the list price of each (a stranded GB200 idles
    # $14/h, a stranded L4 under $1/h), averaged over the same samples as the stranded count.
    gpu_price = {n: f.hourly_cost / f.gpu_count for n, f in facts.items() if f.gpu_count}
    stranded_usd = [sum(free * gpu_price.get(n, 0.0) for n, free in x.stranded_by_node.items())
                    for x in r.samples]
    # The same over trace time (virtual clock): dollars of list price the stranded GPUs idled.
    by_node = (r.time_weighted or {}).get("stranded_gpu_hours_by_node", {})
    stranded_usd_total = sum(h * gpu_price.get(n, 0.0) for n, h in by_node.items())
    return {
        "edges": len(all_edges),
        "colocated": _share([e["colocated"] for e in all_edges]),
        "colocated_same_class": _share([e["colocated"] for e in same]),
        "same_leaf": _share([e["same_leaf"] for e in all_edges]),
        "cross_node_gb": sum(e["cross_node_gb"] for e in all_edges),
        "cross_node_gb_same_class": sum(e["cross_node_gb"] for e in same),
        "by_stage": {k: {"edges": len(v), "colocated": _share([e["colocated"] for e in v]),
                         "cross_node_gb": sum(e["cross_node_gb"] for e in v)} for k, v in edges.items()},
        "cost_by_stage": dict(cost),
        "cost_total": sum(cost.values()),
        "spent_by_stage": dict(spent),
        "spent_total": sum(spent.values()),
        "mean_stranded_usd_per_hour": statistics.mean(stranded_usd) if stranded_usd else 0.0,
        "stranded_usd_total": stranded_usd_total,
        "moved_gb_by_tier": dict(moved),
        "input_read_s": read_s,
        "interactive_pods": interactive,
        "interactive_off_target": len(off_target),
        "off_target_ms_per_token": sorted(round(x, 1) for x in off_target),
        "interactive_unjudged": len(unjudged),
        "unjudged_cases": sorted(set(unjudged)),
        "interactive_judged_how": dict(judged_how),
    }


def _gpus(p: ReplayPod) -> int:
    return parse_workload(p.manifest).gpus


def _share(flags: list[bool]) -> float:
    return sum(flags) / len(flags) if flags else 0.0


# ----- running -----------------------------------------------------------------------------------
class Bench:
    def __init__(self, workdir: Path, extender_env: dict[str, str] | None = None) -> None:
        self.cp = ControlPlane(workdir, find_binaries(build=True), extender_extra_env=extender_env)
        self.kwok: Kwok | None = None
        self.nodes: list[str] = []

    def __enter__(self) -> Bench:
        kwok_bin = build_kwok()
        self.cp.start()
        self.kwok = Kwok(kwok_bin, self.cp.admin_kubeconfig, self.cp.workdir)
        self.kwok.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.kwok:
            self.kwok.stop()
        self.cp.stop()

    def use_nodes(self, nodes: list[dict[str, Any]]) -> None:
        from kubeharness import delete_nodes

        if self.nodes:
            delete_nodes(self.cp.core, self.nodes)
        t0 = time.monotonic()
        self.nodes = create_nodes(self.cp.core, nodes, workers=8)
        self.cp.wait_extender_cache_nodes(len(nodes), timeout=300)
        console.print(f"{len(nodes)} kwok nodes created in {time.monotonic() - t0:.0f}s")

    def clear(self, ns: str, timeout: float = 900.0) -> None:
        """Delete every pod of ``ns`` and wait until none is left.

        With thousands of pods the apiserver's delete-collection call outlives its own 60 s request
        timeout (504) while the deletion goes on server-side, so a timeout is retried, not fatal.
        """
        deadline = time.monotonic() + timeout
        while True:
            try:
                delete_all_pods(self.cp.core, ns, timeout=60)
                return
            except (ApiException, AssertionError):
                if time.monotonic() > deadline:
                    raise
                time.sleep(2)

    def run(self, label: str, nodes: list[dict[str, Any]], pods: list[ReplayPod], variant: str, speed: float,
            window: int, timeout: float, clock: str) -> ReplayResult:
        ns = f"replay-{label}-{variant}".lower().replace(".", "-")[:60]
        ensure_namespace(self.cp.core, ns)
        config = variant_config(self.cp, variant)
        if clock == "virtual":
            config = with_retry_backoff(config, RETRY_BACKOFF_S)
        restart_scheduler_with(self.cp, config, f"{label}-{variant}")
        kueue = None
        if variant in KUEUE_VARIANTS:
            kueue = Kueue(build_kueue(), self.cp, self.cp.workdir, ns, tas=variant == "kueue-tas",
                          node_labels=kwok_node_labels())
            kueue.start(cluster_quota(nodes, [p.manifest for p in pods]))
        columns = (TextColumn(f"{label} {variant}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
        with Progress(*columns, console=console, transient=True) as progress:
            task = progress.add_task("pods", total=len(pods))
            runtime = PodRuntime(nodes, pods) if clock == "virtual" else None
            try:
                r = replay(self.cp, ns, nodes, pods, variant=variant, speed=speed, window=window,
                           timeout_s=timeout, clock=clock, runtime=runtime,
                           admission_idle=kueue.idle if kueue else None,
                           on_progress=lambda done, _t: progress.update(task, completed=done))
                if runtime is not None:
                    r.fallback_gpus = dict(sorted(runtime.fallback_used.items()))
            finally:
                if kueue is not None:
                    kueue.stop()
                    console.print(f"  Kueue: {kueue.admitted} workloads seen admitted, "
                                  f"{kueue.topology_assigned} placed by its topology-aware scheduling; "
                                  f"asked whether idle: {kueue.idle_answers}, not idle only because a "
                                  f"waiting workload fit: {kueue.waited_for_admissible}")
        t0 = time.monotonic()
        self.clear(ns)
        console.print(f"  {label} {variant}: {r.placed}/{r.pods} placed, {r.wall_s:.0f}s "
                      f"(cleanup {time.monotonic() - t0:.0f}s)"
                      + (f", agreement {r.agreement}" if r.agreement is not None else ""))
        if self.kwok:
            self.kwok.check_alive()
        return r


def summarize(r: ReplayResult) -> dict[str, Any]:
    s = r.samples or []

    def mean(attr: str) -> float:
        return statistics.mean(getattr(x, attr) for x in s) if s else 0.0

    stranded_share = [x.gpus_stranded / x.gpus_free for x in s if x.gpus_free]
    agree = r.agreement
    agree_share = None
    if agree:
        total = sum(agree.values())
        agree_share = (agree.get("top", 0) + agree.get("tied_top", 0)) / total if total else None
    return {
        "pods": r.pods, "placed": r.placed, "failed": r.failed, "gpu_pods_failed": r.gpu_pods_failed,
        "gpus_placed": r.gpus_placed, "gpus_failed": r.gpus_failed, "completed": r.completed,
        "overcommits": len(r.overcommits), "unknown_nodes": r.unknown_nodes,
        "fallback_speed_gpus": r.fallback_gpus,
        "admission_settle_timeouts": r.admission_settle_timeouts,
        "mean_gpus_allocated": mean("gpus_allocated"), "mean_gpus_stranded": mean("gpus_stranded"),
        "mean_stranded_share": statistics.mean(stranded_share) if stranded_share else 0.0,
        "mean_whole_free_nodes": mean("whole_free_nodes"),
        "mean_whole_free_8gpu_nodes": mean("whole_free_8gpu_nodes"),
        "mean_mixed_nodes": mean("mixed_nodes"),
        "max_mixed_nodes": max((x.mixed_nodes for x in s), default=0),
        "final": asdict(s[-1]) if s else None,
        "wall_s": r.wall_s, "clock": r.clock, "time_weighted": r.time_weighted,
        "agreement": agree, "agreement_top_share": agree_share,
        **outcomes(r),
        # For reading a run afterwards: where each pod was bound, and the state at every sample.
        "placements": dict(sorted(r.placements.items())),
        "samples": [asdict(x) for x in s],
    }


def _pct(xs: list[float], q: float) -> float | None:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else None


def outcomes(r: ReplayResult) -> dict[str, Any]:
    """Virtual clock: gangs that ran together or deadlocked, GPU time held idle by partial gangs,
    queueing (creation to start, a gang member's start being its gang's) and pipeline completion
    (first creation to last end of the pods sharing a name prefix ``p<i>-``)."""
    if r.clock != "virtual":
        return {}
    wait_of = {n: r.started_at[n] - r.created_at[n] for n in sorted(r.started_at) if n in r.created_at}
    waits = list(wait_of.values())
    pipes: dict[str, list[str]] = defaultdict(list)
    for n in r.created_at:
        pipes[n.split("-", 1)[0]].append(n)
    done = [max(r.started_at[n] + r.ran_s[n] for n in ns) - min(r.created_at[n] for n in ns)
            for ns in pipes.values() if all(n in r.started_at for n in ns)]
    return {
        "trace_span_s": r.trace_span_s, "gangs": r.gangs, "gangs_started": r.gangs_started,
        "gang_deadlocks": r.gang_deadlocks, "idle_held_gpu_h": r.idle_held_gpu_s / 3600,
        "queue_p50_s": _pct(waits, 0.5), "queue_p95_s": _pct(waits, 0.95),
        "pipelines_done": len(done), "pipelines": len(pipes),
        "completion_p50_s": _pct(done, 0.5), "completion_p95_s": _pct(done, 0.95),
        "completion_mean_s": statistics.mean(done) if done else None,
        # For reading a run afterwards: which pods queued, and how long (creation to start), and
        # how long each ran on the node it got (its reads included).
        "queue_s_by_pod": {n: round(w, 1) for n, w in wait_of.items()},
        # Trace time each pod started (a gang member: its gang's start), for orderings read afterwards
        # (which gang started before an earlier one: replay_report.py --overtaken).
        "started_s_by_pod": {n: round(r.started_at[n], 1) for n in sorted(r.started_at)},
        "ran_s_by_pod": {n: round(r.ran_s[n], 1) for n in sorted(r.ran_s)},
        **gang_wait_figures(r),
    }


def gang_wait_figures(r: ReplayResult) -> dict[str, Any]:
    """Per gang: when it could first have started on free whole nodes of one GPU model, when it did
    and why it waited (harness GangWaits); and the totals of those waits, by reason."""
    waited = {g: w for g, w in r.gang_waits.items() if w["wait_s"]}
    by_why: dict[str, float] = defaultdict(float)
    for w in waited.values():
        by_why[w["why"]] += w["wait_s"] / 3600
    return {"gangs_waited_on_free_whole_nodes": len(waited),
            "gang_wait_h_on_free_whole_nodes": sum(by_why.values()),
            "gang_wait_h_by_why": dict(sorted(by_why.items())),
            "gang_waits": r.gang_waits}


def _gang_wait_table(title: str, variants: dict[str, dict[str, Any]], top: int = 10) -> None:
    """The longest waits on free whole nodes, per variant (the full table is in the JSON)."""
    t = Table(title=f"{title}: gangs that waited while free whole nodes of one model could hold them")
    for c in ("variant", "gang", "members x GPUs", "could start (h)", "started (h)", "waited (h)", "why"):
        t.add_column(c)
    for v, s in variants.items():
        rows = sorted(((g, w) for g, w in (s.get("gang_waits") or {}).items() if w["wait_s"]),
                      key=lambda gw: -gw[1]["wait_s"])
        for g, w in rows[:top]:
            t.add_row(v, g.rsplit("/", 1)[-1], f"{w['members']} x {w['gpus'] // max(1, w['members'])}",
                      f"{w['could_start'] / 3600:.1f}", f"{w['started'] / 3600:.1f}",
                      f"{w['wait_s'] / 3600:.1f}", w["why"])
        t.add_row(v, f"total ({len(rows)} gangs)", "", "", "",
                  f"{s.get('gang_wait_h_on_free_whole_nodes', 0.0):.1f}", "")
    console.print(t)


def plot_fragmentation(label: str, results: dict[str, ReplayResult], out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    # On the virtual clock every variant has the same trace time at the same event: plot against
    # it (hours); otherwise against pods created, the one axis variants share on the wall clock.
    by_time = all(r.clock == "virtual" for r in results.values())
    for variant, r in results.items():
        x = [s.trace_time / 3600 if by_time else s.created for s in r.samples]
        kw: dict[str, Any] = {"label": variant, "color": COLORS.get(variant), "lw": 1.4}
        if by_time:
            kw["drawstyle"] = "steps-post"  # a state holds until the next event
        axes[0].plot(x, [s.gpus_allocated for s in r.samples], **kw)
        axes[1].plot(x, [s.gpus_stranded for s in r.samples], **kw)
        axes[2].plot(x, [s.whole_free_8gpu_nodes for s in r.samples], **kw)
    for ax, title in zip(axes, ("GPUs allocated", "stranded GPUs (free on partly used nodes)",
                                "whole free 8-GPU nodes"), strict=True):
        ax.set_title(title)
        ax.set_xlabel("trace time, hours" if by_time else "pods created")
        ax.grid(alpha=0.3)
    axes[0].legend()
    fig.suptitle(f"{label}: real kube-scheduler on kwok nodes")
    fig.tight_layout()
    path = out / f"replay-{label}.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_gravity(figs: dict[str, dict[str, dict[str, Any]]], out: Path, stem: str = "replay-gravity") -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    scenarios = list(figs)
    variants = list(next(iter(figs.values())))
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.2))
    width = 0.8 / max(1, len(variants))
    for i, v in enumerate(variants):
        xs = [j + i * width for j in range(len(scenarios))]
        color = COLORS.get(v)
        axes[0].bar(xs, [100 * figs[s][v]["colocated"] for s in scenarios], width, label=v, color=color)
        axes[1].bar(xs, [figs[s][v]["cost_total"] for s in scenarios], width, label=v, color=color)
    for ax, title in zip(axes, ("co-located with producer (node/NVLink), % of edges",
                                "est. compute cost, $ (all stages)"), strict=True):
        ax.set_xticks([j + width * (len(variants) - 1) / 2 for j in range(len(scenarios))], scenarios)
        ax.set_title(title)
        ax.grid(alpha=0.3, axis="y")
    axes[0].legend()
    fig.tight_layout()
    path = out / f"{stem}.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_cost_by_stage(figs: dict[str, dict[str, dict[str, Any]]], out: Path,
                       stem: str = "replay-gravity") -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    stages = ["data-prep", "pretraining", "alignment", "deployment", "serving"]
    fig, axes = plt.subplots(1, len(figs), figsize=(5 * len(figs), 4.2), squeeze=False)
    for ax, (scenario, per) in zip(axes[0], figs.items(), strict=True):
        variants = list(per)
        width = 0.8 / max(1, len(variants))
        for i, v in enumerate(variants):
            xs = [j + i * width for j in range(len(stages))]
            ax.bar(xs, [per[v]["cost_by_stage"].get(s, 0.0) for s in stages], width, label=v,
                   color=COLORS.get(v))
        ax.set_xticks([j + width * (len(variants) - 1) / 2 for j in range(len(stages))], stages, rotation=20)
        ax.set_title(f"{scenario}: est. compute cost per stage, $")
        ax.grid(alpha=0.3, axis="y")
    axes[0][0].legend()
    fig.tight_layout()
    path = out / f"{stem}-cost.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def fragmentation_table(label: str, sums: dict[str, dict[str, Any]]) -> None:
    t = Table(title=f"{label}: real kube-scheduler on kwok nodes")
    cols = ("variant", "placed", "failed (GPU pods)", "GPUs placed", "GPUs failed", "mean GPUs alloc",
            "mean stranded", "stranded/free", "mean whole free 8-GPU", "time-weighted stranded/free, whole 8",
            "over-commits", "agreement top")
    for c in cols:
        t.add_column(c, justify="left" if c == "variant" else "right")
    for v, s in sums.items():
        agree = s["agreement_top_share"]
        t.add_row(v, str(s["placed"]), f"{s['failed']} ({s['gpu_pods_failed']})", str(s["gpus_placed"]),
                  str(s["gpus_failed"]), f"{s['mean_gpus_allocated']:.0f}", f"{s['mean_gpus_stranded']:.1f}",
                  f"{s['mean_stranded_share']:.3f}", f"{s['mean_whole_free_8gpu_nodes']:.1f}",
                  _weighted(s), str(s["overcommits"]),
                  "-" if agree is None else f"{100 * agree:.1f}%")
    console.print(t)


def main(
    trace: list[str] = typer.Option([], help="openb pod list suffix(es): default, multigpu50, ..."),
    gravity: list[str] = typer.Option([], help="pipeline scenario(s): cpu, gpu, gpu-small"),
    synthetic: int = typer.Option(0, help="also replay a generated trace of this many pods on 24 nodes"),
    gangs: int = typer.Option(0, help="also replay this many generated gangs queueing on 8 nodes"),
    llm_jobs: int = typer.Option(0, help="also replay this many jobs of the LLM-cluster mix (AcmeTrace "
                                         "Kalos shares) on 8 H100 + 8 A100 nodes"),
    load: list[float] = typer.Option(
        [], help="GPU demand / capacity over the arrival span (repeatable): LLM-cluster mix (default 1.0) "
                 "and pipelines (default: one pipeline per 1,200 s)"),
    variants: list[str] = typer.Option(
        [], help="variants to run (default: ours, default, mostalloc; pipelines add affinity and kueue)"),
    sharing: str = typer.Option("whole", help="GPU-sharing pods: whole (1 GPU each) or skip"),
    minutes: float = typer.Option(4.0, help="timed traces, wall clock: wall minutes the arrival span takes"),
    window: int = typer.Option(16, help="created pods allowed undecided before arrivals wait"),
    pipelines: int = typer.Option(48, help="pipelines per gravity scenario"),
    seed: int = typer.Option(1, help="pipeline seed"),
    gravity_speed: float = typer.Option(200.0, help="pipelines, wall clock: trace seconds per wall second"),
    clock: str = typer.Option(
        "virtual", help="virtual: event-driven trace clock, the same load for every variant; wall: trace "
                        "time runs at a fixed speed, kwok finishes pods on wall time"),
    name: str = typer.Option("", help="suffix for the result files (replay-gravity-NAME.json)"),
    data: Path = typer.Option(DATA, help="folder with the openb CSV files"),
    out: Path = typer.Option(RESULTS, help="where JSON and PNG results go"),
    timeout: float = typer.Option(3600.0, help="per replay, seconds"),
    setting: list[str] = typer.Option(
        [], help="what-if through the real path: an extender setting as LLMP_NAME=value (repeatable)"),
) -> None:
    if clock not in CLOCKS:
        raise typer.BadParameter(f"--clock must be one of {', '.join(CLOCKS)}")
    if sharing not in ("whole", "skip"):
        raise typer.BadParameter("--sharing must be whole or skip")
    if any(not (0.0 < x < float("inf")) for x in load):
        raise typer.BadParameter("--load must be a finite demand/capacity ratio above 0, such as 1.0 or 1.3")
    if llm_jobs < 0 or gangs < 0:
        raise typer.BadParameter("--llm-jobs and --gangs count jobs: 0 or more")
    if trace and not (data / "openb_node_list_gpu_node.csv").exists():
        console.print(f"[red]openb data not found at {data}[/red]")
        raise typer.Exit(1)
    out.mkdir(parents=True, exist_ok=True)
    base = os.environ.get("LLMP_TEST_WORKDIR")
    workdir = Path(tempfile.mkdtemp(prefix="llmp-replay-", dir=base))
    console.print(f"control plane workdir and logs: {workdir}")
    ok = False
    env = dict(kv.split("=", 1) for kv in setting)
    if any(not k.startswith("LLMP_") for k in env):
        raise typer.BadParameter("--setting takes LLMP_NAME=value")
    with Bench(workdir, env) as bench:
        if synthetic:
            nodes = [gpu_node(f"syn-{i:02d}", "H100", gpus=8, labels=kwok_node_labels(), index=i)
                     for i in range(24)]
            pods = synthetic_trace(synthetic, seed=7,
                                   make_pod=lambda n, g: llm_pod(n, gpus=g, cpu="2", memory="8Gi"))
            bench.use_nodes(nodes)
            res = {v: bench.run("synthetic", nodes, pods, v, 100.0, window, timeout, clock)
                   for v in variants or TRACE_VARIANTS}
            _write_trace("synthetic", {"pods": synthetic, "speed": 100.0}, res, out)
        if gangs:
            nodes, pods, meta = gang_workload(gangs, seed)
            bench.use_nodes(nodes)
            doc: dict[str, Any] = {"meta": run_meta(meta, nodes, pods, clock), "variants": {}}
            for v in variants or ("ours",):
                before = solver_counters(bench) if v == "ours" else {}
                r = bench.run("gangs", nodes, variant_pods(v, pods), v, 1.0, window, timeout, clock)
                after = solver_counters(bench) if v == "ours" else {}
                waits = gang_waits(pods, r)
                waited = sum(1 for w in waits.values() if w > 0)
                delta = {k: after[k] - before.get(k, 0.0) for k in after}
                runs = sum(x for k, x in delta.items() if k.startswith("runs_"))
                doc["variants"][v] = {**summarize(r), "gangs_waited": waited, "solver": delta,
                                      "solver_runs_per_waiting_gang": runs / waited if waited else None}
                console.print(f"  gangs {v}: {r.gangs_started}/{r.gangs} gangs ran, {waited} waited; "
                              f"solver {delta}"
                              + (f", {runs / waited:.1f} runs per waiting gang" if waited and delta else ""))
            _gang_wait_table("gangs", doc["variants"])
            stem = f"replay-gangs-{name}" if name else "replay-gangs"
            (out / f"{stem}.json").write_text(json.dumps(doc, indent=2))
            console.print(f"wrote {out / f'{stem}.json'}")
        if llm_jobs:
            stem = f"replay-llm-{name}" if name else "replay-llm"
            llm_doc: dict[str, Any] = {}
            for level in load or [1.0]:
                nodes, pods, meta = llm_cluster_workload(llm_jobs, seed, level)
                bench.use_nodes(nodes)
                key = f"load-{level:g}"
                llm_doc[key] = {"meta": run_meta(meta, nodes, pods, clock), "variants": {}}
                for v in variants or ("ours", "mostalloc", "kueue", "kueue-tas"):
                    vp = variant_pods(v, pods)
                    r = bench.run(f"llm-{key}", nodes, vp, v, 1.0, window, timeout, clock)
                    llm_doc[key]["variants"][v] = {**summarize(r), **gravity_figures(nodes, vp, r),
                                                   "mixed_gpu_gangs": mixed_gpu_gangs(nodes, vp, r)}
                    # After every variant, so a later failure does not lose a long replay.
                    (out / f"{stem}.json").write_text(json.dumps(llm_doc, indent=2))
                _outcome_table(f"llm {key}", llm_doc[key]["variants"])
                _gang_wait_table(f"llm {key}", llm_doc[key]["variants"])
            console.print(f"wrote {out / f'{stem}.json'}")
        if trace:
            nodes = openb_nodes(data)
            bench.use_nodes(nodes)
            for t in trace:
                pods, meta = openb_trace(data, t, sharing, minutes)
                meta["clock"] = clock
                console.print(f"openb {t}: {meta}")
                res = {}
                for v in variants or TRACE_VARIANTS:
                    vp = variant_pods(v, pods)
                    res[v] = bench.run(t, nodes, vp, v, meta["speed"], window, timeout, clock)
                    # After every variant, so a later failure does not lose a long replay.
                    _write_trace(f"openb-{t}-{name}" if name else f"openb-{t}", meta, res, out)
        if gravity:
            stem = f"replay-gravity-{name}" if name else "replay-gravity"
            figs: dict[str, dict[str, dict[str, Any]]] = {}
            report: dict[str, Any] = {}
            levels: list[float | None] = list(load) or [None]
            for sc, level in [(sc, level) for sc in gravity for level in levels]:
                nodes, pods, meta = gravity_workload(sc, pipelines, seed, level)
                sc = sc if level is None else f"{sc}-load-{level:g}"
                bench.use_nodes(nodes)
                figs[sc] = {}
                report[sc] = {"meta": run_meta(meta, nodes, pods, clock), "variants": {}}
                runs: dict[str, ReplayResult] = {}
                for v in variants or ("ours", "default", "mostalloc", "affinity", "kueue"):
                    vp = variant_pods(v, pods)
                    r = bench.run(f"gravity-{sc}", nodes, vp, v, gravity_speed, window, timeout, clock)
                    runs[v] = r
                    figs[sc][v] = gravity_figures(nodes, vp, r)
                    report[sc]["variants"][v] = {**summarize(r), **figs[sc][v]}
                _gravity_table(sc, figs[sc], report[sc]["variants"])
                plot_fragmentation(f"{stem.removeprefix('replay-')}-{sc}", runs, out)
                (out / f"{stem}.json").write_text(json.dumps(report, indent=2))
            p1, p2 = plot_gravity(figs, out, stem), plot_cost_by_stage(figs, out, stem)
            console.print(f"wrote {out / f'{stem}.json'}, {p1}, {p2}")
        ok = True
    if ok and not os.environ.get("LLMP_KEEP_LOGS"):
        shutil.rmtree(workdir, ignore_errors=True)


TRACE_VARIANTS = ("ours", "default", "mostalloc")


def _write_trace(label: str, meta: dict[str, Any], res: dict[str, ReplayResult], out: Path) -> None:
    sums = {v: summarize(r) for v, r in res.items()}
    fragmentation_table(label, sums)
    doc = {"meta": meta, "variants": {v: {**sums[v], "samples": [asdict(s) for s in r.samples],
                                          "overcommit_examples": r.overcommits[:10]}
                                      for v, r in res.items()}}
    (out / f"replay-{label}.json").write_text(json.dumps(doc, indent=2))
    png = plot_fragmentation(label, res, out)
    console.print(f"wrote {out / f'replay-{label}.json'} and {png}")


def mixed_gpu_gangs(nodes: list[dict[str, Any]], pods: list[ReplayPod], r: ReplayResult) -> int:
    """Gangs that ran across GPU models (lockstep training runs at its slowest GPU's speed)."""
    gpus = node_gpus(nodes)
    models: dict[str, set[str | None]] = defaultdict(set)
    for p in pods:
        gang = pod_gang(p.manifest)
        if gang and p.name in r.started_at:
            models[gang[0]].add(gpus.get(r.placements.get(p.name, "")))
    return sum(1 for m in models.values() if len(m) > 1)


def _outcome_table(title: str, variants: dict[str, dict[str, Any]]) -> None:
    t = Table(title=title)
    for c in ("variant", "jobs done", "gangs run / all", "deadlocks", "idle-held GPU-h",
              "queue p50 / p95 s", "job completion mean s", "dollars spent", "stranded $/h (common window)",
              "stranded GPU-h beyond packing", "whole free nodes (common window)", "mixed-GPU gangs"):
        t.add_column(c)
    common = common_window(variants)
    for v, s in variants.items():
        cw = common[v]
        t.add_row(v, f"{s['pipelines_done']}/{s['pipelines']}", f"{s['gangs_started']}/{s['gangs']}",
                  str(s["gang_deadlocks"]), f"{s['idle_held_gpu_h']:.1f}",
                  f"{s['queue_p50_s'] or 0:.0f} / {s['queue_p95_s'] or 0:.0f}",
                  f"{s['completion_mean_s'] or 0:,.0f}", f"{s['spent_total']:,.0f}",
                  f"{cw['stranded_usd_per_hour']:.1f}", f"{cw['beyond_packing_gpu_h']:.1f}",
                  f"{cw['whole_free_8gpu_nodes']:.2f}", str(s["mixed_gpu_gangs"]))
    console.print(t)


def _weighted(s: dict[str, Any]) -> str:
    tw = s.get("time_weighted")
    return f"{tw['stranded_share']:.4f}, {tw['whole_free_8gpu_nodes']:.2f}" if tw else "-"


def _gravity_table(scenario: str, figs: dict[str, dict[str, Any]], sums: dict[str, dict[str, Any]]) -> None:
    t = Table(title=f"pipelines, scenario {scenario}: real kube-scheduler on kwok nodes")
    for c in ("variant", "placed", "co-located (all edges)", "co-located (edges rules allow)", "same leaf",
              "cross-node GB", "est. cost $", "stranded/free", "stranded $/h", "whole free 8-GPU",
              "time-weighted stranded/free, whole 8", "training beside interactive (mean/max nodes)",
              "interactive serving off target",
              "over-commits", "agreement top"):
        t.add_column(c, justify="left" if c == "variant" else "right")
    for v, f in figs.items():
        s = sums[v]
        agree = s["agreement_top_share"]
        t.add_row(v, f"{s['placed']}/{s['pods']}", f"{100 * f['colocated']:.1f}%",
                  f"{100 * f['colocated_same_class']:.1f}%", f"{100 * f['same_leaf']:.1f}%",
                  f"{f['cross_node_gb']:,.0f}", f"{f['cost_total']:,.0f}", f"{s['mean_stranded_share']:.4f}",
                  f"{f['mean_stranded_usd_per_hour']:.2f}", f"{s['mean_whole_free_8gpu_nodes']:.2f}",
                  _weighted(s), f"{s['mean_mixed_nodes']:.2f}/{s['max_mixed_nodes']}",
                  attainment(f), str(s["overcommits"]),
                  "-" if agree is None else f"{100 * agree:.1f}%")
    console.print(t)


if __name__ == "__main__":
    typer.run(main)
