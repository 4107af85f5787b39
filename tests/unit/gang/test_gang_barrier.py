"""The all-or-nothing bind barrier (asyncio): everyone binds together, or nobody does."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from app.base.workload import WorkloadSpec, parse_workload
from app.config.settings import Settings
from app.gang.persist import ANNOTATION
from app.gang.regroup import REGROUP_MAX, SCHEDULER_MAX_BACKOFF
from tests.unit.gang.test_gang_coordinator import Cluster, FakeBinder

# Timeouts and regroup wake-ups are fake timers fired by the tests (Cluster.bind_timers and
# Cluster.wake_timers), so nothing here depends on how fast a busy machine runs.


def fast(timeout: float = 0.3) -> Settings:
    return Settings(cluster_source="none", metrics_port=0, gang_bind_timeout_seconds=timeout)


async def settle(cond: Callable[[], bool]) -> None:
    """Let the event loop run until ``cond`` holds (a bounded number of turns, no wall clock)."""
    for _ in range(1000):
        if cond():
            return
        await asyncio.sleep(0)
    assert cond()


def waiting(c: Cluster, gang: str = "ml/g") -> int:
    barrier = c.gangs.barrier.barriers.get(gang)
    return len(barrier.waiters) if barrier is not None else 0


def planned(c: Cluster, pods: list[dict[str, Any]]) -> list[tuple[WorkloadSpec, str]]:
    out = []
    for p in pods:
        d = c.filter(p)
        assert len(d.passed) == 1, d.rejections
        out.append((parse_workload(p), d.passed[0]))
    return out


async def bind(c: Cluster, spec: WorkloadSpec, node: str) -> str:
    return await c.gangs.bind_member(spec, node)


def test_members_are_bound_only_once_all_have_arrived() -> None:
    clock = [1000.0]
    c = Cluster(fast(timeout=5.0), clock=clock)
    c.nodes("n", 4, "leaf-1")
    members = planned(c, c.gang("g", 4))

    async def run() -> list[str]:
        early = [asyncio.create_task(bind(c, s, n)) for s, n in members[:3]]
        await settle(lambda: waiting(c) == 3)
        assert not any(t.done() for t in early)  # three of four arrived: all of them wait ...
        assert c.binder.bound == {}  # ... and nothing is bound yet
        clock[0] += 0.3
        last = await bind(c, *members[3])
        return [last, *[await t for t in early]]

    assert asyncio.run(run()) == ["", "", "", ""]
    assert c.binder.bound == {s.key: n for s, n in members}
    assert c.gangs.ledger.total_reserved() == 0 and "ml/g" not in c.gangs.ledger.plans
    assert c.metric("llm_placement_gangs_total", outcome="bound") == 1
    assert c.metric("llm_placement_gang_wait_seconds_sum") == pytest.approx(0.3)
    assert not c.bind_timers.pending()  # the timeout was cancelled when the last one arrived


def test_timeout_fails_every_waiting_member_and_binds_none() -> None:
    c = Cluster(fast(timeout=0.3))
    c.nodes("n", 4, "leaf-1")
    members = planned(c, c.gang("g", 4))

    async def run() -> list[str]:
        tasks = [asyncio.create_task(bind(c, s, n)) for s, n in members[:3]]
        await settle(lambda: waiting(c) == 3)
        [timeout] = c.bind_timers.pending()
        assert timeout.delay == 0.3
        # First tick: members arrived since the barrier opened, so their calls are answered before
        # kube-scheduler's httpTimeout but their seats are kept ...
        assert c.bind_timers.fire() == 1
        held = [await t for t in tasks]
        assert all("3/4 members reached bind; this member's place is held" in e for e in held)
        assert "ml/g" in c.gangs.barrier.barriers and c.binder.bound == {}
        # ... second tick with no new member: a stall, the barrier gives up.
        assert c.bind_timers.fire() == 1
        return held

    asyncio.run(run())
    assert "ml/g" not in c.gangs.barrier.barriers
    assert c.binder.bound == {}
    assert c.metric("llm_placement_gangs_total", outcome="failed") == 1
    assert c.gangs.ledger.total_reserved() == 32  # capacity still held for the retry
    c.flush()
    timeouts = [m for _, r, m in c.binder.events if r == "GangBindTimeout"]
    assert len(timeouts) == 3
    assert all("only 3/4 members reached bind, none new within 0.3s; none bound" in m for m in timeouts)
    # Regroup: members coming back are parked (rejected) until all four are back ...
    pods = [c.pods[f"g-{i}"] for i in range(4)]
    for i, p in enumerate(pods):
        d = c.filter(p)
        assert d.passed == []
        assert f"regrouping after an incomplete bind: {i + 1}/4 members back" in next(iter(d.rejections.values()))
    # ... then, one kube-scheduler backoff later, one replan and one update of every member wakes
    # them together (the annotation write is the pod update that requeues them).
    [wake] = c.wake_timers.pending()
    assert wake.delay == SCHEDULER_MAX_BACKOFF + 1
    # Members kube-scheduler retries meanwhile (every few seconds) do not push the replan back.
    for p in pods * 3:
        c.filter(p)
    assert c.wake_timers.pending() == [wake]
    epoch = c.gangs.ledger.plans["ml/g"].epoch
    assert c.wake_timers.fire() == 1
    assert c.gangs.ledger.plans["ml/g"].epoch == epoch + 1
    c.flush()
    assert all('"epoch":' + str(epoch + 1) in c.binder.annotations[f"ml/g-{i}"][ANNOTATION] for i in range(4))
    again = planned(c, pods)
    assert {n for _, n in again} == {n for _, n in members}  # nothing failed: same nodes

    async def retry() -> list[str]:
        return list(await asyncio.gather(*(bind(c, s, n) for s, n in again)))

    assert asyncio.run(retry()) == [""] * 4 and len(c.binder.bound) == 4


async def _time_out(c: Cluster, members: list[tuple[WorkloadSpec, str]]) -> list[str]:
    """These members reach bind, the others never do: the barrier's timeout fires."""
    tasks = [asyncio.create_task(bind(c, s, n)) for s, n in members]
    await settle(lambda: waiting(c) == len(members))
    assert c.bind_timers.fire() == 1  # answered, seats held
    out = [await t for t in tasks]
    assert c.bind_timers.fire() == 1  # no new member since: the barrier gives up
    return out


