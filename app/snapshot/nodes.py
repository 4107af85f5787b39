"""Node facts: what a node offers, read from the labels and annotations clusters already carry.

Computed once per watch event (not per request) so filter/prioritize only do arithmetic.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from app.base.catalog import GpuCatalog, GpuSpec, normalize
from app.base.units import parse_bandwidth_tbs, parse_money, parse_quantity, parse_tflops
from app.config.policy import NodeFactsPolicy, NodeLabelKeys

__all__ = ["NodeClass", "NodeFacts", "facts_for", "node_facts", "penalty_tflops", "work_tflops"]

ANN = "llm-placement.io/"
# A CPU socket's DRAM bandwidth, used for CPU-served small models; deliberately modest.
CPU_MEMORY_BANDWIDTH_TBS = 0.2
# What one GPU (or MIG slice) may report as its memory: a MIG 1g slice has 5 GB, the largest GPUs a
# few hundred. Outside this a figure is a typo or a forged label (a GPU reading 0, or 10^12 GB that
# every model fits in) and is ignored with a warning, never believed.
MIN_GPU_MEMORY_GB = 0.25
MAX_GPU_MEMORY_GB = 16_384.0
# GPUs one node may advertise: the largest servers have 16; a count of 10^18 is not a node.
MAX_NODE_GPUS = 1024
# Two memory figures denote the same product when they differ by at most this share: the driver's
# MiB is a little more or less than the marketed decimal GB (docs/node-facts.md).
MEMORY_MATCH_SHARE = 0.08
MigSlices = tuple[tuple[str, float, int, int], ...]


class NodeClass(StrEnum):
    GPU = "gpu"
    CPU = "cpu"
    STORAGE = "storage"


class NodeFacts(BaseModel):
    """Static capabilities of one node (capacity, hardware, topology). Usage lives elsewhere."""

    # No negative or non-finite capacity, ever: node_facts ignores such figures with a warning, and
    # this is the invariant behind it (a negative GiB per GPU would turn every memory check around).
    model_config = ConfigDict(frozen=True, allow_inf_nan=False)

    name: str
    node_class: NodeClass
    gpu_product: str | None = None  # the raw label value
    gpu: GpuSpec | None = None  # catalog entry; None with gpu_count>0 means "unknown product"
    gpu_count: int = Field(0, ge=0)
    gpu_memory_gb: float = Field(0.0, ge=0)
    gpu_bandwidth_tbs: float = Field(0.0, ge=0)
    cpu_millis: float = Field(0.0, ge=0)
    memory_bytes: float = Field(0.0, ge=0)
    pods: int = Field(110, ge=0)
    nvlink_domain: str
    fabric: tuple[str, ...] = ()  # domain ids inner -> outer, "" where the tier is unlabelled
    zone: str = ""
    rdma: bool = False
    hourly_cost: float = Field(0.0, ge=0)
    # Dense BF16 TFLOPS per GPU that work on this node is priced by (docs/node-facts.md, "Throughput"):
    # the operator's figure, else the catalog's, else inferred from what the labels say, else the
    # penalty figure; 0 on a node built without it (see ``work_tflops``). ``gpu_tflops_basis`` says which.
    gpu_tflops: float = Field(0.0, ge=0)
    gpu_tflops_basis: str = ""
    unschedulable: bool = False
    # A PreferNoSchedule taint: kube-scheduler's TaintToleration scores it, so filter_to_best
    # leaves the choice among equal-best nodes to kube-scheduler (app/placement/narrowing.py).
    prefer_no_schedule: bool = False
    labels: dict[str, str] = {}
    warnings: tuple[str, ...] = ()
    # MIG slices published through DRA ResourceSlices (docs/dra.md, "MIG"): per profile
    # (profile, memory GB, slices, free slices); free ones are those no allocated claim holds.
    mig: tuple[tuple[str, float, int, int], ...] = ()
    mig_gpus: int = Field(0, ge=0)  # physical GPUs partitioned into those slices (not in gpu_count)
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
    mig: MigSlices = (),
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
    if gpu_count > MAX_NODE_GPUS:
        warnings.append(f"{gpu_count} GPUs is more than a node has (at most {MAX_NODE_GPUS}); ignored")
        gpu_count = 0
    mig = _valid_mig(mig, warnings)
    mig_gpus = mig_gpus if mig and 0 <= mig_gpus <= MAX_NODE_GPUS else 0
    product, gpu, mem_gb, bw = _gpu_hardware(labels, ann, catalog, keys, gpu_count, warnings)
    tflops, basis = (_gpu_throughput(labels, ann, catalog, keys, product, gpu, warnings)
                     if gpu_count or mig else (0.0, ""))
    node_class = _node_class(labels, ann, bool(gpu_count or mig), warnings)
    # An unknown GPU is priced like a big one: pricing it like a CPU node would make it the cheapest
    # node in the cluster and pull every CPU pod onto it, stranding its GPUs.
    per_gpu = gpu.hourly_cost_usd if gpu and gpu.hourly_cost_usd else unknown_gpu_hourly_cost
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
             mig, product, tflops)
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
        gpu_tflops=tflops,
        gpu_tflops_basis=basis,
        unschedulable=bool((node.get("spec") or {}).get("unschedulable")),
        prefer_no_schedule=_prefer_no_schedule(node),
        labels=labels,
        warnings=tuple(warnings),
        mig=mig,
        mig_gpus=mig_gpus,
    )


def _gpu_hardware(
    labels: dict[str, str], ann: dict[str, str], catalog: GpuCatalog, keys: NodeLabelKeys, gpu_count: int,
    warnings: list[str],
) -> tuple[str | None, GpuSpec | None, float, float]:
    """The GPU product label, its catalog entry, memory per GPU (GB) and bandwidth (TB/s)."""
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
        mem_gb = _label_memory_gb(raw_mem, mem_gb, warnings)
    bw = gpu.hbm_bandwidth_tbs if gpu else 0.0
    if (raw_bw := ann.get(ANN + "gpu-memory-bandwidth")) is not None:
        try:
            bw = parse_bandwidth_tbs(raw_bw)
        except ValueError as exc:
            warnings.append(str(exc))
    return product, gpu, mem_gb, bw


def penalty_tflops(catalog: GpuCatalog) -> tuple[float, str]:
    """What a GPU nothing is known of is priced by: as slow as the slowest catalogued GPU. Its work
    then ranks after every catalogued GPU's at any sane price, never before (docs/node-facts.md)."""
    slowest = min(catalog, key=lambda g: (g.bf16_tflops, g.name))
    return slowest.bf16_tflops, f"unknown: assumed as slow as the slowest catalogued GPU ({slowest.name})"


