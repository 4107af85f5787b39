"""Placement quality of the whole cluster as plain numbers for the ``llm_placement_*`` gauges.

Pure computation over the snapshot (no FastAPI, no Kubernetes client): the service captures what it
needs under its lock, computes outside it, and publishes the result as ``llm_placement_*`` gauges; the
unit tests call the same functions on hand-made snapshots.

Definitions (every gauge below is over *schedulable* GPU nodes: a cordoned node's GPUs cannot be
placed on, so counting them as free would promise capacity that does not exist):

* ``free(node) = max(0, GPUs - GPUs used by bound/assumed pods - GPUs reserved for gangs)``.
  Reserved gang GPUs are promised to a gang, so they are not free for anyone else.
* A node is *partly used* when ``free(node) > 0`` and some of its GPUs are used or reserved.
* **Fragmentation ratio** (per GPU model) = free GPUs on partly used nodes / all free GPUs; 0 when
  nothing is free. Independent of demand: 0 means every free GPU sits in a wholly free node (the next
  whole-node or whole-domain gang fits), 1 means every free GPU sits beside a busy one.
* **Stranded GPUs** (per GPU model) = the free GPUs of partly used nodes whose free count is smaller
  than the GPU request of *every* pending GPU pod, i.e. no pending pod or gang member could be placed
  there by GPU count. "Pending" = a pod the extender knows (watch-fed specs), not bound, requesting at
  least one GPU. With nothing pending nothing is stranded (idle is not stranded; the fragmentation
  ratio shows the structure). Hardware fit (memory, SLO, topology) is not considered, so this is a
  lower bound of what is really unusable: a GPU counted as usable might still be the wrong model.
* **Running $/hour by stage** = for every bound or assumed pod, its share of its node's price (the
  same formula filter uses, :func:`app.placement.feasibility.pod_hourly_cost`), summed by stage; pods
  without a stage annotation go under ``none``.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from app.base.workload import Stage
from app.snapshot.nodes import NodeFacts
from app.snapshot.store import ClusterSnapshot, PlacedPod

if TYPE_CHECKING:
    from app.metrics.metrics import Metrics

log = logging.getLogger(__name__)

UNKNOWN_GPU = "unknown"  # label for GPU products missing from the catalog (bounded, unlike raw labels)
NO_STAGE = "none"
STAGE_LABELS = (*(s.value for s in Stage), NO_STAGE)
DEFAULT_REFRESH_SECONDS = 10.0


def gpu_label(node: NodeFacts) -> str:
    """The bounded ``gpu`` label of a node: the catalog name, or ``unknown``."""
    return node.gpu.name if node.gpu is not None else UNKNOWN_GPU


def share_hourly_cost(gpus: int, cpu_millis: float, memory_bytes: float, node: NodeFacts) -> float:
    """What a pod with these requests costs per hour on ``node``.

    Mirrors :func:`app.placement.feasibility.pod_hourly_cost` (a test pins them equal) but takes plain
    numbers, because the running pods are ``PlacedPod`` records and building a ``WorkloadSpec`` per
    pod every refresh would cost seconds at 100,000 pods.
    """
    if gpus > 0 and node.gpu_count > 0:
        return node.hourly_cost * gpus / node.gpu_count
    shares = [0.0]
    if node.cpu_millis > 0:
        shares.append(cpu_millis / node.cpu_millis)
    if node.memory_bytes > 0:
        shares.append(memory_bytes / node.memory_bytes)
    return node.hourly_cost * max(0.01, *shares)


@dataclass(frozen=True, slots=True)
class QualityInput:
    """What the computation reads, copied out of the snapshot while the service lock is held."""

    nodes: list[NodeFacts]
    used_gpus: dict[str, int]
    reserved_gpus: dict[str, int]
    pods: list[PlacedPod]
    pending_gpu_requests: list[int]


@dataclass(frozen=True, slots=True)
class ClusterQuality:
    free_gpus: dict[tuple[str, str], int] = field(default_factory=dict)  # (domain, gpu) -> free
    allocatable_gpus: dict[str, int] = field(default_factory=dict)  # gpu -> GPUs on schedulable nodes
    stranded_gpus: dict[str, int] = field(default_factory=dict)  # gpu -> stranded
    fragmentation: dict[str, float] = field(default_factory=dict)  # gpu -> ratio in [0, 1]
    hourly_cost: dict[str, float] = field(default_factory=dict)  # stage -> $/hour
    pending_gpus: int = 0
    unknown_gpu_nodes: int = 0
    # Product label string -> nodes with GPUs of that product missing from the catalog ("" when the
    # node has no product label), so an operator sees which products to add or declare.
    unknown_gpu_products: dict[str, int] = field(default_factory=dict)


def capture(snapshot: ClusterSnapshot, reserved: Callable[[str], int] | None = None) -> QualityInput:
    """Copy references out of ``snapshot`` (call with the service lock held).

    Only list/dict copies of existing objects happen here (about a millisecond at 100,000 pods), so
    filter and prioritize, which wait on the same lock, are not held up by the arithmetic.
    ``PlacedPod`` and ``NodeFacts`` fields used later never change after creation (a move creates a
    new ``PlacedPod``; ``NodeFacts`` is frozen), so reading them outside the lock is safe.
    """
    nodes = list(snapshot.nodes.values())
    used = {name: u.gpus for name, u in snapshot.usage.items()}
    held: dict[str, int] = {}
    if reserved is not None:
        for n in nodes:
            if n.has_gpus and (r := reserved(n.name)) > 0:
                held[n.name] = r
    bound = snapshot.pods
    pending = [
        s.gpus for uid, s in snapshot.specs.items()
        if s.gpus > 0 and not s.node_name and uid not in bound
    ]
    return QualityInput(nodes, used, held, list(bound.values()), pending)


# A node label is written by whoever labels nodes: its value is cut short, and past this many
# products the rest are summed under OTHER_PRODUCTS, so a label gone wrong cannot flood the registry.
MAX_PRODUCT_LABEL = 64
MAX_UNKNOWN_PRODUCTS = 32
OTHER_PRODUCTS = "(other)"


def _product_label(product: str | None) -> str:
    return (product or "")[:MAX_PRODUCT_LABEL]


def _bounded(counts: Counter[str]) -> dict[str, int]:
    """The most common products, the rest summed under OTHER_PRODUCTS."""
    top = dict(counts.most_common(MAX_UNKNOWN_PRODUCTS))
    rest = sum(counts.values()) - sum(top.values())
    if rest:
        top[OTHER_PRODUCTS] = rest
    return top


def compute(data: QualityInput) -> ClusterQuality:
    """The cluster-level quality numbers (see the module docstring for each definition)."""
    free: Counter[tuple[str, str]] = Counter()
    allocatable: Counter[str] = Counter()
    free_total: Counter[str] = Counter()
    free_partial: Counter[str] = Counter()
    stranded: Counter[str] = Counter()
    min_request = min(data.pending_gpu_requests, default=None)
    unknown = 0
    unknown_products: Counter[str] = Counter()
    facts: dict[str, NodeFacts] = {}
    for n in data.nodes:
        facts[n.name] = n
        if not n.has_gpus:
            continue
        gpu = gpu_label(n)
        if n.gpu is None:
            unknown += 1
            unknown_products[_product_label(n.gpu_product)] += 1
        if n.unschedulable:
            continue
        busy = max(0, data.used_gpus.get(n.name, 0)) + data.reserved_gpus.get(n.name, 0)
        f = max(0, n.gpu_count - busy)
        allocatable[gpu] += n.gpu_count
        free[(n.nvlink_domain, gpu)] += f
        free_total[gpu] += f
        if f > 0 and busy > 0:
            free_partial[gpu] += f
            if min_request is not None and f < min_request:
                stranded[gpu] += f
    cost: dict[str, float] = dict.fromkeys(STAGE_LABELS, 0.0)
    for p in data.pods:
        node = facts.get(p.node)
        if node is None:  # node deleted before the pod event arrived: no price to charge
            continue
        stage = p.stage.value if p.stage is not None else NO_STAGE
        cost[stage] += share_hourly_cost(p.gpus, p.cpu_millis, p.memory_bytes, node)
    return ClusterQuality(
        free_gpus=dict(free),
        allocatable_gpus=dict(allocatable),
        # Every model present gets a value (0 included) so series do not come and go with demand.
        stranded_gpus={g: stranded.get(g, 0) for g in allocatable},
        fragmentation={g: (free_partial[g] / free_total[g] if free_total[g] else 0.0) for g in allocatable},
        hourly_cost=cost,
        pending_gpus=sum(data.pending_gpu_requests),
        unknown_gpu_nodes=unknown,
        unknown_gpu_products=_bounded(unknown_products),
    )


def snapshot_quality(
    snapshot: ClusterSnapshot, reserved: Callable[[str], int] | None = None
) -> ClusterQuality:
    """Capture and compute in one go (tests, offline tools: no concurrent writers)."""
    return compute(capture(snapshot, reserved))


class QualityPublisher:
    """Writes a ClusterQuality into the gauges, removing label sets that disappeared.

    Stale series must go (a deleted domain must not show its last free count forever), but clearing
    a whole gauge first would let a scrape in between see no series at all; so only the label sets
    absent from the new result are removed.
    """

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics
        self._lock = threading.Lock()  # the periodic thread and an on-demand refresh may overlap
        self._free: set[tuple[str, str]] = set()
        self._gpu: set[str] = set()
        self._unknown_products: set[str] = set()

    def publish(self, q: ClusterQuality) -> None:
        m = self.metrics
        with self._lock:
            for key in self._free - q.free_gpus.keys():
                m.free_gpus.remove(*key)
            for (domain, gpu), v in q.free_gpus.items():
                m.free_gpus.labels(domain, gpu).set(v)
            self._free = set(q.free_gpus)
            gpus = set(q.allocatable_gpus)
            for gpu in self._gpu - gpus:
                for g in (m.stranded_gpus, m.gpu_fragmentation, m.allocatable_gpus):
                    g.remove(gpu)
            for gpu in gpus:
                m.allocatable_gpus.labels(gpu).set(q.allocatable_gpus[gpu])
                m.stranded_gpus.labels(gpu).set(q.stranded_gpus.get(gpu, 0))
                m.gpu_fragmentation.labels(gpu).set(q.fragmentation.get(gpu, 0.0))
            self._gpu = gpus
            for stage, dollars in q.hourly_cost.items():
                m.running_hourly_cost.labels(stage).set(dollars)
            m.pending_gpus.set(q.pending_gpus)
            m.unknown_gpu_nodes.set(q.unknown_gpu_nodes)
            for product in self._unknown_products - q.unknown_gpu_products.keys():
                m.unknown_gpu_product_nodes.remove(product)
            for product, count in q.unknown_gpu_products.items():
                m.unknown_gpu_product_nodes.labels(product).set(count)
            self._unknown_products = set(q.unknown_gpu_products)


class QualityRefresher:
    """A daemon thread that calls ``refresh`` now and then every ``interval`` seconds until stopped."""

    def __init__(self, refresh: Callable[[], object], interval: float = DEFAULT_REFRESH_SECONDS) -> None:
        self.refresh = refresh
        self.interval = interval
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="quality-refresh", daemon=True)
            self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def _run(self) -> None:
        while True:
            try:
                self.refresh()
            except Exception:  # a bad refresh must not end the thread: the next one may succeed
                log.exception("placement-quality refresh failed")
            if self._stop.wait(self.interval):
                return