def test_regroup_gives_up_waiting_for_a_member_that_never_returns() -> None:
    c = Cluster(fast(timeout=0.2))
    c.nodes("n", 4, "leaf-1")
    members = planned(c, c.gang("g", 3))

    assert all("2/3 members reached bind" in e for e in asyncio.run(_time_out(c, members[:2])))
    assert c.filter(c.pods["g-0"]).passed == []  # parked; g-2 never comes back
    [wake] = c.wake_timers.pending()
    assert wake.delay == REGROUP_MAX
    epoch = c.gangs.ledger.plans["ml/g"].epoch
    assert c.wake_timers.fire() == 1
    assert c.gangs.ledger.plans["ml/g"].epoch == epoch + 1
    assert not c.gangs.regroup.active("ml/g")
    assert len(c.filter(c.pods["g-0"]).passed) == 1


def test_a_failed_bind_after_others_is_reported_and_the_rest_replanned() -> None:
    binder = FakeBinder(fail={"ml/g-2"})
    c = Cluster(fast(timeout=5.0), binder=binder)
    c.nodes("n", 6, "leaf-1")
    members = planned(c, c.gang("g", 4))

    async def run() -> list[str]:
        return list(await asyncio.gather(*(bind(c, s, n) for s, n in members)))

    results = asyncio.run(run())
    assert results[2] and "is gone" in results[2]
    assert [r for i, r in enumerate(results) if i != 2] == ["", "", ""]
    failed_node = members[2][1]
    c.flush()
    partial = [m for _, r, m in binder.events if r == "GangPartiallyBound"]
    assert len(partial) == 4 and "3/4 members bound" in partial[0] and failed_node in partial[0]
    # The failed member is replanned with the bound ones fixed and without the failed node.
    binder.fail.clear()
    d = c.filter(c.pods["g-2"])
    assert len(d.passed) == 1 and d.passed[0] != failed_node
    plan = c.gangs.ledger.plans["ml/g"]
    assert sum(1 for m in plan.members.values() if m.bound) == 3

    async def finish() -> str:
        return await bind(c, members[2][0], d.passed[0])

    assert asyncio.run(finish()) == ""
    assert len(binder.bound) == 4 and "ml/g" not in c.gangs.ledger.plans


def test_bind_outside_the_plan_is_refused() -> None:
    c = Cluster(fast())
    names = c.nodes("n", 4, "leaf-1")
    members = planned(c, c.gang("g", 2))
    spec, node = members[0]
    wrong = next(n for n in names if n not in {m[1] for m in members})
    assert "on another node" in asyncio.run(bind(c, spec, wrong))
    stranger = parse_workload(c.gang("h", 2)[0])
    assert "no gang plan holds this pod" in asyncio.run(bind(c, stranger, node))
    assert c.binder.bound == {}