def work_tflops(facts: NodeFacts) -> float:
    """Dense BF16 TFLOPS per GPU that training on ``facts`` is priced by (0 for a node without GPUs).

    Node facts from :func:`node_facts` carry it; facts built by hand fall back to their catalog
    entry, else to the penalty figure of the packaged catalog, so no GPU is ever priced per hour
    beside others priced per unit of work."""
    if facts.gpu_tflops > 0:
        return facts.gpu_tflops
    if facts.gpu is not None:
        return facts.gpu.bf16_tflops
    if not facts.gpu_node:
        return 0.0
    from app.base.catalog import default_catalog

    return penalty_tflops(default_catalog())[0]


def _gpu_throughput(
    labels: dict[str, str], ann: dict[str, str], catalog: GpuCatalog, keys: NodeLabelKeys,
    product: str | None, gpu: GpuSpec | None, warnings: list[str],
) -> tuple[float, str]:
    """Dense BF16 TFLOPS per GPU and where the figure comes from (docs/node-facts.md, "Throughput").

    An operator's annotation wins; then the catalog entry. For a product the catalog lacks, the
    catalogued GPUs consistent with everything the node says (a product name that extends a
    catalogued one, GPU Feature Discovery's compute capability and memory) bound it from below: the
    slowest of them. Nothing known, or nothing consistent: the penalty figure."""
    if (raw := ann.get(ANN + "gpu-bf16-tflops")) is not None:
        try:
            return parse_tflops(raw), "declared by the node annotation"
        except ValueError as exc:
            warnings.append(f"{exc}; ignored")
    if gpu is not None:
        return gpu.bf16_tflops, "catalog"
    said: list[str] = []
    pool = list(catalog)
    if product and (named := _named_like(catalog, product)):
        pool = [g for g in pool if g in named]
        said.append(f'product "{product}" extends {"/".join(sorted(g.name for g in named))}')
    cc = _compute_capability(labels, keys)
    if cc is not None:
        pool = [g for g in pool if g.compute_capability == cc]
        said.append(f"compute capability {cc}")
    if (raw_mem := _first(labels, keys.gpu_memory_mib)) is not None:
        try:
            mib = parse_quantity(raw_mem)
        except ValueError:
            mib = 0.0
        if mib > 0:
            pool = [g for g in pool if abs(_memory_mib(g) - mib) <= MEMORY_MATCH_SHARE * mib]
            said.append(f"{mib:g} MiB")
    if said and pool:
        slowest = min(pool, key=lambda g: (g.bf16_tflops, g.name))
        return slowest.bf16_tflops, f"inferred ({', '.join(said)}): as slow as {slowest.name}"
    return penalty_tflops(catalog)


