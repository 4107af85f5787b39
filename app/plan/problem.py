"""A workflow on a cluster as plain data every planner reads: who may run where, for how long, at what
cost, and how long data takes between two nodes.

Eligibility is the filter's own verdict (``app.placement.feasibility.evaluate``) on an empty node, so a
task is only planned where the extender would let its pod in (docs/stage-policy.md). Transfer time is
``output GB x seconds per GB`` at the distance the data-gravity ladder gives for the two nodes
(``GravityModel.distance`` / ``seconds_per_gb``, docs/data-gravity.md): the same cost model the
extender's gravity term ranks by, including the local read on the same node.

Identical nodes are one group (docs/planner.md, "Size"): nodes whose facts differ only by name are
interchangeable for every planner (same verdicts, durations, costs, and the same distance to every
other node), so the filter and the estimate run once per (task, group), the distances are a table per
pair of groups, and a group contributes at most as many nodes as there are tasks: a plan never needs
more. Identical tasks (a sweep's members, or tasks written alike) share one row of durations.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from app.base.catalog import GpuCatalog
from app.base.objects import pod_object
from app.base.reasons import Rejection
from app.base.workload import (
    TRAINING_STAGES,
    LatencyClass,
    Stage,
    WorkloadError,
    WorkloadSpec,
    parse_workload,
)
from app.config.policy import PolicySource, TierBandwidth
from app.placement.distance import HopLadder
from app.placement.feasibility import NodeFit, evaluate
from app.plan.estimate import EstimateError, task_seconds
from app.plan.workflow import Task, Workflow
from app.snapshot.nodes import NodeFacts, facts_for
from app.snapshot.store import NodeUsage

ANN = "llm-placement.io/"
TRAIN, SERVE, OTHER = "train", "serve", "other"


class ProblemError(ValueError):
    """The workflow cannot be planned on this cluster; the message says which task and why."""


class OutOfTime(ProblemError):
    """The time limit ran out before the problem was built: there is nothing to plan with."""


class Links(Mapping[tuple[str, str], float]):
    """Seconds per GB between two nodes, from a table per pair of node groups: ``local[g]`` on one
    node of group ``g``, ``between[g][h]`` between two distinct nodes of groups ``g`` and ``h``.
    A 20,000-node cluster of a dozen shapes is a 12 x 12 table, not 400 million pairs."""

    def __init__(self, group_of: dict[str, int], local: list[float], between: list[list[float]],
                 labels: list[list[str]]) -> None:
        self.group_of, self.local, self.between, self.labels = group_of, local, between, labels
        self.size = [0] * len(local)  # nodes per group
        for g in group_of.values():
            self.size[g] += 1

    def __getitem__(self, key: tuple[str, str]) -> float:
        a, b = key
        ga, gb = self.group_of[a], self.group_of[b]
        return self.local[ga] if a == b else self.between[ga][gb]

    def label(self, a: str, b: str) -> str:
        return "node" if a == b else self.labels[self.group_of[a]][self.group_of[b]]

    def __iter__(self) -> Iterator[tuple[str, str]]:
        return ((a, b) for a in self.group_of for b in self.group_of)

    def __len__(self) -> int:
        return len(self.group_of) ** 2


class Labels(Mapping[tuple[str, str], str]):
    """The data-gravity ladder's name for each pair's distance, read from ``Links``."""

    def __init__(self, links: Links) -> None:
        self.links = links

    def __getitem__(self, key: tuple[str, str]) -> str:
        if key[0] not in self.links.group_of or key[1] not in self.links.group_of:
            raise KeyError(key)
        return self.links.label(*key)

    def __iter__(self) -> Iterator[tuple[str, str]]:
        return iter(self.links)

    def __len__(self) -> int:
        return len(self.links)


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
    group: int = -1  # nodes of one group are interchangeable (build_problem); -1: not grouped


@dataclass(slots=True)
class PlanProblem:
    """Everything the planners read; the workflow-derived parts (pods, specs) are optional."""

    tasks: list[PlanTask]
    nodes: list[PlanNode]
    duration: dict[str, dict[str, int]]  # task -> eligible node -> whole seconds
    cost: dict[str, dict[str, float]]  # task -> eligible node -> dollars for the whole run
    s_per_gb: Mapping[tuple[str, str], float]  # (from node, to node) -> seconds per GB
    distance: Mapping[tuple[str, str], str] = field(default_factory=dict)  # same keys -> ladder label
    # task -> node (the first of its group: "n-0 and 7 like it") -> the filter's reason
    excluded: dict[str, dict[str, str]] = field(default_factory=dict)
    pods: dict[str, dict[str, Any]] = field(default_factory=dict)  # task -> pod object
    specs: dict[str, WorkloadSpec] = field(default_factory=dict)
    facts: dict[str, NodeFacts] = field(default_factory=dict)
    name: str = "workflow"
    namespace: str = "default"
    # (producer, consumer) -> GB that consumer reads, where it is not the producer's whole output.
    edge_data: dict[tuple[str, str], float] = field(default_factory=dict)
    cluster_nodes: int = 0  # schedulable nodes in the cluster, before groups were cut to size
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


def _group_key(f: NodeFacts, free: int, shared_domain: bool) -> tuple[object, ...]:
    """Everything a planner reads of a node except its name. A node in an NVLink domain of its own
    is as far from every other node as its twins are; nodes sharing one are NVLINK apart, so the
    domain is part of their key."""
    return (f.shape, free, f.cpu_millis, f.memory_bytes, f.hourly_cost, f.fabric, f.zone, f.rdma,
            f.pods, f.nvlink_domain if shared_domain else None)


def _fit_key(t: Task) -> tuple[object, ...]:
    """Everything the filter reads of a task (its pod) except its name and inputs."""
    return (t.stage, t.model_params, t.precision, t.gpus, t.cpu, t.memory,
            tuple(sorted(t.annotations.items())))


def _task_key(t: Task) -> tuple[object, ...]:
    """Everything the filter and the estimate read of a task except its name and inputs."""
    return (*_fit_key(t), t.duration, t.tokens, tuple(sorted(t.durations.items())))


def build_problem(
    wf: Workflow, facts: Sequence[NodeFacts], settings: PolicySource,
    used_gpus: dict[str, int] | None = None, *, catalog: GpuCatalog | None = None,
    bandwidth: TierBandwidth | None = None, deadline: float | None = None,
) -> PlanProblem:
    """``used_gpus``: GPUs already held on a node (a live cluster), not available to the plan.
    ``bandwidth``: the planner's own link speeds (a cluster file's ``bandwidth_gbps``), else the
    data-gravity settings'. ``deadline``: a ``time.perf_counter()`` past which building gives up."""
    if not facts:
        raise ProblemError("the cluster has no schedulable nodes")
    catalog = catalog or GpuCatalog.load()
    policies = settings.policies()
    feas = policies.placement.feasibility
    gpu_resources = policies.placement.gpu_resources
    used = used_gpus or {}
    tasks_in = wf.expanded()
    # Groups of interchangeable nodes, each cut to as many nodes as there are tasks.
    domains: dict[str, int] = {}
    for f in facts:
        domains[f.nvlink_domain] = domains.get(f.nvlink_domain, 0) + 1
    members: dict[tuple[object, ...], list[NodeFacts]] = {}
    for f in facts:
        free = max(0, f.gpu_count - used.get(f.name, 0))
        group = members.setdefault(_group_key(f, free, domains[f.nvlink_domain] > 1), [])
        if len(group) < len(tasks_in):
            group.append(f)
    reps = list(members.values())
    kept = [f for group in reps for f in group]
    nodes = [PlanNode(f.name, max(0, f.gpu_count - used.get(f.name, 0)), int(f.cpu_millis), _hardware(f),
                      _mib(f.memory_bytes), g)
             for g, group in enumerate(reps) for f in group]
    links = _links(reps, settings, bandwidth)
    outputs = {t.name: t.output_gb for t in tasks_in}
    tasks: list[PlanTask] = []
    duration: dict[str, dict[str, int]] = {}
    cost: dict[str, dict[str, float]] = {}
    excluded: dict[str, dict[str, str]] = {}
    pods: dict[str, dict[str, Any]] = {}
    specs: dict[str, WorkloadSpec] = {}
    # One verdict per (kind of task, group): a row each, shared by every task of that kind.
    rows: dict[tuple[object, ...], tuple[dict[str, int], dict[str, float], dict[str, str]]] = {}
    fits: dict[tuple[object, ...], list[NodeFit | str]] = {}  # the filter's verdict per group
    first_nodes = _first_nodes(nodes)
    for t in tasks_in:
        if deadline is not None and time.perf_counter() > deadline:
            raise OutOfTime(f"the time limit ran out while building the problem (at task {t.name} of "
                            f"{len(tasks_in)}); give a longer --time-limit")
        pod = task_pod(t, wf, outputs)
        try:
            spec = parse_workload(pod, gpu_resources)
        except WorkloadError as exc:
            raise ProblemError(f"task {t.name}: " + "; ".join(exc.problems)) from None
        pods[t.name], specs[t.name] = pod, spec
        key = _task_key(t)
        if key not in rows:
            fk = _fit_key(t)
            if fk not in fits:
                fits[fk] = [_fit(spec, group[0], first_nodes[g][0].gpus, feas)
                            for g, group in enumerate(reps)]
            rows[key] = _row(t, spec, reps, fits[fk], nodes_of=first_nodes, catalog=catalog, feas=feas)
        duration[t.name], cost[t.name], excluded[t.name] = rows[key]
        if not duration[t.name]:
            reasons = sorted(set(excluded[t.name].values()))
            raise ProblemError(f"task {t.name} fits no node: " + "; ".join(reasons[:3]))
        tasks.append(PlanTask(t.name, spec.stage.value if spec.stage else t.stage, spec.gpus,
                              int(spec.cpu_millis), t.after, t.output_gb, _kind(spec),
                              _mib(spec.memory_bytes)))
    edge_data = {(a, t.name): gb for t in tasks_in for a, gb in t.reads.items()}
    return PlanProblem(tasks, nodes, duration, cost, links, Labels(links), excluded, pods, specs,
                       {f.name: f for f in kept}, wf.name, wf.namespace, edge_data, len(facts))


