"""Reservation ledger: which GPUs are promised to which gang plan, until bound, deleted or expired.

Pure bookkeeping (no Kubernetes, no clock of its own): the coordinator passes ``now``. Reservations
count only members not yet bound, so a bound member's GPUs are counted once (by the snapshot's
usage) and never twice. ``reserved_gpus`` is called for every node on every filter, so it is O(1):
per-node totals are maintained incrementally.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field


@dataclass(slots=True)
class MemberPlan:
    uid: str
    pod: str  # ns/name
    node: str
    gpus: int
    bound: bool = False


@dataclass(slots=True)
class GangPlan:
    gang: str
    members: dict[str, MemberPlan]  # uid -> where it goes
    planned_at: float
    expires_at: float
    epoch: int = 1
    # A barrier timed out, a bind failed or a planned node stopped fitting: the next filter of a
    # member replans (the reservation is kept until then so no other pod takes the capacity).
    stale: bool = False
    summary: str = ""  # the domains chosen, for events
    restored: bool = False  # rebuilt from pod annotations after a restart
    # Members kube-scheduler has filtered against this plan with their planned node passing its own
    # filters: none is let through to bind until all are (docs/gangs.md, "Gather at filter").
    arrived: set[str] = field(default_factory=set)
    gathered: bool = False  # every unbound member arrived: filters pass them to their nodes
    committed: bool = False  # gathered and some members bound: the rest bind as they reach bind
    # uid -> partial offers in a row (a sample, a node tried alone) without the member's planned
    # node while nothing the extender sees kept it out (app.placement.offer).
    unoffered: dict[str, int] = field(default_factory=dict)

    @property
    def unbound(self) -> list[MemberPlan]:
        return [m for m in self.members.values() if not m.bound]

    @property
    def complete(self) -> bool:
        return all(m.bound for m in self.members.values())

    def nodes(self) -> set[str]:
        return {m.node for m in self.members.values()}


@dataclass(slots=True)
class Ledger:
    ttl: float
    plans: dict[str, GangPlan] = field(default_factory=dict)
    _by_node: dict[str, dict[str, int]] = field(default_factory=dict)  # node -> gang -> GPUs
    _total: dict[str, int] = field(default_factory=dict)  # node -> GPUs reserved by all gangs
    # Bumps when reserved GPUs go back to everyone (a plan dropped before all its members bound,
    # a member bound elsewhere than planned): part of what a gang's "cannot be placed" waits on.
    released: int = 0
    # gang -> node -> GPUs: whole nodes the oldest gang that cannot be placed keeps for itself as
    # they free (docs/gangs.md, "Starvation bound"); counted like a plan's.
    holds: dict[str, dict[str, int]] = field(default_factory=dict)

    def __iter__(self) -> Iterator[GangPlan]:
        return iter(list(self.plans.values()))

    def get(self, gang: str) -> GangPlan | None:
        return self.plans.get(gang)

    def reserved_gpus(self, node: str, exclude_gang: str | None = None) -> int:
        total = self._total.get(node, 0)
        if total and exclude_gang is not None:
            total -= self._by_node.get(node, {}).get(exclude_gang, 0)
        return total

    def reserved_map(self, exclude_gang: str | None = None) -> dict[str, int]:
        """node -> GPUs reserved by other gangs, only for nodes holding a reservation (usually few)."""
        out = {}
        for node in self._total:
            n = self.reserved_gpus(node, exclude_gang)
            if n:
                out[node] = n
        return out

    def holders(self, node: str, exclude_gang: str | None = None) -> list[tuple[str, bool]]:
        """Each other gang with GPUs kept on ``node``: (gang, True) for a hold of the oldest
        waiting gang, (gang, False) for a plan's members not yet bound."""
        return [(gang, gang in self.holds and node in self.holds[gang])
                for gang, gpus in sorted(self._by_node.get(node, {}).items())
                if gpus and gang != exclude_gang]

    def total_reserved(self) -> int:
        return sum(self._total.values())

    def hold(self, gang: str, nodes: dict[str, int]) -> None:
        """Keep ``nodes`` (node -> its GPUs) for ``gang``, replacing the gang's previous hold.
        Only GPUs given back count as released (other gangs' "cannot be placed" may change)."""
        old = self.holds.pop(gang, {})
        if any(old.get(n, 0) > nodes.get(n, 0) for n in old):
            self.released += 1
        for node in set(old) | set(nodes):
            self._add(node, gang, nodes.get(node, 0) - old.get(node, 0))
        if nodes:
            self.holds[gang] = dict(nodes)

    def unhold(self, gang: str) -> bool:
        if gang not in self.holds:
            return False
        self.hold(gang, {})
        return True

    def put(self, plan: GangPlan) -> GangPlan | None:
        """Install ``plan`` (replacing and releasing the gang's previous one, which is returned)."""
        self.unhold(plan.gang)
        old = self.drop(plan.gang)
        self.plans[plan.gang] = plan
        for m in plan.unbound:
            self._add(m.node, plan.gang, m.gpus)
        return old

    def drop(self, gang: str) -> GangPlan | None:
        plan = self.plans.pop(gang, None)
        if plan is not None:
            if any(m.gpus for m in plan.unbound):
                self.released += 1
            for m in plan.unbound:
                self._add(m.node, gang, -m.gpus)
        return plan

    def mark_bound(self, gang: str, uid: str, node: str | None = None) -> bool:
        """A member is bound (by us or seen bound by the watch): release its reservation.

        If it landed somewhere else than planned (``node``), the plan follows reality.
        """
        plan = self.plans.get(gang)
        m = plan.members.get(uid) if plan else None
        if plan is None or m is None or m.bound:
            return False
        self._add(m.node, gang, -m.gpus)
        m.bound = True
        if node and node != m.node:
            self.released += 1
            m.node = node
        return True

    def expired(self, now: float) -> list[GangPlan]:
        """Drop and return plans whose TTL has passed."""
        out = [p for p in self.plans.values() if now >= p.expires_at]
        for p in out:
            self.drop(p.gang)
        return out

    def _add(self, node: str, gang: str, gpus: int) -> None:
        if not gpus:
            return
        per = self._by_node.setdefault(node, {})
        per[gang] = per.get(gang, 0) + gpus
        if per[gang] <= 0:
            del per[gang]
            if not per:
                del self._by_node[node]
        self._total[node] = self._total.get(node, 0) + gpus
        if self._total[node] <= 0:
            del self._total[node]
