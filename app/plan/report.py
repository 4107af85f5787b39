"""The run for people (rich tables, sentences) and for machines (JSON)."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

from app.plan.explain import colocations, critical_path, hms, parallelism
from app.plan.run import PlanRun


def as_json(run: PlanRun) -> dict[str, Any]:
    r = run.result
    p = run.problem
    return {
        "workflow": p.name,
        # Status, bound and gap of the whole problem; what CP-SAT said of the model it solved (the
        # whole, or a narrowed one) is model_status, never the headline.
        "solver": {"status": r.status, "proven_optimal": run.proven, "makespan_s": run.plan.makespan,
                   "bound_s": run.lower_bound, "gap": round(run.gap, 6),
                   "model": "whole" if run.narrowed_to is None else "narrowed",
                   "model_status": run.model_status, "narrowed_to": run.narrowed_to,
                   "plan_from": run.plan.method, "skipped_baselines": run.skipped,
                   "nodes": {"cluster": p.cluster_nodes or len(p.nodes), "modelled": len(p.nodes)},
                   "seconds": round(r.seconds, 3), "secondary": r.secondary,
                   "secondary_status": r.secondary_status, "variables": r.variables,
                   "constraints": r.constraints},
        "plan": [{"task": t, "stage": p.task[t].stage, "node": s.node, "start_s": s.start, "end_s": s.end}
                 for t, s in sorted(run.plan.slots.items(), key=lambda kv: (kv[1].start, kv[0]))],
        "compare": {m: {"makespan_s": x.makespan_s, "cross_node_gb": round(x.cross_node_gb, 3),
                        "transfer_s": x.transfer_s, "cost_usd": round(x.cost_usd, 2),
                        "gpu_hours": round(x.gpu_hours, 2), "valid": not run.problems[m]}
                    for m, x in run.metrics.items()},
        "critical_path": critical_path(p, run.plan),
        "colocations": colocations(p, run.plan),
        "parallel": parallelism(run.plan),
    }


def proof_line(run: PlanRun) -> str:
    """What the plan is known to be, in words: optimal only when proven on the whole problem."""
    bound, gap = hms(run.lower_bound), f"{run.gap:.1%}"
    if run.proven:
        return f"proven optimal on the whole problem (no plan can finish before {bound})"
    if run.narrowed_to is not None:
        found = "best found" if run.plan.method == "cp-sat" else f"showing {run.plan.method}"
        return (f"{found} on a narrowed model (each task's {run.narrowed_to} best candidate nodes and "
                f"the best baseline's; CP-SAT there: {run.model_status}); whole-problem bound {bound}, "
                f"gap {gap}")
    if run.plan.method != "cp-sat":
        return f"solver {run.model_status}: showing {run.plan.method}; whole-problem bound {bound}, gap {gap}"
    return f"{run.model_status}, not proven optimal; whole-problem bound {bound}, gap {gap}"


def render(run: PlanRun, console: Console) -> None:
    p, r = run.problem, run.result
    table = Table(title=f"plan for {p.name}: {len(p.tasks)} tasks on {p.cluster_nodes or len(p.nodes)} nodes")
    for col in ("task", "stage", "node", "hardware", "start", "end", "reads"):
        table.add_column(col)
    for t, s in sorted(run.plan.slots.items(), key=lambda kv: (kv[1].start, kv[0])):
        reads = ", ".join(f"{d} ({p.distance.get((run.plan.slots[d].node, s.node), '?')})"
                          for d in p.task[t].deps)
        table.add_row(t, p.task[t].stage, s.node, p.node[s.node].hardware, hms(s.start), hms(s.end), reads)
    console.print(table)
    proof = proof_line(run)
    console.print(f"makespan {hms(run.plan.makespan)}: {proof}; solved in {r.seconds:.2f} s "
                  f"({r.variables} variables, {r.constraints} constraints); then {r.secondary} "
                  f"minimised at that makespan ({r.secondary_status})")
    cmp = Table(title="compared with the baselines")
    for col in ("method", "makespan", "vs plan", "GB across nodes", "cost $", "GPU-h", "valid"):
        cmp.add_column(col, justify="left" if col == "method" else "right")
    best = run.metrics[run.plan.method].makespan_s
    for m, x in run.metrics.items():
        ratio = f"{x.makespan_s / best:.2f}x" if best else "-"
        cmp.add_row(m, hms(x.makespan_s), ratio, f"{x.cross_node_gb:g}", f"{x.cost_usd:.2f}",
                    f"{x.gpu_hours:.1f}", "yes" if not run.problems[m] else "[red]no[/red]")
    console.print(cmp)
    if run.skipped:
        console.print(f"not run, to leave the solver its time: {', '.join(run.skipped)}")
    console.print("[bold]critical path[/bold] (what the finish time waits for):")
    for line in critical_path(p, run.plan):
        console.print(f"  {line}")
    co = colocations(p, run.plan)
    if co:
        console.print("[bold]co-locations[/bold]:")
        for line in co:
            console.print(f"  {line}")
    par = parallelism(run.plan)
    if par:
        console.print("[bold]in parallel[/bold]:")
        for line in par:
            console.print(f"  {line}")
