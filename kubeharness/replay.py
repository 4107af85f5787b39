"""Replay a timed pod trace through the real kube-scheduler (+ extender) onto kwok-managed nodes.

Used by bench/replay.py (openb traces, pipeline mixes) and tests/integration/test_replay.py. The
driver owns a trace clock (wall or virtual, below):

* a pod is created when the clock reaches its arrival time and every pod it waits for (``after``,
  the previous stage of a pipeline) has Succeeded; kwok finishes it after its duration on the
  trace clock and kube-scheduler frees its resources;
* back-pressure: at most ``window`` created pods may be undecided (neither bound nor marked
  unschedulable by kube-scheduler); while the window is full the clock stops, so a burst the
  scheduler cannot keep up with is delayed, never reordered or dropped;
* idle gaps are skipped: when nothing is undecided or due to finish, the clock jumps to the next
  arrival (a 149-day trace replays in minutes);
* a pod that is still unbound at its ``deadline`` (its departure time in the trace) is deleted and
  counted as failed; pods without one wait until the end of the replay.

kube-scheduler schedules one pod at a time from a FIFO queue and assumes each decision in its cache
before the next, so decisions follow creation order as in the trace.

Two clocks (``clock=``):

* ``"wall"``: the trace clock runs ``speed`` trace seconds per wall second and kwok finishes each
  pod ``duration / speed`` wall seconds after it starts. Simple, but scheduling latency leaks into
  the trace: a variant that decides more slowly (an extender round trip, a gang waiting for its
  members, kube-scheduler's 1-10 s retry backoff) sees a different set of pods still running when
  the next one arrives, so two variants are not compared on the same load.
* ``"virtual"``: event-driven and identical for every variant. The clock stands still while
  anything is in flight and jumps only when the cluster is quiescent: every created pod bound or
  marked unschedulable, every completion the driver asked for seen, and, while a pod waits as
  unschedulable, kube-scheduler's active and backoff queues empty (its ``scheduler_pending_pods``
  metric: every retry the last change caused has been made), or no news for ``retry_settle_s``
  at most. The bench sets kube-scheduler's retry backoff to 1 s for every variant alike. It
  jumps to the next event: an arrival, a deadline, or a running pod's end (its bind time on the
  trace clock plus its duration), where the driver tells kwok to finish the pod now (the
  pod-complete annotation set to zero). Stranded GPUs, allocated GPUs and whole free
  nodes are also integrated over trace time between events (``ReplayResult.time_weighted``).

Fragmentation is sampled from the pods' own state (a watch): at every 1 % of created pods, GPUs
allocated on each node (bound pods that have not finished), stranded GPUs (free GPUs on partly used
GPU nodes) and whole free nodes; any node whose bound pods exceed its capacity is recorded as an
over-commit.
"""

from __future__ import annotations

import copy
import heapq
import random
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, NamedTuple, TypedDict

import httpx
from kubernetes.client import CoreV1Api
from kubernetes.client.rest import ApiException

from app.base.workload import TRAINING_STAGES, LatencyClass, Stage, WorkloadError, parse_workload

from .controlplane import ControlPlane, metric_value
from .kwok import complete_after
from .objects import GPU_RESOURCE, create_pod
from .podwatch import list_then_watch
from .procs import port_is_free, wait_until
from .schedconfig import write_yaml

TERMINAL = ("Succeeded", "Failed")
AGREEMENT_METRIC = "llm_placement_scheduler_agreement_total"
AGREEMENT_OUTCOMES = ("top", "tied_top", "lower", "unranked")


# ----- scheduler variants ------------------------------------------------------------------------
def variant_config(cp: ControlPlane, variant: str) -> dict[str, Any]:
    """KubeSchedulerConfiguration of one variant; every variant serves the ``llm-placement`` profile
    so the same pod manifests go through each.

    * ``ours``: the chart's file as shipped (extender, its profile's score plugins and weight);
    * ``default``: kube-scheduler's default profile, nothing configured (what an operator gets);
    * ``mostalloc``: the default profile with NodeResourcesFit scoring ``MostAllocated`` on
      ``nvidia.com/gpu`` and every node scored: GPU bin-packing, what an operator would set instead;
    * ``affinity``: the default profile; the pods themselves carry a preferred podAffinity to their
      producer (bench/replay.py adds it), kube-scheduler's own data-gravity mechanism;
    * ``mostalloc-sep``: ``mostalloc``, the pods carrying a required podAntiAffinity that keeps
      interactive serving off nodes running training (bench/replay.py adds it): bin-packing under
      the separation rule of docs/stage-policy.md, which plain ``mostalloc`` does not keep;
    * ``kueue``: ``mostalloc`` behind real Kueue admitting each gang all-or-nothing on quota
      (kubeharness/kueue.py; the caller runs Kueue and queues the pods);
    * ``kueue-tas``: the same with Kueue's topology-aware scheduling, which admits a gang only onto
      nodes with room for all of it.
    """
    if variant == "ours":
        return cp.scheduler_config(with_extender=True)
    chart = cp.scheduler_config(with_extender=False)
    cfg: dict[str, Any] = {
        "apiVersion": chart["apiVersion"],
        "kind": chart["kind"],
        # The same client rate limits as ours, so no variant is throttled differently.
        "clientConnection": chart["clientConnection"],
        "leaderElection": {"leaderElect": False},
        "profiles": [{"schedulerName": chart["profiles"][0]["schedulerName"]}],
    }
    if variant in ("default", "affinity"):
        return cfg
    if variant in ("mostalloc", "mostalloc-sep", "kueue", "kueue-tas"):
        cfg["percentageOfNodesToScore"] = 100
        cfg["profiles"][0]["pluginConfig"] = [
            {
                "name": "NodeResourcesFit",
                "args": {"scoringStrategy": {"type": "MostAllocated",
                                             "resources": [{"name": GPU_RESOURCE, "weight": 1}]}},
            }
        ]
        return cfg
    raise ValueError(f"unknown scheduler variant {variant!r}")