def test_a_repeated_bind_call_supersedes_the_earlier_one() -> None:
    c = Cluster(fast(timeout=5.0))
    c.nodes("n", 4, "leaf-1")
    members = planned(c, c.gang("g", 2))

    async def run() -> tuple[str, str, str]:
        first = asyncio.create_task(bind(c, *members[0]))
        await settle(lambda: waiting(c) == 1)
        second = asyncio.create_task(bind(c, *members[0]))
        await settle(first.done)
        other = await bind(c, *members[1])
        return await first, await second, other

    first, second, other = asyncio.run(run())
    assert "superseded" in first and second == "" and other == ""
    assert len(c.binder.bound) == 2


def test_a_cancelled_waiter_leaves_the_barrier() -> None:
    c = Cluster(fast(timeout=5.0))
    c.nodes("n", 4, "leaf-1")
    members = planned(c, c.gang("g", 2))

    async def run() -> None:
        t = asyncio.create_task(bind(c, *members[0]))
        await settle(lambda: waiting(c) == 1)
        t.cancel()  # kube-scheduler gave up on this HTTP call
        await settle(t.done)
        await settle(lambda: waiting(c) == 0)
        # The other member arriving alone does not complete the gang.
        t2 = asyncio.create_task(bind(c, *members[1]))
        await settle(lambda: waiting(c) == 1)
        assert not t2.done() and c.binder.bound == {}
        t2.cancel()

    asyncio.run(run())


def test_retried_bind_of_a_bound_member_succeeds() -> None:
    c = Cluster(fast(timeout=5.0))
    c.nodes("n", 2, "leaf-1")
    members = planned(c, c.gang("g", 1))

    async def twice() -> tuple[str, str]:
        return await bind(c, *members[0]), await bind(c, *members[0])

    assert asyncio.run(twice()) == ("", "")
    assert len(c.binder.bound) == 1


def test_a_node_cordoned_while_members_gather_aborts_the_bind() -> None:
    c = Cluster(fast(timeout=5.0))
    c.nodes("n", 4, "leaf-1")
    members = planned(c, c.gang("g", 2))
    node = members[0][1]
    with c.service.lock:
        facts = c.service.snapshot.nodes[node]
        c.service.snapshot.upsert_node(facts.model_copy(update={"unschedulable": True}))

    async def run() -> list[str]:
        return list(await asyncio.gather(*(bind(c, s, n) for s, n in members)))

    results = asyncio.run(run())
    assert all(f"planned node {node} became unschedulable before bind; none bound" in r for r in results)
    assert c.binder.bound == {}
    assert node in c.gangs.states["ml/g"].excluded and c.gangs.ledger.plans["ml/g"].stale
    assert c.gangs.regroup.active("ml/g")  # members regroup before the replan


def test_a_late_bind_during_a_regroup_joins_it_instead_of_waiting() -> None:
    c = Cluster(fast(timeout=0.2))
    c.nodes("n", 4, "leaf-1")
    members = planned(c, c.gang("g", 3))

    asyncio.run(_time_out(c, members[:2]))
    late = asyncio.run(bind(c, *members[2]))  # filtered before the failure, arrives after it
    assert "regrouping after an incomplete bind" in late
    assert "ml/g" not in c.gangs.barrier.barriers and c.binder.bound == {}


def test_members_arriving_over_several_timeouts_keep_their_seats_and_all_bind_together() -> None:
    """A large gang reaches bind over tens of seconds (one kube-scheduler cycle per member): calls
    are answered before kube-scheduler's httpTimeout, but the gang binds whole when the last arrives."""
    c = Cluster(fast(timeout=0.3))
    c.nodes("n", 4, "leaf-1")
    members = planned(c, c.gang("g", 4))

    async def run() -> tuple[list[str], list[str], str]:
        first = [asyncio.create_task(bind(c, s, n)) for s, n in members[:2]]
        await settle(lambda: waiting(c) == 2)
        assert c.bind_timers.fire() == 1
        early = [await t for t in first]
        third = asyncio.create_task(bind(c, *members[2]))
        await settle(lambda: waiting(c) == 3)
        assert c.bind_timers.fire() == 1  # member 2 arrived meanwhile: progress, not a stall
        middle = [await third]
        assert c.binder.bound == {}  # nobody bound before the last member
        last = await bind(c, *members[3])
        return early, middle, last

    early, middle, last = asyncio.run(run())
    assert all("place is held" in e for e in early + middle)
    assert last == ""
    assert c.binder.bound == {f"ml/g-{i}": n for i, (_, n) in enumerate(members)}
    # kube-scheduler retries the members it was told to retry: they are bound already, success.
    assert asyncio.run(bind(c, *members[0])) == ""
    assert c.metric("llm_placement_gangs_total", outcome="failed") in (None, 0)


