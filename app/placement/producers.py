"""Where a pod's inputs sit: its `depends-on` producers and serving-group partners (docs/data-gravity.md).

Each ``depends-on`` name is an edge to a producer: a pod or a gang, in the consumer's namespace unless
written ``ns/name``. An edge resolves to the node(s) where the producer's output sits: where it runs or
is bound, where it ran if it finished less than ``producer_memory_seconds`` ago (its output is still on
that node's disk), or where a gang's reservation plan puts it.

Serving groups (``llm-placement.io/serving-group``) reuse the same edges: a ``prefill`` pod has an edge
to the ``decode`` pods of its group and the reverse, since every request's KV cache crosses between
them.

Pure: reads a ClusterSnapshot and never mutates it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from app.base.workload import MAX_LIST_ITEMS, PREFIX, ServingRole, WorkloadSpec
from app.snapshot.store import ClusterSnapshot, PlacedPod, serving_group_key

# When a pod declares producers but not how much it reads, still prefer its producers' neighbourhood:
# the amount only weighs producers against each other, so any positive figure gives the same ranking.
DEFAULT_INPUT_GB = 1.0
# Namespace annotation by which a producer's namespace lets other namespaces' pods follow its pods.
SHARE_ANNOTATION = PREFIX + "share-with"
SERVING_GROUP = "serving-group"  # Edge.kind of a serving group's partner pods


@dataclass(frozen=True, slots=True)
class Site:
    """One place a producer's output sits, with the share of the edge's data found there."""

    node: str
    state: str  # "bound" (running or bound), "finished", "planned" (gang reservation)
    share: float


@dataclass(frozen=True, slots=True)
class Edge:
    """One resolved ``depends-on`` entry."""

    producer: str  # ns/name
    kind: str  # "pod", "gang" or "missing"
    gb: float  # data this edge carries (the pod's input-data-gb split over its edges)
    sites: tuple[Site, ...] = ()
    note: str = ""

    @property
    def found(self) -> bool:
        return bool(self.sites)


@dataclass(slots=True)
class _Memo:
    generation: int = -1
    finished_gangs: dict[str, list[PlacedPod]] = field(default_factory=dict)


@dataclass(eq=False)
class ProducerResolver:
    """``planned`` returns the planned node of every member of a gang that holds a reservation (one
    entry per member), or nothing; the gang book supplies it. ``clock`` is injectable so the simulator
    and tests can move time. Built by ``app.placement.gravity.GravityModel``, which holds the defaults."""

    snapshot: ClusterSnapshot
    producer_memory_seconds: float
    planned: Callable[[str], Sequence[str]] | None
    clock: Callable[[], float]
    default_input_gb: float
    _memo: _Memo = field(default_factory=_Memo, init=False, repr=False)

    def _fresh(self, pod: PlacedPod, now: float) -> bool:
        return pod.finished_at is None or now - pod.finished_at <= self.producer_memory_seconds

    def _finished_gang_members(self, gang: str) -> list[PlacedPod]:
        # Finished pods are indexed by name only; build a gang index once per snapshot generation.
        memo = self._memo
        if memo.generation != self.snapshot.generation:
            index: dict[str, list[PlacedPod]] = {}
            for p in self.snapshot.finished.values():
                if p.gang:
                    index.setdefault(p.gang, []).append(p)
            memo.finished_gangs = index
            memo.generation = self.snapshot.generation
        return memo.finished_gangs.get(gang, [])

    def _resolve_one(self, key: str, gb: float, now: float) -> Edge:
        snap = self.snapshot
        window = self.producer_memory_seconds
        forgotten = ""
        at = snap.node_of(key)
        if at is not None:
            node, finished = at
            pod = snap.finished.get(key) if finished else None
            if pod is None or self._fresh(pod, now):
                if node not in snap.nodes:
                    return Edge(key, "missing", gb, note=f"producer {key} ran on {node}, no longer a node")
                return Edge(key, "pod", gb, (Site(node, "finished" if finished else "bound", 1.0),))
            forgotten = f"producer {key} finished more than {window:g}s ago; its node is forgotten"
        # A gang: live bound members, members that finished within the window, else the plan.
        located: list[tuple[str, str]] = [(n, "bound") for n in snap.gang_nodes(key)]
        located += [(p.node, "finished") for p in self._finished_gang_members(key) if self._fresh(p, now)]
        if not located and self.planned is not None:
            located = [(n, "planned") for n in self.planned(key)]
        lost = {n for n, _ in located if n not in snap.nodes}
        located = [(n, s) for n, s in located if n not in lost]
        if located:
            # A gang's output (a sharded checkpoint) is spread over its members: each member's node
            # holds its share, so a consumer next to one member still reads the others' shares remotely.
            counts = Counter(located)
            total = sum(counts.values())
            sites = tuple(Site(n, s, c / total) for (n, s), c in sorted(counts.items()))
            return Edge(key, "gang", gb, sites)
        if lost:
            return Edge(key, "missing", gb, note=f"producer {key} ran on nodes no longer in the cluster")
        note = forgotten or (
            f"producer {key} not found (not running, bound, planned, or finished in the last {window:g}s)"
        )
        return Edge(key, "missing", gb, note=note)

    def resolve(self, spec: WorkloadSpec) -> list[Edge]:
        """Every distinct producer the pod names, resolved; never raises."""
        # A dict keeps first-seen order and de-duplicates in linear time (the parser bounds the list
        # at MAX_LIST_ITEMS, docs/annotations.md; the slice keeps specs built elsewhere bounded too).
        keys: dict[str, None] = {}
        for raw in spec.depends_on[:MAX_LIST_ITEMS]:
            ns, sep, name = raw.partition("/")
            key = raw if sep and ns and name else f"{spec.namespace}/{raw.strip('/')}"
            if key != spec.key:
                keys.setdefault(key)
        group = self._serving_group_edge(spec)
        if not keys:
            return [group] if group is not None else []
        # input-data-gb is what the pod reads from all of them together.
        per_edge = (spec.input_data_gb or self.default_input_gb) / len(keys)
        now = self.clock()
        edges = [self._resolve_one(k, per_edge, now) if self.shared(k, spec.namespace)
                 else self._unshared(k, spec.namespace, per_edge) for k in keys]
        return [*edges, group] if group is not None else edges

    def _serving_group_edge(self, spec: WorkloadSpec) -> Edge | None:
        """The placed partners of a prefill or decode pod: its group's pods of the other role.

        The group is looked up in the pod's own namespace only. Until a partner is placed the edge has
        no sites: it pulls nowhere and, unlike a missing producer, blocks nothing (the first pod of a
        pair goes where it fits best, the second follows it). Its weight is ``default_input_gb``, the
        figure of a producer of unknown size: the pull ranks partners' neighbourhoods, not GB.
        """
        if spec.serving_group is None or spec.serving_role is ServingRole.BOTH:
            return None
        want = ServingRole.DECODE if spec.serving_role is ServingRole.PREFILL else ServingRole.PREFILL
        key = serving_group_key(spec)
        located: list[str] = []
        for peer in self.snapshot.serving_group_members(key):
            if peer.serving_role is not want or peer.key == spec.key:
                continue
            at = self.snapshot.node_of(peer.key)
            if at is not None and not at[1] and at[0] in self.snapshot.nodes:
                located.append(at[0])
        label = f"{key} ({want.value})"
        if not located:
            return Edge(label, SERVING_GROUP, self.default_input_gb,
                        note=f"no {want.value} pod of serving-group {key} is placed yet")
        counts = Counter(located)
        sites = tuple(Site(n, "bound", c / len(located)) for n, c in sorted(counts.items()))
        return Edge(label, SERVING_GROUP, self.default_input_gb, sites)

    def shared(self, key: str, consumer_namespace: str) -> bool:
        """May a pod of ``consumer_namespace`` follow producer ``key`` (docs/data-gravity.md)?

        Its own namespace always; another only when that namespace opts in with the annotation
        ``llm-placement.io/share-with`` naming the consumer's namespace (or ``*``).
        """
        producer_ns = key.partition("/")[0]
        if producer_ns == consumer_namespace:
            return True
        allowed = self.snapshot.namespace_shares.get(producer_ns, frozenset())
        return "*" in allowed or consumer_namespace in allowed

    @staticmethod
    def _unshared(key: str, consumer_namespace: str, gb: float) -> Edge:
        # Never looked up: the same answer whether the producer exists or not, so a tenant cannot
        # use depends-on to learn what runs in a namespace that does not share with it, or where.
        return Edge(key, "missing", gb, note=f"producer {key} not found or its namespace does not "
                    f"share with {consumer_namespace} ({SHARE_ANNOTATION})")
