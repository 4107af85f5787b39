"""Gang scheduling through an extender: plan on filter, hold in a ledger, bind all-or-nothing.

kube-scheduler sees one pod at a time and gives extenders no Permit phase, so (DESIGN §5):

* **filter** of a member: until every member exists, every node is rejected ("waiting for gang
  members 3/8") and nothing is reserved. Then the whole gang is planned at once (``solver.plan``),
  the plan is held in the :class:`Ledger` (other pods' filters see those GPUs as taken) and
  persisted on the member pods, and each member passes only its planned node. Re-filters return the
  same node; a planned node that stops fitting (cordoned, taken) triggers a replan without it.
* **admission order**: plans are made one gang at a time under the service lock and only from
  capacity nobody else reserved, so gangs never hold partial capacity and cannot deadlock; among
  gangs waiting for capacity, older ones (priority, then first wait, then name) are planned first.
* **bind** of a member waits (asyncio, no thread held) until every unbound member of the plan has
  reached bind, then binds them all in threads and answers each. If they do not all arrive within
  ``gang_bind_timeout_seconds`` (kept below kube-scheduler's ``httpTimeout``), every waiting member
  gets an Error, nobody is bound, and the plan is replanned at the next filter. A bind that fails
  after others succeeded is reported in events and the rest is replanned around the failed node.
* **restart**: plans are rebuilt from the pods' annotations before serving (``restore``); members
  already bound are fixed in any replan.
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from app.config import Settings
from app.core.feasibility import NodeFit, P, Rejection
from app.core.placer import NOT_CACHED
from app.core.snapshot import ClusterSnapshot
from app.core.workload import PREFIX, WorkloadSpec
from app.gang import diagnose
from app.gang.instance import GangInstance, build, evaluator, shape_key
from app.gang.ledger import GangPlan, Ledger, MemberPlan
from app.gang.persist import ANNOTATION, PlanRecord, PlanWriter, encode
from app.gang.problem import Assignment, Index
from app.gang.solver import PlanResult, plan
from app.metrics import Metrics

if TYPE_CHECKING:
    from app.service import ExtenderService

log = logging.getLogger(__name__)

RESERVED_ELSEWHERE = P + "reserved for gang plan on another node"
EVENT_INTERVAL = 30.0  # seconds between "cannot place" events for one gang (same reason)
# kube-scheduler's podMaxBackoffSeconds (default 10): a pod re-filtered now may wait this long in
# backoff before it can be scheduled again, so a regroup wakes members only after it has passed.
SCHEDULER_MAX_BACKOFF = 10.0
REGROUP_MAX = 60.0  # a member that never comes back (gated, stuck in-tree) cannot stall the gang longer


@dataclass(slots=True)
class GangState:
    first_seen: float  # first filter of any member (gang wait time starts here)
    priority: int = 0
    waiting_since: float | None = None  # complete but not placeable: in the admission queue
    excluded: set[str] = field(default_factory=set)  # nodes that failed this gang
    epochs: int = 0
    last_event: float = -math.inf
    last_reason: str = ""
    last_result: PlanResult | None = None
    last_offered: Sequence[str] = ()  # the nodes kube-scheduler offered at the last member filter
    # After a barrier timeout: members are parked (rejected) until all are back, then woken at once.
    regroup: bool = False
    parked: set[str] = field(default_factory=set)
    wake_timer: threading.Timer | None = None
    wakes: int = 0


@dataclass(slots=True)
class _Waiter:
    spec: WorkloadSpec
    node: str
    future: asyncio.Future[str]


@dataclass(slots=True)
class _Barrier:
    gang: str
    epoch: int
    first_arrival: float
    waiters: dict[str, _Waiter] = field(default_factory=dict)
    timer: asyncio.TimerHandle | None = None
    binding: bool = False


class GangCoordinator:
    """The placer's :class:`~app.core.placer.GangHook` and the service's gang binder."""

    def __init__(
        self,
        settings: Settings,
        snapshot: ClusterSnapshot,
        lock: threading.RLock,
        metrics: Metrics,
        writer: PlanWriter | None = None,
        clock: Callable[[], float] = time.time,
        workers: int = 2,
        lookahead: int = 2,
    ) -> None:
        self.settings = settings
        self.snapshot = snapshot
        self.lock = lock
        self.metrics = metrics
        self.writer = writer
        self.clock = clock
        self.workers = workers
        self.lookahead = lookahead
        self.ledger = Ledger(settings.gang_reservation_ttl_seconds)
        self.gangs: dict[str, GangState] = {}
        self.barriers: dict[str, _Barrier] = {}
        # Deletions are only trusted once the watch has listed everything (after a restart the
        # snapshot starts empty and every restored member would look deleted).
        self.synced: Callable[[], bool] = lambda: True
        self._swept: tuple[int, int] = (-1, -1)
        self._next_expiry = math.inf
        self._executor = ThreadPoolExecutor(max_workers=16, thread_name_prefix="gang-bind")
        self.regroup_delay = SCHEDULER_MAX_BACKOFF + 1.0
        self.regroup_max = REGROUP_MAX

    # --- GangHook: reservations ---------------------------------------------------------------
    def reserved_gpus(self, node: str, exclude_gang: str | None) -> int:
        self._maybe_sweep()
        return self.ledger.reserved_gpus(node, exclude_gang)

    def reserved_map(self, exclude_gang: str | None) -> dict[str, int]:
        """All reservations other gangs hold, once per filter call (the hot path reads this map
        instead of calling ``reserved_gpus`` for each of 5,000 nodes)."""
        self._maybe_sweep()
        return self.ledger.reserved_map(exclude_gang)

    def _maybe_sweep(self) -> None:
        # Two integer compares on the common path; the sweep runs only when something changed.
        snap = self.snapshot
        if (snap.generation != self._swept[0] or len(snap.specs) != self._swept[1]
                or (self.ledger.plans and self.clock() >= self._next_expiry)):
            with self.lock:
                self._sweep(self.clock())

    # --- GangHook: filter ---------------------------------------------------------------------
    def filter_member(
        self,
        spec: WorkloadSpec,
        fits: dict[str, NodeFit],
        rejections: dict[str, Rejection],
        node_names: Sequence[str],
    ) -> tuple[dict[str, NodeFit], dict[str, Rejection]]:
        gang = spec.gang
        if gang is None:
            return fits, rejections
        key, uid = gang.key, spec.uid or spec.key
        with self.lock:
            now = self.clock()
            self._sweep(now, force=True)
            state = self.gangs.get(key)
            if state is None:
                state = self.gangs[key] = GangState(first_seen=now, priority=spec.priority)
            size = gang.size or self.snapshot.podgroup_min_member.get(key)
            if size is None:
                return _reject_all(node_names, P + f"gang {key} has no size: set {PREFIX}gang-size or "
                                   f"create PodGroup {gang.name} with minMember")
            members = self._members(key, spec)
            if len(members) < size:
                return _reject_all(node_names, P + f"waiting for gang members {len(members)}/{size}")
            state.last_offered = node_names
            current = self.ledger.get(key)
            node = None
            if current is not None and not current.stale:
                mp = current.members.get(uid)
                if mp is not None and mp.node in fits:
                    node = mp.node
                else:
                    if mp is not None:
                        state.excluded.add(mp.node)  # the planned node no longer takes this member
                    current.stale = True
            if node is None:
                self._admit_older(key, state, node_names, now)
                got = self._plan(key, members, spec, fits, node_names, state, now)
                if isinstance(got, str):
                    return _reject_gang(fits, rejections, P + got)
                mp = got.members.get(uid)
                if mp is None or mp.node not in fits:
                    return _reject_gang(fits, rejections, P + "gang plan does not include this pod")
                node = mp.node
            if state.regroup:
                return self._park(key, uid, state, now, fits, rejections)
            return _only(node, fits, rejections)

    def _members(self, key: str, spec: WorkloadSpec) -> list[WorkloadSpec]:
        members = self.snapshot.gang_members(key)
        uid = spec.uid or spec.key
        if all((m.uid or m.key) != uid for m in members):
            members.append(spec)  # the watch may not have delivered the pod being filtered yet
        return members

    # --- planning -------------------------------------------------------------------------------
    def _plan(
        self,
        key: str,
        members: list[WorkloadSpec],
        spec: WorkloadSpec,
        fits: dict[str, NodeFit] | None,
        node_names: Sequence[str],
        state: GangState,
        now: float,
    ) -> GangPlan | str:
        """Plan (or replan) ``key``; install the plan, or return the short reason it cannot be."""
        previous = self.ledger.get(key)

        def reserved(node: str) -> int:
            return self.ledger.reserved_gpus(node, key)

        own_shape = shape_key(spec) if fits is not None else None
        eligible = evaluator(self.snapshot, self.settings, fits, own_shape, reserved)
        inst = build(self.snapshot, self.settings, key, members, eligible, node_names, reserved,
                     state.excluded)
        if not inst.pending:
            return "every gang member is already bound"
        index = Index(inst.problem)
        result = plan(inst.problem, time_limit=self.settings.solver_time_limit_seconds, workers=self.workers,
                      prefer=previous.nodes() if previous else set(), index=index)
        state.last_result = result
        self.metrics.solver_duration.labels(result.status).observe(result.seconds)
        self.metrics.solver_runs.labels(result.status).inc()
        if result.assignment is None:
            if previous is not None:
                self._release(previous, "replan found no placement")
            if state.waiting_since is None:
                state.waiting_since = now
            others = sum(self.ledger.reserved_gpus(n.name, key) for n in inst.problem.nodes)
            diag = diagnose.why_not(index, others)
            self._event_unplaceable(key, spec, diag, now, state)
            return "gang cannot be placed: " + diag.short
        state.waiting_since = None
        state.epochs = max(state.epochs, previous.epoch if previous else 0) + 1
        new = self._install(key, inst, result.assignment, index, result, state, previous, now)
        if previous is not None:
            self.metrics.gangs_bound.labels("replanned").inc()
        return new

    def _install(
        self, key: str, inst: GangInstance, assignment: Assignment, index: Index, result: PlanResult,
        state: GangState, previous: GangPlan | None, now: float,
    ) -> GangPlan:
        members: dict[str, MemberPlan] = {}
        for uid, node in inst.bound.items():
            spec = self.snapshot.specs.get(uid)
            members[uid] = MemberPlan(uid, spec.key if spec else uid, node, spec.gpus if spec else 0, True)
        sticky = {m.uid: m.node for m in previous.members.values()} if previous else {}
        for shape, specs in inst.pending.items():
            slots: list[str] = []
            for node in sorted(assignment):
                slots += [node] * assignment[node].get(shape, 0)
            rest: list[WorkloadSpec] = []
            for s in specs:  # keep members where the previous plan had them, when it still can
                uid = s.uid or s.key
                if sticky.get(uid) in slots:
                    slots.remove(sticky[uid])
                    members[uid] = MemberPlan(uid, s.key, sticky[uid], s.gpus)
                else:
                    rest.append(s)
            for s, node in zip(rest, slots, strict=True):
                members[s.uid or s.key] = MemberPlan(s.uid or s.key, s.key, node, s.gpus)
        ms = result.seconds * 1000
        gap = "" if result.status == "optimal" or math.isinf(result.gap) else f", gap {result.gap:.2%}"
        summary = (f"{diagnose.describe(index, assignment)}; {result.method} {result.status}{gap} "
                   f"in {ms:.0f} ms")
        new = GangPlan(key, members, now, now + self.ledger.ttl, state.epochs, summary=summary)
        self.ledger.put(new)
        self._fail_barrier(key, P + f"gang {key} was replanned; retrying")
        self._refresh_expiry()
        self._persist(new)
        what = f"{len(new.unbound)} pods to bind"
        for m in new.unbound:
            self._event(m.pod, m.uid, "GangPlanned", P + f"gang {key} planned ({what}): {summary}; this "
                        f"pod goes to {m.node}")
        return new

    def _admit_older(self, key: str, state: GangState, node_names: Sequence[str], now: float) -> None:
        """Gangs that waited longer for capacity are planned first (deterministic admission)."""
        mine = (-state.priority, state.waiting_since if state.waiting_since is not None else now, key)
        queue = sorted(
            ((-s.priority, s.waiting_since, k) for k, s in self.gangs.items()
             if s.waiting_since is not None and k != key and k not in self.ledger.plans),
        )
        for prio, since, other in queue[: self.lookahead]:
            if (prio, since, other) >= mine:
                break
            members = self.snapshot.gang_members(other)
            pending = [m for m in members if not self.snapshot.pods.get(m.uid or m.key) and not m.node_name]
            if not pending or pending[0].gang is None:
                continue
            size = pending[0].gang.size or self.snapshot.podgroup_min_member.get(other)
            if size is None or len(members) < size:
                continue
            self._plan(other, members, pending[0], None, node_names, self.gangs[other], now)

    # --- bind barrier ---------------------------------------------------------------------------
    async def bind_member(self, spec: WorkloadSpec, node: str, service: ExtenderService) -> str:
        """All-or-nothing: answer once every unbound member of the plan reached bind (or fail all)."""
        if spec.gang is None:
            return await asyncio.to_thread(service.bind_one, spec.namespace, spec.name, spec.uid, node, spec)
        key, uid = spec.gang.key, spec.uid or spec.key
        loop = asyncio.get_running_loop()
        with self.lock:
            self._sweep(self.clock(), force=True)
            placed = self.snapshot.pods.get(uid)
            if placed is not None and placed.node == node:
                return ""  # a retried bind of a member already bound there
            current = self.ledger.get(key)
            mp = current.members.get(uid) if current else None
            if current is None or mp is None:
                return P + f"no gang plan holds this pod (gang {key}); it will be replanned"
            if mp.node != node:
                return P + f"gang {key} plans this pod on another node; retrying"
            state = self.gangs.get(key)
            if state is not None and state.regroup:
                # Filtered before the last attempt failed: join the regroup instead of starting a
                # barrier of one that would only time out and reset it.
                return P + f"gang {key} is regrouping after an incomplete bind; retrying"
            barrier = self.barriers.get(key)
            if barrier is None or barrier.epoch != current.epoch:
                if barrier is not None:
                    self._fail_barrier(key, P + f"gang {key} was replanned; retrying")
                barrier = self.barriers[key] = _Barrier(key, current.epoch, self.clock())
                barrier.timer = loop.call_later(
                    self.settings.gang_bind_timeout_seconds, self._on_timeout, key, current.epoch
                )
            old = barrier.waiters.pop(uid, None)
            if old is not None and not old.future.done():
                old.future.set_result(P + "superseded by a newer bind call for this pod")
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
            await self._bind_all(barrier, service)
        try:
            return await future
        except asyncio.CancelledError:
            # kube-scheduler gave up on this call: this member is no longer waiting.
            with self.lock:
                b = self.barriers.get(key)
                if b is barrier and not b.binding and b.waiters.get(uid) is not None:
                    del b.waiters[uid]
            raise

    async def _bind_all(self, barrier: _Barrier, service: ExtenderService) -> None:
        loop = asyncio.get_running_loop()
        waiters = list(barrier.waiters.items())
        calls = [
            loop.run_in_executor(self._executor, service.bind_one, w.spec.namespace, w.spec.name,
                                 w.spec.uid, w.node, w.spec)
            for _, w in waiters
        ]
        results = await asyncio.gather(*calls, return_exceptions=True)
        errors: dict[str, str] = {}
        key = barrier.gang
        with self.lock:
            now = self.clock()
            for (uid, w), res in zip(waiters, results, strict=True):
                err = res if isinstance(res, str) else P + f"bind failed: {res}"
                if err:
                    errors[uid] = err
                else:
                    self.ledger.mark_bound(key, uid, w.node)
            if self.barriers.get(key) is barrier:
                del self.barriers[key]
            current = self.ledger.get(key)
            if not errors:
                if current is not None and current.complete:
                    self._complete(current, now)
            else:
                self._partial(key, current, waiters, errors, now)
            self._update_gauge()
        for uid, w in waiters:
            if not w.future.done():
                w.future.set_result(errors.get(uid, ""))

    def _schedulable(self, node: str) -> bool:
        facts = self.snapshot.nodes.get(node)
        return facts is not None and not facts.unschedulable

    def _abort(self, key: str, current: GangPlan, barrier: _Barrier, gone: list[str]) -> None:
        msg = (P + f"gang {key}: planned node {gone[0]} became unschedulable before bind"
               + (f" (and {len(gone) - 1} more)" if len(gone) > 1 else "") + "; none bound, replanning")
        state = self.gangs.get(key)
        if state is not None:
            state.excluded |= set(gone)
            state.regroup, state.parked = True, set()
            self._schedule_wake(key, state, self.regroup_max)
        current.stale = True
        self.metrics.gangs_bound.labels("failed").inc()
        self._fail_barrier(key, msg)
        for uid, w in barrier.waiters.items():
            self._event(w.spec.key, uid, "GangBindAborted", msg, warning=True)

    def _partial(self, key: str, current: GangPlan | None, waiters: list[tuple[str, _Waiter]],
                 errors: dict[str, str], now: float) -> None:
        """Some binds failed after others succeeded: say so, and replan the rest around the node."""
        state = self.gangs.get(key)
        failed = {uid: w for uid, w in waiters if uid in errors}
        if state is not None:
            state.excluded |= {w.node for w in failed.values()}
        if current is not None:
            current.stale = True
        bound = len(waiters) - len(failed)
        first_uid, first = next(iter(failed.items()))
        msg = (P + f"gang {key} partially bound: {bound}/{len(waiters)} members bound; "
               f"{first.spec.key} failed on {first.node} ({errors[first_uid].removeprefix(P)})"
               + (f" and {len(failed) - 1} more" if len(failed) > 1 else "")
               + "; replanning the rest without that node")
        log.warning("%s", msg)
        self.metrics.gangs_bound.labels("replanned").inc()
        for uid, w in waiters:
            self._event(w.spec.key, uid, "GangPartiallyBound", msg, warning=True)

    def _on_timeout(self, key: str, epoch: int) -> None:
        with self.lock:
            barrier = self.barriers.get(key)
            if barrier is None or barrier.epoch != epoch or barrier.binding:
                return
            current = self.ledger.get(key)
            needed = len(current.unbound) if current else len(barrier.waiters)
            msg = (P + f"gang {key}: only {len(barrier.waiters)}/{needed} members reached bind within "
                   f"{self.settings.gang_bind_timeout_seconds:g}s; none bound (all-or-nothing), retrying")
            self.metrics.gangs_bound.labels("failed").inc()
            self._fail_barrier(key, msg)
            for uid, w in barrier.waiters.items():
                self._event(w.spec.key, uid, "GangBindTimeout", msg, warning=True)
            state = self.gangs.get(key)
            if state is not None and current is not None:
                # Members reached bind in different backoff phases of kube-scheduler; retrying as
                # they come would miss each other again. Park them all, then wake them together.
                state.regroup = True
                state.parked = set()
                self._schedule_wake(key, state, self.regroup_max)

    def _park(self, key: str, uid: str, state: GangState, now: float, fits: dict[str, NodeFit],
              rejections: dict[str, Rejection]) -> tuple[dict[str, NodeFit], dict[str, Rejection]]:
        """Regroup: reject the member (it waits in kube-scheduler's unschedulable pool) until every
        unbound member is back; the wake-up comes one full backoff after the last one arrived, so a
        single pod update moves them all to the active queue at the same time."""
        current = self.ledger.get(key)
        waiting = {m.uid for m in current.unbound} if current else set()
        state.parked.add(uid)
        back = len(waiting & state.parked)
        if waiting <= state.parked:
            self._schedule_wake(key, state, self.regroup_delay)
        return _reject_gang(fits, rejections, P + f"gang {key} regrouping after an incomplete bind: "
                            f"{back}/{len(waiting)} members back")

    def _schedule_wake(self, key: str, state: GangState, delay: float) -> None:
        if state.wake_timer is not None:
            state.wake_timer.cancel()
        state.wakes += 1
        timer = threading.Timer(delay, self._wake, (key, state.wakes))
        timer.daemon = True
        state.wake_timer = timer
        timer.start()

    def _wake(self, key: str, token: int) -> None:
        """End a regroup: replan (dropping the old plan, keeping members where they fit) and write
        the new plan on every member, which is the pod update that requeues them together."""
        with self.lock:
            state = self.gangs.get(key)
            if state is None or state.wakes != token or not state.regroup:
                return
            state.regroup = False
            state.parked = set()
            state.wake_timer = None
            current = self.ledger.get(key)
            members = self.snapshot.gang_members(key)
            pending = [m for m in members if not self.snapshot.pods.get(m.uid or m.key) and not m.node_name]
            if current is None or not pending:
                return
            current.stale = True
            got = self._plan(key, members, pending[0], None, state.last_offered or list(current.nodes()),
                             state, self.clock())
            log.info("gang %s: regroup over, %s", key, "replanned" if not isinstance(got, str) else got)

    def _fail_barrier(self, key: str, msg: str) -> None:
        barrier = self.barriers.pop(key, None)
        if barrier is None or barrier.binding:
            if barrier is not None:
                self.barriers[key] = barrier  # binds in flight finish on their own
            return
        if barrier.timer is not None:
            barrier.timer.cancel()
        for w in barrier.waiters.values():
            if not w.future.done():
                w.future.set_result(msg)

    # --- lifecycle: sweep, complete, release, restore ----------------------------------------------
    def _sweep_key(self) -> tuple[int, int]:
        # Placements bump the generation; a pending pod's deletion only shrinks ``specs``.
        return self.snapshot.generation, len(self.snapshot.specs)

    def _sweep(self, now: float, force: bool = False) -> None:
        """Follow the snapshot: members bound or deleted, gangs complete, reservations expired."""
        key = self._sweep_key()
        if not force and key == self._swept and now < self._next_expiry:
            return
        self._swept = key
        synced = self.synced()
        for p in self.ledger:
            for m in p.unbound:
                placed = self.snapshot.pods.get(m.uid)
                if placed is not None:
                    self.ledger.mark_bound(p.gang, m.uid, placed.node)
            if synced:
                gone = [m for m in p.members.values()
                        if m.uid not in self.snapshot.specs and m.uid not in self.snapshot.pods]
                if gone and not p.complete:
                    self._release(p, f"member {gone[0].pod} was deleted")
                    self.metrics.gangs_bound.labels("failed").inc()
                    continue
            if p.complete:
                self._complete(p, now)
        for p in self.ledger.expired(now):
            self.metrics.reservations_expired.inc()
            self._fail_barrier(p.gang, P + f"gang {p.gang}: reservation expired; retrying")
            self._clear_annotations(p)
            log.info("gang %s: reservation expired after %.0fs", p.gang, self.ledger.ttl)
        if synced:
            gone_gangs = [k for k in self.gangs
                          if k not in self.snapshot.gang_index and k not in self.ledger.plans]
            for forgotten in gone_gangs:
                del self.gangs[forgotten]  # every member gone: forget the gang
        self._refresh_expiry()
        self._update_gauge()

    def _complete(self, p: GangPlan, now: float) -> None:
        self.ledger.drop(p.gang)
        state = self.gangs.pop(p.gang, None)
        self.metrics.gangs_bound.labels("bound").inc()
        if state is not None:
            self.metrics.gang_wait.observe(max(0.0, now - state.first_seen))

    def _release(self, p: GangPlan, why: str) -> None:
        self.ledger.drop(p.gang)
        self._fail_barrier(p.gang, P + f"gang {p.gang}: plan released ({why}); retrying")
        self._clear_annotations(p)

    def restore(self, records: list[PlanRecord], now: float | None = None) -> int:
        """Rebuild reservations from persisted plans (before serving); returns the gangs restored."""
        now = self.clock() if now is None else now
        by_gang: dict[str, list[PlanRecord]] = {}
        for r in records:
            by_gang.setdefault(r.gang, []).append(r)
        restored = 0
        with self.lock:
            for gang, recs in by_gang.items():
                planned_at = max(r.planned_at for r in recs)
                if planned_at + self.ledger.ttl <= now:
                    continue  # expired while we were away: plan afresh
                epoch = max(r.epoch for r in recs)
                members = {r.uid: MemberPlan(r.uid, r.pod, r.node, r.gpus) for r in recs}
                # Members written under different epochs (a crash mid-write) may overlap: keep all
                # reservations (never too few) but replan at the first filter.
                stale = len({r.epoch for r in recs}) > 1
                p = GangPlan(gang, members, planned_at, planned_at + self.ledger.ttl, epoch, stale=stale,
                             summary="restored after restart", restored=True)
                self.ledger.put(p)
                state = self.gangs.setdefault(gang, GangState(first_seen=planned_at))
                state.epochs = max(state.epochs, epoch)
                restored += 1
            self._refresh_expiry()
            self._update_gauge()
        return restored

    # --- side effects ---------------------------------------------------------------------------
    def _persist(self, p: GangPlan) -> None:
        if self.writer is None:
            return
        for m in p.unbound:
            ns, name = m.pod.split("/", 1)
            self.writer.annotate(ns, name, {ANNOTATION: encode(p.gang, m.node, p.planned_at, p.epoch)})

    def _clear_annotations(self, p: GangPlan) -> None:
        if self.writer is None:
            return
        for m in p.unbound:
            if m.uid in self.snapshot.specs:
                ns, name = m.pod.split("/", 1)
                self.writer.annotate(ns, name, {ANNOTATION: ""})

    def _event(self, pod: str, uid: str, reason: str, message: str, warning: bool = False) -> None:
        if self.writer is None:
            return
        ns, name = pod.split("/", 1)
        self.writer.event(ns, name, uid, reason, message, warning)

    def _event_unplaceable(self, key: str, spec: WorkloadSpec, diag: diagnose.Diagnosis, now: float,
                           state: GangState) -> None:
        if diag.short == state.last_reason and now - state.last_event < EVENT_INTERVAL:
            return
        state.last_event, state.last_reason = now, diag.short
        self._event(spec.key, spec.uid, "GangUnschedulable", P + diag.detail, warning=True)

    def _refresh_expiry(self) -> None:
        self._next_expiry = min((p.expires_at for p in self.ledger), default=math.inf)

    def _update_gauge(self) -> None:
        self.metrics.reservations.set(self.ledger.total_reserved())

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)


def _reject_all(node_names: Sequence[str], msg: str) -> tuple[dict[str, NodeFit], dict[str, Rejection]]:
    r = Rejection(msg)
    return {}, {n: r for n in node_names}


def _only(node: str, fits: dict[str, NodeFit], rejections: dict[str, Rejection]
          ) -> tuple[dict[str, NodeFit], dict[str, Rejection]]:
    out = dict(rejections)
    reserved = Rejection(RESERVED_ELSEWHERE)
    for n in fits:
        if n != node:
            out[n] = reserved
    return {node: fits[node]}, out


def _reject_gang(fits: dict[str, NodeFit], rejections: dict[str, Rejection], msg: str
                 ) -> tuple[dict[str, NodeFit], dict[str, Rejection]]:
    """The gang's reason on every node that could take a member alone or lacked only capacity.

    Unresolvable: preempting pods for one member cannot place the gang (the plan already counted
    what is free), and it must not trigger evictions for a pod that would wait anyway.
    """
    out = dict(rejections)
    r = Rejection(msg)
    for n in fits:
        out[n] = r
    for n, old in rejections.items():
        if not old.unresolvable and old is not NOT_CACHED:
            out[n] = r
    return {}, out
