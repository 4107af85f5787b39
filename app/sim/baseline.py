"""kube-scheduler's default placement, for comparisons in the simulator and benchmarks.

What the default profile (v1.36 defaults) does for a pod with no affinity, tolerations, spread
constraints or images on the nodes, which is every pod the benchmarks generate:

* Filter: NodeUnschedulable, then NodeResourcesFit (pod count, CPU, memory and every extended resource
  such as ``nvidia.com/gpu``: the pod's request must fit into allocatable minus what bound pods
  request). NodeAffinity, TaintToleration, NodePorts, volume and spread filters pass every node here.
* Score: NodeResourcesFit with the LeastAllocated strategy (weight 1) over cpu and memory (weight 1
  each — GPUs are not scored by default) using *non-zero* requests (a container without a CPU or
  memory request counts as 100m / 200 MiB), plus NodeResourcesBalancedAllocation (weight 1) over cpu
  and memory using actual requests, scored as the change in balance the pod brings (skipped for
  best-effort pods). TaintToleration, NodeAffinity, PodTopologySpread (no default constraints apply
  to bare pods), InterPodAffinity and ImageLocality give every node the same score, so they cannot
  change the choice and are left out.
* Select: highest total; ties broken at random (kube-scheduler draws a random number per node).
* ``percentageOfNodesToScore``: below 100 nodes every feasible node is scored; above, the adaptive
  default (50% - nodes/125, at least 5% and 100 nodes) stops the filter after that many feasible
  nodes, starting where the previous cycle stopped.

Integer arithmetic follows the Go code (``pkg/scheduler/framework/plugins/noderesources``) so scores
tie exactly where the real scheduler's tie. Approximation: non-zero requests are applied per pod, not
per container (identical when every container states its requests, as the generated pods do).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from app.core.snapshot import ClusterSnapshot, PlacedPod
from app.core.workload import WorkloadError, WorkloadSpec, parse_workload, pod_resources
from app.sim.scheduler import Placement

MAX_NODE_SCORE = 100
DEFAULT_MILLI_CPU_REQUEST = 100  # schedutil.DefaultMilliCPURequest
DEFAULT_MEMORY_REQUEST = 200 * 1024 * 1024  # schedutil.DefaultMemoryRequest
MIN_FEASIBLE_NODES_TO_FIND = 100
MIN_FEASIBLE_NODES_PERCENTAGE_TO_FIND = 5


@dataclass(frozen=True, slots=True)
class _Req:
    gpus: int
    cpu: int  # millicores
    mem: int  # bytes


def _nonzero(cpu: int, mem: int) -> tuple[int, int]:
    return (cpu or DEFAULT_MILLI_CPU_REQUEST, mem or DEFAULT_MEMORY_REQUEST)


def least_allocated(requested: Sequence[int], allocatable: Sequence[int]) -> int:
    """leastResourceScorer with weight 1 per resource."""
    score = weight_sum = 0
    for req, cap in zip(requested, allocatable, strict=True):
        if cap == 0:
            continue
        score += 0 if req > cap else ((cap - req) * MAX_NODE_SCORE) // cap
        weight_sum += 1
    return score // weight_sum if weight_sum else 0


def _balance(requested: Sequence[int], allocatable: Sequence[int]) -> int:
    fractions = [min(1.0, r / a) for r, a in zip(requested, allocatable, strict=True) if a != 0]
    std = 0.0
    if len(fractions) == 2:
        std = abs((fractions[0] - fractions[1]) / 2)
    elif len(fractions) > 2:
        mean = sum(fractions) / len(fractions)
        std = (sum((f - mean) ** 2 for f in fractions) / len(fractions)) ** 0.5
    return int((1 - std) * MAX_NODE_SCORE)


def balanced_allocation(
    requested: Sequence[int], allocated: Sequence[int], allocatable: Sequence[int]
) -> int:
    """balancedResourceScorer: the balance after the pod relative to before, in [50, 100]."""
    with_pod = _balance(requested, allocatable)
    without = _balance(allocated, allocatable)
    # Go's int64 division truncates toward zero; int(x / 2) does the same for either sign.
    return MAX_NODE_SCORE // 2 + int((MAX_NODE_SCORE // 2 + with_pod - without) / 2)


def num_feasible_nodes_to_find(num_all: int, percentage: int | None = None) -> int:
    """How many feasible nodes kube-scheduler looks for before it stops filtering."""
    if num_all < MIN_FEASIBLE_NODES_TO_FIND:
        return num_all
    pct = percentage
    if pct is None or pct <= 0:
        pct = max(MIN_FEASIBLE_NODES_PERCENTAGE_TO_FIND, 50 - num_all // 125)
    return max(num_all * pct // 100, MIN_FEASIBLE_NODES_TO_FIND)


class DefaultScheduler:
    """The default profile over a ClusterSnapshot; same ``admit``/``schedule`` shape as SimScheduler."""

    def __init__(
        self,
        snapshot: ClusterSnapshot,
        *,
        seed: int = 0,
        gpu_resources: tuple[str, ...] = ("nvidia.com/gpu", "amd.com/gpu"),
        percentage_of_nodes_to_score: int | None = None,
    ) -> None:
        self.snapshot = snapshot
        self.rng = random.Random(seed)
        self.gpu_resources = gpu_resources
        self.percentage = percentage_of_nodes_to_score
        self._next_start = 0

    def admit(self, pods: list[dict[str, Any]]) -> None:
        """Record specs the way the extender's watch would, so shared quality code can read gangs."""
        for pod in pods:
            try:
                self.snapshot.track_spec(parse_workload(pod, self.gpu_resources))
            except WorkloadError:
                continue

    # --- plugins -----------------------------------------------------------------------------
    def fits(self, req: _Req, node: str) -> bool:
        facts = self.snapshot.nodes[node]
        u = self.snapshot.usage.get(node)
        used_pods = len(u.pods) if u else 0
        used_gpu = u.gpus if u else 0
        used_cpu = u.cpu_millis if u else 0.0
        used_mem = u.memory_bytes if u else 0.0
        if facts.unschedulable or used_pods + 1 > facts.pods:
            return False
        if req.cpu > 0 and req.cpu > facts.cpu_millis - used_cpu:
            return False
        if req.mem > 0 and req.mem > facts.memory_bytes - used_mem:
            return False
        return not (req.gpus > 0 and req.gpus > facts.gpu_count - used_gpu)

    def score(self, req: _Req, node: str) -> int:
        facts = self.snapshot.nodes[node]
        u = self.snapshot.usage.get(node)
        pods: list[PlacedPod] = list(u.pods.values()) if u else []
        alloc = [int(facts.cpu_millis), int(facts.memory_bytes)]
        nz_cpu, nz_mem = _nonzero(req.cpu, req.mem)
        node_nz = [0, 0]
        for p in pods:
            c, m = _nonzero(int(p.cpu_millis), int(p.memory_bytes))
            node_nz[0] += c
            node_nz[1] += m
        least = least_allocated([node_nz[0] + nz_cpu, node_nz[1] + nz_mem], alloc)
        if req.cpu == 0 and req.mem == 0:
            balanced = 0  # PreScore returns Skip for best-effort pods: the plugin adds nothing
        else:
            used = [int(sum(p.cpu_millis for p in pods)), int(sum(p.memory_bytes for p in pods))]
            balanced = balanced_allocation([used[0] + req.cpu, used[1] + req.mem], used, alloc)
        return least + balanced

    # --- one scheduling cycle ----------------------------------------------------------------
    def schedule(self, pod: dict[str, Any]) -> Placement:
        meta = pod.get("metadata") or {}
        key = f"{meta.get('namespace') or 'default'}/{meta.get('name')}"
        spec: WorkloadSpec | None
        try:
            spec = parse_workload(pod, self.gpu_resources)
        except WorkloadError:
            spec = None  # the default scheduler never reads our annotations
        try:
            gpus, cpu, mem = pod_resources(pod, self.gpu_resources)
        except ValueError as exc:
            return Placement(key, None, None, f"invalid resources: {exc}")
        req = _Req(gpus, int(cpu), int(mem))
        stage = spec.stage.value if spec and spec.stage else None

        names = sorted(self.snapshot.nodes)
        if not names:
            return Placement(key, stage, None, "no nodes")
        want = num_feasible_nodes_to_find(len(names), self.percentage)
        feasible: list[str] = []
        start = self._next_start % len(names)
        processed = 0
        for i in range(len(names)):
            name = names[(start + i) % len(names)]
            processed += 1
            if self.fits(req, name):
                feasible.append(name)
                if len(feasible) >= want:
                    break
        self._next_start = (start + processed) % len(names)
        if not feasible:
            return Placement(key, stage, None, f"0/{len(names)} nodes: insufficient resources")

        best: str | None = None
        best_score = -1
        best_rand = -1
        for name in feasible:
            s = self.score(req, name)
            r = self.rng.getrandbits(62)
            if s > best_score or (s == best_score and r > best_rand):
                best, best_score, best_rand = name, s, r
        assert best is not None
        if spec is not None:
            self.snapshot.assume(spec, best)
        else:
            uid = str(meta.get("uid") or key)
            self.snapshot.place(PlacedPod(uid, key, best, gpus, cpu, mem, None, None, None, assumed=True))
        return Placement(key, stage, best, "")
