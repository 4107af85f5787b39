"""A gang plan's life after planning: follow the snapshot (members bound or deleted), complete,
release, expire, and rebuild plans from pod annotations after a restart.

Methods named without ``locked_`` take the service lock themselves; the others expect it held.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from app.base.reasons import MESSAGE_PREFIX, shown
from app.gang.book import GangBook, GangState
from app.gang.ledger import GangPlan, MemberPlan
from app.gang.persist import FUTURE_SKEW_SECONDS, PlanRecord, PlanStore
from app.gang.report import Reporter

log = logging.getLogger(__name__)


@dataclass(eq=False)
class Lifecycle:
    book: GangBook
    lock: threading.RLock
    reporter: Reporter
    store: PlanStore
    clock: Callable[[], float]
    fail_bind: Callable[[str, str], None]  # fail the gang's bind barrier with this message
    forget: Callable[[str], None]  # drop other components' state of a gang that is gone
    # Deletions are only trusted once the watch has listed everything (after a restart the
    # snapshot starts empty and every restored member would look deleted).
    synced: Callable[[], bool]
    _swept: tuple[int, int] = field(init=False, default=(-1, -1))

    def maybe_sweep(self) -> None:
        """Two integer compares on the common path; the sweep runs only when something changed."""
        snap, book = self.book.snapshot, self.book
        if (snap.generation != self._swept[0] or len(snap.specs) != self._swept[1]
                or (book.ledger.plans and self.clock() >= book.next_expiry)):
            with self.lock:
                self.locked_sweep(self.clock())

    def locked_sweep(self, now: float, force: bool = False) -> None:
        """Follow the snapshot: members bound or deleted, gangs complete, reservations expired."""
        snap, ledger = self.book.snapshot, self.book.ledger
        # Placements bump the generation; a pending pod's deletion only shrinks ``specs``.
        key = (snap.generation, len(snap.specs))
        if not force and key == self._swept and now < self.book.next_expiry:
            return
        self._swept = key
        synced = self.synced()
        for p in ledger:
            for m in p.unbound:
                placed = snap.pods.get(m.uid)
                if placed is not None:
                    ledger.mark_bound(p.gang, m.uid, placed.node)
            if synced and p.restored and any(m.node not in snap.nodes for m in p.unbound):
                # Restored plans are only trusted for nodes that exist (docs/gangs.md).
                self.locked_release(p, "restored plan names a node not in the cluster")
                self.reporter.metrics.plan_rejected("unknown_node")
                continue
            if synced:
                gone = [m for m in p.members.values() if m.uid not in snap.specs and m.uid not in snap.pods]
                if gone and not p.complete:
                    self.locked_release(p, f"member {gone[0].pod} was deleted")
                    self.reporter.metrics.outcome("failed")
                    continue
            if p.complete:
                self.locked_complete(p, now)
        for p in ledger.expired(now):
            self.reporter.metrics.reservation_expired()
            self.fail_bind(p.gang, MESSAGE_PREFIX + f"gang {shown(p.gang)}: reservation expired; retrying")
            self._clear(p)
            log.info("gang %s: reservation expired after %.0fs", p.gang, ledger.ttl)
        if synced:
            gone_gangs = [k for k in self.book.states
                          if k not in snap.gang_index and k not in ledger.plans and not self.book.planning(k)]
            for forgotten in gone_gangs:
                del self.book.states[forgotten]  # every member gone: forget the gang
                self.book.ledger.unhold(forgotten)
                self._forget(forgotten)
        self.book.refresh_expiry()
        self.update_gauge()

    def locked_complete(self, p: GangPlan, now: float) -> None:
        self.book.ledger.drop(p.gang)
        state = self.book.states.pop(p.gang, None)
        self._forget(p.gang)
        self.reporter.metrics.outcome("bound")
        if state is not None:
            self.reporter.metrics.waited(max(0.0, now - state.first_seen))

    def locked_release(self, p: GangPlan, why: str) -> None:
        self.book.ledger.drop(p.gang)
        self.fail_bind(p.gang, MESSAGE_PREFIX + f"gang {shown(p.gang)}: plan released ({why}); retrying")
        self._clear(p)

    def restore(self, records: list[PlanRecord], now: float | None = None) -> int:
        """Rebuild reservations from persisted plans (before serving, and when a standby replica
        takes over: app/gang/takeover.py); returns the gangs restored. A gang already in the ledger
        keeps the plan it has (ours, newer than anything persisted)."""
        now = self.clock() if now is None else now
        ledger = self.book.ledger
        by_gang: dict[str, list[PlanRecord]] = {}
        for r in records:
            by_gang.setdefault(r.gang, []).append(r)
        restored = 0
        with self.lock:
            for gang, recs in by_gang.items():
                if ledger.get(gang) is not None:
                    continue
                planned_at = max(r.planned_at for r in recs)
                if planned_at + ledger.ttl <= now:
                    continue  # expired while we were away: plan afresh
                if planned_at > now + FUTURE_SKEW_SECONDS:
                    # Never made by us: a plan "from the future" would hold GPUs past the TTL.
                    log.warning("gang %s: persisted plan dated %.0fs ahead ignored", gang, planned_at - now)
                    continue
                epoch = max(r.epoch for r in recs)
                members = {r.uid: MemberPlan(r.uid, r.pod, r.node, r.gpus) for r in recs}
                # Members written under different epochs (a crash mid-write) may overlap: keep all
                # reservations (never too few) but replan at the first filter.
                stale = len({r.epoch for r in recs}) > 1
                ledger.put(GangPlan(gang, members, planned_at, planned_at + ledger.ttl, epoch, stale=stale,
                                    summary="restored after restart", restored=True))
                state = self.book.states.setdefault(gang, GangState(first_seen=planned_at))
                state.epochs = max(state.epochs, epoch)
                restored += 1
            self.book.refresh_expiry()
            self.update_gauge()
        return restored

    def update_gauge(self) -> None:
        self.reporter.metrics.reserved(self.book.ledger.total_reserved())

    def _clear(self, p: GangPlan) -> None:
        self.store.clear(m.pod for m in p.unbound if m.uid in self.book.snapshot.specs)

    def _forget(self, key: str) -> None:
        self.reporter.forget(key)
        self.forget(key)
