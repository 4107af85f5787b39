"""GPUs through Dynamic Resource Allocation (resource.k8s.io/v1): node facts and pod demand.

Pure: the cluster adapter (``app.cluster.dra``) feeds ``DraIndex`` from watches of ResourceSlices,
ResourceClaims, ResourceClaimTemplates and DeviceClasses; node facts and workload parsing read it.

Node facts are not computed a second way: ``overlay`` rewrites a Node dict so that the GPUs its
slices publish appear where GPU Feature Discovery would put them (product and memory labels, the GPU
count as allocatable ``nvidia.com/gpu``), and ``facts_for`` does the rest exactly as for GFD nodes.
Precedence on a node that has both: the slices win (docs/dra.md).

``DraIndex`` is the one object the rest of the extender holds; the work is done by its parts, one
module each: devices (``dra_devices``), selectors (``dra_selectors``), slices (``dra_slices``),
claims held (``dra_claims``), device classes (``dra_classes``), taint rules (``dra_taints``),
compute-domain cliques (``dra_domains``), what claims and pods ask for (``dra_demand``) and what one
node offers (``dra_nodes``). Their public names are importable from here as well.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from app.base.workload import ClaimedDevices
from app.config.policy import NodeLabelKeys
from app.dra.claims import ClaimBook
from app.dra.classes import IMPLICIT_PREFIX, DeviceClasses
from app.dra.demand import ClaimDemand, DemandReader
from app.dra.devices import (
    BLOCKING_EFFECTS,
    CLIQUE_ATTRS,
    DRIVER,
    MAX_ATTRIBUTES,
    MAX_COUNTERS,
    MAX_DEVICES,
    MAX_NAME,
    PCI_BUS_ID,
    DraDevice,
    parse_device,
)
from app.dra.domains import ComputeDomains
from app.dra.nodes import DraNodeGpus, Left, MigSlices, NodeQueries, node_gpus, overlay
from app.dra.selectors import (
    MAX_EXPR,
    MAX_PREDICATES,
    MAX_REGEX,
    MAX_VALUES,
    STANDARD_DOMAIN,
    DevicePredicate,
    Selection,
    class_driver,
    class_selection,
    device_satisfies,
    product_matches,
    read_selectors,
)
from app.dra.slices import MAX_NODE_DEVICES, ParsedSlice, SliceStore, parse_slice
from app.dra.taints import TaintRules, taint_rule

__all__ = [
    "BLOCKING_EFFECTS", "CLIQUE_ATTRS", "DRIVER", "IMPLICIT_PREFIX", "MAX_ATTRIBUTES", "MAX_COUNTERS",
    "MAX_DEVICES", "MAX_EXPR", "MAX_NAME", "MAX_NODE_DEVICES", "MAX_PREDICATES",
    "MAX_REGEX", "MAX_VALUES", "PCI_BUS_ID", "STANDARD_DOMAIN", "ClaimDemand", "DevicePredicate",
    "DraDevice", "DraIndex", "DraNodeGpus", "Left", "MigSlices", "ParsedSlice",
    "Selection", "class_driver", "class_selection", "device_satisfies", "node_gpus", "overlay",
    "parse_device", "parse_slice", "product_matches", "read_selectors", "taint_rule",
]


@dataclass(slots=True)
class DraIndex:
    """Everything DRA the extender knows; fed by watches, read by node facts and workload parsing."""

    driver: str = DRIVER
    enabled: bool = False  # the API exists and the slices were listed
    # Set once the watcher has listed the resource.k8s.io kinds: pods parsed from then on count
    # their claims' GPUs (ClusterSnapshot.claim_reader).
    reads_claims: bool = False
    slice_store: SliceStore = field(init=False, repr=False)
    claim_book: ClaimBook = field(init=False, repr=False)
    device_classes: DeviceClasses = field(init=False, repr=False)
    taints: TaintRules = field(init=False, repr=False)
    domains: ComputeDomains = field(init=False, repr=False)
    reader: DemandReader = field(init=False, repr=False, compare=False)
    node_queries: NodeQueries = field(init=False, repr=False, compare=False)
    _summaries: dict[str, tuple[int, DraNodeGpus | None]] = field(default_factory=dict, init=False)
    # Bumps on every change of slices, classes, claims, templates, taint rules or domains: a pod
    # parsed while it stood still reads the same claims (``stamp``; the filter reuses the watch's
    # parse of a pod only at the same resourceVersion and stamp).
    changes: int = field(default=0, init=False, compare=False)

    @property
    def stamp(self) -> tuple[int, bool]:
        return self.changes, self.reads_claims

    def __post_init__(self) -> None:
        self.slice_store = SliceStore(self.driver)
        self.claim_book = ClaimBook(self.driver)
        self.device_classes = DeviceClasses(self.driver)
        self.taints = TaintRules(self.slice_store)
        self.domains = ComputeDomains()
        self.reader = DemandReader(self.slice_store, self.claim_book, self.device_classes)
        self.node_queries = NodeQueries(self.slice_store, self.claim_book, self.taints, self.domains,
                                        self.gpus_of)

    # --- slices -----------------------------------------------------------------------------------
    def put_slice(self, obj: dict[str, Any]) -> str | None:
        """Add or replace a slice; returns the node whose facts changed (None if none)."""
        return self.put_parsed_slice(obj, parse_slice(obj))

    def put_parsed_slice(self, obj: dict[str, Any], s: ParsedSlice | None) -> str | None:
        """``put_slice`` with ``parse_slice(obj)`` done beforehand, outside the service lock (a slice
        of 128 devices takes milliseconds to read, and filter waits for that lock)."""
        self.changes += 1
        return self.slice_store.put(str((obj.get("metadata") or {}).get("name") or ""), s)

    def drop_slice(self, name: str) -> str | None:
        self.changes += 1
        return self.slice_store.drop(name)

    def clear_slices(self) -> None:
        self.changes += 1
        self.slice_store.clear()

    # --- per node ---------------------------------------------------------------------------------
    def over_limit(self, node: str) -> bool:
        """The node publishes more than MAX_NODE_DEVICES devices: its DRA GPUs are not read."""
        return self.slice_store.over_limit(node)

    def gpus_of(self, node: str) -> DraNodeGpus | None:
        names = self.slice_store.by_node.get(node)
        if not names or self.over_limit(node):
            return None
        # Overlay, MIG slices and MIG parents all read the summary: one computation per change of
        # the slices, not three (a node may carry hundreds of slices; docs/dra.md, "Churn").
        hit = self._summaries.get(node)
        if hit is not None and hit[0] == self.slice_store.version:
            return hit[1]
        got = node_gpus(self.slice_store.node_slices(node), self.driver)
        self._summaries[node] = (self.slice_store.version, got)
        return got

    def overlay(self, node: dict[str, Any], keys: NodeLabelKeys) -> dict[str, Any]:
        return self.node_queries.overlay(node, keys)

    def mig_of(self, node: str) -> tuple[tuple[str, float, int, int], ...]:
        """(profile, memory GB, slices, free slices) per MIG profile of ``node`` (``NodeFacts.mig``)."""
        return self.node_queries.mig_of(node)

    def mig_parents(self, node: str) -> int:
        return self.node_queries.mig_parents(node)

    def busy_gpus(self, node: str) -> int:
        """Full GPUs of ``node`` not free for a new claim (docs/dra.md, "Free GPUs")."""
        return self.node_queries.busy_gpus(node)

    # --- ComputeDomain cliques (the driver's compute-domain.nvidia.com side) -------------------------
    def put_domain(self, kind: str, obj: dict[str, Any]) -> set[str]:
        """Returns the nodes whose clique id may have changed."""
        self.changes += 1
        return self.domains.put(kind, obj)

    def drop_domain(self, kind: str, obj: dict[str, Any]) -> set[str]:
        self.changes += 1
        return self.domains.drop(kind, obj)

    def clear_domains(self, kind: str) -> set[str]:
        self.changes += 1
        return self.domains.clear(kind)

    def node_clique(self, node: str) -> str | None:
        return self.domains.node_clique(node)

    # --- DeviceTaintRules -------------------------------------------------------------------------
    def put_taint_rule(self, obj: dict[str, Any]) -> set[str]:
        """Add or replace a DeviceTaintRule; returns the nodes whose devices it may concern."""
        self.changes += 1
        return self.taints.put(obj)

    def drop_taint_rule(self, name: str) -> set[str]:
        self.changes += 1
        return self.taints.drop(name)

    def clear_taint_rules(self) -> set[str]:
        self.changes += 1
        return self.taints.clear()

    # --- classes and claims -----------------------------------------------------------------------
    def put_class(self, obj: dict[str, Any]) -> None:
        self.changes += 1
        self.device_classes.put(obj)

    def drop_class(self, name: str) -> None:
        self.changes += 1
        self.device_classes.drop(name)

    def clear_classes(self) -> None:
        self.changes += 1
        self.device_classes.clear()

    def put_claim(self, obj: dict[str, Any]) -> set[str]:
        """Add or replace a claim; returns the nodes whose held devices changed."""
        self.changes += 1
        return self.slice_store.nodes_of(self.claim_book.put(obj))

    def drop_claim(self, key: str) -> set[str]:
        self.changes += 1
        return self.slice_store.nodes_of(self.claim_book.drop(key))

    def clear_claims(self) -> set[str]:
        self.changes += 1
        return self.slice_store.nodes_of(self.claim_book.clear())

    def put_template(self, obj: dict[str, Any]) -> None:
        self.changes += 1
        self.claim_book.put_template(obj)

    def drop_template(self, key: str) -> None:
        self.changes += 1
        self.claim_book.templates.pop(key, None)

    def clear_templates(self) -> None:
        self.changes += 1
        self.claim_book.templates.clear()

    def is_allocated(self, key: str) -> bool:
        return self.claim_book.is_allocated(key)

    def claim_node(self, key: str) -> str | None:
        """The node whose devices of the driver an allocated claim holds (None: not allocated to
        devices of ours, or spread over nodes). kube-scheduler offers a pod with such a claim that
        node only, until the allocation is given back (docs/gangs.md, "Gangs with DRA claims")."""
        pools = {pool for pool, _ in self.claim_book.claim_devices.get(key, ())}
        nodes = {self.slice_store.pool_node.get(pool) for pool in pools}
        return nodes.pop() if len(nodes) == 1 else None

    def demand(self, claim_spec: dict[str, Any], status: dict[str, Any] | None = None) -> ClaimDemand:
        """Full GPUs and MIG slices of our driver a claim holds (allocated) or asks for (not yet)."""
        return self.reader.demand(claim_spec, status)

    def pod_gpus(self, pod: dict[str, Any], counted: tuple[str, ...] = ()) -> int:
        """Full GPUs a pod's claims hold or ask for, plus those of extended resources a DeviceClass
        of the driver backs that ``counted`` leaves out (``DemandReader.pod_gpus``)."""
        return self.reader.pod_gpus(pod, counted)

    def pod_devices(self, pod: dict[str, Any], counted: tuple[str, ...] = ()) -> ClaimedDevices:
        """Everything a pod's claims say beyond the full-GPU count (``DemandReader.pod_devices``)."""
        return self.reader.pod_devices(pod, counted)
