"""The gang table: each gang's wait state and the reservation ledger, kept in one place.

Every method expects the caller to hold the service lock (the snapshot it reads is shared with the
watch threads). The planner, the bind barrier and the lifecycle sweep all read and write gangs
through this one object, so there is one owner per piece of state: the ledger and the per-gang
states here, barriers in :mod:`app.gang.barrier`, regroups in :mod:`app.gang.regroup`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

from app.base.reasons import Rejection, shown
from app.base.workload import WorkloadSpec
from app.gang.instance import member_node
from app.gang.ledger import Ledger
from app.snapshot.store import ClusterSnapshot

# A "cannot be placed" stands at most this long even if nothing it was reached on seems to have
# changed: a bound on what a missed signal can cost (a node kube-scheduler offers one member and not
# another, a change nothing here counts). docs/gangs.md, "Cannot place".
VERDICT_SECONDS = 60.0
# A gang's place in the gang queue: (-priority, creation, first seen by the watch, key); smaller
# goes first (docs/gangs.md, "Gang queue").
QueueKey = tuple[int, float, int, str]


@dataclass(frozen=True, slots=True)
class Verdict:
    """A gang found unplaceable, and the state of the cluster it was found on."""

    why: Rejection
    stamp: tuple[object, ...]
    until: float
    # The nodes kube-scheduler offered the member whose solve said "no": a member offered a node
    # outside them (another member's view, or the same member once a taint no longer keeps it off
    # a node) may be placed where that solve could not look.
    offered: frozenset[str] = frozenset()


@dataclass(slots=True)
class GangState:
    first_seen: float  # first filter of any member (gang wait time starts here)
    priority: int = 0
    waiting_since: float | None = None  # complete but not placeable: in the admission queue
    excluded: set[str] = field(default_factory=set)  # nodes that failed this gang
    epochs: int = 0
    last_offered: Sequence[str] = ()  # the nodes kube-scheduler offered at the last member filter
    last_failure: Rejection | None = None  # why the last background plan found no placement
    verdict: Verdict | None = None  # the last solve found no placement: see GangBook.standing


class GangBook:
    def __init__(self, snapshot: ClusterSnapshot, ttl: float, scheduler_name: str = "") -> None:
        self.snapshot = snapshot
        # Only gangs of this scheduler queue (empty: every gang); another scheduler's pods never
        # reach this extender, so a plan for them would hold GPUs nobody binds.
        self.scheduler_name = scheduler_name
        self.ledger = Ledger(ttl)
        self.states: dict[str, GangState] = {}
        # Gangs whose plan is being solved right now (with the lock released): another member's
        # filter gets a "retry" instead of starting a second solve, and the sweep keeps their state.
        self._planning: dict[str, int] = {}
        self.next_expiry = math.inf

    def state(self, key: str, now: float, priority: int = 0) -> GangState:
        state = self.states.get(key)
        if state is None:
            state = self.states[key] = GangState(first_seen=now, priority=priority)
        return state

    def members(self, key: str, spec: WorkloadSpec | None = None) -> list[WorkloadSpec]:
        """Members kube-scheduler can schedule: a pod behind scheduling gates has not arrived (it
        never reaches filter, so a plan counting it would hold GPUs for a gang that cannot bind)."""
        members = [m for m in self.snapshot.gang_members(key) if not m.gated]
        if spec is not None:
            uid = spec.uid or spec.key
            if all((m.uid or m.key) != uid for m in members):
                members.append(spec)  # the watch may not have delivered the pod being filtered yet
        return members

    def count_members(self, key: str, spec: WorkloadSpec) -> int:
        """How many members exist, the pod being filtered included: ``len(members())`` without
        building the list (an incomplete gang's members are counted at every retry)."""
        live, specs = self.snapshot.gang_index.get(key, ()), self.snapshot.specs
        arrived = sum(1 for u in live if u in specs and not specs[u].gated)
        return arrived + ((spec.uid or spec.key) not in live)

    def pending(self, key: str) -> tuple[list[WorkloadSpec], list[WorkloadSpec]]:
        """(all members but gated ones, the unbound ones)."""
        members = self.members(key)
        return members, [m for m in members if not member_node(self.snapshot, m)]

    def size(self, key: str, spec: WorkloadSpec) -> int | None:
        gang = spec.gang
        if gang is not None and gang.native:
            # Only the native PodGroup's minCount: the count kube-scheduler's gang Permit waits
            # for, so the two barriers agree on when the gang is whole (docs/gangs.md).
            return self.snapshot.native_min_count.get(key)
        if gang is not None and gang.size:
            return gang.size
        if gang is not None and gang.volcano:
            return self.snapshot.volcano_min_member.get(key)
        return self.snapshot.podgroup_min_member.get(key)

    def size_conflict(self, key: str) -> str | None:
        """Words naming two members whose own sizes disagree (``gang-size`` 4 on one, 2 on another),
        or None. Such a gang is neither ungated, planned nor requeued until its members agree: no
        size would be right for all of them (docs/gangs.md, "Members that disagree")."""
        sizes: dict[int, str] = {}
        for m in self.snapshot.gang_members(key):
            if m.gang is not None and m.gang.size is not None and not m.gang.native:
                sizes.setdefault(m.gang.size, m.key)
        if len(sizes) < 2:
            return None
        (a, pa), (b, pb) = sorted(sizes.items(), reverse=True)[:2]
        more = f" (and {len(sizes) - 2} other sizes)" if len(sizes) > 2 else ""
        return (f"members of gang {shown(key)} disagree on its size: {a} ({shown(pa)}) and {b} "
                f"({shown(pb)}){more}; nothing is planned or reserved until every member says the same")

    def not_a_gang(self, spec: WorkloadSpec) -> bool:
        """A pod of a native PodGroup with the basic policy: scheduled one by one, like any pod."""
        gang = spec.gang
        return (gang is not None and gang.native and gang.key in self.snapshot.native_min_count
                and self.snapshot.native_min_count[gang.key] is None)

    def roster(self, members: Sequence[WorkloadSpec]) -> frozenset[tuple[str, str]]:
        """Who is in the gang and where the bound ones are: a plan is only valid for this roster."""
        return frozenset((m.uid or m.key, member_node(self.snapshot, m)) for m in members)

    # --- the gang queue (docs/gangs.md, "Gang queue") -----------------------------------------------
    def order(self, key: str, members: Sequence[WorkloadSpec]) -> QueueKey:
        """Higher pod priority first, then the earlier of the first member's creation and the
        PodGroup's, then which the watch saw first (creation times have whole seconds), then the
        name: known before any member is filtered and the same in every replica, unlike the order
        kube-scheduler happens to pop the members in."""
        created = min((m.created for m in members if m.created), default=0.0)
        group = self.snapshot.gang_created.get(key, 0.0)
        if group and (not created or group < created):
            created = group
        # creationTimestamp has whole seconds: within one, the order the watch saw the gangs in.
        seen = self.snapshot.gang_seen.get(key, 0)
        return (-max((m.priority for m in members), default=0), created, seen, key)

    def queue(self) -> list[tuple[QueueKey, str]]:
        """Complete gangs of this scheduler with members to place and no plan, in queue order."""
        out = []
        specs = self.snapshot.specs
        for key, uids in list(self.snapshot.gang_index.items()):
            if key in self.ledger.plans:
                continue
            # Cheap first: thousands of incomplete gangs may exist (a flood), each far from its size.
            any_spec = next((specs[u] for u in uids if u in specs), None)
            known = self.size(key, any_spec) if any_spec is not None else None
            if known is None or len(uids) < known:
                continue
            members, pending = self.pending(key)
            if not pending:
                continue
            first = pending[0]
            foreign = self.scheduler_name and first.scheduler_name not in ("", self.scheduler_name)
            if foreign or self.not_a_gang(first):
                continue
            size = self.size(key, first)
            if size is None or len(members) < size or self.size_conflict(key) is not None:
                continue
            out.append((self.order(key, members), key))
        out.sort()
        return out

    # --- "cannot be placed" verdicts (docs/gangs.md) ----------------------------------------------
    def stamp(self, key: str, members: Sequence[WorkloadSpec], size: int) -> tuple[object, ...]:
        """What a solve for ``key`` depends on that can turn "no" into "yes": room freed anywhere
        (pods ended or deleted, nodes added, changed or uncordoned, DRA devices given back),
        ResourceSlices, other gangs' reservations given back, and the gang itself (its size, its
        members, their specs and where the bound ones are). Bindings of other pods move none of
        it: they only take room. Cheap enough for every retry of every member."""
        snap = self.snapshot
        return (snap.freed, snap.dra.slice_store.version, self.ledger.released, size,
                tuple((m.uid or m.key, member_node(snap, m), m) for m in members))

    def standing(self, key: str, state: GangState, members: Sequence[WorkloadSpec], size: int,
                 now: float, offered: Iterable[str] | None = None) -> Rejection | None:
        """Why the gang cannot be placed, if its last solve said so and nothing that could change
        the answer has changed since: kube-scheduler retries each member on every cluster event,
        and solving again on the same facts would give the same "no" (docs/gangs.md). ``offered``:
        the nodes kube-scheduler offers the member asking now; one the solve was not offered voids
        the "no"."""
        v = state.verdict
        if v is None:
            return None
        wider = offered is not None and not v.offered.issuperset(offered)
        if now < v.until and not wider and v.stamp == self.stamp(key, members, size):
            return v.why
        state.verdict = None
        return None

    # --- plans in progress ------------------------------------------------------------------------
    def planning(self, key: str) -> bool:
        return key in self._planning

    @contextmanager
    def plan_in_progress(self, key: str) -> Iterator[None]:
        self.begin_planning(key)
        try:
            yield
        finally:
            self.end_planning(key)

    def begin_planning(self, key: str) -> None:
        self._planning[key] = self._planning.get(key, 0) + 1

    def end_planning(self, key: str) -> None:
        left = self._planning[key] - 1
        if left:
            self._planning[key] = left
        else:
            del self._planning[key]

    def refresh_expiry(self) -> None:
        self.next_expiry = min((p.expires_at for p in self.ledger), default=math.inf)