def _first_nodes(nodes: list[PlanNode]) -> dict[int, list[PlanNode]]:
    out: dict[int, list[PlanNode]] = {}
    for n in nodes:
        out.setdefault(n.group, []).append(n)
    return out


def _fit(spec: WorkloadSpec, f: NodeFacts, free_gpus: int, feas: Any) -> NodeFit | str:
    """The filter's verdict on an idle node, or why not (also CPU and host memory, which
    kube-scheduler's own resource fit checks)."""
    verdict = evaluate(spec, f, NodeUsage(), free_gpus, feas)
    if isinstance(verdict, Rejection):
        return verdict.message
    if spec.cpu_millis > f.cpu_millis:
        return "not enough CPU"
    if f.memory_bytes > 0 and spec.memory_bytes > f.memory_bytes:
        return "not enough host memory"
    assert isinstance(verdict, NodeFit)
    return verdict


def _row(
    t: Task, spec: WorkloadSpec, reps: list[list[NodeFacts]], fits: list[NodeFit | str], *,
    nodes_of: dict[int, list[PlanNode]], catalog: GpuCatalog, feas: Any,
) -> tuple[dict[str, int], dict[str, float], dict[str, str]]:
    """Durations, costs and refusals of one kind of task over every group (judged on its first node)."""
    by_type = catalog_of(t.name, t.durations, catalog)
    duration: dict[str, int] = {}
    cost: dict[str, float] = {}
    excluded: dict[str, str] = {}
    for g, group in enumerate(reps):
        f, verdict = group[0], fits[g]
        measured = None
        if isinstance(verdict, str):
            reason: str | None = verdict
        else:
            reason = None
            measured = _measured(t.durations, f, by_type)
            if t.durations and measured is None and t.duration is None and t.tokens is None:
                reason = "no measured duration for this node type"
        if reason is not None:
            more = f" and {len(group) - 1} like it" if len(group) > 1 else ""
            excluded[f"{f.name}{more}"] = reason
            continue
        assert isinstance(verdict, NodeFit)
        try:
            secs = max(1, math.ceil(measured)) if measured is not None else task_seconds(
                t.name, spec, verdict, f, duration=t.duration, tokens=t.tokens,
                default_concurrency=feas.default_concurrency)
        except EstimateError as exc:
            raise ProblemError(str(exc)) from None
        names = [n.name for n in nodes_of[g]]
        duration.update(dict.fromkeys(names, secs))
        cost.update(dict.fromkeys(names, verdict.pod_hourly_cost * secs / 3600.0))
    return duration, cost, excluded


