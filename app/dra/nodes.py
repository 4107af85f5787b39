"""What one node's DRA devices amount to: the summary of its slices (``node_gpus``), its Node as GPU
Feature Discovery would have labelled it (``overlay``), and what of it is free for a new claim
(``NodeQueries``) (docs/dra.md). Pure."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from app.config.policy import NodeLabelKeys
from app.dra.claims import ClaimBook
from app.dra.devices import DRIVER, DraDevice
from app.dra.domains import ComputeDomains
from app.dra.slices import ParsedSlice, SliceStore, current, newest
from app.dra.taints import TaintRules


@dataclass(frozen=True, slots=True)
class MigSlices:
    """The MIG devices of one profile on one node."""

    profile: str
    memory_mib: float  # the smallest among them
    devices: tuple[tuple[str, str], ...]  # (pool, device name)


@dataclass(frozen=True, slots=True)
class DraNodeGpus:
    """What one node's slices of the GPU driver publish."""

    product: str | None  # the most common full-GPU product (MIG-only node: the parents' product)
    count: int  # full GPUs (MIG slices not counted: a full-GPU pod cannot use them)
    memory_mib: float | None  # the smallest full-GPU memory (a pod may land on any of them)
    mig_devices: int = 0
    mixed_products: bool = False
    mig: tuple[MigSlices, ...] = ()  # by profile
    mig_gpus: int = 0  # physical GPUs partitioned into MIG (distinct parents)
    clique: str | None = None



def _physical(pool: str, d: DraDevice) -> tuple[str, str]:
    """Which physical GPU a device is (part of): its counter set when it has one (every device of a
    partitionable GPU takes from the same set), else a MIG slice's parent, else the device itself."""
    if d.counter_set is not None:
        return pool, "counters:" + d.counter_set
    if d.mig and d.parent:
        return "uuid", d.parent
    return "uuid", d.uuid or f"{pool}/{d.name}"


def _aliases(pool: str, d: DraDevice) -> set[tuple[str, str]]:
    """Every name a full GPU goes by as a physical GPU (its counter set, its UUID)."""
    out = {_physical(pool, d)}
    if d.uuid:
        out.add(("uuid", d.uuid))
    return out


def node_gpus(slices: list[ParsedSlice], driver: str = DRIVER) -> DraNodeGpus | None:
    """Summarise the newest generation of each pool of ``driver`` on one node."""
    pooled = current(slices, driver)
    if not pooled:
        return None
    devices = [d for _, d in pooled]
    full = [d for d in devices if d.full]
    products = Counter(d.product for d in full if d.product)
    mig_products = Counter(d.product for d in devices if d.mig and d.product)
    mems = [d.memory_mib for d in full if d.memory_mib]
    by_profile: dict[str, list[tuple[str, DraDevice]]] = {}
    for pool, d in pooled:
        if d.mig:
            by_profile.setdefault(d.profile or "unknown", []).append((pool, d))
    mig = tuple(
        MigSlices(profile=p, memory_mib=min((d.memory_mib or 0.0) for _, d in devs),
                  devices=tuple((pool, d.name) for pool, d in devs))
        for p, devs in sorted(by_profile.items()))
    cliques = Counter(d.clique for d in devices if d.clique)
    product = products.most_common(1)[0][0] if products else (
        mig_products.most_common(1)[0][0] if mig_products else None)
    # A partitionable GPU is published as its full device plus every MIG placement, all taking
    # from one counter set: one physical GPU, counted once, as a full GPU. MIG slices of a GPU with
    # no full device (static MIG) are its only trace: such GPUs are ``mig_gpus`` (for the price).
    whole = {_physical(pool, d) for pool, d in pooled if d.full}
    known = set().union(*(_aliases(pool, d) for pool, d in pooled if d.full))
    return DraNodeGpus(
        product=product,
        count=len(whole),
        memory_mib=min(mems) if mems else None,
        mig_devices=sum(1 for d in devices if d.mig),
        mixed_products=len(products) > 1,
        mig=mig,
        mig_gpus=len({_physical(pool, d) for pool, d in pooled if d.mig} - known),
        clique=cliques.most_common(1)[0][0] if cliques else None,
    )


Left = dict[tuple[str, str], dict[str, float]]  # (pool, counter set) -> counter -> amount left


def _counters_left(slices: list[ParsedSlice], held: list[tuple[str, DraDevice]]) -> Left:
    """(pool, counter set) -> what the allocated devices leave of each shared counter."""
    left = {(s.pool, name): dict(c) for s in slices for name, c in s.counters.items()}
    for pool, d in held:
        for cset, amounts in d.consumes:
            have = left.get((pool, cset))
            if have is not None:
                for name, n in amounts:
                    if name in have:
                        have[name] -= n
    return left


def _fits(left: Left, pool: str, d: DraDevice) -> bool:
    """Could ``d`` still be allocated as far as counters go? A counter set not (yet) seen limits nothing."""
    for cset, amounts in d.consumes:
        have = left.get((pool, cset))
        if have is not None and any(name in have and have[name] < n - 1e-9 for name, n in amounts):
            return False
    return True


