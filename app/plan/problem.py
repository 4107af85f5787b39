"""A workflow on a cluster as plain data every planner reads: who may run where, for how long, at what
cost, and how long data takes between two nodes.

Eligibility is the filter's own verdict (``app.core.feasibility.evaluate``) on an empty node, so a
task is only planned where the extender would let its pod in (docs/stage-policy.md). Transfer time is
``output GB x seconds per GB`` at the distance the data-gravity ladder gives for the two nodes
(``GravityModel.distance`` / ``seconds_per_gb``, docs/data-gravity.md): the same cost model the
extender's gravity term ranks by, including the local read on the same node.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from app.core.catalog import GpuCatalog
from app.core.feasibility import NodeFit, evaluate
from app.core.gravity import GravityModel
from app.core.nodes import NodeFacts, facts_for
from app.core.policy import PolicySource
from app.core.reasons import Rejection
from app.core.snapshot import ClusterSnapshot, NodeUsage
from app.core.workload import (
    TRAINING_STAGES,
    LatencyClass,
    Stage,
    WorkloadError,
    WorkloadSpec,
    parse_workload,
)
from app.objects import pod_object
from app.plan.estimate import EstimateError, task_seconds
from app.plan.workflow import Task, Workflow

ANN = "llm-placement.io/"
TRAIN, SERVE, OTHER = "train", "serve", "other"


class ProblemError(ValueError):
    """The workflow cannot be planned on this cluster; the message says which task and why."""


@dataclass(frozen=True, slots=True)
class PlanTask:
    name: str
    stage: str
    gpus: int
    cpu_millis: int
    deps: tuple[str, ...]
    output_gb: float
    # Interactive serving may not run beside training on one node (a hard rule): "serve" and "train"
    # tasks on the same node must not overlap in time.
    kind: str = OTHER
    memory_mib: int = 0  # host memory the pod requests


@dataclass(frozen=True, slots=True)
class PlanNode:
    name: str
    gpus: int
    cpu_millis: int
    hardware: str = ""
    memory_mib: int = 0  # allocatable host memory; 0: not stated, not limited


@dataclass(slots=True)
class PlanProblem:
    """Everything the planners read; the workflow-derived parts (pods, specs) are optional."""

    tasks: list[PlanTask]
    nodes: list[PlanNode]
    duration: dict[str, dict[str, int]]  # task -> eligible node -> whole seconds
    cost: dict[str, dict[str, float]]  # task -> eligible node -> dollars for the whole run
    s_per_gb: dict[tuple[str, str], float]  # (from node, to node) -> seconds per GB
    distance: dict[tuple[str, str], str] = field(default_factory=dict)  # same keys -> ladder label
    excluded: dict[str, dict[str, str]] = field(default_factory=dict)  # task -> node -> filter reason
    pods: dict[str, dict[str, Any]] = field(default_factory=dict)  # task -> pod object
    specs: dict[str, WorkloadSpec] = field(default_factory=dict)
    facts: dict[str, NodeFacts] = field(default_factory=dict)
    name: str = "workflow"
    namespace: str = "default"
    # (producer, consumer) -> GB that consumer reads, where it is not the producer's whole output.
    edge_data: dict[tuple[str, str], float] = field(default_factory=dict)
    task: dict[str, PlanTask] = field(init=False)
    node: dict[str, PlanNode] = field(init=False)
    succ: dict[str, list[str]] = field(init=False)  # producer -> consumers

    def __post_init__(self) -> None:
        self.task = {t.name: t for t in self.tasks}
        self.node = {n.name: n for n in self.nodes}
        self.succ: dict[str, list[str]] = {t.name: [] for t in self.tasks}
        for t in self.tasks:
            for d in t.deps:
                self.succ[d].append(t.name)

    def eligible(self, task: str) -> list[str]:
        return list(self.duration[task])

    def edge_gb(self, producer: str, consumer: str) -> float:
        """GB ``consumer`` reads from ``producer``: the edge's own size, else the producer's output."""
        return self.edge_data.get((producer, consumer), self.task[producer].output_gb)

    def transfer(self, producer: str, src: str, dst: str, consumer: str | None = None) -> int:
        """Whole seconds for what ``consumer`` reads of ``producer``'s output (all of it when no
        consumer is named) to reach ``dst`` from ``src``."""
        gb = self.task[producer].output_gb if consumer is None else self.edge_gb(producer, consumer)
        return math.ceil(gb * self.s_per_gb[(src, dst)] - 1e-9) if gb > 0 else 0

    def edges(self) -> list[tuple[str, str]]:
        return [(d, t.name) for t in self.tasks for d in t.deps]

    def topological(self) -> list[str]:
        order: list[str] = []
        indeg = {t.name: len(t.deps) for t in self.tasks}
        ready = [t.name for t in self.tasks if not t.deps]
        while ready:
            n = ready.pop(0)
            order.append(n)
            for s in self.succ[n]:
                indeg[s] -= 1
                if indeg[s] == 0:
                    ready.append(s)
        return order


def task_pod(task: Task, wf: Workflow, outputs: dict[str, float]) -> dict[str, Any]:
    """The pod a task becomes: our annotations, its deps as data-gravity edges (docs/data-gravity.md)."""
    ann = dict(task.annotations)
    if task.model_params:
        ann[ANN + "model-params"] = task.model_params
    if task.precision:
        ann[ANN + "precision"] = task.precision
    if task.after:
        ann[ANN + "depends-on"] = ",".join(task.after)
        gb = sum(task.reads.get(a, outputs[a]) for a in task.after)
        if gb > 0:
            ann[ANN + "input-data-gb"] = f"{gb:g}"
    return pod_object(task.name, namespace=wf.namespace, stage=task.stage, gpus=task.gpus, cpu=task.cpu,
                      memory=task.memory, annotations=ann, uid=f"plan-{wf.name}-{task.name}")


def _mib(memory_bytes: float) -> int:
    return max(0, math.ceil(memory_bytes / (1 << 20)))


def _kind(spec: WorkloadSpec) -> str:
    if spec.stage in TRAINING_STAGES:
        return TRAIN
    if spec.stage is Stage.SERVING and spec.effective_latency_class is LatencyClass.INTERACTIVE:
        return SERVE
    return OTHER


def _hardware(f: NodeFacts) -> str:
    if f.gpu_count:
        return f"{f.gpu_count}x {f.gpu.name if f.gpu else f.gpu_product}"
    return f"{f.node_class.value}, {f.cpu_millis / 1000:g} CPU"


def node_facts_of(
    nodes: Iterable[dict[str, Any]], settings: PolicySource, catalog: GpuCatalog
) -> list[NodeFacts]:
    """Node objects -> facts, the way the extender's cache reads them; cordoned nodes left out."""
    policy = settings.policies().node_facts
    out = [facts_for(n, catalog, policy) for n in nodes]
    return [f for f in out if not f.unschedulable]