def with_retry_backoff(config: dict[str, Any], seconds: int) -> dict[str, Any]:
    """``config`` with kube-scheduler's retry backoff for unschedulable pods (initial and maximum)
    set to ``seconds``. The virtual clock waits for retries before it moves on, so a short, equal
    backoff for every variant keeps replays short and compares variants on the same pacing."""
    return {**config, "podInitialBackoffSeconds": seconds, "podMaxBackoffSeconds": seconds}


def restart_scheduler_with(cp: ControlPlane, config: dict[str, Any], tag: str, timeout: float = 60.0) -> None:
    """Restart the harness's kube-scheduler on ``config`` (same ports, same log file)."""
    assert cp.scheduler is not None or cp.apiserver is not None
    path = write_yaml(cp.workdir / f"scheduler-config-{tag}.yaml", config)
    if cp.scheduler is None:
        cp.start_scheduler()
    assert cp.scheduler is not None
    cp.scheduler.stop()
    cp.scheduler.argv = [a if not a.startswith("--config=") else f"--config={path}" for a in cp.scheduler.argv]
    cp.scheduler_config_file = path
    wait_until(lambda: port_is_free(cp.ports.scheduler), 30, "scheduler port to be free")
    cp.scheduler.start()

    def ready() -> bool:
        url = f"https://127.0.0.1:{cp.ports.scheduler}/readyz"
        return httpx.get(url, verify=False, timeout=2).status_code == 200

    wait_until(ready, timeout, "kube-scheduler /readyz", interval=0.1, watch=[cp.scheduler])


def agreement(cp: ControlPlane) -> dict[str, float] | None:
    """The extender's agreement counter by outcome; None while the extender does not export it."""
    try:
        text = cp.extender_metrics()
    except httpx.HTTPError:
        return None
    out = {o: metric_value(text, AGREEMENT_METRIC, {"outcome": o}) for o in AGREEMENT_OUTCOMES}
    if all(v is None for v in out.values()):
        return None
    return {k: float(v or 0.0) for k, v in out.items()}


# ----- the trace ---------------------------------------------------------------------------------
@dataclass
class ReplayPod:
    manifest: dict[str, Any]
    arrive: float = 0.0  # trace seconds
    duration: float | None = None  # trace seconds of running; None = runs until the replay ends
    deadline: float | None = None  # trace time after which an unbound pod gives up (failed)
    after: tuple[str, ...] = ()  # pods that must have Succeeded before this one is created

    @property
    def name(self) -> str:
        return str(self.manifest["metadata"]["name"])

    @cached_property
    def role(self) -> str:
        return pod_role(self.manifest)


def pod_gang(manifest: dict[str, Any]) -> tuple[str, int] | None:
    """(gang key, size) as the extender reads the pod; None for a pod outside any sized gang."""
    try:
        spec = parse_workload(manifest)
    except WorkloadError:
        return None
    if spec.gang is None or not spec.gang.size or spec.gang.size < 2:
        return None
    return spec.gang.key, spec.gang.size


class Gangs:
    """Lockstep semantics for the virtual clock: members start together when the last one binds and
    end together, at the pace of the slowest member on the node it got."""

    def __init__(self, trace: list[ReplayPod]) -> None:
        self.of: dict[str, str] = {}
        self.size: dict[str, int] = {}
        for p in trace:
            g = pod_gang(p.manifest)
            if g is not None:
                self.of[p.name] = g[0]
                self.size[g[0]] = g[1]
        self.bound: dict[str, dict[str, float]] = {k: {} for k in self.size}
        self.started: set[str] = set()

    def bind(self, name: str, vt: float) -> list[str] | None:
        """Record a member's bind; the members to start now when it completes its gang, else None
        (a pod outside any gang starts at once: [name])."""
        key = self.of.get(name)
        if key is None:
            return [name]
        self.bound[key][name] = vt
        if key in self.started or len(self.bound[key]) < self.size[key]:
            return None
        self.started.add(key)
        return sorted(self.bound[key])

    def waiting(self) -> dict[str, dict[str, float]]:
        """Gangs with members bound but not all: member -> bind time."""
        return {k: b for k, b in self.bound.items() if b and k not in self.started}


def pod_gpus(manifest: dict[str, Any]) -> int:
    return sum(
        int(((c.get("resources") or {}).get("requests") or {}).get(GPU_RESOURCE, "0"))
        for c in manifest["spec"].get("containers") or []
    )


