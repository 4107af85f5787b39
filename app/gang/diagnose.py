"""Words for users: which domains a plan uses, or the dominant reason a gang cannot be placed.

Filter reasons must be short and node-independent (kube-scheduler counts identical strings into its
"0/N nodes are available" line); the details (free GPUs per domain vs needed) go into pod events.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from app.base.reasons import ReasonCode
from app.gang.problem import Assignment, Candidate, Index, capacity

SHOW = 5  # domains listed in an event


@dataclass(frozen=True, slots=True)
class Diagnosis:
    short: str  # for FailedAndUnresolvableNodes (no node names, no per-domain numbers)
    detail: str  # for the pod event
    code: ReasonCode = ReasonCode.GANG  # the rejections metric's rule


def short_name(domain: str) -> str:
    return domain.rsplit("/", 1)[-1]


def describe(index: Index, assignment: Assignment) -> str:
    """'fabric tier 1 spine-1, fabric tier 0 leaf-2 (1 domain each), 8 nodes'."""
    used = [index.by_name[n] for n in assignment if sum(assignment[n].values())] + list(index.fixed)
    parts = []
    for tier in index.tiers[:-1]:
        doms = sorted({short_name(tier.domain_of[n.name]) for n in used})
        shown = ", ".join(doms[:SHOW]) + (f" +{len(doms) - SHOW} more" if len(doms) > SHOW else "")
        parts.append(f"{tier.name} {shown}" + (f" ({len(doms)} domains)" if len(doms) > 1 else ""))
    nodes = len({n.name for n in used})
    parts.append(f"{nodes} node" + ("s" if nodes != 1 else ""))
    return ", ".join(parts)


def why_not(index: Index, reserved_by_others: int = 0) -> Diagnosis:
    """The first hard rule, in order of how fundamental it is, that no placement can satisfy."""
    problem = index.problem
    nodes = [n for n in problem.nodes if n.shapes is None or n.shapes]
    what = " + ".join(f"{s.count} pods x {s.gpus} GPUs" for s in problem.shapes)
    need = problem.gpus
    held = (f"; {reserved_by_others} GPUs are reserved for other gangs planned earlier"
            if reserved_by_others else "")
    for s in problem.shapes:
        cap = sum(capacity(n, s) for n in nodes)
        if cap < s.count:
            return Diagnosis(
                f"gang needs {what}; eligible nodes have room for {cap} of {s.count} pods",
                f"gang needs {need} GPUs ({what}); eligible nodes have room for {cap} of those "
                f"{s.count} pods{held}; free GPUs {_by_domain(index, nodes)}",
            )
    single = any(all(capacity(n, s) >= s.count for s in problem.shapes) for n in nodes)
    rdma = [n for n in nodes if n.rdma]
    if not single:
        short_rdma = [s for s in problem.shapes if sum(capacity(n, s) for n in rdma) < s.count]
        if short_rdma:
            s = short_rdma[0]
            room = sum(capacity(n, s) for n in rdma)
            return Diagnosis(
                f"gang spans nodes and needs RDMA; RDMA nodes have room for {room} of {s.count} pods",
                f"gang needs {need} GPUs ({what}) across nodes, which requires RDMA; RDMA-capable "
                f"nodes have room for {room} of {s.count} pods{held}; free GPUs on RDMA nodes "
                f"{_by_domain(index, rdma)}",
            )
    key = problem.required_key
    if key is not None:
        by_dom: dict[str, list[Candidate]] = defaultdict(list)
        for n in nodes:
            if n.required is not None:
                by_dom[n.required].append(n)
        free = sorted(((sum(max(n.free_gpus, 0) for n in v if n.rdma or len(v) == 1), d)
                       for d, v in by_dom.items()), reverse=True)
        best = free[0][0] if free else 0
        listing = ", ".join(f"{d} {g}" for g, d in free[:SHOW]) or "none labelled"
        return Diagnosis(
            f"gang needs {need} GPUs in one {key} domain; at most {best} free in one",
            f"gang needs {need} GPUs ({what}) inside one {key} domain (topology-required-placement); "
            f"free GPUs by {key}: {listing}{held}",
            ReasonCode.TOPOLOGY,
        )
    return Diagnosis(
        "gang has no placement satisfying every rule (solver time limit?)",
        f"gang needs {need} GPUs ({what}); no placement found within the planning time limit; "
        f"free GPUs {_by_domain(index, nodes)}{held}",
    )


def _by_domain(index: Index, nodes: list[Candidate]) -> str:
    """'by fabric tier 0: leaf-1 24, leaf-3 16 (40 in total)' at the innermost fabric tier."""
    total = sum(max(n.free_gpus, 0) for n in nodes)
    if len(index.tiers) < 2:
        return f"{total} in total"
    tier = index.tiers[-2]
    per: dict[str, int] = defaultdict(int)
    for n in nodes:
        per[short_name(tier.domain_of[n.name])] += max(n.free_gpus, 0)
    ranked = sorted(per.items(), key=lambda kv: (-kv[1], kv[0]))
    shown = ", ".join(f"{d} {g}" for d, g in ranked[:SHOW] if g > 0) or "none"
    return f"by {tier.name}: {shown} ({total} in total)"
