"""kube-scheduler's in-tree arithmetic that the simulator models, as integers like the Go code.

What kube-scheduler (v1.36) does for a pod with no affinity, tolerations, spread constraints or
volumes on nodes that carry no images or PreferNoSchedule taints, which is every pod the simulator
and the benchmarks generate:

* Filter: NodeUnschedulable, then NodeResourcesFit (pod count, CPU, memory and every extended resource
  such as ``nvidia.com/gpu``: the pod's request must fit into allocatable minus what bound pods
  request). NodeAffinity, TaintToleration, NodePorts, volume and spread filters pass every node here.
* Score: NodeResourcesFit (default: LeastAllocated over cpu and memory, weight 1 each, on *non-zero*
  requests: a container without a CPU or memory request counts as 100m / 200 MiB; configurable to
  MostAllocated and to extended resources such as ``nvidia.com/gpu``, which are scored on actual
  requests and skipped for pods that do not request them), plus NodeResourcesBalancedAllocation over
  cpu and memory using actual requests, scored as the change in balance the pod brings (skipped for
  best-effort pods). The other default score plugins give every node the same score for such pods
  (see ``app.sim.profile.CONSTANT_PLUGINS``), so they cannot change the choice and are left out.
* ``percentageOfNodesToScore``: below 100 nodes every feasible node is scored; above, the adaptive
  default (50% - nodes/125, at least 5% and 100 nodes) stops the filter after that many feasible
  nodes, starting where the previous cycle stopped.

The scheduling loop that combines these with the extender and breaks ties is ``app.sim.scheduler``;
``DefaultScheduler`` (the default profile, no extender) is importable from here as before.

Integer arithmetic follows the Go code (``pkg/scheduler/framework/plugins/noderesources``) so scores
tie exactly where the real scheduler's tie. Approximation: non-zero requests are applied per pod, not
per container (identical when every container states its requests, as the generated pods do).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from app.snapshot.store import ClusterSnapshot

if TYPE_CHECKING:
    from app.sim.profile import ResourceWeight

MAX_NODE_SCORE = 100
DEFAULT_MILLI_CPU_REQUEST = 100  # schedutil.DefaultMilliCPURequest
DEFAULT_MEMORY_REQUEST = 200 * 1024 * 1024  # schedutil.DefaultMemoryRequest
CPU, MEMORY = "cpu", "memory"


@dataclass(frozen=True, slots=True)
class Req:
    """A pod's requests as kube-scheduler's filter and scorers read them (sum over containers)."""

    gpus: int
    cpu: int  # millicores
    mem: int  # bytes


_Req = Req  # the name earlier callers used


def _nonzero(cpu: int, mem: int) -> tuple[int, int]:
    return (cpu or DEFAULT_MILLI_CPU_REQUEST, mem or DEFAULT_MEMORY_REQUEST)


def least_allocated(
    requested: Sequence[int], allocatable: Sequence[int], weights: Sequence[int] | None = None
) -> int:
    """leastResourceScorer (weight 1 per resource unless given)."""
    return _resource_scorer(requested, allocatable, weights, most=False)


def most_allocated(
    requested: Sequence[int], allocatable: Sequence[int], weights: Sequence[int] | None = None
) -> int:
    """mostResourceScorer: the fuller the node after the pod, the higher (bin-packing)."""
    return _resource_scorer(requested, allocatable, weights, most=True)


def _resource_scorer(
    requested: Sequence[int], allocatable: Sequence[int], weights: Sequence[int] | None, *, most: bool
) -> int:
    ws = list(weights) if weights is not None else [1] * len(requested)
    score = weight_sum = 0
    for req, cap, w in zip(requested, allocatable, ws, strict=True):
        if cap == 0:
            continue  # resource absent on the node, or an extended resource the pod does not request
        if most:
            # requested can exceed capacity because pods without requests count the non-zero defaults.
            resource_score = (min(req, cap) * MAX_NODE_SCORE) // cap
        else:
            resource_score = 0 if req > cap else ((cap - req) * MAX_NODE_SCORE) // cap
        score += resource_score * w
        weight_sum += w
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


# --- the plugins over a ClusterSnapshot ----------------------------------------------------------
def fits(snapshot: ClusterSnapshot, req: Req, node: str) -> bool:
    """NodeUnschedulable + NodeResourcesFit's filter."""
    facts = snapshot.nodes[node]
    u = snapshot.usage.get(node)
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