def pod_role(manifest: dict[str, Any]) -> str:
    """'training', 'interactive' (latency-bound serving) or '' as the extender reads the pod
    (stage aliases, default latency class): the separation rule of docs/stage-policy.md keeps the
    first two off one node. A pod the extender cannot read has no role."""
    try:
        spec = parse_workload(manifest)
    except WorkloadError:
        return ""
    if spec.stage in TRAINING_STAGES:
        return "training"
    interactive = spec.stage is Stage.SERVING and spec.effective_latency_class is LatencyClass.INTERACTIVE
    return "interactive" if interactive else ""


def _cpu_milli(q: str) -> int:
    return int(q[:-1]) if q.endswith("m") else int(float(q) * 1000)


def pod_cpu_milli(manifest: dict[str, Any]) -> int:
    return sum(
        _cpu_milli(str(((c.get("resources") or {}).get("requests") or {}).get("cpu", "0")))
        for c in manifest["spec"].get("containers") or []
    )


def synthetic_trace(pods: int, seed: int, *, span_s: float = 1500.0, mean_duration_s: float = 600.0,
                    max_duration_s: float = 1200.0, make_pod: Callable[[str, int], dict[str, Any]]) -> list[ReplayPod]:
    """A generated trace (no shared data): Poisson arrivals over ``span_s``, exponential durations,
    GPU counts 1/2/4/8 drawn 60/20/12/8 %. ``make_pod(name, gpus)`` builds each manifest."""
    rng = random.Random(seed)
    out = []
    for i in range(pods):
        gpus = rng.choices((1, 2, 4, 8), (60, 20, 12, 8))[0]
        arrive = rng.uniform(0.0, span_s)
        duration = min(max_duration_s, rng.expovariate(1 / mean_duration_s))
        out.append(ReplayPod(make_pod(f"r-{i:04d}", gpus), arrive=arrive, duration=duration))
    out.sort(key=lambda p: p.arrive)
    return out


# ----- pod state from a watch --------------------------------------------------------------------
class PodState(NamedTuple):
    node: str | None = None
    phase: str = "Pending"
    unschedulable: bool = False
    deleted: bool = False


class PodTracker(threading.Thread):
    """Every pod of a namespace as the API reports it (list, then watch); thread-safe snapshots."""

    def __init__(self, core: CoreV1Api, namespace: str) -> None:
        super().__init__(daemon=True, name=f"replay-watch-{namespace}")
        self.core, self.namespace = core, namespace
        self.pods: dict[str, PodState] = {}
        self.lock = threading.Lock()
        self.stop_event = threading.Event()
        self.error: BaseException | None = None
        self.synced = threading.Event()
        self.version = 0  # bumps on every change, so the driver can wait for news cheaply
        self.changed: set[str] = set()  # pods changed since the driver last took changes
        self.news = threading.Condition(self.lock)

    def _see(self, kind: str, pod: dict[str, Any]) -> None:
        name = pod["metadata"]["name"]
        st = pod.get("status") or {}
        unschedulable = any(
            c.get("type") == "PodScheduled" and c.get("status") == "False" for c in st.get("conditions") or []
        )
        with self.lock:
            old = self.pods.get(name, PodState())
            self.pods[name] = PodState(
                pod["spec"].get("nodeName") or old.node,
                st.get("phase") or old.phase,
                unschedulable,
                old.deleted or kind == "DELETED",
            )
            self.changed.add(name)
            self.version += 1
            self.news.notify_all()

    def run(self) -> None:
        def listed(items: list[dict[str, Any]]) -> None:
            for p in items:
                self._see("ADDED", p)
            self.synced.set()

        try:
            list_then_watch(self.core, self.namespace, on_list=listed, on_event=self._see,
                            stop=self.stop_event.is_set)
        except BaseException as exc:  # reported by the driver
            self.error = exc
            self.synced.set()

    def snapshot(self) -> dict[str, PodState]:
        with self.lock:
            return dict(self.pods)

    def take_changes(self) -> dict[str, PodState]:
        """The pods changed since the last call, as they are now: with thousands of pods the driver
        must not rescan every pod on every event."""
        with self.lock:
            out = {n: self.pods[n] for n in self.changed}
            self.changed.clear()
            return out

    def wait_news(self, version: int, timeout: float) -> None:
        """Return once the version differs from ``version``, or after ``timeout`` seconds."""
        with self.news:
            self.news.wait_for(lambda: self.version != version, timeout)

    def stop(self) -> None:
        self.stop_event.set()
        self.join(timeout=40)


# ----- results -----------------------------------------------------------------------------------
@dataclass
class Sample:
    created: int  # pods created so far (the x axis: the same for every variant)
    trace_time: float
    wall_s: float
    gpus_allocated: int
    gpus_free: int
    gpus_stranded: int  # free GPUs on GPU nodes that are partly used
    whole_free_nodes: int  # GPU nodes with every GPU free
    whole_free_8gpu_nodes: int
    placed: int
    unschedulable: int
    # Nodes running training beside interactive serving. docs/stage-policy.md's hard rule keeps an
    # interactive pod off a node running training; a training pod is only scored away from serving,
    # so ours can mix too (rarely). Baselines without the extender mix freely.
    mixed_nodes: int = 0
    # node -> free GPUs on each partly used GPU node: which nodes the stranded GPUs sit on, so a
    # difference between variants can be traced to the placements behind it.
    stranded_by_node: dict[str, int] = field(default_factory=dict)


