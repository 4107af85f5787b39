"""Node facts: what a node offers, read from the labels and annotations clusters already carry.

Computed once per watch event (not per request) so filter/prioritize only do arithmetic.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict

from app.core.catalog import GpuCatalog, GpuSpec
from app.core.policy import NodeFactsPolicy, NodeLabelKeys
from app.core.units import parse_bandwidth_tbs, parse_money, parse_quantity

ANN = "llm-placement.io/"
# A CPU socket's DRAM bandwidth, used for CPU-served small models; deliberately modest.
CPU_MEMORY_BANDWIDTH_TBS = 0.2


class NodeClass(StrEnum):
    GPU = "gpu"
    CPU = "cpu"
    STORAGE = "storage"


class NodeFacts(BaseModel):
    """Static capabilities of one node (capacity, hardware, topology). Usage lives elsewhere."""

    model_config = ConfigDict(frozen=True)

    name: str
    node_class: NodeClass
    gpu_product: str | None = None  # the raw label value
    gpu: GpuSpec | None = None  # catalog entry; None with gpu_count>0 means "unknown product"
    gpu_count: int = 0
    gpu_memory_gb: float = 0.0
    gpu_bandwidth_tbs: float = 0.0
    cpu_millis: float = 0.0
    memory_bytes: float = 0.0
    pods: int = 110
    nvlink_domain: str
    fabric: tuple[str, ...] = ()  # domain ids inner -> outer, "" where the tier is unlabelled
    zone: str = ""
    rdma: bool = False
    hourly_cost: float = 0.0
    unschedulable: bool = False
    # A PreferNoSchedule taint: kube-scheduler's TaintToleration scores it, so filter_to_best
    # leaves the choice among equal-best nodes to kube-scheduler (app/core/narrowing.py).
    prefer_no_schedule: bool = False
    labels: dict[str, str] = {}
    warnings: tuple[str, ...] = ()
    # MIG slices published through DRA ResourceSlices (docs/dra.md, "MIG"): per profile
    # (profile, memory GB, slices, free slices); free ones are those no allocated claim holds.
    mig: tuple[tuple[str, float, int, int], ...] = ()
    mig_gpus: int = 0  # physical GPUs partitioned into those slices (not in gpu_count)
    # Everything the hard rules read except the name: nodes with equal shapes get equal verdicts,
    # so a 5,000-node request evaluates each shape once (thousands of nodes, a dozen shapes).
    shape: tuple[object, ...] = ()
    shape_id: int = -1  # a small int for ``shape``, assigned by the snapshot (cheap to hash)

    @property
    def has_gpus(self) -> bool:
        return self.gpu_count > 0

    @property
    def gpu_known(self) -> bool:
        return self.gpu is not None

    @property
    def gpu_node(self) -> bool:
        """Full GPUs or MIG slices: a node CPU-stage pods keep off (docs/stage-policy.md)."""
        return self.gpu_count > 0 or bool(self.mig)

    def domain_at(self, label_key: str) -> str | None:
        """The topology domain this node is in for an arbitrary label key (None: unlabelled)."""
        if label_key == "kubernetes.io/hostname":
            return self.labels.get(label_key, self.name)
        return self.labels.get(label_key)


def _first(labels: dict[str, str], keys: Sequence[str]) -> str | None:
    for k in keys:
        v = labels.get(k)
        if v:
            return v
    return None


def node_facts(
    node: dict[str, Any],
    catalog: GpuCatalog,
    keys: NodeLabelKeys,
    cpu_hourly_cost: float = 0.05,
    unknown_gpu_hourly_cost: float = 4.0,
    mig: tuple[tuple[str, float, int, int], ...] = (),
    mig_gpus: int = 0,
) -> NodeFacts:
    """Build NodeFacts from a Node dict. Never raises on odd labels: problems become ``warnings``."""
    meta = node.get("metadata") or {}
    name = str(meta.get("name") or "")
    labels = {str(k): str(v) for k, v in (meta.get("labels") or {}).items()}
    ann = {str(k): str(v) for k, v in (meta.get("annotations") or {}).items()}
    status = node.get("status") or {}
    alloc = status.get("allocatable") or status.get("capacity") or {}
    warnings: list[str] = []

    def qty(key: str) -> float:
        raw = alloc.get(key)
        if raw is None:
            return 0.0
        try:
            return parse_quantity(raw)
        except ValueError:
            warnings.append(f"allocatable {key}={raw!r} unreadable")
            return 0.0

    gpu_count = int(sum(qty(k) for k in keys.gpu_resource))
    product = _first(labels, keys.gpu_product)
    gpu = catalog.lookup(product) if product else None
    if gpu_count and product is None:
        warnings.append("node advertises GPUs but carries no GPU product label")
    elif gpu_count and gpu is None:
        warnings.append(f'GPU product "{product}" is not in the catalog')

    mem_gb = 0.0
    if gpu is not None:
        # What the driver reports, when the catalog has it: weights are decimal GB, and an H100
        # "80GB" offers more than 80 of them (docs/node-facts.md).
        mem_gb = gpu.memory_mib * 1.048576 / 1000.0 if gpu.memory_mib else gpu.memory_gb
    if (raw_mem := _first(labels, keys.gpu_memory_mib)) is not None:
        try:
            mem_gb = parse_quantity(raw_mem) * 1.048576 / 1000.0  # MiB -> GB
        except ValueError:
            warnings.append(f"gpu memory label {raw_mem!r} unreadable")
    bw = gpu.hbm_bandwidth_tbs if gpu else 0.0
    if (raw_bw := ann.get(ANN + "gpu-memory-bandwidth")) is not None:
        try:
            bw = parse_bandwidth_tbs(raw_bw)
        except ValueError as exc:
            warnings.append(str(exc))

    cls_raw = ann.get(ANN + "node-class") or labels.get(ANN + "node-class")
    node_class = NodeClass.GPU if gpu_count or mig else NodeClass.CPU
    if cls_raw:
        try:
            node_class = NodeClass(cls_raw.lower())
        except ValueError:
            warnings.append(f'node-class "{cls_raw}" is not storage, cpu or gpu')
    if node_class is not NodeClass.GPU and (gpu_count or mig):
        node_class = NodeClass.GPU  # GPUs present outrank a stale annotation

    # An unknown GPU is priced like a big one: pricing it like a CPU node would make it the cheapest
    # node in the cluster and pull every CPU pod onto it, stranding its GPUs.
    per_gpu = gpu.hourly_cost_usd if gpu else unknown_gpu_hourly_cost
    physical = gpu_count + (mig_gpus if mig else 0)  # a MIG-partitioned GPU costs what it costs whole
    cost = per_gpu * physical if physical else cpu_hourly_cost
    if (raw_cost := ann.get(ANN + "hourly-cost")) is not None:
        try:
            cost = parse_money(raw_cost)
        except ValueError as exc:
            warnings.append(str(exc))

    rdma = any(labels.get(k, "").lower() == "true" for k in keys.rdma) or any(
        qty(r) > 0 for r in keys.rdma_resources
    )
    fabric = tuple(_first(labels, tier) or "" for tier in keys.fabric_tiers)
    # The raw product too: a claim's productName selector (docs/dra.md) tells apart two products the
    # catalog reads as one model. MIG slices with their free counts: a MIG pod's verdict depends on them.
    shape = (node_class, gpu.name if gpu else product, gpu_count, mem_gb, bw, qty("cpu"), qty("memory"), cost,
             mig, product)
    return NodeFacts(
        shape=shape,
        name=name,
        node_class=node_class,
        gpu_product=product,
        gpu=gpu,
        gpu_count=gpu_count,
        gpu_memory_gb=mem_gb,
        gpu_bandwidth_tbs=bw,
        cpu_millis=qty("cpu") * 1000,
        memory_bytes=qty("memory"),
        pods=int(qty("pods")) or 110,
        nvlink_domain=_first(labels, keys.nvlink_domain) or f"node:{name}",
        fabric=fabric,
        zone=labels.get("topology.kubernetes.io/zone", ""),
        rdma=rdma,
        hourly_cost=cost,
        unschedulable=bool((node.get("spec") or {}).get("unschedulable")),
        prefer_no_schedule=_prefer_no_schedule(node),
        labels=labels,
        warnings=tuple(warnings),
        mig=mig,
        mig_gpus=mig_gpus if mig else 0,
    )


def node_inputs(node: dict[str, Any]) -> dict[str, Any]:
    """Just what ``node_facts`` reads of a Node: kept per node so that facts can be computed again
    when something else they depend on changes (DRA slices and claims, docs/dra.md) without asking
    the API server for the Node again. Other annotations and taints are left out (memory)."""
    def part(obj: Any, key: str) -> dict[str, Any]:
        v = obj.get(key) if isinstance(obj, dict) else None
        return v if isinstance(v, dict) else {}

    meta, spec, status = part(node, "metadata"), part(node, "spec"), part(node, "status")
    ann = part(meta, "annotations")
    raw_taints = spec.get("taints")
    taints: list[Any] = raw_taints if isinstance(raw_taints, list) else []
    return {
        "metadata": {"name": meta.get("name"), "labels": meta.get("labels"),
                     "annotations": {k: v for k, v in ann.items() if str(k).startswith(ANN)}},
        "spec": {"unschedulable": spec.get("unschedulable"),
                 "taints": [t for t in taints if isinstance(t, dict)
                            and t.get("effect") == "PreferNoSchedule"]},
        "status": {"allocatable": status.get("allocatable"), "capacity": status.get("capacity")},
    }


def _prefer_no_schedule(node: dict[str, Any]) -> bool:
    taints = (node.get("spec") or {}).get("taints") or []
    return isinstance(taints, list) and any(
        isinstance(t, dict) and t.get("effect") == "PreferNoSchedule" for t in taints)


def facts_for(
    node: dict[str, Any], catalog: GpuCatalog, policy: NodeFactsPolicy,
    mig: tuple[tuple[str, float, int, int], ...] = (), mig_gpus: int = 0,
) -> NodeFacts:
    """node_facts with every knob taken from the policy (the one call site shape everyone uses)."""
    return node_facts(node, catalog, policy.labels, policy.default_cpu_hourly_cost,
                      policy.unknown_gpu_hourly_cost, mig, mig_gpus)
