"""Planning without the service lock: other pods' filters and watch updates never wait for a solve,
and a plan whose capacity changed during the solve is checked and made again before it is used."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import orjson

from app.base.objects import pod_object
from app.base.workload import parse_workload
from app.gang.persist import ANNOTATION
from app.gang.problem import Index, Problem
from app.gang.solver import PlanResult, plan
from tests.unit.gang.test_gang_coordinator import Cluster

WAIT = 30.0  # only a guard against a hung test; nothing below depends on how long anything takes


class SlowSolve:
    """The real planner, held at a gate: ``started`` once a solve is under way, then it waits for
    ``release``. ``during`` runs inside the solve (the lock is released then) after the gate."""

    def __init__(self, hold: bool = True) -> None:
        self.started = threading.Event()
        self.release = threading.Event()
        self.finished = threading.Event()
        self.calls: list[PlanResult] = []
        if not hold:
            self.release.set()
        self.during: Callable[[PlanResult], None] | None = None

    def __call__(self, problem: Problem, index: Index, prefer: set[str]) -> PlanResult:
        self.started.set()
        assert self.release.wait(WAIT)
        result = plan(problem, index=index, prefer=prefer)
        self.calls.append(result)
        if self.during is not None:
            during, self.during = self.during, None
            during(result)
        self.finished.set()
        return result


def body(pod: dict[str, Any], names: list[str]) -> bytes:
    return orjson.dumps({"pod": pod, "nodenames": names})


def answer(raw: bytes) -> dict[str, Any]:
    out: dict[str, Any] = orjson.loads(raw)
    return out


def test_a_filter_for_another_pod_answers_while_a_gang_is_being_solved() -> None:
    solve = SlowSolve()
    c = Cluster(solve=solve)
    names = c.nodes("n", 6, "leaf-1")
    gang = c.gang("g", 4)
    loner = pod_object("loner", namespace="ml", stage="pretraining", gpus=8)
    c.add(loner)
    results: dict[str, dict[str, Any]] = {}

    def filter_in_thread(key: str, pod: dict[str, Any]) -> threading.Thread:
        def run() -> None:
            results[key] = answer(c.service.filter(body(pod, names)))

        t = threading.Thread(target=run, name=f"filter-{key}", daemon=True)
        t.start()
        return t

    planning = filter_in_thread("member", gang[0])  # kube-scheduler's call for the first member
    assert solve.started.wait(WAIT)  # the gang's solve is under way (and held at the gate)

    # Another pod's filter, a watch update and another member's filter all get through now.
    t0 = time.perf_counter()
    other = filter_in_thread("loner", loner)
    other.join(WAIT)
    took = time.perf_counter() - t0
    # Answered (filter_to_best keeps one of the equal nodes) while the solve is still held.
    assert not other.is_alive() and len(results["loner"]["NodeNames"]) == 1
    assert results["loner"]["NodeNames"][0] in names
    newcomer = pod_object("newcomer", namespace="ml", stage="pretraining", gpus=8)
    watch = threading.Thread(target=c.add, args=(newcomer,), daemon=True)  # the pod watch, under the lock
    watch.start()
    watch.join(WAIT)
    assert not watch.is_alive() and newcomer["metadata"]["uid"] in c.service.snapshot.specs
    sibling = filter_in_thread("sibling", gang[1])
    sibling.join(WAIT)
    assert not sibling.is_alive()
    # ... a member whose gang is being planned is told to retry (resolvable, so no long backoff).
    assert results["sibling"]["NodeNames"] == []
    assert not results["sibling"]["FailedAndUnresolvableNodes"]
    assert all("is being planned; retrying" in r for r in results["sibling"]["FailedNodes"].values())
    # The plan had not finished when they answered.
    assert not solve.finished.is_set() and planning.is_alive() and "member" not in results

    solve.release.set()
    planning.join(WAIT)
    assert not planning.is_alive()
    [node] = results["member"]["NodeNames"]
    assert c.gangs.ledger.plans["ml/g"].members[gang[0]["metadata"]["uid"]].node == node
    print(f"filter answered in {took * 1000:.2f} ms while a gang was being solved")


def test_a_node_taken_during_the_solve_makes_the_planner_plan_again() -> None:
    solve = SlowSolve(hold=False)
    c = Cluster(solve=solve)
    c.nodes("n", 3, "leaf-1")
    [member] = c.gang("g", 1)
    taken: list[str] = []

    def bind_elsewhere(result: PlanResult) -> None:
        # A pod is bound on the planned node while the lock is released (the watch delivers it).
        assert result.assignment is not None
        [node] = result.assignment
        taken.append(node)
        with c.service.lock:
            c.service.snapshot.assume(parse_workload(pod_object("intruder", namespace="other", gpus=8)), node)

    solve.during = bind_elsewhere
    d = c.filter(member)
    assert len(solve.calls) == 2  # the first plan failed its check at commit and was made again
    assert len(d.passed) == 1 and d.passed[0] != taken[0]
    plan_ = c.gangs.ledger.plans["ml/g"]
    assert plan_.epoch == 1 and taken[0] not in plan_.nodes()
    for n, u in c.service.snapshot.usage.items():
        assert u.gpus + c.gangs.reserved_gpus(n, None) <= 8


def test_members_filtered_together_get_one_plan() -> None:
    """Two members' filters race: one solves, the other retries, and the gang is planned once."""
    solve = SlowSolve()
    c = Cluster(solve=solve)
    c.nodes("n", 4, "leaf-1")
    a, b = c.gang("g", 2)
    out: dict[str, Any] = {}
    first = threading.Thread(target=lambda: out.setdefault("a", c.filter(a)), daemon=True)
    first.start()
    assert solve.started.wait(WAIT)
    out["b"] = c.filter(b)
    solve.release.set()
    first.join(WAIT)
    assert out["b"].passed == [] and len(out["a"].passed) == 1
    assert len(solve.calls) == 1
    assert len(c.filter(b).passed) == 1  # the retry finds its planned node


