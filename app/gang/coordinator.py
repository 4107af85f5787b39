"""Gang scheduling through an extender: plan on filter, hold in a ledger, bind all-or-nothing.

kube-scheduler sees one pod at a time and gives extenders no Permit phase, so (``docs/gangs.md``):

* **filter** of a member: until every member exists, every node is rejected ("waiting for gang
  members 3/8") and nothing is reserved. Then the whole gang is planned at once
  (:mod:`app.gang.planning`, solved with the service lock released), the plan is held in the
  ledger (other pods' filters see those GPUs as taken) and persisted on the member pods, and each
  member passes only its planned node. Re-filters return the same node; a planned node that stops
  fitting (cordoned, taken) triggers a replan without it. A member filtered while its gang is being
  solved is rejected as resolvable, so kube-scheduler retries it soon. The live server plans in the
  background (``GangRuntime.background``): its filter runs on the event loop and must not wait.
* **bind** of a member waits for the others (:mod:`app.gang.barrier`); an incomplete bind makes
  the gang regroup (:mod:`app.gang.regroup`).
* **requeue**: members turned away on an answer that goes stale without a pod event ("waiting for
  members", "cannot be placed") are brought back by a timed re-check (:mod:`app.gang.requeue`).
* **restart**: plans are rebuilt from the pods' annotations before serving
  (:mod:`app.gang.lifecycle`); members already bound are fixed in any replan.

This module is only the facade the service sees (the placer's ``GangHook`` and the service's
gang binder), like the coscheduling plugin over its ``core.Manager`` in scheduler-plugins.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

from app.base.reasons import MESSAGE_PREFIX, ReasonCode, Rejection, reject, shown
from app.base.workload import PREFIX, WorkloadSpec
from app.config.policy import GangPolicy
from app.gang.barrier import BindBarrier, BindFn, loop_timers
from app.gang.book import GangBook, GangState
from app.gang.instance import DataSites
from app.gang.ledger import GangPlan, Ledger, MemberPlan
from app.gang.lifecycle import Lifecycle
from app.gang.persist import PlanRecord, PlanStore, PlanWriter
from app.gang.planning import CHANGED, Planner, SolveFn
from app.gang.problem import Index, Problem
from app.gang.regroup import Regrouper, Timers, thread_timers
from app.gang.report import GangMetrics, NoMetrics, Reporter
from app.gang.requeue import Requeuer
from app.gang.solver import PlanResult, plan
from app.placement import offer
from app.placement.feasibility import NodeFit
from app.placement.placer import NOT_CACHED
from app.snapshot.store import ClusterSnapshot

RESERVED_ELSEWHERE = reject(ReasonCode.GANG, "reserved for gang plan on another node")
NOT_IN_PLAN = reject(ReasonCode.GANG, "gang plan does not include this pod")
Verdicts = tuple[Mapping[str, NodeFit], dict[str, Rejection]]


@dataclass(frozen=True, slots=True)
class GangRuntime:
    """Time, timers and the solver: real by default, replaceable in tests (no wall-clock waits)."""

    clock: Callable[[], float] = time.time
    bind_timers: Timers = loop_timers  # bind barrier timeouts (asyncio's call_later by default)
    wake_timers: Timers = thread_timers  # regroup wake-ups
    member_timers: Timers = thread_timers  # re-checks of gangs turned away as incomplete
    incomplete_timers: Timers = thread_timers  # reports of gangs incomplete for too long
    hold_timers: Timers = thread_timers  # looks at waiting gangs reaching the starvation bound
    solve: SolveFn | None = None  # None: CP-SAT with the policy's time limit
    synced: Callable[[], bool] = lambda: True  # has the watch listed everything (deletions trusted)
    # The HTTP server answers filter on its event loop: a filter that waited for a solve would hold
    # up every other request, so the live service plans in the background and members retry.
    # Off (demo, simulator, tests): the filter waits for the solve, with the service lock released.
    background: bool = False
    # Live: members pass filter only once all have arrived there (``GangCoordinator._gather``). It
    # answers kube-scheduler's retry timing (backoff per pod, a bind call bounded by httpTimeout);
    # callers that filter and bind members back to back (demo, simulator, tests) have neither.
    gather: bool = False


class GangCoordinator:
    """The placer's :class:`~app.placement.placer.GangHook` and the service's gang binder."""

    def __init__(
        self,
        policy: GangPolicy,
        snapshot: ClusterSnapshot,
        lock: threading.RLock,
        bind: BindFn,
        metrics: GangMetrics | None = None,
        writer: PlanWriter | None = None,
        runtime: GangRuntime | None = None,
        workers: int = 2,
        book: GangBook | None = None,
        data_sites: DataSites | None = None,
    ) -> None:
        rt = runtime or GangRuntime()
        self.lock = lock
        self.clock = rt.clock
        self.background = rt.background
        self.gather = rt.gather
        self.writer = writer
        self.percentage = policy.percentage_of_nodes_to_score
        # Given when others must read the reservations before this object exists (data gravity).
        self.book = book or GangBook(snapshot, policy.reservation_ttl_seconds)
        self.book.scheduler_name = policy.scheduler_name
        self.reporter = Reporter(metrics or NoMetrics(), writer)
        store = PlanStore(writer)
        # Back-edges between the parts go through these lambdas (resolved when called).
        self.lifecycle = Lifecycle(
            self.book, lock, self.reporter, store, rt.clock,
            fail_bind=lambda key, msg: self.barrier.fail(key, msg),
            forget=lambda key: self.regroup.forget(key), synced=rt.synced,
        )
        self.requeue = Requeuer(self.book, lock, writer, rt.member_timers, rt.clock,
                                warn_after=policy.incomplete_warn_seconds,
                                incomplete_timers=rt.incomplete_timers, hold_timers=rt.hold_timers,
                                at_bound=lambda key: self.planner.at_bound(key))
        self.regroup = Regrouper(self.book, lock, replan=lambda key: self.planner.replan(key),
                                 timers=rt.wake_timers)
        self.barrier = BindBarrier(
            self.book, lock, bind, self.reporter, policy.bind_timeout_seconds, rt.clock,
            sweep=lambda now: self.lifecycle.locked_sweep(now, force=True),
            complete=self.lifecycle.locked_complete, regrouping=self.regroup.active,
            regroup=self.regroup.start, timers=rt.bind_timers,
        )
        limit = policy.solver_time_limit_seconds

        def cp_sat(problem: Problem, index: Index, prefer: set[str]) -> PlanResult:
            return plan(problem, time_limit=limit, workers=workers, prefer=prefer, index=index)

        self.planner = Planner(
            self.book, lock, policy, rt.solve or cp_sat, self.reporter, store, rt.clock,
            release=self.lifecycle.locked_release,
            replanned=lambda key: self.barrier.fail(
                key, MESSAGE_PREFIX + f"gang {shown(key)} was replanned; retrying"),
            data_sites=data_sites, hold_due=self.requeue.hold_due,
        )

    @property
    def ledger(self) -> Ledger:
        return self.book.ledger

    @property
    def states(self) -> dict[str, GangState]:
        return self.book.states

    # --- GangHook: reservations ---------------------------------------------------------------
    def reserved_gpus(self, node: str, exclude_gang: str | None) -> int:
        self.lifecycle.maybe_sweep()
        return self.book.ledger.reserved_gpus(node, exclude_gang)

    def reserved_map(self, exclude_gang: str | None) -> dict[str, int]:
        """All reservations other gangs hold, once per filter call (the hot path reads this map
        instead of calling ``reserved_gpus`` for each of 5,000 nodes)."""
        self.lifecycle.maybe_sweep()
        return self.book.ledger.reserved_map(exclude_gang)

    def reservation_reason(self, node: str, exclude_gang: str | None) -> str | None:
        """Which gangs keep ``node``'s GPUs, for a pod refused there only because of them."""
        holders = self.book.ledger.holders(node, exclude_gang)
        if not holders:
            return None
        return "; ".join(
            f"GPUs held for gang {shown(gang)}, the oldest gang waiting for whole nodes" if held
            else f"GPUs reserved for gang {shown(gang)}, whose members are being placed"
            for gang, held in holders)

    # --- the gang queue (docs/gangs.md, "Gang queue") ------------------------------------------
    def queue_status(self) -> tuple[int, float]:
        """(complete gangs without a plan, age in seconds of the oldest of them; 0 when none)."""
        with self.lock:
            queue = self.book.queue()
            now = self.clock()
            ages = [now - order[1] for order, _ in queue if order[1]]
        return len(queue), max(ages, default=0.0)

    def incomplete_too_long(self) -> int:
        with self.lock:
            return self.requeue.overdue_now()

    def queue_info(self, key: str) -> dict[str, object]:
        """What explain says of a gang's place: its position (0: not queued: planned, incomplete or
        bound), the queue's length and the gangs ahead holding plans or nodes it waits behind."""
        with self.lock:
            place, length = self.planner.position(key)
            return {"position": place, "length": length, "waits_behind": self.planner.waits_behind(key),
                    "planned": key in self.book.ledger.plans}

    # --- GangHook: filter ---------------------------------------------------------------------
    def undecidable(self, spec: WorkloadSpec) -> Rejection | None:
        """Why no node can take this member yet, whatever the nodes: its gang has no size, or not
        all its members exist. Answered before any node is looked at, so the retries of thousands
        of incomplete gangs' members cost next to nothing (docs/gangs.md, "Waiting members")."""
        gang = spec.gang
        if gang is None:
            return None
        key, book = gang.key, self.book
        with self.lock:
            now = self.clock()
            self.lifecycle.locked_sweep(now)
            book.state(key, now, spec.priority)
            if book.not_a_gang(spec):
                return None
            if (conflict := book.size_conflict(key)) is not None:
                # No requeue timer: only a member's change can settle it, and that is a pod event.
                return reject(ReasonCode.GANG, conflict)
            size = book.size(key, spec)
            if size is None and gang.native:
                # kube-scheduler holds these pods too until the PodGroup exists (docs/gangs.md).
                return reject(ReasonCode.GANG,
                              f"gang {shown(key)} waits for PodGroup {shown(gang.name)} (scheduling.k8s.io)")
            if size is None:
                return reject(ReasonCode.GANG,
                              f"gang {shown(key)} has no size: set {PREFIX}gang-size or create PodGroup "
                              f"{shown(gang.name)} with minMember"
                              + (" (scheduling.volcano.sh)" if gang.volcano else " (scheduling.x-k8s.io)"))
            members = book.count_members(key, spec)
            if members < size:
                self.requeue.when_complete(key, size)
                self.requeue.watch_incomplete(key)
                return reject(ReasonCode.GANG, f"waiting for gang members {members}/{size}")
        return None

    def filter_member(
        self, spec: WorkloadSpec, fits: Mapping[str, NodeFit], rejections: dict[str, Rejection],
        node_names: Sequence[str],
    ) -> Verdicts:
        gang = spec.gang
        if gang is None:
            return fits, rejections
        key, uid = gang.key, spec.uid or spec.key
        book = self.book
        waiting = self.undecidable(spec)
        if waiting is not None:
            return _reject_all(node_names, waiting)
        with self.lock:
            now = self.clock()
            self.lifecycle.locked_sweep(now, force=True)
            state = book.state(key, now, spec.priority)
            if book.not_a_gang(spec):
                return fits, rejections
            members = book.members(key, spec)
            size = book.size(key, spec) or len(members)
            if len(members) < size:
                return _reject_all(node_names, reject(
                    ReasonCode.GANG, f"waiting for gang members {len(members)}/{size}"))
            if book.planning(key):
                return _retry(fits, rejections, _being_planned(key))
            state.last_offered = node_names
            current = book.ledger.get(key)
            node = None
            if self.gather and current is not None and not current.stale and not current.gathered:
                # Members turned away while gathering wait in kube-scheduler's unschedulable pool:
                # the one whose planned node was cordoned or removed may not come back to find it
                # (docs/gangs.md, "Gather at filter"). Any member's filter replans without it.
                nodes = book.snapshot.nodes
                gone = {m.node for m in current.unbound
                        if (f := nodes.get(m.node)) is None or f.unschedulable}
                if gone:
                    state.excluded |= gone
                    current.stale = True
            if current is not None and not current.stale:
                kept = self._planned_node(key, current, uid, fits, node_names, state)
                if isinstance(kept, Rejection):
                    return _retry(fits, rejections, kept)
                node = kept
            if node is None and (standing := book.standing(key, state, members, size, now,
                                                          node_names)) is not None:
                self.requeue.when_void(key)
                return _reject_gang(fits, rejections, standing)  # nothing changed: no new solve
            if node is None and self.background:
                self.planner.start(key, spec, fits, node_names, state)
                self.requeue.when_void(key)
                if state.last_failure:  # nothing changed for it yet, as far as we know: say why
                    return _reject_gang(fits, rejections, state.last_failure)
                return _retry(fits, rejections, _being_planned(key))
            if node is None:
                with book.plan_in_progress(key):  # other members retry while gangs ahead plan
                    ahead = self.planner.admit_ahead(key, node_names, now)
                got = ahead or self.planner.plan(key, members, spec, fits, node_names, state, now)
                if isinstance(got, Rejection):
                    if got is CHANGED or not got.unresolvable:
                        return _retry(fits, rejections, got)
                    self.requeue.when_void(key)
                    return _reject_gang(fits, rejections, got)
                mp = got.members.get(uid)
                if mp is None or mp.node not in fits:
                    return _reject_gang(fits, rejections, NOT_IN_PLAN)
                node = mp.node
            if self.regroup.active(key):
                return _reject_gang(fits, rejections, Rejection(ReasonCode.GANG, self.regroup.park(key, uid)))
            plan = book.ledger.get(key)
            if self.gather and plan is not None and not self._gather(plan, uid):
                arrived = sum(1 for m in plan.unbound if m.uid in plan.arrived)
                return _reject_gang(fits, rejections, reject(
                    ReasonCode.GANG, f"waiting for gang {shown(key)}: {arrived} of {len(plan.unbound)} "
                    "members arrived"))
            return _only(node, fits, rejections)

    def _planned_node(self, key: str, plan: GangPlan, uid: str, fits: Mapping[str, NodeFit],
                      node_names: Sequence[str], state: GangState) -> str | Rejection | None:
        """(lock held) The member's planned node while it still takes the member; why the member
        waits with the plan kept (its node left out of a partial offer); None when the plan no
        longer holds (marked stale, the node that failed excluded from the replan)."""
        mp = plan.members.get(uid)
        if mp is not None and mp.node in fits:
            plan.unoffered.pop(uid, None)
            return mp.node
        if mp is not None and (why := self._not_offered(key, plan, mp, node_names)) is not None:
            return why
        if mp is not None:
            state.excluded.add(mp.node)  # the planned node no longer takes this member
        plan.stale = True
        if offer.partial(len(node_names), len(self.book.snapshot.nodes), self.percentage) and \
                len(node_names) == 1:
            # A node tried alone: kube-scheduler's full search follows in this very cycle, and a
            # replan on one node would only give the gang's reservation back.
            return reject(ReasonCode.GANG, f"gang {shown(key)} is replanned at its next offer; retrying",
                          unresolvable=False)
        return None

    def _not_offered(self, key: str, plan: GangPlan, mp: MemberPlan,
                     node_names: Sequence[str]) -> Rejection | None:
        """(lock held) Why the member waits, keeping the plan, when its planned node is missing from
        an offer that may be only a part of the nodes kube-scheduler's filters pass (a sample, a
        node tried alone) and nothing the extender sees keeps it out; None when the node stopped
        fitting: offered and turned down by the extender's own rules, gone, cordoned, its GPUs
        taken, left out of a complete offer, or left out of too many partial ones in a row
        (docs/gangs.md, "Offers that are a part of the cluster")."""
        node = mp.node
        if node in node_names:
            return None
        snap = self.book.snapshot
        facts = snap.nodes.get(node)
        if facts is None or facts.unschedulable:
            return None
        need = sum(m.gpus for m in plan.unbound if m.node == node)
        if snap.free_gpus(node) - self.book.ledger.reserved_gpus(node, key) < need:
            return None
        offered, total = len(node_names), len(snap.nodes)
        if not offer.partial(offered, total, self.percentage):
            return None
        misses = plan.unoffered[mp.uid] = plan.unoffered.get(mp.uid, 0) + 1
        if misses > offer.patience(offered, total, self.percentage):
            return None
        return reject(ReasonCode.GANG, f"planned node {node} of gang {shown(key)} was not among the "
                      f"{offered} of {total} nodes kube-scheduler offered this time (a part of the "
                      "cluster); the plan stands; retrying", unresolvable=False)

    def _gather(self, plan: GangPlan, uid: str) -> bool:
        """(lock held) Has every unbound member of ``plan`` been filtered with its planned node
        passing kube-scheduler's own filters? Only then does any member pass to bind.

        kube-scheduler brings members back one by one, each after its own backoff (up to 10 s), and
        a bind call must be answered within its ``httpTimeout``: members let through as they came
        reached bind seconds apart, and each call answered before the rest arrived was an error in
        kube-scheduler's log. Turned away at filter instead, a member is an Unschedulable event
        ("waiting for gang ns/name: 3 of 8 members arrived"); when the last one arrives, the others
        are requeued together (a pod update) and bind as a whole (docs/gangs.md, "Gather at
        filter"). Members already bound count as arrived.
        """
        if plan.gathered:
            return True
        plan.arrived.add(uid)
        unbound = plan.unbound
        if any(m.uid not in plan.arrived for m in unbound):
            return False
        plan.gathered = True
        if self.writer is not None:
            for m in unbound:
                if m.uid != uid:
                    ns, _, name = m.pod.partition("/")
                    self.writer.annotate(ns, name, {GATHERED_ANNOTATION: str(plan.epoch)})
        return True

    # --- the service's gang binder, start and stop ------------------------------------------------
    async def bind_member(self, spec: WorkloadSpec, node: str) -> str:
        return await self.barrier.bind_member(spec, node)

    def restore(self, records: list[PlanRecord], now: float | None = None) -> int:
        return self.lifecycle.restore(records, now)

    def close(self) -> None:
        self.planner.close()
        self.barrier.close()


