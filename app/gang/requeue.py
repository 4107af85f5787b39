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

from app.core.workload import PREFIX
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
                 timers: Timers, clock: Callable[[], float]) -> None:
        self.book = book
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