def _links(reps: list[list[NodeFacts]], settings: PolicySource, bandwidth: TierBandwidth | None) -> Links:
    """Seconds per GB per pair of groups, on the data-gravity ladder (docs/data-gravity.md). Two
    distinct nodes of one group are as far apart as its first two (a group of one has no such pair)."""
    gravity = settings.policies().gravity
    ladder = HopLadder(gravity.fabric_tiers, bandwidth or gravity.tier_bandwidth)

    def between(a: NodeFacts, b: NodeFacts) -> tuple[float, str]:
        d, rung = ladder.distance(a, b)
        return ladder.seconds_per_gb(d, rung), d.label

    first = [group[0] for group in reps]
    group_of = {f.name: g for g, group in enumerate(reps) for f in group}
    local = [between(f, f)[0] for f in first]
    table: list[list[float]] = []
    labels: list[list[str]] = []
    for g, a in enumerate(first):
        pairs = [between(a, reps[g][1] if g == h and len(reps[g]) > 1 else b) for h, b in enumerate(first)]
        table.append([s for s, _ in pairs])
        labels.append([label for _, label in pairs])
    return Links(group_of, local, table, labels)


def catalog_of(task: str, durations: dict[str, float], catalog: GpuCatalog) -> dict[str, float]:
    """Measured durations keyed by node type: a catalog GPU name (any alias given), or "cpu"."""
    if not durations:
        return {}
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
