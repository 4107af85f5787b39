"""The plan as pods a cluster follows (docs/planner.md, "Output").

Each task's pod carries:

* the workload annotations the extender reads (stage, model size, ``depends-on`` and
  ``input-data-gb`` toward its producers), so the filter's hard rules and data gravity apply as usual;
* ``plan.llm-placement.io/slot``: the planned node, start and end (JSON) and the plan it belongs to,
  for people and tools (a workflow engine creates the pod when the producers have finished: the plan
  assumes that, Kubernetes itself does not order pods);
* a required node affinity on ``metadata.name`` = the planned node: kube-scheduler only offers that
  node to the extender, so the pod lands there or waits until it has room, never elsewhere.

The slot key lives outside the ``llm-placement.io/`` prefix on purpose: the extender warns about
unknown keys under its prefix, and this one is the planner's, not a workload setting.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import yaml

from app.plan.cpsat import SolveResult
from app.plan.problem import PlanProblem
from app.plan.schedule import Schedule

SLOT = "plan.llm-placement.io/slot"


def planned_pod(problem: PlanProblem, schedule: Schedule, task: str, result: SolveResult | None = None
                ) -> dict[str, Any]:
    pod = copy.deepcopy(problem.pods[task])
    meta = pod["metadata"]
    meta.pop("uid", None)
    pod.pop("status", None)
    s = schedule.slots[task]
    slot = {"workflow": problem.name, "task": task, "node": s.node, "start_s": s.start, "end_s": s.end,
            "after": list(problem.task[task].deps), "makespan_s": schedule.makespan,
            "method": schedule.method}
    if result is not None:
        slot["status"] = result.status
    meta["annotations"][SLOT] = json.dumps(slot, separators=(",", ":"), sort_keys=True)
    pod["spec"]["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchFields": [
            {"key": "metadata.name", "operator": "In", "values": [s.node]}]}]}}}
    return pod


def planned_pods(problem: PlanProblem, schedule: Schedule, result: SolveResult | None = None
                 ) -> list[dict[str, Any]]:
    """In the order they start (ties: workflow order)."""
    order = {t.name: i for i, t in enumerate(problem.tasks)}
    names = sorted(schedule.slots, key=lambda n: (schedule.slots[n].start, order[n]))
    return [planned_pod(problem, schedule, n, result) for n in names]


def to_yaml(pods: list[dict[str, Any]]) -> str:
    return yaml.safe_dump_all(pods, sort_keys=False)


def planned_node(pod: dict[str, Any]) -> str | None:
    """The node a planned pod's slot names (None: not a planned pod)."""
    raw = ((pod.get("metadata") or {}).get("annotations") or {}).get(SLOT)
    try:
        node = json.loads(raw)["node"] if raw else None
    except (ValueError, KeyError, TypeError):
        return None
    return node if isinstance(node, str) else None
