"""Soak with faults: thousands of pods of every stage on kwok nodes while components are killed.

Used by bench/soak.py (the full run, ``make soak``) and tests/integration/test_soak.py (a small run
in CI). One control plane of its own (it kills etcd and kube-apiserver, which the suite's shared
control plane must survive untouched). kwok manages the nodes (kubeharness/kwok.py,
node stage only: ``Kwok(..., pod_stages=False)``) and the soak itself plays the pods' kubelet: a
bound pod is marked Succeeded once its duration has passed, so capacity turns over all the time.
Why not kwok's pod stages: its client asks for watch-list streams, which this etcd (3.5.1, no
RequestWatchProgress) cannot serve, and every refusal backs its pod watch off, from the start and
for a minute and more after each outage; finishing the late pods from here raced kwok, which then
wrote a stale Running over a Succeeded pod (a finished pod running again, counted twice). One
writer of pod status, on time through every outage, keeps the invariants about the scheduler.

The workload (``make_jobs``, a fixed seed), every pod pinned by ``nodeSelector`` to one node pool so
that "capacity exists" is exact:

* data-prep CPU pods (pool ``cpu``);
* 1-GPU serving pods, 7B at int8 (pool ``l4``) and 1-GPU LoRA alignment pods (pool ``a100``);
* gangs of 2-3 pretraining members of 8 GPUs (pool ``h100``, RDMA, two fabric leaves), named by the
  ``scheduling.x-k8s.io/pod-group`` label with ``llm-placement.io/gang-size`` (docs/gangs.md);
* pipelines: a data-prep producer, then (once it has Succeeded) an alignment consumer with
  ``llm-placement.io/depends-on`` naming it (docs/data-gravity.md).

Admission: a job is created only when the pods of its pool that are created and not finished, plus
its own, fit the pool at once (GPUs for GPU pools, CPU for the CPU pool; gang members take whole
8-GPU nodes). So every created pod has room the moment the pods before it are placed, and a pod
still Pending ``pending_bound_s`` after its creation is a failure of the scheduler, not of the load.

Poison: a pod in another namespace for a scheduler nobody runs with ``nvidia.com/gpu: "1e400"``
(docs/extender-protocol.md, what a bad object costs), one of ours with the same, and one of ours with
an invalid ``model-params``. They must stay unbound and cost nothing else.

Faults: every ``fault_interval_s`` the next of extender, kube-scheduler, kube-apiserver, etcd is
killed with SIGKILL, kept down ``down_s`` and started again on the same ports and data.

Invariants (docs/extender-protocol.md, Targets; docs/gangs.md, Guarantees), checked on every change
the pod watch brings and again at the end:

* no node holds more GPUs (or CPU) than it has, counting bound pods that have not finished;
* no gang partly bound: members ever bound is 0 or the gang's size, allowed to differ only while a
  bind round is under way (``gang_grace_s``) and never at the end;
* no pod bound twice: its node never changes, and kube-scheduler wrote at most one ``Scheduled``
  event for it;
* no pod Pending past ``pending_bound_s`` after its creation (capacity always exists, see above);
* at the end: every non-poison pod has Succeeded or is bound, the poison pods are unbound, and the
  extender holds no gang reservation (``llm_placement_reserved_gpus`` is 0).
"""

from __future__ import annotations

import json
import random
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from functools import partial
from typing import Any

from kubernetes.client import CoreV1Api
from kubernetes.client.rest import ApiException

from .controlplane import ControlPlane, ensure_namespace, metric_value
from .kwok import COMPLETE_AFTER, Kwok, complete_after, kwok_node_labels
from .objects import ANN, GPU_RESOURCE, cpu_node, create_nodes, gpu_node, llm_pod
from .podwatch import list_then_watch
from .procs import wait_until
from .rawapi import send

POOL = "soak.llm-placement.io/pool"
GANG_LABEL = "scheduling.x-k8s.io/pod-group"
SOAK_LABEL = "soak.llm-placement.io/run"
FAULTS = ("extender", "kube-scheduler", "kube-apiserver", "etcd")
GANG_MEMBER_GPUS = 8
POOL_CPU_MILLI = 64_000