@dataclass(frozen=True, slots=True)
class NodeRequested:
    """What bound pods request on a node: actual (``Requested``) and non-zero (``NonZeroRequested``)."""

    cpu: int
    mem: int
    nz_cpu: int
    nz_mem: int
    gpus: int


def node_requested(snapshot: ClusterSnapshot, node: str) -> NodeRequested:
    u = snapshot.usage.get(node)
    if u is None or not u.pods:
        return NodeRequested(0, 0, 0, 0, 0)
    nz_cpu = nz_mem = 0
    for p in u.pods.values():
        c, m = _nonzero(int(p.cpu_millis), int(p.memory_bytes))
        nz_cpu += c
        nz_mem += m
    cpu = int(sum(p.cpu_millis for p in u.pods.values()))
    mem = int(sum(p.memory_bytes for p in u.pods.values()))
    return NodeRequested(cpu, mem, nz_cpu, nz_mem, u.gpus)


def _allocatable_request(
    snapshot: ClusterSnapshot, node: str, used: NodeRequested, req: Req, resource: str,
    gpu_resources: Sequence[str], *, nonzero: bool,
) -> tuple[int, int]:
    """calculateResourceAllocatableRequest: (allocatable, requested with the pod), (0, 0) to skip."""
    facts = snapshot.nodes[node]
    if resource == CPU:
        pod = _nonzero(req.cpu, req.mem)[0] if nonzero else req.cpu
        return int(facts.cpu_millis), (used.nz_cpu if nonzero else used.cpu) + pod
    if resource == MEMORY:
        pod = _nonzero(req.cpu, req.mem)[1] if nonzero else req.mem
        return int(facts.memory_bytes), (used.nz_mem if nonzero else used.mem) + pod
    if resource in gpu_resources and req.gpus > 0 and facts.gpu_count > 0:
        # Extended resources count actual requests, and only for pods that request them.
        return facts.gpu_count, used.gpus + req.gpus
    return 0, 0


def fit_score(
    snapshot: ClusterSnapshot, req: Req, node: str, strategy: str, resources: Sequence[ResourceWeight],
    gpu_resources: Sequence[str], used: NodeRequested | None = None,
) -> int:
    """NodeResourcesFit's score (0..100) under a LeastAllocated or MostAllocated strategy."""
    used = used if used is not None else node_requested(snapshot, node)
    pairs = [_allocatable_request(snapshot, node, used, req, r.name, gpu_resources, nonzero=True)
             for r in resources]
    alloc = [a for a, _ in pairs]
    requested = [r if a else 0 for a, r in pairs]
    weights = [r.weight for r in resources]
    if strategy == "MostAllocated":
        return most_allocated(requested, alloc, weights)
    return least_allocated(requested, alloc, weights)


def balanced_score(
    snapshot: ClusterSnapshot, req: Req, node: str, resources: Sequence[ResourceWeight],
    gpu_resources: Sequence[str], used: NodeRequested | None = None,
) -> int:
    """NodeResourcesBalancedAllocation's score (0 when its PreScore skips a best-effort pod)."""
    if req.cpu == 0 and req.mem == 0:
        return 0  # PreScore returns Skip for best-effort pods: the plugin adds nothing
    used = used if used is not None else node_requested(snapshot, node)
    with_pod = [_allocatable_request(snapshot, node, used, req, r.name, gpu_resources, nonzero=False)
                for r in resources]
    # An extended resource the pod does not request is skipped (allocatable 0) before and after.
    alloc = [a for a, _ in with_pod]
    requested = [r if a else 0 for a, r in with_pod]
    before_of = {CPU: used.cpu, MEMORY: used.mem}
    before = [before_of.get(r.name, used.gpus) if a else 0
              for r, (a, _) in zip(resources, with_pod, strict=True)]
    return balanced_allocation(requested, before, alloc)


def __getattr__(name: str) -> Any:
    # DefaultScheduler is the general loop (app.sim.scheduler) under the default profile; imported
    # lazily because that module imports the arithmetic above.
    if name == "DefaultScheduler":
        from app.sim.scheduler import DefaultScheduler

        return DefaultScheduler
    raise AttributeError(name)
