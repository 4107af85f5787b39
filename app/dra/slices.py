"""ResourceSlices: parsing one (``parse_slice``) and keeping them by node and pool (``SliceStore``),
so that a node's devices read as its pools' newest complete generation (docs/dra.md). Pure."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from app.dra.devices import (
    DRIVER,
    MAX_COUNTERS,
    MAX_DEVICES,
    DraDevice,
    as_dict,
    counter_amounts,
    parse_device,
)

# Devices one node may publish across all its slices. A node of 8 GPUs with every MIG placement
# published (DynamicMIG) carries about 160; past this the node's DRA GPUs are not read at all, said
# in the log and counted (docs/dra.md, "Churn"): recomputing a node's facts walks every device, and
# 100,000 devices on one node held the lock filter needs for a second per change.
MAX_NODE_DEVICES = 1024


@dataclass(slots=True)
class ParsedSlice:
    node: str
    driver: str
    pool: str
    generation: int
    devices: tuple[DraDevice, ...]
    counters: dict[str, dict[str, float]] = field(default_factory=dict)  # spec.sharedCounters
    count: int = 1  # pool.resourceSliceCount: the slices the pool has at this generation


def parse_slice(obj: dict[str, Any]) -> ParsedSlice | None:
    """One ResourceSlice; None for slices we cannot use (not per node, unreadable)."""
    spec = obj.get("spec") if isinstance(obj, dict) else None
    if not isinstance(spec, dict):
        return None
    node, driver = spec.get("nodeName"), spec.get("driver")
    pool = as_dict(spec.get("pool"))
    if not isinstance(node, str) or not node or not isinstance(driver, str):
        return None  # network-attached (allNodes / nodeSelector) devices are not a node's GPUs
    gen = pool.get("generation")
    raw_devices = spec.get("devices")
    devices: list[Any] = raw_devices if isinstance(raw_devices, list) else []
    parsed = tuple(d for d in (parse_device(x) for x in devices[:MAX_DEVICES]) if d is not None)
    # Counter sets may come in a slice of their own (the driver's DynamicMIG on Kubernetes 1.35+).
    raw_sets = spec.get("sharedCounters")
    sets = {str(c["name"]): dict(counter_amounts(c.get("counters")))
            for c in (raw_sets if isinstance(raw_sets, list) else [])[:MAX_COUNTERS]
            if isinstance(c, dict) and isinstance(c.get("name"), str)}
    count = pool.get("resourceSliceCount")
    return ParsedSlice(node=node, driver=driver, pool=str(pool.get("name") or node),
                       generation=gen if isinstance(gen, int) and not isinstance(gen, bool) else 0,
                       devices=parsed, counters=sets,
                       count=min(count, MAX_DEVICES) if isinstance(count, int) and not isinstance(count, bool)
                       and count > 0 else 1)


def newest(slices: list[ParsedSlice], driver: str) -> list[ParsedSlice]:
    """The slices of the newest generation of each pool of ``driver``."""
    gens: dict[str, int] = {}
    for s in slices:
        if s.driver == driver:
            gens[s.pool] = max(gens.get(s.pool, s.generation), s.generation)
    return [s for s in slices if s.driver == driver and s.generation == gens.get(s.pool)]


def current(slices: list[ParsedSlice], driver: str) -> list[tuple[str, DraDevice]]:
    """(pool, device) of the newest generation of each pool of ``driver``."""
    return [(s.pool, d) for s in newest(slices, driver) for d in s.devices]


@dataclass(slots=True)
class SliceStore:
    """Every ResourceSlice seen, by name, node and pool; the pools of ``driver`` also by node."""

    driver: str = DRIVER
    slices: dict[str, ParsedSlice] = field(default_factory=dict)  # slice name -> parsed
    by_node: dict[str, set[str]] = field(default_factory=dict)  # node -> slice names
    node_devices: dict[str, int] = field(default_factory=dict)  # node -> devices in its slices
    pool_node: dict[str, str] = field(default_factory=dict)  # pool -> node (the driver's pools)
    # pool -> the slices of its last complete generation (all resourceSliceCount of them seen).
    complete: dict[str, tuple[ParsedSlice, ...]] = field(default_factory=dict)
    version: int = 0  # bumped on every slice change (caches of what slices say key on it)

    def put(self, name: str, s: ParsedSlice | None) -> str | None:
        """Add or replace the slice ``name`` (None: it is no node's, or unreadable, so only the old
        one goes); returns the node whose facts changed (None if none)."""
        self.version += 1
        old = self.slices.pop(name, None)
        if old is not None:
            self.by_node.get(old.node, set()).discard(name)
            self.node_devices[old.node] = self.node_devices.get(old.node, 0) - len(old.devices)
        if s is not None:
            self.node_devices[s.node] = self.node_devices.get(s.node, 0) + len(s.devices)
            self.slices[name] = s
            self.by_node.setdefault(s.node, set()).add(name)
            if s.driver == self.driver:
                self.pool_node[s.pool] = s.node
                self._note_complete(s.node, s.pool)
        if old is not None and old.driver == self.driver and (s is None or s.pool != old.pool):
            self._note_complete(old.node, old.pool)
        return s.node if s is not None else (old.node if old is not None else None)

    def drop(self, name: str) -> str | None:
        self.version += 1
        old = self.slices.pop(name, None)
        if old is None:
            return None
        self.by_node.get(old.node, set()).discard(name)
        self.node_devices[old.node] = self.node_devices.get(old.node, 0) - len(old.devices)
        if old.driver == self.driver:
            self._note_complete(old.node, old.pool)
        return old.node

    def clear(self) -> None:
        self.version += 1
        self.slices.clear()
        self.by_node.clear()
        self.node_devices.clear()
        self.complete.clear()

    def _note_complete(self, node: str, pool: str) -> None:
        """Remember the pool's newest generation once all its slices are in; forget a pool gone."""
        mine = [s for s in self._raw(node) if s.driver == self.driver and s.pool == pool]
        if not mine:
            self.complete.pop(pool, None)
            return
        latest = newest(mine, self.driver)
        if len(latest) >= latest[0].count:
            self.complete[pool] = tuple(latest)

    def _raw(self, node: str) -> list[ParsedSlice]:
        return [self.slices[n] for n in sorted(self.by_node.get(node, ())) if n in self.slices]

    def node_slices(self, node: str) -> list[ParsedSlice]:
        """The node's slices, the driver's pools at their newest generation once all its slices are
        in (``resourceSliceCount``): while the driver republishes a pool, slice by slice, its last
        complete generation stands, so that the node does not seem to lose its GPUs meanwhile (the
        driver's DynamicMIG publishes its counters and each GPU's devices in slices of their own)."""
        raw = self._raw(node)
        out = [s for s in raw if s.driver != self.driver]
        pools = {s.pool for s in raw if s.driver == self.driver}
        for pool in sorted(pools):
            latest = newest([s for s in raw if s.driver == self.driver and s.pool == pool], self.driver)
            out += latest if len(latest) >= latest[0].count or pool not in self.complete \
                else list(self.complete[pool])
        return out

    def over_limit(self, node: str) -> bool:
        """The node publishes more than MAX_NODE_DEVICES devices: its DRA GPUs are not read."""
        return self.node_devices.get(node, 0) > MAX_NODE_DEVICES

    def device(self, pool: str, device: str) -> DraDevice | None:
        node = self.pool_node.get(pool)
        candidates = [self.slices[n] for n in self.by_node.get(node, ()) if n in self.slices] \
            if node is not None else list(self.slices.values())
        for s in candidates:
            if s.driver == self.driver and s.pool == pool:
                for d in s.devices:
                    if d.name == device:
                        return d
        return None

    def nodes_of(self, devices: Iterable[tuple[str, str]]) -> set[str]:
        """The nodes of the pools of (pool, device) pairs; pools not seen have none."""
        return {self.pool_node[p] for p, _ in devices if p in self.pool_node}