def overlay(node: dict[str, Any], gpus: DraNodeGpus | None, keys: NodeLabelKeys) -> dict[str, Any]:
    """``node`` as GFD would have labelled it for the GPUs its slices publish (docs/dra.md).

    Slices win over GFD labels and over allocatable ``nvidia.com/gpu`` (the first GPU resource key):
    one set of GPUs is either published by the DRA driver or by the device plugin, and with the
    extended-resource mapping allocatable is zero while the slices still list every GPU. A node
    whose GPUs are all MIG-partitioned keeps its parents' product (MIG slices come as facts of their
    own, ``DraIndex.mig_of``) and zero full GPUs. A clique id from the slices becomes the first
    NVLink-domain label unless the node already carries one (GFD's ``nvidia.com/gpu.clique``).
    """
    if gpus is None or (gpus.count == 0 and not gpus.mig and not gpus.clique):
        return node
    meta = dict(node.get("metadata") or {})
    labels = dict(meta.get("labels") or {})
    if gpus.clique and keys.nvlink_domain and not any(labels.get(k) for k in keys.nvlink_domain):
        labels[keys.nvlink_domain[0]] = gpus.clique
    if gpus.count == 0 and not gpus.mig:
        meta["labels"] = labels
        return {**node, "metadata": meta}
    if gpus.product and keys.gpu_product:
        for k in keys.gpu_product:
            labels.pop(k, None)
        labels[keys.gpu_product[0]] = gpus.product
    if keys.gpu_memory_mib:
        for k in keys.gpu_memory_mib:
            labels.pop(k, None)
        if gpus.memory_mib and gpus.count:
            labels[keys.gpu_memory_mib[0]] = str(int(gpus.memory_mib))
    meta["labels"] = labels
    status = dict(node.get("status") or {})
    for which in ("allocatable", "capacity"):
        res = dict(status.get(which) or {})
        if keys.gpu_resource:
            res[keys.gpu_resource[0]] = str(gpus.count)
        status[which] = res
    return {**node, "metadata": meta, "status": status}


class NodeQueries:
    """Per-node reads over the slices, the claims holding devices, the DeviceTaintRules and the
    ComputeDomain cliques. ``summary`` is the node's ``node_gpus``, cached by the caller per change
    of the slices (overlay, MIG slices and MIG parents all read it)."""

    def __init__(self, store: SliceStore, book: ClaimBook, taints: TaintRules, domains: ComputeDomains,
                 summary: Callable[[str], DraNodeGpus | None]) -> None:
        self.store = store
        self.book = book
        self.taints = taints
        self.domains = domains
        self.summary = summary

    def overlay(self, node: dict[str, Any], keys: NodeLabelKeys) -> dict[str, Any]:
        name = (node.get("metadata") or {}).get("name") if isinstance(node, dict) else None
        if not isinstance(name, str) or not (self.store.by_node or self.domains.cliques):
            return node
        gpus = self.summary(name)
        clique = self.domains.node_clique(name)
        if clique and (gpus is None or not gpus.clique):
            # The slices carry no clique id: the one the ComputeDomain daemons report for the node.
            gpus = replace(gpus, clique=clique) if gpus is not None else \
                DraNodeGpus(product=None, count=0, memory_mib=None, clique=clique)
        return overlay(node, gpus, keys)

    def mig_of(self, node: str) -> tuple[tuple[str, float, int, int], ...]:
        """(profile, memory GB, slices, free slices) per MIG profile of ``node``: free are those no
        allocated claim holds. Node facts (``NodeFacts.mig``)."""
        gpus = self.summary(node) if self.store.by_node.get(node) else None
        if gpus is None or not gpus.mig:
            return ()  # none, or over the device limit
        gb = 1.048576 / 1000.0
        busy = self.unavailable(node)
        return tuple((m.profile, m.memory_mib * gb, len(m.devices),
                      sum(1 for d in m.devices if d not in busy))
                     for m in gpus.mig)

    def mig_parents(self, node: str) -> int:
        gpus = self.summary(node) if self.store.by_node.get(node) else None
        return gpus.mig_gpus if gpus is not None else 0

    def busy_gpus(self, node: str) -> int:
        """Full GPUs of ``node`` not free for a new claim (docs/dra.md, "Free GPUs")."""
        if not self.store.by_node.get(node) or self.store.over_limit(node):
            return 0
        busy = self.unavailable(node)
        whole: dict[tuple[str, str], bool] = {}  # physical GPU -> one of its full devices is free
        for p, d in current(self.store.node_slices(node), self.store.driver):
            if d.full:
                key = _physical(p, d)
                whole[key] = whole.get(key, False) or (p, d.name) not in busy
        return sum(1 for free in whole.values() if not free)

    def unavailable(self, node: str) -> set[tuple[str, str]]:
        """(pool, device) of ``node`` kube-scheduler would not hand to a new claim of our pods:

        * held by an allocated claim, whether or not a pod of ours uses it (a claim allocated ahead
          of its pods, or shared by several, holds its devices once);
        * tainted NoSchedule / NoExecute, in the slice or by a DeviceTaintRule (tolerations are not
          read: a tainted device is not capacity for our pods);
        * partitionable: taking more of its counter set than the allocated devices leave (a GPU
          with any MIG partition allocated is not whole-free, nor are the placements overlapping it);
        * a GPU whose VFIO passthrough twin is allocated.
        """
        slices = newest(self.store.node_slices(node), self.store.driver)
        pooled = [(s.pool, d) for s in slices for d in s.devices]
        taken = self.book.held
        held = [(p, d) for p, d in pooled if taken.get((p, d.name))]
        out = {(pool, d.name) for pool, d in pooled
               if taken.get((pool, d.name)) or d.tainted or self.taints.covers(pool, d.name)}
        left = _counters_left(slices, held)
        out |= {(pool, d.name) for pool, d in pooled if not _fits(left, pool, d)}
        # A GPU whose passthrough twin (same PCI bus id) is allocated is gone until the driver
        # republishes the node without it; kube-scheduler does not know they are one GPU.
        passed = {d.pci for _, d in held if d.kind == "vfio" and d.pci}
        out |= {(pool, d.name) for pool, d in pooled if d.full and d.pci in passed}
        return out
