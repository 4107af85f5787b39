"""Regroup after an incomplete bind: park members until all are back, then wake them together.

Members reach bind in different backoff phases of kube-scheduler; retrying as they come would miss
each other again. So after a barrier timeout (or an abort) every returning member is rejected
("parked" in kube-scheduler's unschedulable pool) until the whole gang is back; one full scheduler
backoff after the last one arrived a timer replans the gang, and writing the new plan on every
member is the pod update that moves them all to the active queue at once (``docs/gangs.md``).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from app.base.reasons import MESSAGE_PREFIX, shown
from app.gang.book import GangBook

log = logging.getLogger(__name__)

# kube-scheduler's podMaxBackoffSeconds (default 10): a pod re-filtered now may wait this long in
# backoff before it can be scheduled again, so a regroup wakes members only after it has passed.
SCHEDULER_MAX_BACKOFF = 10.0
REGROUP_MAX = 60.0  # a member that never comes back (gated, stuck in-tree) cannot stall the gang longer


class Cancellable(Protocol):
    def cancel(self) -> None: ...


# (delay seconds, callback) -> a handle that can cancel it: threading.Timer, asyncio's call_later
# or a test's manual clock.
Timers = Callable[[float, Callable[[], None]], Cancellable]


def thread_timers(delay: float, fn: Callable[[], None]) -> Cancellable:
    timer = threading.Timer(delay, fn)
    timer.daemon = True
    timer.start()
    return timer


@dataclass(slots=True)
class _Regroup:
    token: int
    parked: set[str] = field(default_factory=set)
    timer: Cancellable | None = None
    all_back: bool = False  # the wake for "every member is back" is armed


class Regrouper:
    def __init__(
        self,
        book: GangBook,
        lock: threading.RLock,
        replan: Callable[[str], None],
        timers: Timers = thread_timers,
        delay: float = SCHEDULER_MAX_BACKOFF + 1.0,
        longest: float = REGROUP_MAX,
    ) -> None:
        self.book = book
        self.lock = lock
        self.replan = replan  # called with the lock held when a regroup ends
        self.timers = timers
        self.delay = delay
        self.longest = longest
        self._groups: dict[str, _Regroup] = {}
        self._tokens = 0

    def active(self, key: str) -> bool:
        return key in self._groups

    def start(self, key: str) -> None:
        """Begin (or restart) a regroup; it ends at the latest ``longest`` seconds from now."""
        old = self._groups.pop(key, None)
        if old is not None and old.timer is not None:
            old.timer.cancel()
        self._tokens += 1
        group = self._groups[key] = _Regroup(self._tokens)
        self._schedule(key, group, self.longest)

    def park(self, key: str, uid: str) -> str:
        """Count ``uid`` back; the reason to reject it with. Wakes all one backoff after the last."""
        group = self._groups[key]
        current = self.book.ledger.get(key)
        waiting = {m.uid for m in current.unbound} if current else set()
        group.parked.add(uid)
        back = len(waiting & group.parked)
        if waiting <= group.parked and not group.all_back:
            # Armed once: members retrying every few seconds must not push the replan back (or
            # cancel the cap of ``longest``), or a gang whose members are all back waits forever.
            group.all_back = True
            self._schedule(key, group, min(self.delay, self.longest))
        return (MESSAGE_PREFIX + f"gang {shown(key)} regrouping after an incomplete bind: "
                f"{back}/{len(waiting)} members back")

    def forget(self, key: str) -> None:
        group = self._groups.pop(key, None)
        if group is not None and group.timer is not None:
            group.timer.cancel()

    def _schedule(self, key: str, group: _Regroup, delay: float) -> None:
        if group.timer is not None:
            group.timer.cancel()
        self._tokens += 1
        group.token = token = self._tokens
        group.timer = self.timers(delay, lambda: self._wake(key, token))

    def _wake(self, key: str, token: int) -> None:
        with self.lock:
            group = self._groups.get(key)
            if group is None or group.token != token:
                return
            del self._groups[key]
            self.replan(key)
