"""Bring back gang members kube-scheduler would otherwise leave waiting for minutes.

kube-scheduler requeues a pod an extender turned away on the next event about that pod; without
one it waits for the periodic flush of unschedulable pods (five minutes). Two answers of the gang
filter can go stale with no such event, because the extender's watch and kube-scheduler's are
separate and either may run ahead:

* "waiting for gang members 1/2": the last member was created but not yet in the extender's cache
  when the others were filtered (:meth:`Requeuer.when_complete`);
* "cannot be placed": room was freed (another gang's pods deleted), kube-scheduler retried the
  members on its own watch's deletion events, and the extender answered on facts already gone
  (:meth:`Requeuer.when_void`).

Each re-check runs on a timer; when the answer no longer holds, every unbound member gets an
annotation write, the pod update that requeues it (docs/gangs.md, "Waiting members" and "Cannot
place").
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from app.base.reasons import MESSAGE_PREFIX, shown
from app.base.workload import GANG_GATE, PREFIX
from app.gang.book import GangBook
from app.gang.persist import PlanWriter
from app.gang.regroup import Timers

log = logging.getLogger(__name__)

# The first re-check of an incomplete gang, then doubling up to the cap while members are missing.
MEMBER_RECHECK_SECONDS = 1.0
MEMBER_RECHECK_MAX_SECONDS = 30.0
MEMBERS_ANNOTATION = PREFIX + "gang-members"
RETRY_ANNOTATION = PREFIX + "gang-retry"
# A "cannot be placed" answer is looked at again this long after it was given, and once more later.
VERDICT_RECHECK_SECONDS = 2.0
VERDICT_RECHECK_MAX_SECONDS = 10.0


class Requeuer:
    """Timed re-checks of gangs turned away; one pending check per gang and kind."""

    def __init__(self, book: GangBook, lock: threading.RLock, writer: PlanWriter | None,
                 timers: Timers, clock: Callable[[], float], warn_after: float = 600.0,
                 incomplete_timers: Timers | None = None, hold_timers: Timers | None = None,
                 at_bound: Callable[[str], None] = lambda key: None) -> None:
        self.book = book
        self.at_bound = at_bound  # solve a gang reaching its starvation bound again (lock held)
        self.hold_timers = hold_timers or timers
        self.incomplete_timers = incomplete_timers or timers
        self.warn_after = warn_after  # an incomplete gang is reported this long after its creation
        self._incomplete_checks: set[str] = set()
        self.overdue: set[str] = set()  # gangs reported incomplete for too long (and still known)
        self.lock = lock
        self.writer = writer
        self.timers = timers
        self.clock = clock
        self._member_checks: set[str] = set()
        self._verdict_checks: set[str] = set()
        # Per gang, how many "cannot be placed" answers were given: a look set before the latest
        # answer leaves that answer one more look of its own (a slow watch can trail it as long).
        self._told: dict[str, int] = {}
        self._nudges: dict[str, int] = {}
        self._hold_checks: set[str] = set()  # gangs with a look armed at their starvation bound

    def when_complete(self, key: str, size: int, delay: float = MEMBER_RECHECK_SECONDS) -> None:
        """(lock held) Requeue the waiting members once all ``size`` of them are in the cache."""
        if key in self._member_checks:
            return
        self._member_checks.add(key)
        self.timers(delay, lambda: self._members_complete(key, size, delay))

    def when_void(self, key: str, delay: float = VERDICT_RECHECK_SECONDS) -> None:
        """(lock held) Requeue the members if, ``delay`` seconds on, what the "cannot be placed"
        answer rested on has changed (the verdict is void, or a solve ended without a plan)."""
        self._told[key] = self._told.get(key, 0) + 1
        self._look(key, delay)

    def watch_incomplete(self, key: str) -> None:
        """(lock held) Report the gang if it still misses members ``warn_after`` seconds after its
        first member's creation: a warning event on every pod it has, once, and the
        ``llm_placement_gangs_incomplete_too_long`` gauge (docs/gangs.md, "Incomplete gangs")."""
        if key in self._incomplete_checks or key in self.overdue:
            return
        members = self.book.snapshot.gang_members(key)
        if not members:
            return
        now = self.clock()
        created = min((m.created for m in members if m.created), default=0.0) or now
        self._incomplete_checks.add(key)
        self.incomplete_timers(max(0.0, created + self.warn_after - now),
                               lambda: self._incomplete_overdue(key))

    def _incomplete_overdue(self, key: str) -> None:
        with self.lock:
            self._incomplete_checks.discard(key)
            every = self.book.snapshot.gang_members(key)
            if not every:
                return
            size = self.book.size(key, every[0])
            have = len(self.book.members(key))
            if size is None or have >= size:
                return
            self.overdue.add(key)
            log.warning("gang %s: %d of %d members after %.0f s", key, have, size, self.warn_after)
            if self.writer is None:
                return
            message = (MESSAGE_PREFIX + f"gang {shown(key)} has had {have} of {size} members for more than "
                       f"{self.warn_after:.0f} s; it holds no GPUs. To release it, create the missing "
                       "members, or delete its pods (members held at admission can also be let go by "
                       f"removing the scheduling gate {GANG_GATE}); docs/gangs.md, \"Incomplete gangs\"")
            for m in every:
                self.writer.event(m.namespace, m.name, m.uid or m.key, "GangIncompleteTooLong", message,
                                  warning=True)

    def overdue_now(self) -> int:
        """(lock held) Gangs reported incomplete for too long that are still incomplete."""
        for key in list(self.overdue):
            every = self.book.snapshot.gang_members(key)
            size = self.book.size(key, every[0]) if every else None
            if size is None or len(self.book.members(key)) >= size:
                self.overdue.discard(key)
        return len(self.overdue)

    def hold_due(self, key: str, delay: float) -> None:
        """(lock held) Look at a gang still waiting ``delay`` seconds on, when it reaches the
        starvation bound: solve it again at once (the first waiting gang of the gang queue then
        holds nodes) and requeue its members (docs/gangs.md, "Starvation bound"). Without it the
        hold would wait for some cluster event to bring a member to the extender, and the node
        that event freed could go to later work first."""
        if key in self._hold_checks:
            return
        self._hold_checks.add(key)
        self.hold_timers(delay, lambda: self._hold_reached(key))

    def _hold_reached(self, key: str) -> None:
        with self.lock:
            self._hold_checks.discard(key)
            book = self.book
            _, unbound = book.pending(key)
            state = book.states.get(key)
            if (not unbound or state is None or state.waiting_since is None or self.writer is None
                    or book.ledger.get(key) is not None or key in book.ledger.holds):
                return  # gone, bound, planned or holding already
            self.at_bound(key)
            if book.ledger.get(key) is not None:
                return  # planned: the plan annotation has requeued them
            n = self._nudges[key] = self._nudges.get(key, 0) + 1
            log.info("gang %s: waiting for %.0f s, the starvation bound; requeueing %d member(s)", key,
                     self.clock() - state.waiting_since, len(unbound))
            for m in unbound:
                self.writer.annotate(m.namespace, m.name, {RETRY_ANNOTATION: str(n)})

    def resized(self, key: str) -> None:
        """(lock held) A gang's size arrived or changed (a PodGroup created after its pods, its
        ``minMember`` lowered): members told "no size" or "waiting for members" hear of it from no
        pod change, and would wait for kube-scheduler's five-minute flush. Requeue them now if the
        gang is complete at its new size (docs/gangs.md, "Late sizes")."""
        members, unbound = self.book.pending(key)
        if not unbound or self.writer is None or self.book.ledger.get(key) is not None:
            return
        size = self.book.size(key, unbound[0])
        if size is None or len(members) < size:
            return
        n = self._nudges[key] = self._nudges.get(key, 0) + 1
        log.info("gang %s: its size is now %d and all members exist; requeueing %d member(s)", key, size,
                 len(unbound))
        for m in unbound:
            self.writer.annotate(m.namespace, m.name, {RETRY_ANNOTATION: str(n)})

    def _look(self, key: str, delay: float) -> None:
        if key in self._verdict_checks:
            return
        self._verdict_checks.add(key)
        told = self._told.get(key, 0)
        self.timers(delay, lambda: self._verdict_moved(key, delay, told))

    def _members_complete(self, key: str, size: int, delay: float) -> None:
        with self.lock:
            self._member_checks.discard(key)
            members, unbound = self.book.pending(key)
            if not members:
                return  # the gang was deleted
            if len(members) < size:
                if delay < MEMBER_RECHECK_MAX_SECONDS:
                    self.when_complete(key, size, min(delay * 2, MEMBER_RECHECK_MAX_SECONDS))
                return
            if self.writer is None or self.book.ledger.get(key) is not None:
                return  # planned already: the plan annotation has requeued them
            value = f"{len(members)}/{size}"
            for m in unbound:
                self.writer.annotate(m.namespace, m.name, {MEMBERS_ANNOTATION: value})

    def _verdict_moved(self, key: str, delay: float, told: int) -> None:
        with self.lock:
            self._verdict_checks.discard(key)
            book = self.book
            members, unbound = book.pending(key)
            state = book.states.get(key)
            if not unbound or state is None or self.writer is None:
                self._nudges.pop(key, None)
                self._told.pop(key, None)
                return  # deleted, or bound
            if book.ledger.get(key) is not None:
                return  # planned: the plan annotation has requeued them
            if book.planning(key):
                self._look(key, delay)  # the solve's own outcome is looked at next
                return
            size = book.size(key, unbound[0]) or len(members)
            if book.standing(key, state, members, size, self.clock()) is not None:
                # A slow watch: one later look, and one more for an answer given since this look
                # was set (kube-scheduler retried the members meanwhile).
                if delay < VERDICT_RECHECK_MAX_SECONDS or self._told.get(key, 0) != told:
                    self._look(key, VERDICT_RECHECK_MAX_SECONDS)
                return
            n = self._nudges[key] = self._nudges.get(key, 0) + 1
            log.info("gang %s: its \"cannot be placed\" no longer stands; requeueing %d member(s)",
                     key, len(unbound))
            for m in unbound:
                self.writer.annotate(m.namespace, m.name, {RETRY_ANNOTATION: str(n)})