@dataclass
class ReplayResult:
    variant: str
    pods: int = 0
    placed: int = 0
    failed: int = 0  # never bound (expired at their deadline, or still pending at the end)
    gpu_pods_failed: int = 0
    gpus_placed: int = 0
    gpus_failed: int = 0
    completed: int = 0  # Succeeded through kwok
    overcommits: list[str] = field(default_factory=list)
    samples: list[Sample] = field(default_factory=list)
    placements: dict[str, str] = field(default_factory=dict)  # pod -> node, every pod ever bound
    wall_s: float = 0.0
    trace_span_s: float = 0.0
    agreement: dict[str, float] | None = None
    max_nodes_reused: int = 0  # GPU nodes that ran pods one after another (proves resources freed)
    clock: str = "wall"
    # Virtual clock only: figures averaged over trace time (each state weighted by how long it
    # lasted), which sampling at arrivals cannot give: a state that lasts a day counts as a day.
    time_weighted: TimeWeightedFigures | None = None
    bound_at: dict[str, float] = field(default_factory=dict)  # virtual clock: pod -> trace time bound
    # Nodes pods were bound to that the replay was not given: its figures would miss those pods.
    unknown_nodes: list[str] = field(default_factory=list)
    # Virtual clock: when each pod really started running (a gang member: when its last member
    # bound) and how long it ran there (its runtime on the node it got, a gang's slowest member's).
    started_at: dict[str, float] = field(default_factory=dict)
    ran_s: dict[str, float] = field(default_factory=dict)
    created_at: dict[str, float] = field(default_factory=dict)  # trace time each pod was created
    gangs: int = 0
    gangs_started: int = 0
    # Gangs some of whose members were bound but that never had all of them at once: the replay
    # ended with nothing else able to happen (a deadlock), and the GPU-seconds such members held
    # while waiting for the rest (partial gangs hold their GPUs, as on a real cluster).
    gang_deadlocks: int = 0
    idle_held_gpu_s: float = 0.0
    # Virtual clock: GPUs pods ran on at a speed not measured, and how it was had ("datasheet",
    # "declared", "none": runtime.PodRuntime.fallback_used), so a figure says what it rests on.
    fallback_gpus: dict[str, str] = field(default_factory=dict)
    # Virtual clock with an admission controller: times the clock moved on after ADMISSION_SETTLE_S
    # without the controller saying it had nothing left to admit (0 in a clean run).
    admission_settle_timeouts: int = 0
    # Virtual clock: per gang, when all its members existed, the first quiescent trace time at which
    # free whole nodes of one GPU model could hold it, when it started, and why it waited (GangWaits).
    gang_waits: dict[str, dict[str, Any]] = field(default_factory=dict)


@dataclass
class NodeCap:
    gpus: int
    cpu_milli: int


def node_product(node: dict[str, Any]) -> str:
    """The node's GPU product label (GPU Feature Discovery), empty without one."""
    return str((node["metadata"].get("labels") or {}).get("nvidia.com/gpu.product", ""))


def node_caps(nodes: list[dict[str, Any]]) -> dict[str, NodeCap]:
    out = {}
    for n in nodes:
        alloc = (n.get("status") or {}).get("allocatable") or {}
        out[n["metadata"]["name"]] = NodeCap(int(alloc.get(GPU_RESOURCE, "0")), _cpu_milli(str(alloc.get("cpu", "0"))))
    return out


def _sample(created: int, vt: float, wall: float, caps: dict[str, NodeCap], pods: dict[str, ReplayPod],
            states: dict[str, PodState]) -> tuple[Sample, list[str]]:
    used_gpu: dict[str, int] = {}
    used_cpu: dict[str, int] = {}
    roles: dict[str, set[str]] = {}
    placed = unsched = 0
    for name, s in states.items():
        if s.node:
            placed += 1
        elif s.unschedulable and not s.deleted:
            unsched += 1
        if not s.node or s.deleted or s.phase in TERMINAL or name not in pods:
            continue
        m = pods[name].manifest
        used_gpu[s.node] = used_gpu.get(s.node, 0) + pod_gpus(m)
        used_cpu[s.node] = used_cpu.get(s.node, 0) + pod_cpu_milli(m)
        if role := pods[name].role:
            roles.setdefault(s.node, set()).add(role)
    mixed = sum(1 for r in roles.values() if len(r) == 2)
    alloc = free = stranded = whole = whole8 = 0
    by_node: dict[str, int] = {}
    over: list[str] = []
    for node, cap in caps.items():
        g, c = used_gpu.get(node, 0), used_cpu.get(node, 0)
        if g > cap.gpus or c > cap.cpu_milli:
            over.append(f"{node}: {g}/{cap.gpus} GPUs, {c}/{cap.cpu_milli} mCPU")
        if not cap.gpus:
            continue
        f = max(0, cap.gpus - g)
        alloc += min(g, cap.gpus)
        free += f
        if 0 < f < cap.gpus:
            stranded += f
            by_node[node] = f
        if f == cap.gpus:
            whole += 1
            whole8 += cap.gpus == 8
    return Sample(created, vt, wall, alloc, free, stranded, whole, whole8, placed, unsched, mixed, by_node), over


