"""The plan in words: its critical path (what the finish time waits for) and each co-location."""

from __future__ import annotations

from app.plan.problem import Links, PlanProblem
from app.plan.schedule import Schedule


def hms(seconds: float) -> str:
    s = round(seconds)
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


def critical_path(problem: PlanProblem, schedule: Schedule) -> list[str]:
    """From the last task back to time 0: each step is the input or the capacity it waited for."""
    slots = schedule.slots
    if not slots:
        return []
    cur = max(slots, key=lambda n: (slots[n].end, n))
    chain: list[str] = []
    seen: set[str] = set()
    while cur not in seen:
        seen.add(cur)
        s = slots[cur]
        line = f"{cur} on {s.node} {hms(s.start)}-{hms(s.end)}"
        binding = [d for d in problem.task[cur].deps
                   if slots[d].end + problem.transfer(d, slots[d].node, s.node, cur) == s.start]
        if binding:
            d = binding[0]
            lag = problem.transfer(d, slots[d].node, s.node, cur)
            gb = problem.edge_gb(d, cur)
            where = "locally" if slots[d].node == s.node else (
                f"from {slots[d].node} ({problem.distance.get((slots[d].node, s.node), 'remote')})")
            chain.append(f"{line}: starts when {d}'s {gb:g} GB has been read {where} in {lag} s")
            cur = d
            continue
        blocker = [o for o, x in slots.items() if x.node == s.node and x.end == s.start and o != cur]
        if s.start > 0 and blocker:
            chain.append(f"{line}: waits for capacity on {s.node} until {blocker[0]} ends")
            cur = blocker[0]
            continue
        chain.append(f"{line}: starts at once" if s.start == 0 else f"{line}")
        break
    chain.reverse()
    return chain


def colocations(problem: PlanProblem, schedule: Schedule) -> list[str]:
    """Each producer/consumer pair on one node, with what reading the data elsewhere would cost."""
    out: list[str] = []
    slots = schedule.slots
    cache: dict[tuple[str, int], list[str]] = {}
    for u, v in problem.edges():
        node = slots[u].node
        if slots[v].node != node or problem.edge_gb(u, v) <= 0:
            continue
        here = problem.transfer(u, node, node, v)
        others = [(problem.transfer(u, node, m, v), m) for m in _nearest(problem, node, v, cache)]
        alt = ""
        if others:
            lag, m = min(others)
            alt = (f" instead of {lag} s on the nearest other node it may run on ({m}, "
                   f"{problem.distance.get((node, m), 'remote')})")
        out.append(f"{v} runs on {node}, where {u} wrote the {problem.edge_gb(u, v):g} GB it reads: "
                   f"read locally in {here} s{alt}")
    return out


def _nearest(problem: PlanProblem, node: str, consumer: str, cache: dict[tuple[str, int], list[str]]
             ) -> list[str]:
    """The nodes other than ``node`` that ``consumer`` may run on, one per group (Links: a group's
    nodes are equally far from ``node``; the first by name stands for it)."""
    row = problem.duration[consumer]
    key = (node, id(row))
    if key not in cache:
        links = problem.s_per_gb
        if isinstance(links, Links):
            first: dict[int, str] = {}
            for m in row:
                g = links.group_of[m]
                if m != node and (g not in first or m < first[g]):
                    first[g] = m
            cache[key] = list(first.values())
        else:
            cache[key] = [m for m in row if m != node]
    return cache[key]


def parallelism(schedule: Schedule) -> list[str]:
    """Groups of tasks that run at the same time (what a step-by-step placement can miss)."""
    slots = schedule.slots
    out: list[str] = []
    names = sorted(slots, key=lambda n: (slots[n].start, n))
    used: set[str] = set()
    for a in names:
        if a in used:
            continue
        group = []
        for b in names:  # by start: past a's end no later task overlaps it
            if slots[b].start >= slots[a].end:
                break
            if b not in used and slots[a].start < slots[b].end:
                group.append(b)
        if len(group) > 1:
            used.update(group)
            nodes = sorted({slots[g].node for g in group})
            out.append(f"{', '.join(group)} run side by side on {', '.join(nodes)}")
    return out
