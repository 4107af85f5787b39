"""CP-SAT against brute force on random tiny task graphs; the checker catches broken schedules."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.plan.cpsat import solve
from app.plan.heft import heft
from app.plan.problem import OTHER, SERVE, TRAIN, PlanNode, PlanProblem, PlanTask
from app.plan.schedule import Schedule, Slot, verify
from testkit.plan_brute import brute_force


@st.composite
def problems(draw: st.DrawFn) -> PlanProblem:
    n_nodes = draw(st.integers(2, 3))
    nodes = [PlanNode(f"n{i}", draw(st.integers(1, 4)), 4000) for i in range(n_nodes)]
    n_tasks = draw(st.integers(2, 4))
    tasks: list[PlanTask] = []
    duration: dict[str, dict[str, int]] = {}
    cost: dict[str, dict[str, float]] = {}
    for i in range(n_tasks):
        name = f"t{i}"
        deps = tuple(f"t{j}" for j in range(i) if draw(st.booleans()))
        gpus = draw(st.integers(0, 3))
        kind = draw(st.sampled_from([OTHER, OTHER, TRAIN, SERVE]))
        ok = [n for n in nodes if n.gpus >= gpus and draw(st.integers(0, 3)) > 0] or [max(nodes, key=lambda n: n.gpus)]
        if ok[0].gpus < gpus:
            gpus = ok[0].gpus
        duration[name] = {n.name: draw(st.integers(1, 20)) for n in ok}
        cost[name] = {n.name: float(d) for n, d in zip(ok, duration[name].values(), strict=True)}
        tasks.append(PlanTask(name, "x", gpus, draw(st.sampled_from([0, 1000, 3000])), deps,
                              float(draw(st.integers(0, 10))), kind))
    s_per_gb = {}
    for a in nodes:
        for b in nodes:
            s_per_gb[(a.name, b.name)] = 0.1 if a == b else draw(st.sampled_from([0.5, 1.0, 2.0]))
    return PlanProblem(tasks, nodes, duration, cost, s_per_gb)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problems())
def test_cp_sat_matches_brute_force(problem: PlanProblem) -> None:
    best = brute_force(problem)
    assert verify(problem, best) == []
    result = solve(problem, time_limit=1.0, secondary="none", workers=1)
    assert result.schedule is not None
    assert result.status == "optimal"
    assert verify(problem, result.schedule) == []
    assert result.makespan == best.makespan
    h = heft(problem)
    assert verify(problem, h) == []
    assert h.makespan >= best.makespan


def _chain() -> PlanProblem:
    nodes = [PlanNode("a", 2, 1000), PlanNode("b", 2, 1000)]
    tasks = [PlanTask("p", "x", 2, 0, (), 10.0, TRAIN), PlanTask("c", "x", 2, 0, ("p",), 0.0, SERVE)]
    duration = {"p": {"a": 5, "b": 5}, "c": {"a": 3, "b": 3}}
    return PlanProblem(tasks, nodes, duration, {k: dict.fromkeys(v, 1.0) for k, v in duration.items()},
                       {("a", "a"): 0.1, ("b", "b"): 0.1, ("a", "b"): 1.0, ("b", "a"): 1.0})


def test_checker_catches_each_broken_rule() -> None:
    p = _chain()
    good = Schedule("x", {"p": Slot("a", 0, 5), "c": Slot("a", 6, 9)})
    assert verify(p, good) == []
    early = Schedule("x", {"p": Slot("a", 0, 5), "c": Slot("b", 6, 9)})  # 10 GB at 1 s/GB: 15
    assert any("before its inputs" in m for m in verify(p, early))
    wrong_len = Schedule("x", {"p": Slot("a", 0, 4), "c": Slot("a", 6, 9)})
    assert any("duration" in m for m in verify(p, wrong_len))
    assert "unscheduled" in verify(p, Schedule("x", {"p": Slot("a", 0, 5)}))[0]


def test_transfer_time_decides_colocation() -> None:
    p = _chain()
    result = solve(p, time_limit=1.0, secondary="none", workers=1)
    assert result.schedule is not None
    s = result.schedule.slots
    assert s["p"].node == s["c"].node  # 1 s locally instead of 10 s across
    assert result.makespan == 5 + 1 + 3