# ----- per-gang waits ----------------------------------------------------------------------------
class GangWaits:
    """For each gang, when it could first have started on free whole nodes of one GPU model and when
    it did (virtual clock). Checked at every quiescent trace time the clock is about to leave: a gang
    all of whose members exist, not started, whose members fit (first fit, largest first) on nodes
    of one model with no pod bound: it could have started then. Why it waited is read from what
    started meanwhile: a gang needing more GPUs ("held for a larger gang"), anything else ("queue
    order"), or nothing ("nothing started meanwhile": no scheduler or admission acted although the
    nodes were free, as when a clock moves on before an admission controller)."""

    def __init__(self, trace: list[ReplayPod], gangs: Gangs, nodes: list[dict[str, Any]],
                 caps: dict[str, NodeCap]) -> None:
        self.gangs = gangs
        self.members: dict[str, list[str]] = defaultdict(list)
        for name, key in gangs.of.items():
            self.members[key].append(name)
        self.need = {k: sorted((pod_gpus(p.manifest) for p in trace if gangs.of.get(p.name) == k), reverse=True)
                     for k in gangs.size}
        self.model = {n["metadata"]["name"]: node_product(n) for n in nodes}
        self.caps = caps
        self.first: dict[str, float] = {}
        self.created: dict[str, float] = {}

    def check(self, vt: float, created: dict[str, float], by_name: dict[str, ReplayPod],
              states: dict[str, PodState]) -> None:
        """Note the gangs that could start now, on the state at quiescent trace time ``vt``."""
        todo = [k for k in self.gangs.size if k not in self.first and k not in self.gangs.started
                and len(self.members[k]) >= self.gangs.size[k] and all(m in created for m in self.members[k])]
        if not todo:
            return
        busy = {s.node for n, s in states.items() if s.node and not s.deleted and s.phase not in TERMINAL
                and n in by_name}
        whole: dict[str, list[int]] = defaultdict(list)
        for node, cap in self.caps.items():
            if cap.gpus and node not in busy:
                whole[self.model.get(node, "")].append(cap.gpus)
        for k in todo:
            self.created[k] = max(created[m] for m in self.members[k])
            if any(first_fit(self.need[k], free) for free in whole.values()):
                self.first[k] = vt

    def table(self, started_at: dict[str, float], by_name: dict[str, ReplayPod]) -> dict[str, dict[str, Any]]:
        starts = {k: min(started_at[m] for m in ms if m in started_at)
                  for k, ms in self.members.items() if any(m in started_at for m in ms)}
        solo = {n: t for n, t in started_at.items() if n not in self.gangs.of}
        out: dict[str, dict[str, Any]] = {}
        for k in sorted(self.gangs.size):
            first, start = self.first.get(k), starts.get(k)
            row: dict[str, Any] = {"members": self.gangs.size[k], "gpus": sum(self.need[k]),
                                   "created": self.created.get(k), "could_start": first, "started": start,
                                   "wait_s": None, "why": ""}
            if first is not None and start is not None and start > first:
                row["wait_s"] = start - first
                larger = [g for g, t in starts.items() if g != k and first <= t < start
                          and sum(self.need[g]) > sum(self.need[k])]
                others = [g for g, t in starts.items() if g != k and first <= t < start]
                others += [n for n, t in solo.items() if first <= t < start and pod_gpus(by_name[n].manifest)]
                row["why"] = ("held for a larger gang" if larger else "queue order" if others
                              else "nothing started meanwhile")
            elif first is not None and start is None:
                row["why"] = "never started"
            out[k] = row
        return out


def first_fit(need: list[int], free: list[int]) -> bool:
    """``need`` (GPUs per member) fits the nodes ``free`` (GPUs each), first fit, largest member first."""
    room = sorted(free, reverse=True)
    for g in sorted(need, reverse=True):
        for i, f in enumerate(room):
            if f >= g:
                room[i] -= g
                break
        else:
            return False
    return True


# ----- the driver --------------------------------------------------------------------------------
CLOCKS = ("wall", "virtual")


def packing_bound(stranded_by_node: dict[str, int], kinds: dict[str, tuple[int, str]]) -> int:
    """The fewest GPUs the same partly used nodes would strand if their work were packed perfectly.

    ``kinds``: node -> (GPUs, GPU product). Work on partly used nodes of one kind (same size and
    GPU) could share as few of them as it fills; only the last one's remainder need stay free. What
    a placement strands beyond this bound is its own doing; the bound itself follows from the load.
    """
    used: dict[tuple[int, str], int] = defaultdict(int)
    for node, free in stranded_by_node.items():
        cap = kinds[node][0]
        used[kinds[node]] += cap - free
    return sum((cap - u % cap) % cap for (cap, _gpu), u in used.items())


class TimeWeightedFigures(TypedDict):
    """A virtual-clock replay's figures averaged over trace time (``ReplayResult.time_weighted``)."""

    span_s: float
    gpus_allocated: float
    gpus_stranded: float
    stranded_share: float
    whole_free_8gpu_nodes: float
    stranded_gpu_hours: float
    stranded_beyond_packing_gpu_hours: float
    stranded_gpu_hours_by_node: dict[str, float]
    nodes_8gpu: int


