"""Greedy topology best-fit, the way Kueue's topology-aware scheduling places a pod set.

Kept deliberately faithful to that baseline (it is what the benchmark compares CP-SAT against, and a
fallback when nothing better is found in time):

* required topology: only domains of that label that can hold the whole gang, the best fit first;
* the whole gang on one node if any node can hold it (no RDMA needed then), else RDMA nodes only;
* find the innermost tier with a single domain that holds the whole gang and take the best-fitting
  (smallest sufficient) one; if no single domain at any tier holds it, take outermost domains by
  free capacity, largest first, the last one best-fit;
* descend tier by tier distributing the count the same way, down to nodes (best fit again).

Gangs with several member shapes are placed largest shape first (first-fit decreasing) inside the
smallest domain whose free GPUs cover the gang; it is a fallback there, not an optimiser.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from app.gang.problem import Assignment, Candidate, Index, Shape, first_fit


def greedy(index: Index, allowed: set[int] | None = None) -> Assignment | None:
    """A feasible assignment, or None when the greedy finds none (not a proof of infeasibility)."""
    pool = [i for i in range(len(index.classes)) if allowed is None or i in allowed]
    if len(index.problem.shapes) == 1:
        return _single_shape(index, index.problem.shapes[0], pool)
    return _multi_shape(index, pool)


def _groups(index: Index, pool: list[int]) -> list[list[int]]:
    """Class groups that may host the gang: one per required domain, or one group."""
    if index.problem.required_key is None:
        return [pool]
    by_dom: dict[str, list[int]] = defaultdict(list)
    for i in pool:
        d = index.classes[i].first.required
        if d is not None:
            by_dom[d].append(i)
    fixed_domains = {n.required for n in index.fixed}
    if fixed_domains:
        if len(fixed_domains) > 1 or None in fixed_domains:
            return []
        return [by_dom.get(next(iter(fixed_domains)) or "", [])]
    return [by_dom[d] for d in sorted(by_dom)]


def _single_shape(index: Index, shape: Shape, pool: list[int]) -> Assignment | None:
    key, need = shape.key, shape.count
    options = []
    for group in _groups(index, pool):
        total = sum(index.classes[i].capacity(key) for i in group)
        if total >= need:
            options.append((total, index.classes[group[0]].first.required or "", group))
    options.sort(key=lambda o: (o[0], o[1]))
    for _, _, group in options:
        got = _place_in_group(index, group, shape)
        if got is not None:
            return {node: {key: cnt} for node, cnt in got.items() if cnt}
    return None


def _place_in_group(index: Index, group: list[int], shape: Shape) -> dict[str, int] | None:
    key, need = shape.key, shape.count
    classes = index.classes
    fixed = {n.name for n in index.fixed}
    # One node for the whole gang needs no RDMA; with members already bound, only their node can.
    single = [i for i in group if classes[i].caps[key] >= need
              and (not fixed or fixed == {classes[i].first.name})]
    if single:
        best = min(single, key=lambda i: (classes[i].caps[key], classes[i].first.free_gpus,
                                          classes[i].first.name))
        return {classes[best].first.name: need}
    if fixed and not all(n.rdma for n in index.fixed):
        return None
    rdma = [i for i in group if classes[i].first.rdma and classes[i].caps[key] > 0]
    if sum(classes[i].capacity(key) for i in rdma) < need:
        return None
    return _Tas(index, key, fixed).place(rdma, need)


class _Tas:
    """Kueue-style: innermost single fitting domain (best fit), else greedy over domains, descending."""

    def __init__(self, index: Index, shape: str, anchor: set[str]) -> None:
        self.index = index
        self.shape = shape
        self.depth = len(index.tiers) - 1  # non-node tiers, outer -> inner
        self.anchor = [tuple(t.domain_of[a] for t in index.tiers[:-1]) for a in anchor]

    def cap(self, members: Sequence[int]) -> int:
        return sum(self.index.classes[i].capacity(self.shape) for i in members)

    def domains(self, level: int, within: Sequence[int]) -> dict[str, list[int]]:
        out: dict[str, list[int]] = defaultdict(list)
        for i in within:
            out[self.index.classes[i].domains[level]].append(i)
        return out

    def anchored(self, level: int, d: str) -> bool:
        # Domains holding already-bound members first (a replan joins them; Kueue has no such case).
        return any(a[level] == d for a in self.anchor)

    def place(self, members: list[int], need: int) -> dict[str, int]:
        for level in range(self.depth - 1, -1, -1):
            fitting = [(d, m) for d, m in self.domains(level, members).items() if self.cap(m) >= need]
            if fitting:
                _, chosen = min(fitting, key=lambda dm: (not self.anchored(level, dm[0]),
                                                         self.cap(dm[1]), dm[0]))
                return self.spread(level + 1, chosen, need)
        return self.spread(0, members, need)

    def spread(self, level: int, members: Sequence[int], need: int) -> dict[str, int]:
        if level >= self.depth:
            return self.fill_nodes(members, need)
        doms = self.domains(level, members)
        fitting = [(d, m) for d, m in doms.items() if self.cap(m) >= need]
        if fitting:
            _, chosen = min(fitting, key=lambda dm: (self.cap(dm[1]), dm[0]))
            return self.spread(level + 1, chosen, need)
        out: dict[str, int] = {}
        left = need
        ranked = sorted(doms.items(), key=lambda dm: (-self.cap(dm[1]), dm[0]))
        while left > 0 and ranked:
            # The smallest domain that holds the remainder, else the largest one left.
            fits = [dm for dm in ranked if self.cap(dm[1]) >= left]
            pick = min(fits, key=lambda dm: (self.cap(dm[1]), dm[0])) if fits else ranked[0]
            ranked.remove(pick)
            take = min(left, self.cap(pick[1]))
            out.update(self.spread(level + 1, pick[1], take))
            left -= take
        return out

    def fill_nodes(self, members: Sequence[int], need: int) -> dict[str, int]:
        """Best fit at the node level: fullest sufficient node for the remainder, else largest first."""
        nodes = [(c.caps[self.shape], n.name) for c in (self.index.classes[i] for i in members)
                 for n in c.nodes if c.caps[self.shape] > 0]
        pool = sorted(nodes, key=lambda cn: (-cn[0], cn[1]))
        out: dict[str, int] = {}
        left = need
        while left > 0 and pool:
            fits = [cn for cn in pool if cn[0] >= left]
            pick = min(fits) if fits else pool[0]
            pool.remove(pick)
            take = min(left, pick[0])
            out[pick[1]] = take
            left -= take
        return out


def _multi_shape(index: Index, pool: list[int]) -> Assignment | None:
    """First-fit decreasing inside the best-fitting domain for the total GPUs (fallback only)."""
    shapes = sorted(index.problem.shapes, key=lambda s: (-s.gpus, -s.cpu_millis, -s.memory_bytes, s.key))
    need = index.problem.gpus
    fixed = {n.name for n in index.fixed}
    for group in _groups(index, pool):
        nodes = [n for i in group for n in index.classes[i].nodes]
        for n in sorted(nodes, key=lambda n: (n.free_gpus, n.name)):  # the whole gang on one node
            if fixed <= {n.name}:
                one = first_fit([n], shapes)
                if one is not None:
                    return one
        if not all(n.rdma for n in index.fixed):
            continue
        rdma = [n for n in nodes if n.rdma]
        for ti in range(len(index.tiers) - 1, -1, -1):  # node tier, then inner -> outer
            tier = index.tiers[ti]
            doms: dict[str, list[Candidate]] = defaultdict(list)
            for n in rdma:
                doms[tier.domain_of[n.name]].append(n)
            ranked = sorted(doms.items(), key=lambda dm: (sum(n.free_gpus for n in dm[1]), dm[0]))
            for _, members in ranked:
                names = {n.name for n in members}
                anchored = all(tier.domain_of[f] in {tier.domain_of[m] for m in names} for f in fixed)
                if anchored and sum(n.free_gpus for n in members) >= need:
                    got = first_fit(sorted(members, key=lambda n: (-n.free_gpus, n.name)), shapes)
                    if got is not None:
                        return got
        if fixed <= {n.name for n in rdma}:  # no single domain holds it: across domains, fullest first
            got = first_fit(sorted(rdma, key=lambda n: (-n.free_gpus, n.name)), shapes)
            if got is not None:
                return got
    return None