def _named_like(catalog: GpuCatalog, product: str) -> list[GpuSpec]:
    """Catalogued GPUs whose name or an alias the product name extends ("NVIDIA-H100-80GB-HBM3-OEM"
    extends "NVIDIA-H100-80GB-HBM3"): whole words only, so an "A10" never matches an "A100"."""
    key = normalize(product)
    return [g for g in catalog if any(key.startswith(normalize(a) + "-") for a in (g.name, *g.aliases))]


def _compute_capability(labels: dict[str, str], keys: NodeLabelKeys) -> str | None:
    major, minor = _first(labels, keys.gpu_compute_major), _first(labels, keys.gpu_compute_minor)
    if major is None or minor is None or not major.isdigit() or not minor.isdigit():
        return None
    return f"{int(major)}.{int(minor)}"


def _memory_mib(g: GpuSpec) -> float:
    return g.memory_mib or g.memory_gb * 1000.0 / 1.048576


def _node_class(labels: dict[str, str], ann: dict[str, str], gpus: bool, warnings: list[str]) -> NodeClass:
    cls_raw = ann.get(ANN + "node-class") or labels.get(ANN + "node-class")
    node_class = NodeClass.GPU if gpus else NodeClass.CPU
    if cls_raw:
        try:
            node_class = NodeClass(cls_raw.lower())
        except ValueError:
            warnings.append(f'node-class "{cls_raw}" is not storage, cpu or gpu')
    # GPUs present outrank a stale annotation.
    return NodeClass.GPU if gpus else node_class


def _gpu_memory_ok(gb: object) -> bool:
    return isinstance(gb, int | float) and math.isfinite(gb) and MIN_GPU_MEMORY_GB <= gb <= MAX_GPU_MEMORY_GB


def _label_memory_gb(raw: str, fallback: float, warnings: list[str]) -> float:
    """The GPU memory label (MiB, GFD's or the DRA overlay's) in GB; ``fallback`` (the catalog's
    figure, or 0) when it is unreadable or out of range, with a warning saying which."""
    try:
        gb = parse_quantity(raw) * 1.048576 / 1000.0  # MiB -> GB
    except ValueError:
        warnings.append(f"gpu memory label {raw!r} unreadable")
        return fallback
    if not _gpu_memory_ok(gb):
        warnings.append(f"gpu memory label {raw!r} MiB is not a GPU's memory "
                        f"({MIN_GPU_MEMORY_GB:g} to {MAX_GPU_MEMORY_GB:g} GB); ignored")
        return fallback
    return gb


def _valid_mig(mig: MigSlices, warnings: list[str]) -> MigSlices:
    """MIG slices as published (docs/dra.md), less any profile whose memory or counts are not real
    numbers: one device with a negative or missing memory capacity must not make the node offer
    slices of 0 or -80 GB. Free counts are clipped into 0..slices."""
    out = []
    for profile, gb, slices, free in mig:
        if not _gpu_memory_ok(gb) or not isinstance(slices, int) or not 0 < slices <= MAX_NODE_GPUS * 8:
            warnings.append(f"MIG profile {profile!r}: {gb!r} GB x {slices!r} slices is not a real "
                            "capacity; ignored")
            continue
        out.append((profile, float(gb), slices, min(max(int(free), 0), slices)))
    return tuple(out)


def node_inputs(node: dict[str, Any]) -> dict[str, Any]:
    """Just what ``node_facts`` and the bind checks (app.base.bind_checks) read of a Node: kept per
    node so that facts can be computed again when something else they depend on changes (DRA
    slices and claims, docs/dra.md) without asking the API server for the Node again. Other
    annotations are left out (memory)."""
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
                            and t.get("effect") in ("PreferNoSchedule", "NoSchedule", "NoExecute")]},
        "status": {"allocatable": status.get("allocatable"), "capacity": status.get("capacity")},
    }


def _prefer_no_schedule(node: dict[str, Any]) -> bool:
    taints = (node.get("spec") or {}).get("taints") or []
    return isinstance(taints, list) and any(
        isinstance(t, dict) and t.get("effect") == "PreferNoSchedule" for t in taints)


def facts_for(
    node: dict[str, Any], catalog: GpuCatalog, policy: NodeFactsPolicy,
    mig: MigSlices = (), mig_gpus: int = 0,
) -> NodeFacts:
    """node_facts with every knob taken from the policy (the one call site shape everyone uses)."""
    return node_facts(node, catalog, policy.labels, policy.default_cpu_hourly_cost,
                      policy.unknown_gpu_hourly_cost, mig, mig_gpus)
