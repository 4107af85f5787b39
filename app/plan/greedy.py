"""What one-pod-at-a-time placement with our extender does with the same workflow.

A discrete-event replay: a task's pod is submitted when its last producer finishes; our own placer
(``app.placement.placer.Placer``: the filter's hard rules, then ``score`` with the stage weights and the
data-gravity term toward where its producers ran) picks its best node among those with room now. With
no room it waits for the next task to finish. It then starts once its input has been read, the same
transfer rule the other planners use. This is the extender's policy, not kube-scheduler's tie-breaks:
among equal best nodes the first by name is taken.
"""

from __future__ import annotations

import time

from app.config.policy import PolicySource
from app.placement.gravity import GravityModel
from app.placement.placer import Placer
from app.plan.problem import PlanProblem
from app.plan.schedule import Schedule, Slot, ready_time
from app.snapshot.store import ClusterSnapshot, PlacedPod, placed_from_spec


class GreedyError(ValueError):
    """The problem was not built from a workflow (no pods to place)."""


def greedy_extender(problem: PlanProblem, settings: PolicySource, deadline: float | None = None) -> Schedule:
    """``deadline``: a ``time.perf_counter()`` past which the replay gives up (GreedyError)."""
    if not problem.pods or not problem.facts:
        raise GreedyError("the extender baseline needs a problem built from a workflow and nodes")
    policies = settings.policies()
    snap = ClusterSnapshot()
    for name in problem.node:
        snap.upsert_node(problem.facts[name])
    now = 0.0
    gravity = GravityModel(snap, policies.gravity, clock=lambda: now)
    placer = Placer(policies.placement, snap, gravity=gravity)
    # GPUs the plan may not use (already held on a live cluster) are held here too.
    for n in problem.nodes:
        held = problem.facts[n.name].gpu_count - n.gpus
        if held > 0:
            snap.place(_holder(n.name, held))
    names = [n.name for n in problem.nodes]
    order = {t.name: i for i, t in enumerate(problem.tasks)}
    slots: dict[str, Slot] = {}
    released: dict[str, int] = {}  # task -> time its pod was submitted
    running: set[str] = set()
    done: set[str] = set()
    for t in problem.tasks:
        if not t.deps:
            released[t.name] = 0
    while len(done) < len(problem.tasks):
        if deadline is not None and time.perf_counter() > deadline:
            raise GreedyError("the extender baseline ran out of time")
        waiting = sorted((n for n in released if n not in slots), key=lambda n: (released[n], order[n]))
        for name in waiting:
            spec = problem.specs[name]
            decision = placer.filter(problem.pods[name], names)
            # kube-scheduler's own NodeResourcesFit keeps CPU from being over-committed.
            cpu = problem.task[name].cpu_millis
            fits = [decision.fits[n] for n in decision.passed if n in problem.duration[name]
                    and snap.usage[n].cpu_millis + cpu <= problem.node[n].cpu_millis]
            if not fits:
                continue
            scores = placer.score(spec, fits)
            best = min(scores, key=lambda s: (-s.score, -s.total, s.node)).node
            start = max(int(now), ready_time(problem, slots, name, best))
            slots[name] = Slot(best, start, start + problem.duration[name][best])
            snap.place(placed_from_spec(spec, best))
            running.add(name)
        if not running:
            stuck = [n for n in released if n not in slots]
            raise GreedyError(f"tasks {stuck} cannot be placed even on an idle cluster")
        nxt = min(slots[n].end for n in running)
        now = float(nxt)
        for name in sorted(n for n in running if slots[n].end == nxt):
            running.discard(name)
            done.add(name)
            snap.finish(problem.specs[name].uid or problem.specs[name].key, now=now)
            for s in problem.succ[name]:
                if all(d in done for d in problem.task[s].deps):
                    released[s] = nxt
    return Schedule("extender (one pod at a time)", slots)


def _holder(node: str, gpus: int) -> PlacedPod:
    return PlacedPod(uid=f"held-{node}", key=f"held/{node}", node=node, gpus=gpus, cpu_millis=0.0,
                     memory_bytes=0.0, stage=None, latency_class=None, gang=None)
