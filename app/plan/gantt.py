"""The plan (and optionally a baseline) as a Gantt chart PNG: one row per node used."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from app.plan.problem import PlanProblem
from app.plan.schedule import Schedule

_COLOURS = {"data-prep": "#8c8c8c", "pretraining": "#1f77b4", "alignment": "#2ca02c",
            "deployment": "#9467bd", "serving": "#ff7f0e"}


def gantt(problem: PlanProblem, schedules: Sequence[Schedule], path: str | Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")  # no display: files only
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    # Rows are the nodes a schedule uses, not the cluster's (20,000 nodes would be a 9,000-inch chart).
    used = max((len({s.node for s in sched.slots.values()}) for sched in schedules), default=1)
    fig, axes = plt.subplots(len(schedules), 1, figsize=(12, 1.2 + 0.45 * min(used, 200)),
                             squeeze=False, sharex=True)
    for ax, sched in zip(axes[:, 0], schedules, strict=True):
        rows = sorted({s.node for s in sched.slots.values()})
        y = {n: i for i, n in enumerate(rows)}
        for name, s in sched.slots.items():
            stage = problem.task[name].stage
            ax.barh(y[s.node], (s.end - s.start) / 3600, left=s.start / 3600, height=0.6,
                    color=_COLOURS.get(stage, "#17becf"), edgecolor="black", alpha=0.85)
            ax.text((s.start + s.end) / 7200, y[s.node], name, ha="center", va="center", fontsize=7)
        ax.set_yticks(range(len(rows)), [f"{n} ({problem.node[n].hardware})" for n in rows], fontsize=8)
        ax.invert_yaxis()
        ax.set_title(f"{sched.method}: makespan {sched.makespan / 3600:.2f} h", fontsize=10)
        ax.grid(axis="x", alpha=0.3)
    axes[-1, 0].set_xlabel("hours from the workflow's start")
    fig.legend(handles=[Patch(color=c, label=s) for s, c in _COLOURS.items()], loc="upper right",
               fontsize=7, ncol=5)
    fig.tight_layout(rect=(0, 0, 1, 0.95))
    out = Path(path)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
