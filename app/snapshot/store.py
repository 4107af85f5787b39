"""Cluster snapshot: node facts plus what is running (or about to run) where.

The adapter feeds it from watch events; the demo and simulator feed it from files. Placement code
reads it and never mutates it: a verb reads one consistent view of it and writes only its
assumptions (a pod we bound but the watch has not shown), both through
:class:`app.snapshot.access.SnapshotAccess`, which refuses any other write from a thread that
holds a view (:class:`ReadOnlyView`). Callers serialise access (one lock in the adapter), so nothing
here locks.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from app.base.workload import TRAINING_STAGES, LatencyClass, Precision, Stage, WorkloadSpec
from app.dra.index import DraIndex
from app.snapshot.node_table import NodeTable
from app.snapshot.nodes import NodeFacts

TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})


class ReadOnlyView(RuntimeError):
    """A thread that reads the snapshot as a verb wrote to it other than through its assumptions."""


@dataclass(slots=True)
class PlacedPod:
    """A pod that holds (or held) resources on a node."""

    uid: str
    key: str
    node: str
    gpus: int  # charged to the node: extended resources, and claims not yet allocated
    cpu_millis: float
    memory_bytes: float
    stage: Stage | None
    latency_class: LatencyClass | None
    gang: str | None
    priority: int = 0
    assumed: bool = False  # bound by us, not yet confirmed by the watch
    finished_at: float | None = None  # producers that finished still count for data gravity
    # GPU serving pods only: their workload and the precision they were bound at, so measured
    # latency can be attributed to a model on a GPU (app.serving.live_profiles).
    serving: WorkloadSpec | None = None
    precision: Precision | None = None
    # The pod's DRA claims (ns/name, full GPUs). Given with ``gpus`` holding every GPU the pod
    # asks for; on placing, the snapshot charges only those of claims not yet allocated: an
    # allocated claim's devices count on their node once, however many pods share the claim
    # (``NodeUsage.dra_busy``, docs/dra.md).
    claims: tuple[tuple[str, int], ...] = ()
    base_gpus: int | None = None  # ``gpus`` less the claims' (set on placing)


@dataclass(slots=True)
class NodeUsage:
    gpus: int = 0
    cpu_millis: float = 0.0
    memory_bytes: float = 0.0
    pods: dict[str, PlacedPod] = field(default_factory=dict)
    stages: Counter[str] = field(default_factory=Counter)
    interactive: int = 0
    training: int = 0  # kept as a plain counter: it is read for every node on the hot path
    # Full GPUs of the node's DRA devices that are not free for a new claim (allocated, whether or
    # not a pod of ours holds the claim; docs/dra.md). Included in ``gpus``.
    dra_busy: int = 0


class ClusterSnapshot:
    """Nodes, their usage, and where every known pod is (or last was)."""

    def __init__(self) -> None:
        self.nodes: dict[str, NodeFacts] = {}
        # name -> what node facts are computed from (app.snapshot.nodes.node_inputs): DRA events
        # recompute a node's facts from it, not from a fresh GET of the Node (docs/dra.md).
        self.node_inputs: dict[str, dict[str, Any]] = {}
        self.usage: dict[str, NodeUsage] = {}
        # name -> (facts, usage, shape id): one lookup per node on the filter hot path, and a small
        # int standing for the node's shape (hashing the shape tuple per node per request is slow).
        self.entries: dict[str, tuple[NodeFacts, NodeUsage, int]] = {}
        self._shape_ids: dict[tuple[object, ...], int] = {}
        self.pods: dict[str, PlacedPod] = {}  # uid -> running/bound pod
        self.claim_pods: dict[str, set[str]] = {}  # DRA claim ns/name -> uids of placed pods naming it
        self.by_key: dict[str, str] = {}  # ns/name -> uid
        self.finished: dict[str, PlacedPod] = {}  # ns/name -> finished producer (data gravity)
        self.specs: dict[str, WorkloadSpec] = {}  # uid -> every live pod that parsed (bound or not)
        # uid -> (resourceVersion, DRA stamp) the spec was parsed at: the filter reuses the watch's
        # parse of a pod at the same version, while the DRA objects it may read stood still.
        self.spec_source: dict[str, tuple[str, tuple[int, bool]]] = {}
        self.gang_index: dict[str, set[str]] = {}  # gang key -> live member uids
        # gang key -> when the watch first saw a live member (a counter): breaks ties between gangs
        # created in the same second (creationTimestamp has whole seconds; docs/gangs.md).
        self.gang_seen: dict[str, int] = {}
        self._seen = 0
        # ns/serving-group -> live member uids: prefill and decode pods kept close (data gravity).
        self.serving_groups: dict[str, set[str]] = {}
        self.podgroup_min_member: dict[str, int] = {}  # ns/name -> PodGroup.spec.minMember
        # ns/name -> Volcano PodGroup (scheduling.volcano.sh) spec.minMember (docs/gangs.md).
        self.volcano_min_member: dict[str, int] = {}
        # ns/name -> native PodGroup (scheduling.k8s.io/v1alpha2) gang minCount, None for the basic
        # policy (not a gang); absent: not seen (docs/gangs.md, native Workload API).
        self.native_min_count: dict[str, int | None] = {}
        # ns/name -> creationTimestamp (Unix seconds) of a PodGroup of any kind: a gang sized by one
        # queues from the earlier of it and its first member (docs/gangs.md, "Gang queue").
        self.gang_created: dict[str, float] = {}
        # namespace -> namespaces it shares its pods' data with (Namespace annotation
        # llm-placement.io/share-with, docs/data-gravity.md); "*" shares with every namespace.
        self.namespace_shares: dict[str, frozenset[str]] = {}
        # GPUs published through DRA ResourceSlices and the claims pods hold (docs/dra.md); empty
        # on clusters without the resource.k8s.io API.
        self.dra = DraIndex()
        self.generation = 0  # bumps on every change; caches key on it
        # Bumps only when room may have appeared: a pod released what it held, a node came or its
        # facts changed, DRA devices were given back. A gang found unplaceable is not planned
        # again until it moves (docs/gangs.md, "Cannot place"); a bind must not move it.
        self.freed = 0
        # The same nodes and usage counters as columns, for per-request work by class of node.
        self.table = NodeTable()
        # Threads reading a verb's view (ident -> depth) and whether an assumption is being written:
        # a write from a viewing thread is refused unless it is an assumption (SnapshotAccess).
        self.viewers: dict[int, int] = {}
        self.assuming = False

    def _writable(self) -> None:
        if self.viewers and not self.assuming and threading.get_ident() in self.viewers:
            raise ReadOnlyView("a verb wrote to the cluster snapshot other than through its "
                               "assumptions (app.snapshot.access)")

    # --- nodes ---------------------------------------------------------------------------------
    def upsert_node(self, facts: NodeFacts) -> None:
        self._writable()
        sid = self._shape_ids.setdefault(facts.shape, len(self._shape_ids))
        if facts.shape_id != sid:
            facts = facts.model_copy(update={"shape_id": sid})
        if self.nodes.get(facts.name) != facts:
            self.freed += 1
        self.nodes[facts.name] = facts
        usage = self.usage.setdefault(facts.name, NodeUsage())
        self.entries[facts.name] = (facts, usage, sid)
        self.table.set_node(facts.name, sid, facts.gpu_count, facts.prefer_no_schedule)
        self._sync(facts.name, usage)
        self.generation += 1

    def remove_node(self, name: str) -> None:
        self._writable()
        self.nodes.pop(name, None)
        self.node_inputs.pop(name, None)
        self.entries.pop(name, None)
        self.table.remove_node(name)
        self.generation += 1

    # --- pods ----------------------------------------------------------------------------------
    def place(self, pod: PlacedPod) -> None:
        """Record ``pod`` on its node (idempotent by UID; a move releases the old node)."""
        self._writable()
        if pod.claims:
            if pod.base_gpus is None:
                pod.base_gpus = pod.gpus - sum(n for _, n in pod.claims)
            pod.gpus = self._charge(pod)
        old = self.pods.get(pod.uid)
        if old is not None:
            # Same node: keep the record, unless the watch reports other resources than were
            # assumed at bind (a DRA claim is allocated after filter: docs/dra.md). The watch is the
            # truth; an assumption never overrides it.
            if old.node == pod.node and (pod.assumed or _same_resources(old, pod)):
                old.assumed = old.assumed and pod.assumed
                old.precision = pod.precision or old.precision
                return
            self._release(old)
        self.pods[pod.uid] = pod
        self.by_key[pod.key] = pod.uid
        self.finished.pop(pod.key, None)
        u = self.usage.setdefault(pod.node, NodeUsage())
        u.gpus += pod.gpus
        u.cpu_millis += pod.cpu_millis
        u.memory_bytes += pod.memory_bytes
        u.pods[pod.uid] = pod
        for claim, _ in pod.claims:
            self.claim_pods.setdefault(claim, set()).add(pod.uid)
        if pod.stage is not None:
            u.stages[pod.stage.value] += 1
            if pod.stage in TRAINING_STAGES:
                u.training += 1
        if pod.stage is Stage.SERVING and pod.latency_class is LatencyClass.INTERACTIVE:
            u.interactive += 1
        self._sync(pod.node, u)
        self.generation += 1

    def assume(self, spec: WorkloadSpec, node: str) -> None:
        self.place(placed_from_spec(spec, node, assumed=True))

    def unassume(self, uid: str) -> None:
        """Take back an assumption whose bind failed (a pod the watch confirmed stays)."""
        self._writable()
        pod = self.pods.get(uid)
        if pod is not None and pod.assumed:
            self._release(pod)

    def finish(self, uid: str, now: float | None = None) -> None:
        """A pod ended (succeeded, failed or deleted): free its resources, remember its node."""
        self._writable()
        pod = self.pods.get(uid)
        if pod is None:
            return
        self._release(pod)
        pod.finished_at = time.time() if now is None else now
        self.finished[pod.key] = pod

    def _release(self, pod: PlacedPod) -> None:
        self.freed += 1
        self.pods.pop(pod.uid, None)
        if self.by_key.get(pod.key) == pod.uid:
            self.by_key.pop(pod.key, None)
        for claim, _ in pod.claims:
            holders = self.claim_pods.get(claim)
            if holders is not None:
                holders.discard(pod.uid)
                if not holders:
                    del self.claim_pods[claim]
        u = self.usage.get(pod.node)
        if u is not None and u.pods.pop(pod.uid, None) is not None:
            u.gpus -= pod.gpus
            u.cpu_millis -= pod.cpu_millis
            u.memory_bytes -= pod.memory_bytes
            if pod.stage is not None:
                u.stages[pod.stage.value] -= 1
                if pod.stage in TRAINING_STAGES:
                    u.training -= 1
            if pod.stage is Stage.SERVING and pod.latency_class is LatencyClass.INTERACTIVE:
                u.interactive -= 1
            self._sync(pod.node, u)
        self.generation += 1

    # --- DRA (docs/dra.md) ---------------------------------------------------------------------
    def _charge(self, pod: PlacedPod) -> int:
        base = pod.gpus if pod.base_gpus is None else pod.base_gpus
        return base + sum(n for claim, n in pod.claims if not self.dra.is_allocated(claim))

    def claim_reader(self) -> DraIndex | None:
        """How pods' DRA claims are read, once the cluster's claims are known (else None)."""
        return self.dra if self.dra.reads_claims else None

    def refresh_dra(self, nodes: Iterable[str] = (), claims: Iterable[str] = ()) -> None:
        """After DRA objects changed: the busy devices of ``nodes`` and the charge of the pods that
        name ``claims``. Both at once (under the caller's lock), so a claim's GPUs move from its
        pods to its node without a moment where they count twice or not at all."""
        self._writable()
        for node in nodes:
            u = self.usage.setdefault(node, NodeUsage())
            busy = self.dra.busy_gpus(node)
            if busy < u.dra_busy:
                self.freed += 1
            if busy != u.dra_busy:
                u.gpus += busy - u.dra_busy
                u.dra_busy = busy
                self._sync(node, u)
                self.generation += 1
        for claim in claims:
            for uid in sorted(self.claim_pods.get(claim, ())):
                pod = self.pods.get(uid)
                if pod is None or (charge := self._charge(pod)) == pod.gpus:
                    continue
                if charge < pod.gpus:
                    self.freed += 1
                u = self.usage.setdefault(pod.node, NodeUsage())
                u.gpus += charge - pod.gpus
                pod.gpus = charge
                self._sync(pod.node, u)
                self.generation += 1

    def new_gpus(self, spec: WorkloadSpec) -> int:
        """GPUs the pod still needs free: those of claims already allocated are held, shares need
        room on a device rather than a free GPU (docs/dra.md)."""
        return spec.charged_gpus - sum(n for claim, n in spec.claim_gpus if self.dra.is_allocated(claim))

    def _sync(self, node: str, u: NodeUsage) -> None:
        self.table.set_usage(node, u.gpus, u.cpu_millis, u.training, u.interactive)

    def forget_finished_before(self, cutoff: float) -> None:
        self._writable()
        for key in [k for k, p in self.finished.items() if (p.finished_at or 0) < cutoff]:
            del self.finished[key]

    def track_spec(self, spec: WorkloadSpec, version: str = "") -> None:
        """Remember a live pod's spec (gang membership, explain); bound or pending alike.
        ``version``: the resourceVersion it was parsed from (empty: not to be reused by filter)."""
        self._writable()
        if version:
            self.spec_source[spec.uid or spec.key] = (version, self.dra.stamp)
        else:
            self.spec_source.pop(spec.uid or spec.key, None)
        uid = spec.uid or spec.key
        old = self.specs.get(uid)
        if old is not None and old.gang is not None and (spec.gang is None or old.gang.key != spec.gang.key):
            self._untrack_gang(old.gang.key, uid)
        if old is not None and old.serving_group is not None and old.serving_group != spec.serving_group:
            self._untrack(self.serving_groups, serving_group_key(old), uid)
        self.specs[uid] = spec
        if spec.gang is not None:
            self.gang_index.setdefault(spec.gang.key, set()).add(uid)
            if spec.gang.key not in self.gang_seen:
                self._seen += 1
                self.gang_seen[spec.gang.key] = self._seen
        if spec.serving_group is not None:
            self.serving_groups.setdefault(serving_group_key(spec), set()).add(uid)

    def untrack_spec(self, uid: str) -> None:
        self._writable()
        self.spec_source.pop(uid, None)
        old = self.specs.pop(uid, None)
        if old is not None and old.gang is not None:
            self._untrack_gang(old.gang.key, uid)
        if old is not None and old.serving_group is not None:
            self._untrack(self.serving_groups, serving_group_key(old), uid)

    @staticmethod
    def _untrack(index: dict[str, set[str]], key: str, uid: str) -> None:
        members = index.get(key)
        if members is not None:
            members.discard(uid)
            if not members:
                del index[key]

    def serving_group_members(self, key: str) -> list[WorkloadSpec]:
        """Live pods of the serving group ``ns/group``, bound or pending."""
        return [self.specs[u] for u in sorted(self.serving_groups.get(key, ())) if u in self.specs]

    def _untrack_gang(self, gang: str, uid: str) -> None:
        members = self.gang_index.get(gang)
        if members is not None:
            members.discard(uid)
            if not members:
                del self.gang_index[gang]
                self.gang_seen.pop(gang, None)

    def gang_members(self, gang: str) -> list[WorkloadSpec]:
        return [self.specs[u] for u in sorted(self.gang_index.get(gang, ())) if u in self.specs]

    # --- queries -------------------------------------------------------------------------------
    def watched_spec(self, uid: str, version: str) -> WorkloadSpec | None:
        """The watch's parse of pod ``uid`` if it was made from ``version`` of the pod and no DRA
        object changed since (a parse reads the pod's claims); else None."""
        got = self.spec_source.get(uid)
        if got is None or got[0] != version or got[1] != self.dra.stamp:
            return None
        return self.specs.get(uid)

    def free_gpus(self, node: str) -> int:
        facts = self.nodes.get(node)
        if facts is None:
            return 0
        return facts.gpu_count - self.usage.get(node, NodeUsage()).gpus

    def node_of(self, key: str) -> tuple[str, bool] | None:
        """Where the pod named ``ns/name`` is bound (finished=False) or last ran (finished=True)."""
        uid = self.by_key.get(key)
        if uid is not None and uid in self.pods:
            return self.pods[uid].node, False
        if key in self.finished:
            return self.finished[key].node, True
        return None

    def gang_nodes(self, gang_key: str) -> list[str]:
        return [self.pods[u].node for u in self.gang_index.get(gang_key, ()) if u in self.pods]


def serving_group_key(spec: WorkloadSpec) -> str:
    """A serving group is named within the pod's namespace: another tenant cannot join it."""
    return f"{spec.namespace}/{spec.serving_group}"


def _same_resources(a: PlacedPod, b: PlacedPod) -> bool:
    return (a.gpus, a.cpu_millis, a.memory_bytes) == (b.gpus, b.cpu_millis, b.memory_bytes)


def placed_from_spec(spec: WorkloadSpec, node: str, *, assumed: bool = False) -> PlacedPod:
    return PlacedPod(
        uid=spec.uid or spec.key,
        key=spec.key,
        node=node,
        gpus=spec.charged_gpus,
        cpu_millis=spec.cpu_millis,
        memory_bytes=spec.memory_bytes,
        stage=spec.stage,
        latency_class=spec.effective_latency_class,
        gang=spec.gang.key if spec.gang else None,
        priority=spec.priority,
        assumed=assumed,
        serving=serving_spec(spec),
        claims=spec.claim_gpus,
    )


def serving_spec(spec: WorkloadSpec) -> WorkloadSpec | None:
    """The spec worth keeping on a placed pod for learnt profiles: GPU serving with a model size."""
    ok = spec.stage is Stage.SERVING and spec.gpus > 0 and spec.model_params is not None
    return spec if ok else None