class _TimeWeighted:
    """Integrals over trace time of the fragmentation figures (virtual clock)."""

    def __init__(self, kinds: dict[str, tuple[int, str]] | None = None) -> None:
        self.span = self.allocated = self.stranded = self.free = self.whole8 = self.excess = 0.0
        self.kinds = kinds or {}
        self.by_node: dict[str, float] = defaultdict(float)  # stranded GPU-seconds per node

    def add(self, smp: Sample, dt: float) -> None:
        self.span += dt
        self.allocated += smp.gpus_allocated * dt
        self.stranded += smp.gpus_stranded * dt
        self.free += smp.gpus_free * dt
        self.whole8 += smp.whole_free_8gpu_nodes * dt
        for node, free in smp.stranded_by_node.items():
            self.by_node[node] += free * dt
        if self.kinds:
            self.excess += (smp.gpus_stranded - packing_bound(smp.stranded_by_node, self.kinds)) * dt

    def figures(self) -> TimeWeightedFigures:
        span = self.span or 1.0
        return {
            "span_s": self.span,
            "gpus_allocated": self.allocated / span,
            "gpus_stranded": self.stranded / span,
            "stranded_share": self.stranded / self.free if self.free else 0.0,
            "whole_free_8gpu_nodes": self.whole8 / span,
            "stranded_gpu_hours": self.stranded / 3600.0,
            # Stranded beyond what perfect packing of the same partly used work would strand.
            "stranded_beyond_packing_gpu_hours": self.excess / 3600.0,
            "stranded_gpu_hours_by_node": {n: v / 3600.0 for n, v in sorted(self.by_node.items()) if v},
            "nodes_8gpu": sum(1 for cap, _gpu in self.kinds.values() if cap == 8),
        }


