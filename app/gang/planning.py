"""Planning and admission: one gang's plan, made without holding the service lock.

A plan is made in three steps so filter calls, prioritize calls and watch updates for other pods
never wait for a solve (up to ``solver_time_limit_seconds``):

1. **brief** (lock held): build the planning problem from the snapshot, capacities net of every
   other gang's reservations. The problem is an immutable copy; nothing the solver reads changes.
2. **solve** (lock released): the problem goes to a planner thread while the calling thread waits
   on a :class:`threading.Condition` over the service lock, which releases it completely.
3. **commit** (lock held again): if a planned node no longer has room (someone was bound there
   meanwhile, another gang reserved it), plan again from a fresh brief; if a member came, went or
   was bound, answer "retry" (the gang's size check comes first); otherwise install the plan in
   the ledger, persist it and report it.

Admission order: plans only use capacity nobody else reserved, so gangs never hold partial capacity
and cannot deadlock; complete gangs are planned, and their plans committed, in the gang queue's order
(priority, then creation; :meth:`GangBook.order`), a later gang first only as a backfill.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace

from app.base.catalog import GpuSpec
from app.base.reasons import MESSAGE_PREFIX, ReasonCode, Rejection, reject, shown
from app.base.workload import Stage, WorkloadSpec
from app.config.policy import GangPolicy
from app.gang import diagnose
from app.gang.book import VERDICT_SECONDS, GangBook, GangState, Verdict
from app.gang.hold import nodes_to_hold
from app.gang.instance import (
    DataSites,
    GangInstance,
    build,
    evaluator,
    input_note,
    match_inputs,
    member_node,
    shape_key,
    unfit_nodes,
)
from app.gang.ledger import GangPlan, MemberPlan
from app.gang.lockstep import waits_for_one_model
from app.gang.persist import PlanStore
from app.gang.problem import Index, Problem
from app.gang.report import Reporter
from app.gang.solver import PlanResult
from app.placement.feasibility import NodeFit, evaluate
from app.snapshot.store import NodeUsage

log = logging.getLogger(__name__)

# (problem, its index, nodes to favour among identical ones) -> the plan. Pure and thread-safe.
SolveFn = Callable[[Problem, Index, set[str]], PlanResult]
ATTEMPTS = 3  # solves per request when capacity keeps changing under the planner
# Resolvable: the member is retried at once and finds the new situation.
CHANGED = reject(ReasonCode.GANG, "gang capacity changed while it was being planned; retrying",
                 unresolvable=False)


def _ordinal(n: int) -> str:
    return f"{n}{'th' if 10 <= n % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th')}"


def waits_for(other: str) -> Rejection:
    """Resolvable: a gang ahead in the gang queue is being planned; this one is planned after it."""
    return reject(ReasonCode.GANG, f"waits for gang {shown(other)}, ahead in the gang queue, to be "
                  "planned; retrying", unresolvable=False)


@dataclass(frozen=True, slots=True)
class Brief:
    """What one solve needs, copied under the lock, and what the commit re-checks."""

    key: str
    spec: WorkloadSpec
    inst: GangInstance
    roster: frozenset[tuple[str, str]]
    prefer: frozenset[str]
    stamp: tuple[object, ...]  # taken with the problem: a change during the solve voids a "no"
    offered: frozenset[str] = frozenset()  # the nodes kube-scheduler offered the member filtered


@dataclass(eq=False)
class Planner:
    book: GangBook
    lock: threading.RLock
    policy: GangPolicy
    solve: SolveFn
    reporter: Reporter
    store: PlanStore
    clock: Callable[[], float]
    release: Callable[[GangPlan, str], None]  # drop a plan that can no longer be placed (lock held)
    replanned: Callable[[str], None]  # a new plan replaced the gang's previous one (lock held)
    data_sites: DataSites | None = None  # data gravity: where a member's input sits
    # Look at ``key`` again in ``delay`` seconds, when it reaches the starvation bound (lock held).
    hold_due: Callable[[str, float], None] = lambda key, delay: None
    # wait() on a Condition over an RLock releases every level the thread holds, so a filter
    # that arrived with the service lock held still lets everyone else in during the solve.
    _solved: threading.Condition = field(init=False)
    _pool: ThreadPoolExecutor = field(
        default_factory=lambda: ThreadPoolExecutor(max_workers=2, thread_name_prefix="gang-solve"), init=False
    )
    _jobs: ThreadPoolExecutor = field(  # background plans
        default_factory=lambda: ThreadPoolExecutor(max_workers=1, thread_name_prefix="gang-plan"), init=False
    )

    def __post_init__(self) -> None:
        self._solved = threading.Condition(self.lock)

    def plan(
        self,
        key: str,
        members: list[WorkloadSpec],
        spec: WorkloadSpec,
        fits: Mapping[str, NodeFit] | None,
        offered: Sequence[str],
        state: GangState,
        now: float,
    ) -> GangPlan | Rejection:
        """Plan (or replan) ``key`` (lock held); install the plan, or return why it cannot be."""
        with self.book.plan_in_progress(key):
            for attempt in range(ATTEMPTS):
                brief = self._brief(key, members, spec, fits, offered, state)
                if isinstance(brief, Rejection):
                    return brief
                result, index = self._solve_unlocked(brief)
                if self.book.states.get(key) is not state:
                    return CHANGED  # completed or forgotten meanwhile
                now = max(now, self.clock())
                if result.assignment is None:
                    return self._unplaceable(brief, index, state, now)
                mixed = waits_for_one_model(brief.inst, brief.spec, result.assignment, self._gpus())
                if mixed is not None:
                    return self._wait(brief, state, now, reject(ReasonCode.GANG, mixed))
                if self.book.roster(self.book.members(key, spec)) != brief.roster:
                    return CHANGED  # a member came, went or was bound: the caller looks again
                if self.book.ledger.get(key) is None and (ahead := self.unresolved_ahead(key)):
                    # A gang ahead in the queue completed (or its verdict lapsed) during the solve:
                    # commits go in queue order, so it is planned first and this plan made again
                    # on what it leaves (docs/gangs.md, "Gang queue").
                    if self.book.planning(ahead[0]):
                        return waits_for(ahead[0])
                    log.info("gang %s: gang %s is ahead in the gang queue; planning it first", key, ahead[0])
                    self.admit_ahead(key, sorted(brief.offered), now)
                    continue
                unfit = unfit_nodes(self.book.snapshot, brief.inst.problem, result.assignment,
                                    lambda n: self.book.ledger.reserved_gpus(n, key), brief.inst.own_held)
                if not unfit:
                    return self._commit(brief, result, index, state, now)
                log.info("gang %s: node %s lost its room while planning (attempt %d); planning again",
                         key, unfit[0], attempt + 1)
        return CHANGED

    def start(self, key: str, spec: WorkloadSpec, fits: Mapping[str, NodeFit], offered: Sequence[str],
              state: GangState) -> Future[None]:
        """Plan ``key`` in the background (lock held): admission first, then this gang.

        The caller answers its filter at once. A plan, once made, is written on every member, and
        that pod update is what brings the members back to kube-scheduler; a gang that cannot be
        placed waits for a cluster change anyway, and ``state.last_failure`` says why meanwhile.
        """
        self.book.begin_planning(key)

        def job() -> None:
            try:
                with self.lock:
                    if self.book.states.get(key) is not state:
                        return
                    now = self.clock()
                    got = self.admit_ahead(key, offered, now) or self.plan(
                        key, self.book.members(key, spec), spec, fits, offered, state, now)
                    # A "retry" (capacity moved, a gang ahead being planned) is no reason to tell.
                    state.last_failure = got if isinstance(got, Rejection) and got.unresolvable else None
            except Exception:
                log.exception("gang %s: background plan failed", key)
            finally:
                with self.lock:
                    self.book.end_planning(key)

        return self._jobs.submit(job)

    def admit_ahead(self, key: str, offered: Sequence[str], now: float) -> Rejection | None:
        """(lock held) Plan every gang ahead of ``key`` in the gang queue first, so ``key`` is
        planned on what their plans leave (docs/gangs.md, "Gang queue"). A gang ahead found
        unplaceable on facts that still stand is skipped: it did not fit at this moment, and
        ``key`` may use what it cannot. One being planned by another thread makes ``key`` wait for
        it (returned: why)."""
        for other in self.unresolved_ahead(key):
            if self.book.planning(other):
                return waits_for(other)
            members, pending = self.book.pending(other)
            state = self.book.state(other, now, max(m.priority for m in pending))
            self.plan(other, members, pending[0], None, offered, state, now)
        return None

    def unresolved_ahead(self, key: str) -> list[str]:
        """(lock held) Gangs ahead of ``key`` in the gang queue with neither a plan nor a standing
        "cannot be placed", first first. A gang with a plan already is not in the queue."""
        book = self.book
        members = book.members(key)
        if not members:
            return []
        mine = book.order(key, members)
        now = self.clock()
        out = []
        for order, other in book.queue():
            if order >= mine:
                break
            members_o, pending = book.pending(other)
            state = book.states.get(other)
            size = book.size(other, pending[0]) or len(members_o)
            if state is not None and book.standing(other, state, members_o, size, now) is not None:
                continue
            out.append(other)
        return out

    def position(self, key: str) -> tuple[int, int]:
        """(lock held) ``key``'s place in the gang queue (1 = first) and the queue's length; place 0
        when it is not queued (planned, incomplete or bound)."""
        queue = [k for _, k in self.book.queue()]
        return (queue.index(key) + 1 if key in queue else 0), len(queue)

    def waits_behind(self, key: str) -> list[str]:
        """(lock held) Words for each gang ahead of ``key`` that keeps GPUs from it now: a plan with
        members still to bind, or nodes held for it: ``gang ns/a (created 12:01:03, 4 x 8 GPUs,
        planned on fabric tier-1 b2, 4 nodes)``."""
        book, ledger = self.book, self.book.ledger
        members = book.members(key)
        if not members:
            return []
        mine = book.order(key, members)
        out = []
        for other in sorted(set(ledger.plans) | set(ledger.holds)):
            if other == key:
                continue
            others = book.members(other)
            order = book.order(other, others) if others else None
            if order is None or order >= mine:
                continue
            plan = ledger.get(other)
            unbound = plan.unbound if plan is not None else []
            if plan is not None and not unbound:
                continue
            sizes = Counter(m.gpus for m in unbound) if unbound else Counter(
                m.gpus for m in others if not member_node(book.snapshot, m))
            what = " + ".join(f"{n} x {g} GPUs" for g, n in sorted(sizes.items(), reverse=True))
            created = (time.strftime("%H:%M:%S", time.gmtime(order[1])) if order[1]
                       else "creation unknown")
            where = (f"planned on {plan.summary.split(';')[0]}" if plan is not None and plan.summary
                     else f"holding {', '.join(sorted(ledger.holds.get(other, {})))}" if plan is None
                     else "planned")
            out.append((order, f"gang {shown(other)} (created {created}, {what}, {where})"))
        return [text for _, text in sorted(out)]

    def at_bound(self, key: str) -> None:
        """(lock held) ``key`` reached its starvation bound still waiting: solve it here. Its
        members may never reach the extender meanwhile (no node has room for one, so
        kube-scheduler's own filters turn them away and a pod update does not bring them back),
        and the hold must not wait for the node that frees next: later work could take it first
        (docs/gangs.md, "Starvation bound")."""
        state = self.book.states.get(key)
        members, pending = self.book.pending(key)
        if state is None or not pending or self.book.ledger.get(key) is not None or self.book.planning(key):
            return
        state.verdict = None
        offered = list(state.last_offered) or sorted(self.book.snapshot.nodes)
        got = self.plan(key, members, pending[0], None, offered, state, self.clock())
        log.info("gang %s: at its starvation bound, %s", key,
                 "planned" if not isinstance(got, Rejection) else got.message)

    def replan(self, key: str) -> None:
        """End of a regroup (lock held): replan, keeping members where they fit, and persist it."""
        state = self.book.states.get(key)
        current = self.book.ledger.get(key)
        members, pending = self.book.pending(key)
        if state is None or current is None or not pending or self.book.planning(key):
            return
        current.stale = True
        got = self.plan(key, members, pending[0], None, state.last_offered or list(current.nodes()),
                        state, self.clock())
        log.info("gang %s: regroup over, %s", key,
                 "replanned" if not isinstance(got, Rejection) else got.message)

    def drain(self, timeout: float | None = None) -> None:
        """Wait until every background plan started so far is done (one job thread: FIFO)."""
        self._jobs.submit(lambda: None).result(timeout)

    def close(self) -> None:
        self._jobs.shutdown(wait=False, cancel_futures=True)
        self._pool.shutdown(wait=False, cancel_futures=True)

    # --- the three steps --------------------------------------------------------------------------
    def _brief(self, key: str, members: list[WorkloadSpec], spec: WorkloadSpec,
               fits: Mapping[str, NodeFit] | None, offered: Sequence[str],
               state: GangState) -> Brief | Rejection:
        ledger, snapshot = self.book.ledger, self.book.snapshot
        previous = ledger.get(key)

        def reserved(node: str) -> int:
            return ledger.reserved_gpus(node, key)

        own_shape = shape_key(spec) if fits is not None else None
        eligible = evaluator(snapshot, self.policy, fits, own_shape, reserved)
        inst = build(snapshot, self.policy, key, members, eligible, offered, reserved, state.excluded,
                     self.data_sites, own_shape)
        if not inst.pending:
            return reject(ReasonCode.GANG, "every gang member is already bound")
        prefer = frozenset(previous.nodes()) if previous else frozenset()
        stamp = self.book.stamp(key, members, self.book.size(key, spec) or len(members))
        return Brief(key, spec, inst, self.book.roster(members), prefer, stamp, frozenset(offered))

    def _solve_unlocked(self, brief: Brief) -> tuple[PlanResult, Index]:
        problem, prefer = brief.inst.problem, set(brief.prefer)

        def run() -> tuple[PlanResult, Index]:
            index = Index(problem)
            return self.solve(problem, index, prefer), index

        future: Future[tuple[PlanResult, Index]] = self._pool.submit(run)
        future.add_done_callback(self._wake_waiters)
        with self._solved:
            self._solved.wait_for(future.done)
        result, index = future.result()
        self.reporter.metrics.solved(result.status, result.seconds)
        return result, index

    def _wake_waiters(self, _: Future[tuple[PlanResult, Index]]) -> None:
        with self._solved:
            self._solved.notify_all()

    def _unplaceable(self, brief: Brief, index: Index, state: GangState, now: float) -> Rejection:
        key, ledger = brief.key, self.book.ledger
        previous = ledger.get(key)
        if previous is not None:
            self.release(previous, "replan found no placement")
        if state.waiting_since is None:
            state.waiting_since = now
        others = sum(ledger.reserved_gpus(n.name, key) for n in brief.inst.problem.nodes)
        diag = diagnose.why_not(index, others)
        # Its place in the gang queue, and the gangs ahead that keep what this one lacks, with
        # where (the pod's FailedScheduling event carries the short reason; docs/gangs.md, "Gang
        # queue").
        behind = self.waits_behind(key)
        place, length = self.position(key)
        if behind or place > 1:
            tail = (f"; waits behind {'; '.join(behind[:2])}" + (
                f" and {len(behind) - 2} more" if len(behind) > 2 else "") if behind else "")
            if place:
                tail += f"{',' if behind else ';'} {_ordinal(place)} of {length} in the gang queue"
            diag = replace(diag, short=diag.short + tail, detail=diag.detail + tail)
        self.reporter.unplaceable(key, brief.spec, diag, now)
        why = reject(diag.code, "gang cannot be placed: " + diag.short)
        self._hold_if_oldest(brief, state, now)
        state.verdict = Verdict(why, brief.stamp, self._verdict_until(key, state, now), brief.offered)
        return why

    def _verdict_until(self, key: str, state: GangState, now: float) -> float:
        """(lock held) How long a "cannot be placed" stands: ``VERDICT_SECONDS``, and no later than
        the starvation bound of a gang not holding yet, whose members are then looked at again
        (a solve at or past the bound makes the first waiting gang hold)."""
        until = now + VERDICT_SECONDS
        if state.waiting_since is None or key in self.book.ledger.holds:
            return until
        due = state.waiting_since + self.policy.hold_after_seconds
        if due > now:
            self.hold_due(key, due - now)
            return min(until, due)
        return until

    def _gpus(self) -> dict[str, GpuSpec]:
        """The GPU of every node (lock held)."""
        return {n: f.gpu for n, f in self.book.snapshot.nodes.items() if f.gpu is not None}

    def _wait(self, brief: Brief, state: GangState, now: float, why: Rejection) -> Rejection:
        """Not now, for a reason a solve cannot see (waits_for_one_model): like a gang that cannot
        be placed, the answer stands until the cluster changes."""
        previous = self.book.ledger.get(brief.key)
        if previous is not None:
            self.release(previous, "waiting for one GPU model")
        if state.waiting_since is None:
            state.waiting_since = now
        self._hold_if_oldest(brief, state, now)
        state.verdict = Verdict(why, brief.stamp, self._verdict_until(brief.key, state, now), brief.offered)
        return why

    def _hold_if_oldest(self, brief: Brief, state: GangState, now: float) -> None:
        """The first waiting gang of the gang queue holds whole nodes as they free once it has
        waited ``gang_hold_after_seconds`` (docs/gangs.md, "Starvation bound"). Lock held."""
        ledger, states = self.book.ledger, self.book.states
        if state.waiting_since is None:
            return
        if now - state.waiting_since < self.policy.hold_after_seconds and brief.key not in ledger.holds:
            return
        # The first waiting gang in the gang queue holds; gangs behind it do not.
        mine = self.book.order(brief.key, self.book.members(brief.key))
        older = any(order < mine and (st := states.get(k)) is not None and st.waiting_since is not None
                    for order, k in self.book.queue() if k != brief.key)
        if older:
            if ledger.unhold(brief.key):
                self.book.refresh_expiry()
            return
        snap = self.book.snapshot
        serving = {p.node for uid, p in snap.pods.items()
                   if (s := snap.specs.get(uid)) is not None and s.stage is Stage.SERVING}
        first = next((m for ms in brief.inst.pending.values() for m in ms), None)
        if first is None:
            return

        def fits_when_free(node: str) -> bool:
            facts = snap.nodes.get(node)
            return (facts is not None and not facts.unschedulable and isinstance(
                evaluate(first, facts, NodeUsage(), facts.gpu_count, self.policy.feasibility), NodeFit))

        held = nodes_to_hold(brief.inst, self._gpus(), serving, fits_when_free,
                             set(ledger.holds.get(brief.key, {})))
        if held == ledger.holds.get(brief.key, {}):
            return
        ledger.hold(brief.key, held)
        where = ", ".join(sorted(held))
        log.info("gang %s: oldest waiting gang, holds %s", brief.key, where or "nothing")
        if not held:
            return
        note = (MESSAGE_PREFIX + f"gang {shown(brief.key)} is the oldest waiting gang: no other GPU "
                f"pod is placed on {where} until it is")
        for m in (m for ms in brief.inst.pending.values() for m in ms):
            self.reporter.event(m.key, m.uid or m.key, "GangHoldsNodes", note)

    def _commit(self, brief: Brief, result: PlanResult, index: Index, state: GangState,
                now: float) -> GangPlan:
        key, ledger, snapshot = brief.key, self.book.ledger, self.book.snapshot
        assert result.assignment is not None
        assignment = result.assignment
        previous = ledger.get(key)
        state.waiting_since = None
        state.verdict = None
        state.epochs = max(state.epochs, previous.epoch if previous else 0) + 1
        members: dict[str, MemberPlan] = {}
        for uid, node in brief.inst.bound.items():
            spec = snapshot.specs.get(uid)
            members[uid] = MemberPlan(uid, spec.key if spec else uid, node, spec.gpus if spec else 0, True)
        sticky = {m.uid: m.node for m in previous.members.values()} if previous else {}
        for shape, specs in brief.inst.pending.items():
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
            for s, node in match_inputs(snapshot, rest, slots, brief.inst.inputs):
                members[s.uid or s.key] = MemberPlan(s.uid or s.key, s.key, node, s.gpus)
        ms = result.seconds * 1000
        gap = "" if result.status == "optimal" or math.isinf(result.gap) else f", gap {result.gap:.2%}"
        summary = (f"{diagnose.describe(index, assignment)}; {result.method} {result.status}{gap} "
                   f"in {ms:.0f} ms")
        new = GangPlan(key, members, now, now + ledger.ttl, state.epochs, summary=summary)
        ledger.put(new)
        self.replanned(key)
        self.book.refresh_expiry()
        self.store.save(key, [(m.pod, m.node) for m in new.unbound], new.planned_at, new.epoch)
        what = f"{len(new.unbound)} pods to bind"
        for m in new.unbound:
            note = input_note(snapshot, brief.inst.inputs.get(m.uid), m.node)
            self.reporter.event(m.pod, m.uid, "GangPlanned",
                                MESSAGE_PREFIX + f"gang {shown(key)} planned ({what}): "
                                f"{summary}; this pod goes to {m.node}{note}")
        if previous is not None:
            self.reporter.metrics.outcome("replanned")
        return new
