"""The scheduling literature's own example, entered as published: HEFT and the exact planner.

Topcuoglu, Hariri and Wu, "Performance-effective and low-complexity task scheduling for
heterogeneous computing", IEEE TPDS 13(3), 2002: the 10-task graph on 3 processors (Fig. 2 with its
computation-cost table), for which the paper reports an HEFT schedule of length 80. The duration
matrix and edge costs are those of the reference HEFT implementation's test data
(github.com/mackncheesiest/heft, test/canonicalgraph_task_exe_time.csv and
test/canonicalgraph_task_connectivity.csv); communication between two tasks on one processor is free.
"""

from __future__ import annotations

from pathlib import Path

from app.plan.cpsat import solve
from app.plan.heft import heft
from app.plan.problem import OTHER, PlanNode, PlanProblem, PlanTask
from app.plan.run import PlanRun, lower_bound, plan_workflow
from app.plan.schedule import verify

DURATIONS = [  # task -> (P0, P1, P2)
    (14, 16, 9), (13, 19, 18), (11, 13, 19), (13, 8, 17), (12, 13, 10),
    (13, 16, 9), (7, 15, 11), (5, 11, 14), (18, 12, 20), (21, 7, 16),
]
EDGES = {  # (producer, consumer) -> communication cost between two processors
    (0, 1): 18, (0, 2): 12, (0, 3): 9, (0, 4): 11, (0, 5): 14, (1, 7): 19, (1, 8): 16, (2, 6): 23,
    (3, 7): 27, (3, 8): 23, (4, 8): 13, (5, 7): 15, (6, 9): 17, (7, 9): 11, (8, 9): 13,
}


def paper_problem() -> PlanProblem:
    procs = [PlanNode(f"p{i}", 1, 1000) for i in range(3)]
    tasks = [PlanTask(f"t{i}", "x", 1, 0, tuple(f"t{u}" for (u, v) in EDGES if v == i),
                      float(max((c for (u, _), c in EDGES.items() if u == i), default=0)), OTHER)
             for i in range(10)]
    duration = {f"t{i}": {f"p{j}": d for j, d in enumerate(row)} for i, row in enumerate(DURATIONS)}
    cost = {t: dict.fromkeys(d, 1.0) for t, d in duration.items()}
    s_per_gb = {(a.name, b.name): 0.0 if a is b else 1.0 for a in procs for b in procs}
    edge_data = {(f"t{u}", f"t{v}"): float(c) for (u, v), c in EDGES.items()}
    return PlanProblem(tasks, procs, duration, cost, s_per_gb, edge_data=edge_data)


def test_heft_gives_the_published_80_and_the_exact_planner_proves_better() -> None:
    problem = paper_problem()
    h = heft(problem)
    assert verify(problem, h) == []
    assert h.makespan == 80
    result = solve(problem, time_limit=10.0, secondary="none", hint=h, workers=2)
    assert result.status == "optimal" and result.schedule is not None
    assert verify(problem, result.schedule) == []
    assert result.makespan == 73
    assert lower_bound(problem, result.bound) == 73


def test_cpop_gives_the_published_86() -> None:
    from app.plan.cpop import cpop

    problem = paper_problem()
    c = cpop(problem)
    assert verify(problem, c) == []
    assert c.makespan == 86


# --- The same two examples stated as files, planned as a user would plan them (docs/planner.md) ------

PUBLISHED = Path(__file__).parents[2] / "plan_instances" / "published"


def _from_files(name: str) -> PlanRun:
    from app.config.settings import Settings
    from app.plan.cluster import load_cluster
    from app.plan.workflow import load_workflow

    settings = Settings()
    cf = load_cluster(PUBLISHED / "heft-2002.cluster.yaml")
    assert cf.bandwidth is not None
    return plan_workflow(load_workflow(PUBLISHED / f"{name}.workflow.yaml"), cf.nodes, settings,
                         time_limit=20.0, secondary="none",
                         bandwidth=cf.bandwidth.over(settings.tier_bandwidth_gbps))


def test_the_2002_example_from_files_gives_heft_80_cpop_86_and_a_proven_73() -> None:
    run = _from_files("heft-2002")
    p = run.problem
    # Stated exactly: a local read is free, a read between processors costs the edge's figure.
    assert p.transfer("t0", "p0-0", "p0-0", "t1") == 0 and p.transfer("t0", "p0-0", "p1-0", "t1") == 18
    assert {p.duration["t0"][n] for n in ("p0-0", "p1-0", "p2-0")} == {14, 16, 9}
    assert run.metrics["heft"].makespan_s == 80 and run.metrics["cpop"].makespan_s == 86
    assert run.proven and run.plan.makespan == 73 and run.result.status == "optimal"
    assert all(not problems for problems in run.problems.values())


def test_the_2014_peft_example_from_files_is_proven_below_the_published_peft_schedule() -> None:
    run = _from_files("peft-2014")
    # The reference implementation's PEFT schedule ends at 122 (its test_canonical_graph): the exact
    # plan is no longer, and proven optimal on the whole problem.
    assert run.proven and run.result.status == "optimal" and run.gap == 0.0
    assert run.plan.makespan <= 122
    assert verify(run.problem, run.plan) == []
