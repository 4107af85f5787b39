"""The all-or-nothing bind barrier (asyncio: a waiting member holds no thread).

A member's bind waits until every unbound member of its plan has reached bind, then all are bound
in threads and each call is answered. No call waits longer than the bind timeout (kept below
kube-scheduler's ``httpTimeout``): while members keep arriving, a call that has waited that long is
answered with an error but its member keeps its seat, and the gang is bound, seats whose calls were
already answered included, when the last member arrives. Large gangs need this: kube-scheduler
cycles one pod at a time, so 512 members take tens of seconds to reach bind (docs/gangs.md). Only
when a whole timeout passes with no new member does the barrier give up: nobody is bound and the
gang regroups. A held member with ResourceClaims is the exception: answering its call with an error
made kube-scheduler run Unreserve, which takes the pod out of its claims' ``reservedFor``, and a
kubelet refuses a pod its claims are not reserved for. So such a member is not bound by the
barrier; its seat stays reserved and it binds at once on kube-scheduler's retry, which reserves
its claims again first (docs/gangs.md, "Gangs with DRA claims"). A bind that fails after others
succeeded is reported and the rest is replanned around the failed node. Binding itself is one
capability handed in (:data:`BindFn`), not the service.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from app.base.reasons import MESSAGE_PREFIX, shown
from app.base.workload import WorkloadSpec
from app.gang.book import GangBook
from app.gang.ledger import GangPlan
from app.gang.regroup import Cancellable, Timers
from app.gang.report import Reporter

log = logging.getLogger(__name__)

# Bind one pod on one node (blocking); '' or the error message. The service's single-pod bind.
BindFn = Callable[[WorkloadSpec, str], str]


def loop_timers(delay: float, fn: Callable[[], None]) -> Cancellable:
    return asyncio.get_running_loop().call_later(delay, fn)


@dataclass(slots=True)
class _Waiter:
    spec: WorkloadSpec
    node: str
    future: asyncio.Future[str]


@dataclass(slots=True)
class Barrier:
    gang: str
    epoch: int
    waiters: dict[str, _Waiter] = field(default_factory=dict)
    timer: Cancellable | None = None
    binding: bool = False
    arrived: int = 0  # members seated since the timer last fired: progress, not a stall


@dataclass(eq=False)
class BindBarrier:
    book: GangBook
    lock: threading.RLock
    bind: BindFn
    reporter: Reporter
    timeout: float
    clock: Callable[[], float]
    sweep: Callable[[float], None]  # follow the snapshot before judging a bind (lock held)
    complete: Callable[[GangPlan, float], None]  # every member bound (lock held)
    regrouping: Callable[[str], bool]
    regroup: Callable[[str], None]  # start a regroup of the gang (lock held)
    timers: Timers = loop_timers
    barriers: dict[str, Barrier] = field(default_factory=dict, init=False)
    # Gang -> member uid -> node: members with claims whose held call was answered when the
    # gang completed; they bind on their next call (see the module docstring).
    rebind: dict[str, dict[str, str]] = field(default_factory=dict, init=False)
    _executor: ThreadPoolExecutor = field(
        default_factory=lambda: ThreadPoolExecutor(max_workers=16, thread_name_prefix="gang-bind"), init=False
    )
    # Binds started by a timeout, kept referenced until they finish.
    _tasks: set[asyncio.Task[None]] = field(default_factory=set, init=False)

    async def bind_member(self, spec: WorkloadSpec, node: str) -> str:
        """All-or-nothing: answer once every unbound member of the plan reached bind (or fail all)."""
        if spec.gang is None or self.book.not_a_gang(spec):
            return await asyncio.to_thread(self.bind, spec, node)
        key, uid = spec.gang.key, spec.uid or spec.key
        loop = asyncio.get_running_loop()
        with self.lock:
            self.sweep(self.clock())
            placed = self.book.snapshot.pods.get(uid)
            if placed is not None and placed.node == node:
                self.rebind.get(key, {}).pop(uid, None)
                return ""  # a retried bind of a member already bound there
            committed = self.rebind.get(key, {}).get(uid) == node
            current = self.book.ledger.get(key)
            mp = current.members.get(uid) if current else None
            if current is None or mp is None:
                return (MESSAGE_PREFIX
                        + f"no gang plan holds this pod (gang {shown(key)}); it will be replanned")
            if mp.node != node:
                return MESSAGE_PREFIX + f"gang {shown(key)} plans this pod on another node; retrying"
            # A gathered gang whose first members were bound at a timeout: the rest bind on arrival
            # (joining a barrier that is already binding would leave this call unanswered).
            committed = committed or current.committed
        if committed:
            return await self._bind_committed(spec, key, uid, node)
        with self.lock:
            current = self.book.ledger.get(key)
            if current is None or uid not in current.members:
                return (MESSAGE_PREFIX
                        + f"no gang plan holds this pod (gang {shown(key)}); it will be replanned")
            if self.regrouping(key):
                # Filtered before the last attempt failed: join the regroup instead of starting a
                # barrier of one that would only time out and reset it.
                return MESSAGE_PREFIX + f"gang {shown(key)} is regrouping after an incomplete bind; retrying"
            barrier = self.barriers.get(key)
            if barrier is None or barrier.epoch != current.epoch:
                if barrier is not None:
                    self.fail(key, MESSAGE_PREFIX + f"gang {shown(key)} was replanned; retrying")
                barrier = self.barriers[key] = Barrier(key, current.epoch)
                epoch = current.epoch
                barrier.timer = self.timers(self.timeout, lambda: self._on_timeout(key, epoch))
            old = barrier.waiters.pop(uid, None)
            if old is None:
                barrier.arrived += 1
            elif not old.future.done():
                old.future.set_result(MESSAGE_PREFIX + "superseded by a newer bind call for this pod")
            future: asyncio.Future[str] = loop.create_future()
            barrier.waiters[uid] = _Waiter(spec, node, future)
            complete = all(m.uid in barrier.waiters for m in current.unbound)
            if complete and not barrier.binding:
                gone = sorted({w.node for w in barrier.waiters.values() if not self._schedulable(w.node)})
                if gone:
                    # A planned node was cordoned (or removed) while members gathered: binding now
                    # would put part of the gang on a node being drained. Nobody binds; replan.
                    self._abort(key, current, barrier, gone)
                    complete = False
                else:
                    barrier.binding = True
                    if barrier.timer is not None:
                        barrier.timer.cancel()
        if complete:
            await self._bind_all(barrier)
        try:
            return await future
        except asyncio.CancelledError:
            # kube-scheduler gave up on this call: this member is no longer waiting.
            with self.lock:
                b = self.barriers.get(key)
                if b is barrier and not b.binding and b.waiters.get(uid) is not None:
                    del b.waiters[uid]
            raise

    def fail(self, key: str, msg: str) -> None:
        """Answer every waiting member with ``msg`` (binds already in flight finish on their own)."""
        barrier = self.barriers.get(key)
        if barrier is None or barrier.binding:
            return
        del self.barriers[key]
        if barrier.timer is not None:
            barrier.timer.cancel()
        for w in barrier.waiters.values():
            if not w.future.done():
                w.future.set_result(msg)

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)

    async def _bind_committed(self, spec: WorkloadSpec, key: str, uid: str, node: str) -> str:
        """A held member with claims, back from kube-scheduler with its claims reserved again, or a
        member of a gathered gang whose binding has begun: bound at once, inside this call."""
        err = await asyncio.to_thread(self.bind, spec, node)
        with self.lock:
            if err:
                return err  # its seat stays; kube-scheduler retries
            self.rebind.get(key, {}).pop(uid, None)
            if not self.rebind.get(key, True):
                del self.rebind[key]
            ledger = self.book.ledger
            ledger.mark_bound(key, uid, node)
            current = ledger.get(key)
            if current is not None and current.complete:
                self.complete(current, self.clock())
            self.reporter.metrics.reserved(ledger.total_reserved())
        return ""

    async def _bind_all(self, barrier: Barrier) -> None:
        loop = asyncio.get_running_loop()
        key = barrier.gang
        held = {uid: w for uid, w in barrier.waiters.items() if w.future.done() and w.spec.has_claims}
        if held:
            self.rebind.setdefault(key, {}).update({uid: w.node for uid, w in held.items()})
        waiters = [(uid, w) for uid, w in barrier.waiters.items() if uid not in held]
        calls = [loop.run_in_executor(self._executor, self.bind, w.spec, w.node) for _, w in waiters]
        results = await asyncio.gather(*calls, return_exceptions=True)
        errors: dict[str, str] = {}
        ledger = self.book.ledger
        with self.lock:
            now = self.clock()
            for (uid, w), res in zip(waiters, results, strict=True):
                err = res if isinstance(res, str) else MESSAGE_PREFIX + f"bind failed: {res}"
                if err:
                    errors[uid] = err
                else:
                    ledger.mark_bound(key, uid, w.node)
            if self.barriers.get(key) is barrier:
                del self.barriers[key]
            current = ledger.get(key)
            if not errors:
                if current is not None and current.complete:
                    self.complete(current, now)
            else:
                self._partial(key, current, waiters, errors)
            self.reporter.metrics.reserved(ledger.total_reserved())
        for uid, w in waiters:
            if not w.future.done():
                w.future.set_result(errors.get(uid, ""))

    def _schedulable(self, node: str) -> bool:
        facts = self.book.snapshot.nodes.get(node)
        return facts is not None and not facts.unschedulable

    def _abort(self, key: str, current: GangPlan, barrier: Barrier, gone: list[str]) -> None:
        msg = (MESSAGE_PREFIX + f"gang {shown(key)}: planned node {gone[0]} became unschedulable before bind"
               + (f" (and {len(gone) - 1} more)" if len(gone) > 1 else "") + "; none bound, replanning")
        state = self.book.states.get(key)
        if state is not None:
            state.excluded |= set(gone)
            self.regroup(key)
        current.stale = True
        self.reporter.metrics.outcome("failed")
        self.fail(key, msg)
        for uid, w in barrier.waiters.items():
            self.reporter.event(w.spec.key, uid, "GangBindAborted", msg, warning=True)

    def _partial(self, key: str, current: GangPlan | None, waiters: list[tuple[str, _Waiter]],
                 errors: dict[str, str]) -> None:
        """Some binds failed after others succeeded: say so, and replan the rest around the node."""
        state = self.book.states.get(key)
        failed = {uid: w for uid, w in waiters if uid in errors}
        if state is not None:
            state.excluded |= {w.node for w in failed.values()}
        if current is not None:
            current.stale = True
        bound = len(waiters) - len(failed)
        first_uid, first = next(iter(failed.items()))
        msg = (MESSAGE_PREFIX + f"gang {shown(key)} partially bound: {bound}/{len(waiters)} members bound; "
               f"{first.spec.key} failed on {first.node} ({errors[first_uid].removeprefix(MESSAGE_PREFIX)})"
               + (f" and {len(failed) - 1} more" if len(failed) > 1 else "")
               + "; replanning the rest without that node")
        log.warning("%s", msg)
        self.reporter.metrics.outcome("replanned")
        for uid, w in waiters:
            self.reporter.event(w.spec.key, uid, "GangPartiallyBound", msg, warning=True)

    def _on_timeout(self, key: str, epoch: int) -> None:
        with self.lock:
            barrier = self.barriers.get(key)
            if barrier is None or barrier.epoch != epoch or barrier.binding:
                return
            current = self.book.ledger.get(key)
            if current is not None and current.gathered and current.epoch == epoch:
                # Every member passed kube-scheduler's filters on its planned node (the gather at
                # filter) and is on its way here: bind those here before their calls time out and
                # the rest as they come. Answering them "held" instead would be an error line in
                # kube-scheduler's log for each, and Unreserve for their claims (docs/gangs.md).
                current.committed = True
                barrier.binding = True
                task = asyncio.get_running_loop().create_task(self._bind_all(barrier))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
                return
            needed = len(current.unbound) if current else len(barrier.waiters)
            if barrier.arrived and current is not None:
                # Still arriving: answer the calls before kube-scheduler's httpTimeout cuts them,
                # keep every seat, and look again one timeout later.
                barrier.arrived = 0
                held = (MESSAGE_PREFIX + f"gang {shown(key)}: {len(barrier.waiters)}/{needed} members "
                        "reached bind; this member's place is held until the rest arrive, retrying")
                for w in barrier.waiters.values():
                    if not w.future.done():
                        w.future.set_result(held)
                barrier.timer = self.timers(self.timeout, lambda: self._on_timeout(key, epoch))
                return
            msg = (MESSAGE_PREFIX + f"gang {shown(key)}: only {len(barrier.waiters)}/{needed} members "
                   f"reached bind, none new within {self.timeout:g}s; none bound (all-or-nothing), retrying")
            self.reporter.metrics.outcome("failed")
            self.fail(key, msg)
            for uid, w in barrier.waiters.items():
                self.reporter.event(w.spec.key, uid, "GangBindTimeout", msg, warning=True)
            if key in self.book.states and current is not None:
                self.regroup(key)