def build_problem(
    wf: Workflow, facts: Sequence[NodeFacts], settings: PolicySource,
    used_gpus: dict[str, int] | None = None,
) -> PlanProblem:
    """``used_gpus``: GPUs already held on a node (a live cluster), not available to the plan."""
    if not facts:
        raise ProblemError("the cluster has no schedulable nodes")
    policies = settings.policies()
    feas = policies.placement.feasibility
    gpu_resources = policies.placement.gpu_resources
    snap = ClusterSnapshot()
    for f in facts:
        snap.upsert_node(f)
    gravity = GravityModel(snap, policies.gravity)
    used = used_gpus or {}
    nodes = [PlanNode(f.name, max(0, f.gpu_count - used.get(f.name, 0)), int(f.cpu_millis), _hardware(f),
                      _mib(f.memory_bytes))
             for f in facts]
    s_per_gb: dict[tuple[str, str], float] = {}
    distance: dict[tuple[str, str], str] = {}
    for a in facts:
        for b in facts:
            d, rung = gravity.distance(a, b)
            s_per_gb[(a.name, b.name)] = gravity.seconds_per_gb(d, rung)
            distance[(a.name, b.name)] = d.label
    tasks_in = wf.expanded()
    outputs = {t.name: t.output_gb for t in tasks_in}
    tasks: list[PlanTask] = []
    duration: dict[str, dict[str, int]] = {}
    cost: dict[str, dict[str, float]] = {}
    excluded: dict[str, dict[str, str]] = {}
    pods: dict[str, dict[str, Any]] = {}
    specs: dict[str, WorkloadSpec] = {}
    for t in tasks_in:
        pod = task_pod(t, wf, outputs)
        try:
            spec = parse_workload(pod, gpu_resources)
        except WorkloadError as exc:
            raise ProblemError(f"task {t.name}: " + "; ".join(exc.problems)) from None
        pods[t.name], specs[t.name] = pod, spec
        duration[t.name], cost[t.name], excluded[t.name] = {}, {}, {}
        by_type = catalog_of(t.name, t.durations)
        for f, pn in zip(facts, nodes, strict=True):
            verdict = evaluate(spec, f, NodeUsage(), pn.gpus, feas)
            if isinstance(verdict, Rejection):
                excluded[t.name][f.name] = verdict.message
                continue
            if spec.cpu_millis > f.cpu_millis:
                excluded[t.name][f.name] = "not enough CPU"
                continue
            if f.memory_bytes > 0 and spec.memory_bytes > f.memory_bytes:
                excluded[t.name][f.name] = "not enough host memory"
                continue
            assert isinstance(verdict, NodeFit)
            measured = _measured(t.durations, f, by_type)
            if t.durations and measured is None and t.duration is None and t.tokens is None:
                excluded[t.name][f.name] = "no measured duration for this node type"
                continue
            try:
                secs = max(1, math.ceil(measured)) if measured is not None else task_seconds(
                    t.name, spec, verdict, f, duration=t.duration, tokens=t.tokens,
                    default_concurrency=feas.default_concurrency)
            except EstimateError as exc:
                raise ProblemError(str(exc)) from None
            duration[t.name][f.name] = secs
            cost[t.name][f.name] = verdict.pod_hourly_cost * secs / 3600.0
        if not duration[t.name]:
            reasons = sorted(set(excluded[t.name].values()))
            raise ProblemError(f"task {t.name} fits no node: " + "; ".join(reasons[:3]))
        tasks.append(PlanTask(t.name, spec.stage.value if spec.stage else t.stage, spec.gpus,
                              int(spec.cpu_millis), t.after, t.output_gb, _kind(spec),
                              _mib(spec.memory_bytes)))
    edge_data = {(a, t.name): gb for t in tasks_in for a, gb in t.reads.items()}
    return PlanProblem(tasks, nodes, duration, cost, s_per_gb, distance, excluded, pods, specs,
                       {f.name: f for f in facts}, wf.name, wf.namespace, edge_data)


def catalog_of(task: str, durations: dict[str, float]) -> dict[str, float]:
    """Measured durations keyed by node type: a catalog GPU name (any alias given), or "cpu"."""
    if not durations:
        return {}
    catalog = GpuCatalog.load()
    out: dict[str, float] = {}
    for key, secs in durations.items():
        spec = catalog.lookup(key)
        if spec is None and key.strip().lower() != "cpu":
            raise ProblemError(f"task {task}: durations names {key[:64]!r}, neither a GPU in the catalog "
                               "(llm-placement catalog) nor cpu")
        out[spec.name if spec is not None else "cpu"] = secs
    return out


def _measured(raw: dict[str, float], f: NodeFacts, by_type: dict[str, float]) -> float | None:
    if not raw:
        return None
    if f.gpu_count and f.gpu is not None:
        return by_type.get(f.gpu.name)
    return by_type.get("cpu") if not f.gpu_count else None