def replay(
    cp: ControlPlane,
    namespace: str,
    nodes: list[dict[str, Any]],
    trace: list[ReplayPod],
    *,
    variant: str,
    speed: float,
    window: int = 16,
    samples: int = 100,
    settle_s: float = 5.0,
    timeout_s: float = 3600.0,
    drain: bool = True,
    clock: str = "wall",
    quiet_s: float = 0.0,
    retry_settle_s: float = 5.0,
    on_progress: Callable[[int, int], None] | None = None,
    runtime: Callable[[ReplayPod, str, dict[str, str]], float] | None = None,
    admission_idle: Callable[[Collection[str]], bool] | None = None,
) -> ReplayResult:
    """Replay ``trace`` into ``namespace`` (which must exist and be empty) on ``nodes``.

    The caller has started kube-scheduler with the variant's configuration and kwok for the nodes.
    Returns when every pod has been decided and every pod with a duration has finished (or failed);
    pods left unbound then count as failed and are deleted with the rest by the caller. With
    ``drain=False`` it returns as soon as every pod is bound (or gave up), without waiting for the
    last ones to finish. ``clock`` is ``"wall"`` or ``"virtual"`` (module docstring); ``speed``
    only matters to the wall clock.

    Virtual clock only: ``runtime(pod, node, placements)`` gives how long the pod runs on the node it
    got (placements: pod -> node of every pod bound so far, for the data it reads); without it, its
    trace ``duration``. Gang members (a sized gang the extender reads) start together when the last
    one binds and run as long as the slowest of them; bound members hold their GPUs meanwhile.

    ``admission_idle``: an admission controller in front of kube-scheduler (Kueue, the ``kueue``
    variant) whose gated pods wait like unschedulable ones; the virtual clock also waits until it
    says it has nothing it could admit now and every bind it knows of has reached this driver's
    watch (``Kueue.idle``, given the pods seen bound), at most ``ADMISSION_SETTLE_S``
    without news, each such move counted in ``ReplayResult.admission_settle_timeouts``.
    """
    if clock not in CLOCKS:
        raise ValueError(f"clock must be one of {CLOCKS}, not {clock!r}")
    virtual = clock == "virtual"
    core = cp.core
    caps = node_caps(nodes)
    by_name = {p.name: p for p in trace}
    dependents: dict[str, list[str]] = {}
    for p in trace:
        for a in p.after:
            dependents.setdefault(a, []).append(p.name)
    # Arrival heap of pods whose prerequisites are met: (arrive, index, name).
    ready: list[tuple[float, int, str]] = []
    order = {p.name: i for i, p in enumerate(trace)}
    waiting: dict[str, set[str]] = {p.name: set(p.after) for p in trace if p.after}
    for p in trace:
        if not p.after:
            heapq.heappush(ready, (p.arrive, order[p.name], p.name))
    result = ReplayResult(variant, pods=len(trace), clock=clock)
    result.agreement = None
    before = agreement(cp) if variant == "ours" else None

    tracker = PodTracker(core, namespace)
    tracker.start()
    tracker.synced.wait(30)
    if tracker.error:
        raise tracker.error

    created: dict[str, float] = {}  # name -> trace time created
    open_: set[str] = set()  # created, not bound, not given up
    waiting_on = set(dependents)  # producers whose success someone still waits for
    timed = {p.name for p in trace if p.duration is not None}
    seen_version = -1
    states: dict[str, PodState] = {}
    running: set[str] = set()  # timed pods bound and not finished
    running_timed = 0
    expired: set[str] = set()
    history: dict[str, set[str]] = {}  # node -> pods that ran there
    every = max(1, len(trace) // samples)
    # Virtual clock: when each pod was bound (trace time), the ends still to come, the pods kwok
    # was told to finish and has not yet, and the next created-count to sample at.
    bound_at: dict[str, float] = {}
    gangs = Gangs(trace)
    result.gangs = len(gangs.size)
    waits = GangWaits(trace, gangs, nodes, caps)
    where: dict[str, str] = {}  # pod -> node, as bound
    ends: list[tuple[float, int, str]] = []
    finishing: set[str] = set()
    next_sample = every
    weighted = _TimeWeighted({name: (cap.gpus, node_product(n)) for n in nodes
                              if (cap := caps.get(name := n["metadata"]["name"])) and cap.gpus})
    vt = 0.0
    t0 = time.monotonic()
    last = t0
    quiet_since = t0
    deadline_wall = t0 + timeout_s
    settled_since: float | None = None
    admission_said_idle = False

    def take_sample(now: float, seen: dict[str, PodState]) -> Sample:
        smp, over = _sample(len(created), vt, now - t0, caps, by_name, seen)
        result.samples.append(smp)
        result.overcommits.extend(over)
        if on_progress:
            on_progress(len(created), len(trace))
        return smp

    try:
        while True:
            if tracker.error:
                raise tracker.error
            cp.check_alive()
            now = time.monotonic()
            if now > deadline_wall:
                raise TimeoutError(f"replay {variant} did not finish within {timeout_s:.0f}s")
            if tracker.version != seen_version:
                # Only the pods the watch brought news of: a scan over thousands of pods at every
                # event would take a core from the control plane on a 2-core machine.
                seen_version = tracker.version
                quiet_since = now
                changes = tracker.take_changes()
                states.update(changes)
                for n, st in changes.items():
                    if n not in by_name:
                        continue
                    # A finished producer releases its dependents at the current trace time.
                    if n in waiting_on and st.phase == "Succeeded":
                        waiting_on.discard(n)
                        for d in dependents.get(n, ()):
                            w = waiting.get(d)
                            if w is not None:
                                w.discard(n)
                                if not w:
                                    del waiting[d]
                                    heapq.heappush(ready, (max(vt, by_name[d].arrive), order[d], d))
                    if st.node:
                        open_.discard(n)
                    if n in timed:
                        if st.node and st.phase not in TERMINAL and not st.deleted:
                            running.add(n)
                        else:
                            running.discard(n)
                    if virtual:
                        if st.node and n not in bound_at:
                            bound_at[n] = vt
                            where[n] = st.node
                            start = gangs.bind(n, vt)
                            if start is not None:
                                _start_together(start, vt, by_name, where, bound_at, runtime, timed, result,
                                                lambda end, m: heapq.heappush(ends, (end, order[m], m)))
                        if st.phase in TERMINAL or st.deleted:
                            finishing.discard(n)
                running_timed = len(running)
            undecided = sum(1 for n in open_ if not (states.get(n) and states[n].unschedulable))
            dt = now - last
            last = now
            if virtual:
                # Jump to the next event once nothing is in flight (module docstring).
                due = bool(ready) and ready[0][0] <= vt
                parked = any(states.get(n) and states[n].unschedulable for n in open_)
                idle = now - quiet_since
                if parked:
                    # Retries of unschedulable pods are invisible in the pods until one binds:
                    # wait until kube-scheduler's active and backoff queues are empty (every
                    # retry made and failed again), or retry_settle_s without news at most.
                    quiet = idle >= retry_settle_s or (idle >= PARKED_QUIET_S and scheduler_queues_idle(cp))
                    if quiet and admission_idle is not None:
                        if idle < ADMISSION_SETTLE_S:
                            # The pods this driver has seen bound: a bind the controller's answer
                            # rests on but the watch has not delivered yet keeps the clock here.
                            quiet = admission_idle(where.keys())
                            admission_said_idle = quiet
                        else:
                            admission_said_idle = False
                else:
                    quiet = idle >= quiet_s
                if not due and undecided == 0 and not finishing and quiet:
                    if len(created) >= next_sample:
                        take_sample(now, states)
                        next_sample = (len(created) // every + 1) * every
                    events = [t for t in (ready[0][0] if ready else None, ends[0][0] if ends else None)
                              if t is not None]
                    events += [dl for n in open_ if (dl := by_name[n].deadline) is not None]
                    stuck = gangs.waiting()
                    if not events and stuck and not ready and not waiting \
                            and len(created) == len(trace) and not ends:
                        # Nothing can happen any more: members hold GPUs waiting for members that
                        # can never bind. A real cluster would hold them so forever.
                        result.gang_deadlocks = len(stuck)
                        break
                    if events:
                        waits.check(vt, created, by_name, states)
                        if admission_idle is not None and parked and not admission_said_idle:
                            # Moving on without the admission controller's word: counted, so a
                            # result says whether its clock ever outran the controller.
                            result.admission_settle_timeouts += 1
                        nxt = max(vt, min(events))
                        if nxt > vt:
                            smp, over = _sample(len(created), vt, now - t0, caps, by_name, states)
                            weighted.add(smp, nxt - vt)
                            result.overcommits.extend(over)
                        vt = nxt
                        while ends and ends[0][0] <= vt:
                            _, _, name = heapq.heappop(ends)
                            if _finish_now(core, namespace, name):
                                finishing.add(name)
                        quiet_since = now
            else:
                # Advance the clock unless back-pressured; jump idle gaps.
                blocked = bool(ready) and ready[0][0] <= vt and undecided >= window
                if not blocked:
                    vt += dt * speed
                    if ready and undecided == 0 and running_timed == 0 and ready[0][0] > vt:
                        vt = ready[0][0]
            # Create what is due.
            while ready and ready[0][0] <= vt and undecided < window:
                _, _, name = heapq.heappop(ready)
                p = by_name[name]
                manifest = copy.deepcopy(p.manifest)
                manifest["metadata"].pop("uid", None)
                manifest["metadata"].pop("namespace", None)
                manifest.pop("status", None)
                if p.duration is not None and not virtual:
                    manifest["metadata"].setdefault("annotations", {}).update(
                        complete_after(p.duration / speed)
                    )
                create_pod(core, namespace, manifest)
                created[name] = vt
                open_.add(name)
                undecided += 1
                if not virtual and (len(created) % every == 0 or len(created) == len(trace)):
                    take_sample(now, tracker.snapshot())
            # Pods that gave up waiting.
            for name in [n for n in open_ if (dl := by_name[n].deadline) is not None and vt >= dl]:
                open_.discard(name)
                expired.add(name)
                try:
                    core.delete_namespaced_pod(name, namespace, grace_period_seconds=0, _preload_content=False)
                except ApiException as exc:
                    if exc.status != 404:
                        raise
            # Done: everything created, decided, and every timed pod finished or gave up.
            all_in = len(created) == len(trace) and not ready and not waiting
            if all_in and undecided == 0 and (running_timed == 0 or (not drain and not open_)):
                settled_since = settled_since or now
                # A few seconds for retries of unschedulable pods after the last departures.
                if now - settled_since >= settle_s:
                    break
            else:
                settled_since = None
            tracker.wait_news(seen_version, 0.05)
        states = tracker.snapshot()
        for name, st in states.items():
            if st.node:
                history.setdefault(st.node, set()).add(name)
        take_sample(time.monotonic(), states)
    finally:
        tracker.stop()
    result.wall_s = time.monotonic() - t0
    result.trace_span_s = vt
    if virtual:
        result.time_weighted = weighted.figures()
        result.bound_at = bound_at
        result.created_at = dict(created)
        result.gangs_started = len(gangs.started)
        result.gang_waits = waits.table(result.started_at, by_name)
        # Members of gangs that never started held their GPUs from their bind to the end.
        for members in gangs.waiting().values():
            for m, at in members.items():
                result.idle_held_gpu_s += pod_gpus(by_name[m].manifest) * (vt - at)
    for p in trace:
        s = states.get(p.name)
        g = pod_gpus(p.manifest)
        if s is not None and s.node:
            result.placed += 1
            result.gpus_placed += g
            result.placements[p.name] = s.node
            result.completed += s.phase == "Succeeded"
        else:
            result.failed += 1
            if g:
                result.gpu_pods_failed += 1
                result.gpus_failed += g
    result.unknown_nodes = sorted({n for n in result.placements.values() if n not in caps})
    result.max_nodes_reused = sum(
        1 for node, names in history.items()
        if caps.get(node) and caps[node].gpus and sum(1 for n in names if pod_gpus(by_name[n].manifest) and
                                                      states.get(n) and states[n].phase == "Succeeded") >= 2
    )
    if variant == "ours":
        after = agreement(cp)
        if after is not None:
            result.agreement = {k: after[k] - (before or {}).get(k, 0.0) for k in after}
    return result


def _start_together(
    members: list[str], vt: float, by_name: dict[str, ReplayPod], where: dict[str, str],
    bound_at: dict[str, float],
    runtime: Callable[[ReplayPod, str, dict[str, str]], float] | None, timed: set[str],
    result: ReplayResult, push: Callable[[float, str], None],
) -> None:
    """Start ``members`` (one pod, or a whole gang) at ``vt``: each runs as long as the slowest of
    them on the nodes they got (lockstep), and members bound earlier held their GPUs idle until now."""
    runs = [m for m in members if m in timed]
    if not runs:
        return

    def seconds(m: str) -> float:
        p = by_name[m]
        return runtime(p, where[m], where) if runtime is not None else (p.duration or 0.0)

    span = max(seconds(m) for m in runs)
    for m in runs:
        result.started_at[m] = vt
        result.ran_s[m] = span
        result.idle_held_gpu_s += pod_gpus(by_name[m].manifest) * (vt - bound_at.get(m, vt))
        push(vt + span, m)


PARKED_QUIET_S = 0.3
# The longest the virtual clock waits on an admission controller that does not report idle (its
# metrics unreadable, or it stalls): long enough for a loaded 2-core machine, short of a hang.
ADMISSION_SETTLE_S = 30.0
PENDING_METRIC = "scheduler_pending_pods"


def scheduler_queues_idle(cp: ControlPlane) -> bool:
    """True when kube-scheduler has no pod in its active or backoff queue (its own metric); False
    when it holds one, or its metrics cannot be read."""
    try:
        text = httpx.get(f"https://127.0.0.1:{cp.ports.scheduler}/metrics", verify=False, timeout=2).text
    except httpx.HTTPError:
        return False
    queued = [metric_value(text, PENDING_METRIC, {"queue": q}) for q in ("active", "backoff")]
    return all(v is not None for v in queued) and not any(queued)


def _finish_now(core: CoreV1Api, namespace: str, name: str) -> bool:
    """Tell kwok to finish ``name`` now (its pod-complete stage fires on the annotation); False when
    the pod is already gone."""
    try:
        core.patch_namespaced_pod(name, namespace, {"metadata": {"annotations": complete_after(0.0)}})
    except ApiException as exc:
        if exc.status == 404:
            return False
        raise
    return True