def test_live_mode_plans_off_the_request_path_and_the_plan_write_brings_members_back() -> None:
    """The HTTP server's filter runs on its event loop, so there the filter never waits for a solve."""
    solve = SlowSolve()
    c = Cluster(solve=solve, background=True)
    c.nodes("n", 4, "leaf-1")
    pods = c.gang("g", 2)
    d = c.filter(pods[0])  # answered while the solve is still held at its gate
    assert solve.started.wait(WAIT) and not solve.finished.is_set()
    assert d.passed == [] and not d.unresolvable  # resolvable: kube-scheduler retries it soon
    assert all("gang ml/g is being planned; retrying" in r for r in d.failed.values())
    assert c.filter(pods[1]).passed == []  # no second solve for the other member
    solve.release.set()
    c.gangs.planner.drain(WAIT)
    assert len(solve.calls) == 1
    c.flush()  # the plan is written on both members: the pod updates that requeue them
    planned = {p["metadata"]["name"]: c.gangs.ledger.plans["ml/g"].members[p["metadata"]["uid"]].node
               for p in pods}
    assert all(ANNOTATION in c.binder.annotations[f"ml/{name}"] for name in planned)
    for p in pods:
        assert c.filter(p).passed == [planned[p["metadata"]["name"]]]


def test_live_mode_reports_why_a_gang_cannot_be_placed() -> None:
    c = Cluster(background=True)
    c.nodes("n", 2, "leaf-1")
    pods = c.gang("g", 3)
    assert "being planned" in next(iter(c.filter(pods[0]).failed.values()))
    c.gangs.planner.drain(WAIT)
    d = c.filter(pods[1])  # the last plan's reason, while a fresh solve looks again
    assert d.passed == [] and "gang cannot be placed" in next(iter(d.unresolvable.values()))
    c.gangs.planner.drain(WAIT)
    assert not c.gangs.ledger.plans