GATHERED_ANNOTATION = PREFIX + "gang-gathered"


def _being_planned(key: str) -> Rejection:
    return reject(ReasonCode.GANG, f"gang {shown(key)} is being planned; retrying", unresolvable=False)


def _reject_all(node_names: Sequence[str], r: Rejection) -> Verdicts:
    return {}, {n: r for n in node_names}


def _only(node: str, fits: Mapping[str, NodeFit], rejections: dict[str, Rejection]) -> Verdicts:
    out = dict(rejections)
    for n in fits:
        if n != node:
            out[n] = RESERVED_ELSEWHERE
    return {node: fits[node]}, out


def _reject_gang(fits: Mapping[str, NodeFit], rejections: dict[str, Rejection], why: Rejection,
                 unresolvable: bool = True) -> Verdicts:
    """The gang's reason on every node that could take a member alone or lacked only capacity.

    Unresolvable: preempting pods for one member cannot place the gang (the plan already counted
    what is free), and it must not trigger evictions for a pod that would wait anyway.
    """
    out = dict(rejections)
    r = why if why.unresolvable == unresolvable else replace(why, unresolvable=unresolvable)
    for n in fits:
        out[n] = r
    for n, old in rejections.items():
        if not old.unresolvable and old is not NOT_CACHED:
            out[n] = r
    return {}, out


def _retry(fits: Mapping[str, NodeFit], rejections: dict[str, Rejection], why: Rejection) -> Verdicts:
    """Resolvable: the pod waits for a plan being made right now, not for the cluster to change.

    kube-scheduler requeues a pod an extender rejected on the next cluster event either way (it
    records the rejector as the catch-all "Extender" plugin), and the plan's annotation write on
    every member is such an event, so the member comes back after its short backoff instead of
    waiting in the unschedulable pool. Preemption finds no victims on these nodes (the member fits
    there already), so "resolvable" evicts nobody.
    """
    return _reject_gang(fits, rejections, why, unresolvable=False)