# ----- the cluster and the workload ----------------------------------------------------------------
@dataclass(frozen=True)
class SoakShape:
    """How big a run is: node pools, pods and faults."""

    h100_nodes: int = 4
    l4_nodes: int = 2
    a100_nodes: int = 2
    cpu_nodes: int = 2
    pods: int = 150
    fault_interval_s: float = 12.0
    down_s: float = 2.0
    fault_rounds: int = 1  # each round kills every component of FAULTS once
    min_duration_s: float = 1.0
    max_duration_s: float = 4.0
    pending_bound_s: float = 120.0
    gang_grace_s: float = 15.0
    seed: int = 12
    timeout_s: float = 900.0


def soak_nodes(prefix: str, shape: SoakShape) -> list[dict[str, Any]]:
    kw = kwok_node_labels()
    nodes: list[dict[str, Any]] = []
    i = 0
    for k in range(shape.h100_nodes):
        i += 1
        nodes.append(gpu_node(f"{prefix}-h100-{k}", "H100", gpus=8, rdma=True, tier0=f"leaf-{k % 2}",
                              tier1="spine-1", labels={**kw, POOL: "h100"}, index=i))
    for k in range(shape.l4_nodes):
        i += 1
        nodes.append(gpu_node(f"{prefix}-l4-{k}", "L4", gpus=8, labels={**kw, POOL: "l4"}, index=i))
    for k in range(shape.a100_nodes):
        i += 1
        nodes.append(gpu_node(f"{prefix}-a100-{k}", "A100", gpus=8, labels={**kw, POOL: "a100"}, index=i))
    for k in range(shape.cpu_nodes):
        i += 1
        nodes.append(cpu_node(f"{prefix}-cpu-{k}", cpu=str(POOL_CPU_MILLI // 1000),
                              labels={**kw, POOL: "cpu"}, index=i))
    return nodes


@dataclass
class Job:
    """Pods created together (a gang's members, or one pod); ``after`` names a job to wait for."""

    name: str
    kind: str  # dataprep, serving, alignment, gang, pipeline-producer, pipeline-consumer
    pool: str
    pods: list[dict[str, Any]]
    after: str | None = None

    def demand(self) -> int:
        """GPUs (GPU pools) or CPU millicores (CPU pool) the job holds while it runs."""
        if self.pool == "cpu":
            return sum(_cpu_milli(p) for p in self.pods)
        return sum(_gpus(p) for p in self.pods)


def _gpus(pod: dict[str, Any]) -> int:
    total = 0
    for c in pod["spec"].get("containers") or []:
        total += int(((c.get("resources") or {}).get("requests") or {}).get(GPU_RESOURCE, "0"))
    return total


def _cpu_milli(pod: dict[str, Any]) -> int:
    total = 0
    for c in pod["spec"].get("containers") or []:
        q = str(((c.get("resources") or {}).get("requests") or {}).get("cpu", "0"))
        total += int(q[:-1]) if q.endswith("m") else int(float(q) * 1000)
    return total


def _pinned(pod: dict[str, Any], pool: str, run: str, seconds: float) -> dict[str, Any]:
    pod["spec"]["nodeSelector"] = {POOL: pool}
    pod["metadata"]["labels"][SOAK_LABEL] = run
    pod["metadata"]["annotations"].update(complete_after(seconds))
    return pod


def make_jobs(shape: SoakShape, run: str) -> list[Job]:
    """About ``shape.pods`` pods in jobs of every kind, in creation order (a fixed seed)."""
    rng = random.Random(shape.seed)
    jobs: list[Job] = []
    count = 0
    n = 0

    def dur() -> float:
        return rng.uniform(shape.min_duration_s, shape.max_duration_s)

    while count < shape.pods:
        n += 1
        kind = rng.choices(("dataprep", "serving", "alignment", "gang", "pipeline"), (22, 30, 16, 12, 20))[0]
        name = f"{run}-{kind[:4]}-{n:05d}"
        if kind == "dataprep":
            pod = llm_pod(name, stage="data-prep", cpu="4", memory="8Gi")
            jobs.append(Job(name, kind, "cpu", [_pinned(pod, "cpu", run, dur())]))
            count += 1
        elif kind == "serving":
            pod = llm_pod(name, stage="serving", model_params="7B", precision="int8", gpus=1)
            jobs.append(Job(name, kind, "l4", [_pinned(pod, "l4", run, dur())]))
            count += 1
        elif kind == "alignment":
            pod = llm_pod(name, stage="alignment", model_params="7B", gpus=1,
                          annotations={ANN + "finetune-method": "lora"})
            jobs.append(Job(name, kind, "a100", [_pinned(pod, "a100", run, dur())]))
            count += 1
        elif kind == "gang":
            size = rng.choice((2, 2, 3))
            d = dur()
            members = [
                _pinned(llm_pod(f"{name}-{i}", stage="pretraining", gpus=GANG_MEMBER_GPUS,
                                annotations={ANN + "gang-size": str(size)},
                                labels={GANG_LABEL: name}), "h100", run, d)
                for i in range(size)
            ]
            jobs.append(Job(name, kind, "h100", members))
            count += size
        else:
            prod = llm_pod(f"{name}-prep", stage="data-prep", cpu="4", memory="8Gi")
            jobs.append(Job(f"{name}-prep", "pipeline-producer", "cpu", [_pinned(prod, "cpu", run, dur())]))
            cons = llm_pod(f"{name}-tune", stage="alignment", model_params="7B", gpus=1,
                           annotations={ANN + "finetune-method": "lora", ANN + "depends-on": f"{name}-prep",
                                        ANN + "input-data-gb": "50"})
            jobs.append(Job(f"{name}-tune", "pipeline-consumer", "a100", [_pinned(cons, "a100", run, dur())],
                            after=f"{name}-prep"))
            count += 2
    return jobs


def poison_pods(run: str) -> list[tuple[bool, dict[str, Any]]]:
    """(in the other namespace?, manifest) of the pods that must stay unbound and cost only themselves."""
    out: list[tuple[bool, dict[str, Any]]] = []
    for other, scheduler in ((True, "nobody-runs-this-scheduler"), (False, "llm-placement")):
        pod = llm_pod(f"{run}-poison-{'other' if other else 'ours'}", scheduler_name=scheduler,
                      labels={SOAK_LABEL: run + "-poison"})
        pod["spec"]["containers"][0]["resources"] = {
            "requests": {GPU_RESOURCE: "1e400"}, "limits": {GPU_RESOURCE: "1e400"}}
        out.append((other, pod))
    bad = llm_pod(f"{run}-poison-annotation", stage="serving", model_params="70Q", gpus=1,
                  labels={SOAK_LABEL: run + "-poison"})
    out.append((False, bad))
    return out


# ----- pods as the API reports them (a watch that survives the API server's restarts) ---------------
@dataclass
class PodRecord:
    created: float  # wall time the soak created it (monotonic)
    gpus: int
    cpu_milli: int
    gang: str | None
    pool: str
    duration: float
    node: str | None = None
    nodes_seen: set[str] = field(default_factory=set)
    bound_at: float | None = None
    phase: str = "Pending"
    deleted: bool = False


class ResilientTracker(threading.Thread):
    """List + watch the soak namespace; on any error (the API server or etcd killed) list again.

    Keeps every node a pod was ever seen on: a relist after an outage cannot hide a re-bind.
    ``on_change`` runs under the lock after each batch of events.
    """

    def __init__(self, core: CoreV1Api, namespace: str, records: dict[str, PodRecord],
                 on_change: Callable[[], None]) -> None:
        super().__init__(daemon=True, name=f"soak-watch-{namespace}")
        self.core, self.namespace, self.records, self.on_change = core, namespace, records, on_change
        self.lock = threading.Lock()
        self.stop_event = threading.Event()
        self.relists = 0
        self.synced = threading.Event()

    def _see(self, pod: dict[str, Any], deleted: bool = False) -> None:
        rec = self.records.get(pod["metadata"]["name"])
        if rec is None:  # a poison pod or a pod the soak has not recorded yet (it records first)
            return
        node = pod["spec"].get("nodeName")
        if node:
            rec.nodes_seen.add(node)
            if rec.bound_at is None:
                rec.bound_at = time.monotonic()
            rec.node = rec.node or node
        rec.phase = (pod.get("status") or {}).get("phase") or rec.phase
        rec.deleted = rec.deleted or deleted

    def run(self) -> None:
        def listed(items: list[dict[str, Any]]) -> None:
            with self.lock:
                for p in items:
                    self._see(p)
                self.on_change()
            self.relists += 1
            self.synced.set()

        def changed(kind: str, pod: dict[str, Any]) -> None:
            with self.lock:
                self._see(pod, deleted=kind == "DELETED")
                self.on_change()

        while not self.stop_event.is_set():
            try:
                list_then_watch(self.core, self.namespace, on_list=listed, on_event=changed,
                                stop=self.stop_event.is_set, watch_timeout_s=10, request_timeout=(5, 20))
            except Exception:  # the API server or etcd is down: list again shortly
                if self.stop_event.wait(0.5):
                    return

    def stop(self) -> None:
        self.stop_event.set()
        self.join(timeout=40)


# ----- results ---------------------------------------------------------------------------------------
@dataclass
class SoakResult:
    pods: int = 0  # non-poison pods created
    jobs: int = 0
    gangs: int = 0
    pipelines: int = 0
    placed: int = 0
    completed: int = 0
    faults: dict[str, int] = field(default_factory=dict)
    violations: dict[str, int] = field(default_factory=lambda: {
        "gpu_overcommit": 0, "cpu_overcommit": 0, "gang_partial": 0, "rebound": 0,
        "scheduled_twice": 0, "pending_past_bound": 0, "unfinished": 0, "poison_bound": 0,
        "reservations_left": 0})
    examples: list[str] = field(default_factory=list)
    max_pending_s: float = 0.0
    p50_time_to_bind_s: float = 0.0
    p99_time_to_bind_s: float = 0.0
    wall_s: float = 0.0
    reserved_gpus_end: float | None = None
    tracker_relists: int = 0
    shape: dict[str, Any] = field(default_factory=dict)

    @property
    def total_violations(self) -> int:
        return sum(self.violations.values())

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["total_violations"] = self.total_violations
        return out


class Checker:
    """The invariants, re-evaluated by the tracker on every change (under its lock)."""

    def __init__(self, records: dict[str, PodRecord], caps: dict[str, tuple[int, int]],
                 gang_sizes: dict[str, int], shape: SoakShape, result: SoakResult) -> None:
        self.records, self.caps, self.gang_sizes = records, caps, gang_sizes
        self.shape, self.result = shape, result
        self.partial_since: dict[str, float] = {}
        self.last = 0.0
        self.flagged: set[tuple[str, str]] = set()  # (violation, subject): each counted once

    def _flag(self, kind: str, subject: str, detail: str) -> None:
        if (kind, subject) in self.flagged:
            return
        self.flagged.add((kind, subject))
        self.result.violations[kind] += 1
        if len(self.result.examples) < 20:
            self.result.examples.append(f"{kind}: {detail}")

    def __call__(self, force: bool = False) -> None:
        # A full pass over every pod; at most every 0.2 s (a burst of watch events must not take a
        # core from the control plane). An over-commit lasts until a pod finishes, seconds, so a
        # 0.2 s sample sees it; the end of the run checks once more with force.
        now = time.monotonic()
        if not force and now - self.last < 0.2:
            return
        self.last = now
        gpu: Counter[str] = Counter()
        cpu: Counter[str] = Counter()
        bound_members: Counter[str] = Counter()
        for name, r in self.records.items():
            if len(r.nodes_seen) > 1:
                self._flag("rebound", name, f"{name} seen on {sorted(r.nodes_seen)}")
            if r.node:
                if r.gang:
                    bound_members[r.gang] += 1
                if not r.deleted and r.phase not in ("Succeeded", "Failed"):
                    gpu[r.node] += r.gpus
                    cpu[r.node] += r.cpu_milli
        for node, used in gpu.items():
            if used > self.caps.get(node, (0, 0))[0]:
                self._flag("gpu_overcommit", node, f"{node}: {used}/{self.caps.get(node, (0, 0))[0]} GPUs")
        for node, used in cpu.items():
            if used > self.caps.get(node, (0, 0))[1]:
                self._flag("cpu_overcommit", node, f"{node}: {used}/{self.caps.get(node, (0, 0))[1]} mCPU")
        for gang, size in self.gang_sizes.items():
            b = bound_members.get(gang, 0)
            if 0 < b < size:
                since = self.partial_since.setdefault(gang, now)
                if now - since > self.shape.gang_grace_s:
                    self._flag("gang_partial", gang, f"{gang}: {b}/{size} members bound for {now - since:.0f} s")
            else:
                self.partial_since.pop(gang, None)

    def pending(self, final: bool = False) -> None:
        now = time.monotonic()
        for name, r in self.records.items():
            if r.node or r.deleted:
                continue
            age = now - r.created
            self.result.max_pending_s = max(self.result.max_pending_s, age)
            if age > self.shape.pending_bound_s:
                self._flag("pending_past_bound", name, f"{name} Pending {age:.0f} s")
            elif final:
                self._flag("unfinished", name, f"{name} neither bound nor finished at the end")
        if final:
            for gang, size in self.gang_sizes.items():
                b = sum(1 for r in self.records.values() if r.gang == gang and r.node)
                if 0 < b < size:
                    self._flag("gang_partial", gang, f"{gang}: {b}/{size} members bound at the end")


# ----- the run ---------------------------------------------------------------------------------------
class Faults:
    """Kill -9 and restart one component of the control plane, each on its own ports and data."""

    def __init__(self, cp: ControlPlane, kwok: Kwok, shape: SoakShape, result: SoakResult,
                 log: Callable[[str], None]) -> None:
        self.cp, self.kwok, self.shape, self.result, self.log = cp, kwok, shape, result, log
        self.plan = list(FAULTS) * shape.fault_rounds
        self.next_at: float | None = None

    def due(self, now: float) -> bool:
        if not self.plan:
            return False
        if self.next_at is None:
            self.next_at = now + self.shape.fault_interval_s
        return now >= self.next_at

    def inject(self) -> None:
        what = self.plan.pop(0)
        cp = self.cp
        comp = {"extender": cp.extender, "kube-scheduler": cp.scheduler, "kube-apiserver": cp.apiserver,
                "etcd": cp.etcd}[what]
        assert comp is not None
        t0 = time.monotonic()
        comp.kill()
        time.sleep(self.shape.down_s)
        if what == "extender":
            cp.start_extender()
        elif what == "kube-scheduler":
            cp.start_scheduler()
        elif what == "kube-apiserver":
            cp.start_apiserver()
        else:
            cp.start_etcd()
        if what in ("kube-apiserver", "etcd"):
            # After an etcd restart the API server reconnects on its own; the next fault waits for it.
            wait_until(lambda: _api_ready(cp), 60, "kube-apiserver to answer after the fault")
        self.result.faults[what] = self.result.faults.get(what, 0) + 1
        self.log(f"fault: killed {what} (-9), back after {time.monotonic() - t0:.1f} s")
        self.next_at = time.monotonic() + self.shape.fault_interval_s


def _api_ready(cp: ControlPlane) -> bool:
    try:
        cp.core.list_namespace(limit=1, _request_timeout=3)
        return True
    except Exception:
        return False


def _retry(fn: Callable[[], Any], what: str, timeout: float = 120.0) -> Any:
    """Call the API through an outage: connection errors and 5xx are retried, 409 means done."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return fn()
        except ApiException as exc:
            if exc.status == 409:
                return None
            if exc.status not in (0, 429, 500, 502, 503, 504) or time.monotonic() > deadline:
                raise
        except Exception:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{what}: API unreachable for {timeout:.0f} s") from None
        time.sleep(0.5)


def run_soak(cp: ControlPlane, kwok: Kwok, namespace: str, shape: SoakShape, *,
             log: Callable[[str], None] = lambda s: None,
             on_progress: Callable[[int, int], None] | None = None) -> SoakResult:
    """Run the soak in ``namespace`` (created here) on nodes it creates; return counts and violations.

    The caller has started the control plane and kwok (``pod_stages=False``); they are left running
    (faults restart the control plane's components).
    """
    core = cp.core
    result = SoakResult(shape=asdict(shape))
    run = namespace
    ensure_namespace(core, namespace)
    other_ns = namespace + "-other"
    ensure_namespace(core, other_ns)
    nodes = soak_nodes(namespace, shape)
    create_nodes(core, nodes)
    caps: dict[str, tuple[int, int]] = {}
    pool_cap: Counter[str] = Counter()
    for n in nodes:
        alloc = n["status"]["allocatable"]
        g = int(alloc.get(GPU_RESOURCE, "0"))
        c = int(alloc["cpu"]) * 1000
        caps[n["metadata"]["name"]] = (g, c)
        pool = n["metadata"]["labels"][POOL]
        pool_cap[pool] += c if pool == "cpu" else g
    cp.wait_extender_cache_nodes(len(nodes), timeout=60)

    jobs = make_jobs(shape, run)
    by_name = {j.name: j for j in jobs}
    gang_sizes = {j.name: len(j.pods) for j in jobs if j.kind == "gang"}
    result.jobs = len(jobs)
    result.gangs = len(gang_sizes)
    result.pipelines = sum(1 for j in jobs if j.kind == "pipeline-producer")
    records: dict[str, PodRecord] = {}
    checker = Checker(records, caps, gang_sizes, shape, result)
    tracker = ResilientTracker(core, namespace, records, checker)

    for other, pod in poison_pods(run):
        ns = other_ns if other else namespace
        _retry(partial(send, core.create_namespaced_pod, ns, pod), "create poison pod")
    tracker.start()
    tracker.synced.wait(30)

    faults = Faults(cp, kwok, shape, result, log)
    queue = [j for j in jobs if j.after is None]
    blocked = {j.name: j for j in jobs if j.after is not None}
    job_pods: dict[str, list[str]] = {j.name: [p["metadata"]["name"] for p in j.pods] for j in jobs}
    done_jobs: set[str] = set()
    created_jobs: set[str] = set()
    t0 = time.monotonic()
    last_pending_check = 0.0
    last_status, status_every_s = t0, 15.0
    finished: set[str] = set()
    try:
        while True:
            now = time.monotonic()
            if now - t0 > shape.timeout_s:
                log(f"timeout after {shape.timeout_s:.0f} s")
                break
            kwok.check_alive()
            if faults.due(now):
                faults.inject()
                continue
            with tracker.lock:
                in_flight: Counter[str] = Counter()
                for jname in created_jobs - done_jobs:
                    names = job_pods[jname]
                    if all(records[n].phase in ("Succeeded", "Failed") or records[n].deleted for n in names):
                        done_jobs.add(jname)
                    else:
                        in_flight[by_name[jname].pool] += by_name[jname].demand()
                for jname in [b for b, j in blocked.items() if j.after in done_jobs]:
                    queue.append(blocked.pop(jname))
                due: list[str] = []
                if now - last_pending_check > 0.5:
                    checker(force=True)
                    checker.pending()
                    last_pending_check = now
                    due = [n for n, r in records.items()
                           if r.bound_at is not None and r.phase not in ("Succeeded", "Failed")
                           and not r.deleted and now - r.bound_at >= r.duration and n not in finished]
            for name in due:
                # The pods' kubelet (see the module docstring): done after its duration.
                try:
                    core.patch_namespaced_pod_status(name, namespace, {"status": {"phase": "Succeeded"}},
                                                     _preload_content=False, _request_timeout=5)
                    finished.add(name)
                except Exception:
                    pass  # the API server is down: next tick
            with tracker.lock:
                if now - last_status >= status_every_s:
                    last_status = now
                    bound = sum(1 for r in records.values() if r.node)
                    done = sum(1 for r in records.values() if r.phase == "Succeeded")
                    log(f"{now - t0:5.0f} s: {len(records)} created, {bound} bound, {done} succeeded; "
                        f"in flight {dict(in_flight)}; violations {result.total_violations}")
            # Create in order; a job that does not fit its pool yet waits, and so do the ones after it
            # in that pool (no overtaking: a gang is never starved by the 1-GPU pods behind it).
            stalled: set[str] = set()
            created_now = 0
            for job in list(queue):
                if job.pool in stalled:
                    continue
                if in_flight[job.pool] + job.demand() > pool_cap[job.pool]:
                    stalled.add(job.pool)
                    continue
                with tracker.lock:
                    for p in job.pods:
                        records[p["metadata"]["name"]] = PodRecord(
                            time.monotonic(), _gpus(p), _cpu_milli(p),
                            p["metadata"]["labels"].get(GANG_LABEL), job.pool,
                            float(p["metadata"]["annotations"][COMPLETE_AFTER].rstrip("s")))
                for p in job.pods:
                    _retry(partial(send, core.create_namespaced_pod, namespace, p), "create pod")
                in_flight[job.pool] += job.demand()
                created_jobs.add(job.name)
                queue.remove(job)
                created_now += len(job.pods)
                result.pods += len(job.pods)
                if on_progress:
                    on_progress(result.pods, sum(len(j.pods) for j in jobs))
            if not queue and not blocked and done_jobs >= created_jobs and not faults.plan:
                break
            time.sleep(0.2 if not created_now else 0.05)
        # Settle: the reservations of the last gangs are released at their bind.
        wall = time.monotonic() - t0
        reserved = None
        for _ in range(60):
            try:
                reserved = metric_value(cp.extender_metrics(), "llm_placement_reserved_gpus")
            except Exception:
                reserved = None
            if reserved == 0:
                break
            time.sleep(1)
        result.reserved_gpus_end = reserved
        if reserved is None or reserved > 0:
            result.violations["reservations_left"] += 1
            result.examples.append(f"reservations_left: llm_placement_reserved_gpus = {reserved}")
        with tracker.lock:
            checker(force=True)
            checker.pending(final=True)
        _final_checks(core, namespace, other_ns, run, records, result)
    finally:
        tracker.stop()
    result.wall_s = wall
    result.tracker_relists = tracker.relists
    result.placed = sum(1 for r in records.values() if r.node)
    result.completed = sum(1 for r in records.values() if r.phase == "Succeeded")
    waits = sorted(r.bound_at - r.created for r in records.values() if r.bound_at is not None)
    if waits:
        result.p50_time_to_bind_s = waits[len(waits) // 2]
        result.p99_time_to_bind_s = waits[min(len(waits) - 1, int(len(waits) * 0.99))]
    return result


def _final_checks(core: CoreV1Api, namespace: str, other_ns: str, run: str,
                  records: dict[str, PodRecord], result: SoakResult) -> None:
    """What only a last look can tell: Scheduled events per pod, and the poison pods still unbound."""
    raw = _retry(lambda: core.list_namespaced_event(
        namespace, field_selector="reason=Scheduled", _preload_content=False), "list events")
    scheduled: Counter[str] = Counter()
    for e in json.loads(raw.data)["items"]:
        scheduled[(e.get("involvedObject") or {}).get("name", "")] += 1
    for name, count in scheduled.items():
        if name in records and count > 1:
            result.violations["scheduled_twice"] += 1
            if len(result.examples) < 20:
                result.examples.append(f"scheduled_twice: {name} has {count} Scheduled events")
    for ns in (namespace, other_ns):
        raw = _retry(partial(send, core.list_namespaced_pod, ns, label_selector=f"{SOAK_LABEL}={run}-poison"),
                     "list poison")
        for p in json.loads(raw.data)["items"]:
            if p["spec"].get("nodeName"):
                result.violations["poison_bound"] += 1
                result.examples.append(f"poison_bound: {p['metadata']['name']} on {p['spec']['nodeName']}")