def test_a_held_member_with_claims_is_not_bound_behind_kube_schedulers_back() -> None:
    """kube-scheduler ran Unreserve for a member whose bind call was answered with an error, taking
    it out of its claims' reservedFor; binding it then would give the kubelet a pod its claims are
    not reserved for. It keeps its seat and binds on its retried call (claims reserved again)."""
    c = Cluster(fast(timeout=0.3))
    c.nodes("n", 4, "leaf-1")
    pods = c.gang("g", 3)
    members = planned(c, pods)
    members = [(s.model_copy(update={"has_claims": True}), n) for s, n in members]

    async def run() -> tuple[str, str]:
        first = asyncio.create_task(bind(c, *members[0]))
        await settle(lambda: waiting(c) == 1)
        assert c.bind_timers.fire() == 1
        held = await first  # answered: kube-scheduler unreserves this member's claims
        await asyncio.gather(*(bind(c, s, n) for s, n in members[1:]))
        assert "ml/g-0" not in c.binder.bound  # not bound without its claims reserved
        return held, await bind(c, *members[0])  # the retry, claims reserved again

    held, retried = asyncio.run(run())
    assert "place is held" in held
    assert retried == ""
    assert c.binder.bound == {f"ml/g-{i}": n for i, (_, n) in enumerate(members)}
    assert c.gangs.ledger.total_reserved() == 0


def test_the_held_member_keeps_its_seat_until_it_returns() -> None:
    c = Cluster(fast(timeout=0.3))
    c.nodes("n", 4, "leaf-1")
    members = [(s.model_copy(update={"has_claims": True}), n) for s, n in planned(c, c.gang("g", 2))]

    async def run() -> None:
        first = asyncio.create_task(bind(c, *members[0]))
        await settle(lambda: waiting(c) == 1)
        c.bind_timers.fire()
        await first
        assert await bind(c, *members[1]) == ""

    asyncio.run(run())
    # The member that arrived last is bound; the held one is not, and its GPUs stay reserved for it.
    assert c.binder.bound == {"ml/g-1": members[1][1]}
    assert c.gangs.ledger.total_reserved() > 0


def test_gathered_members_reaching_bind_apart_are_bound_without_an_error() -> None:
    """Once every member passed filter (gathered), a bind call is never answered with an error
    for want of the others: at the bind timeout those here are bound, later ones at once."""
    c = Cluster(fast(timeout=5.0), gather=True)
    c.nodes("n", 4, "leaf-1")
    pods = c.gang("g", 4)
    for p in pods:
        c.filter(p)  # all arrive; the last one opens the gate
    members = planned(c, pods)

    async def run() -> list[str]:
        early = [asyncio.create_task(bind(c, s, n)) for s, n in members[:2]]
        await settle(lambda: waiting(c) == 2)
        assert c.bind_timers.fire() == 1  # the others are still on their way: bind these two now
        answers = [await t for t in early]
        late = [await bind(c, s, n) for s, n in members[2:]]  # no wait for anybody
        return answers + late

    assert asyncio.run(run()) == ["", "", "", ""]
    assert sorted(c.binder.bound) == [f"ml/g-{i}" for i in range(4)]
    assert "ml/g" not in c.gangs.ledger.plans and c.gangs.ledger.total_reserved() == 0


def test_a_gathered_member_arriving_while_the_first_ones_are_being_bound_is_bound_in_its_own_call() -> None:
    import threading

    class SlowBinder(FakeBinder):
        """Binds of the first two members wait until released: the window a late member hits."""

        def __init__(self) -> None:
            super().__init__()
            self.release = threading.Event()

        def bind(self, namespace: str, name: str, uid: str, node: str) -> bool:
            if name in ("g-0", "g-1"):
                assert self.release.wait(10)
            return super().bind(namespace, name, uid, node)

    binder = SlowBinder()
    c = Cluster(fast(timeout=5.0), binder=binder, gather=True)
    c.nodes("n", 4, "leaf-1")
    pods = c.gang("g", 4)
    for p in pods:
        c.filter(p)
    members = planned(c, pods)

    async def run() -> list[str]:
        early = [asyncio.create_task(bind(c, s, n)) for s, n in members[:2]]
        await settle(lambda: waiting(c) == 2)
        assert c.bind_timers.fire() == 1  # binding of the first two begins, and blocks
        late = await asyncio.wait_for(bind(c, *members[2]), 5)  # answered while they are blocked
        binder.release.set()
        return [await t for t in early] + [late, await bind(c, *members[3])]

    try:
        assert asyncio.run(run()) == ["", "", "", ""]
    finally:
        binder.release.set()
    assert sorted(binder.bound) == [f"ml/g-{i}" for i in range(4)]
