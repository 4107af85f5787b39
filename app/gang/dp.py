"""Exact tree dynamic programme for the separable part of the gang objective (pure, numpy).

Topology tiers nest, and every term of the objective except "GPU models mixed" and a preferred label
that no single domain satisfies is a sum over the domains and nodes used. For one member shape and no
bound members, the optimum therefore decomposes over the domain tree: for every domain, the cheapest
way to host ``j`` members inside it (j = 0..pods) is a min-plus convolution of its children's
tables, plus the domain's opening cost if j > 0. One pass bottom-up, one traceback top-down.

The result is the exact optimum of that relaxation: the CP-SAT model takes it as its warm start and
as a lower bound on its objective (``exact`` when the relaxation lost nothing, e.g. one GPU model),
which is what lets it prove optimality within milliseconds on thousands of nodes.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from app.gang.problem import Assignment, Index, NodeClass, Weights

INF = np.int64(2**61)  # INF + INF still fits in int64
Table = npt.NDArray[np.int64]


@dataclass(slots=True)
class DpResult:
    assignment: Assignment
    value: int  # in the weighted-sum units of :func:`app.gang.problem.weights`, mixing excluded
    exact: bool  # True: also optimal for the full objective


@dataclass(slots=True)
class _Node:
    """A domain (or the root) in the tree: children are domains or classes."""

    table: Table
    children: list[_Node | int]  # int: class index
    splits: list[npt.NDArray[np.int32]]  # splits[i][j]: members given to child i+1 of j so far


def tree_dp(index: Index, allowed: set[int], w: Weights) -> DpResult | None:
    problem = index.problem
    if len(problem.shapes) != 1 or index.fixed:
        return None
    shape = problem.shapes[0]
    pods = shape.count
    pool = [i for i in sorted(allowed) if index.classes[i].caps[shape.key] > 0]
    if problem.required_key is not None:
        pool = [i for i in pool if index.classes[i].first.required is not None]
    exact = w.exact
    cells: dict[tuple[str | None, str | None], list[int]] = defaultdict(list)
    pref_const = 0
    if problem.preferred_key is not None:
        for i in pool:
            f = index.classes[i].first
            cells[(f.required, f.preferred or f"?{f.name}")].append(i)
        fitting = {k: v for k, v in cells.items() if _fits(index, v, shape.key, pods)}
        if fitting:
            cells = defaultdict(list, fitting)
            pref_const = w.preferred  # one preferred domain, whatever the cell
        else:
            exact = False  # the preferred count would need a non-separable term: relaxation only
            cells = defaultdict(list)
            for i in pool:
                cells[(index.classes[i].first.required, None)].append(i)
    else:
        for i in pool:
            cells[(index.classes[i].first.required, None)].append(i)
    best: tuple[int, Assignment] | None = None
    for key in sorted(cells, key=lambda k: (k[0] or "", k[1] or "")):
        got = _solve_cell(index, cells[key], shape.key, pods, w)
        if got is not None and (best is None or got[0] < best[0]):
            best = got
    if best is None:
        return None
    value, assignment = best
    models = {index.by_name[n].gpu_model for n in assignment if index.by_name[n].gpu_model}
    return DpResult(assignment, value + pref_const, exact and len(models) <= 1)


def _fits(index: Index, members: list[int], shape: str, pods: int) -> bool:
    rdma = sum(index.classes[i].capacity(shape) for i in members if index.classes[i].first.rdma)
    return rdma >= pods or max(index.classes[i].caps[shape] for i in members) >= pods


def _open_cost(index: Index, c: NodeClass, w: Weights) -> int:
    """Opening every domain above a node plus the node itself (a whole gang on one node)."""
    cost = w.tiers[-1] + index.node_bottom(c.first)
    for ti, tier in enumerate(index.tiers[:-1]):
        cost += w.tiers[ti] + index.domain_bottom(tier, c.domains[ti])
    return cost


def _solve_cell(
    index: Index, members: list[int], shape: str, pods: int, w: Weights
) -> tuple[int, Assignment] | None:
    classes = index.classes
    gpus = index.shapes[shape].gpus
    best: tuple[int, Assignment] | None = None
    # The whole gang on one node needs no RDMA.
    for i in members:
        c = classes[i]
        if c.caps[shape] >= pods:
            cost = _open_cost(index, c, w) + pods * gpus * index.type_cost(c.first)
            if best is None or cost < best[0]:
                best = (cost, {c.first.name: {shape: pods}})
    rdma = [i for i in members if classes[i].first.rdma]
    if sum(classes[i].capacity(shape) for i in rdma) < pods:
        return best
    root = _build(index, rdma, shape, pods, w)
    if len(root.table) > pods and root.table[pods] < INF:
        value = int(root.table[pods])
        if best is None or value < best[0]:
            per_class: dict[int, int] = defaultdict(int)
            _trace(root, pods, per_class)
            best = (value, _expand(index, per_class, shape))
    return best


def _build(index: Index, members: list[int], shape: str, pods: int, w: Weights) -> _Node:
    classes = index.classes
    depth = len(index.tiers) - 1
    gpus = index.shapes[shape].gpus

    def leaf(i: int) -> Table:
        c = classes[i]
        m = c.caps[shape]
        n = min(pods, m * c.k)
        j = np.arange(n + 1, dtype=np.int64)
        opened = -(-j // m)  # ceil(j / m): fill nodes before opening another
        return opened * (w.tiers[-1] + index.node_bottom(c.first)) + j * (gpus * index.type_cost(c.first))

    def node(level: int, idx: list[int]) -> _Node:
        if level == depth:
            children: list[_Node | int] = list(idx)
            tables = [leaf(i) for i in idx]
        else:
            groups: dict[str, list[int]] = defaultdict(list)
            for i in idx:
                groups[classes[i].domains[level]].append(i)
            kids = [_domain(level, d, groups[d]) for d in sorted(groups)]
            children = list(kids)
            tables = [k.table for k in kids]
        acc = tables[0]
        splits = []
        for t in tables[1:]:
            acc, split = _minplus(acc, t, pods + 1)
            splits.append(split)
        return _Node(acc, children, splits)

    def _domain(level: int, d: str, idx: list[int]) -> _Node:
        sub = node(level + 1, idx)
        table = sub.table.copy()
        table[1:] += w.tiers[level] + index.domain_bottom(index.tiers[level], d)
        np.minimum(table, INF, out=table)  # keep "impossible" from creeping towards overflow
        return _Node(table, [sub], [])

    return node(0, members)


def _minplus(a: Table, b: Table, limit: int) -> tuple[Table, npt.NDArray[np.int32]]:
    """c[k] = min_j a[k-j] + b[j] for k < limit, and the j chosen for every k (ties: smallest j).

    One vectorised pass: row k of a sliding window over ``a`` (padded with INF) holds a[k-j] for
    every j, so the whole convolution is an (n x len(b)) add and a row-wise argmin.
    """
    n = min(len(a) + len(b) - 1, limit)
    lb = min(len(b), n)
    pad = np.full(lb - 1, INF, dtype=np.int64)
    padded = np.concatenate([pad, a[:n], np.full(max(0, n - len(a)), INF, dtype=np.int64)])
    window = np.lib.stride_tricks.sliding_window_view(padded, lb)[:n, ::-1]
    total = window + b[:lb]
    arg = total.argmin(axis=1).astype(np.int32)
    out = np.minimum(total[np.arange(n), arg], INF)
    return out, arg


def _trace(n: _Node, j: int, per_class: dict[int, int]) -> None:
    amounts = [0] * len(n.children)
    for i in range(len(n.children) - 1, 0, -1):
        s = int(n.splits[i - 1][j])
        amounts[i] = s
        j -= s
    amounts[0] = j
    for child, amount in zip(n.children, amounts, strict=True):
        if amount <= 0:
            continue
        if isinstance(child, int):
            per_class[child] += amount
        else:
            _trace(child, amount, per_class)


def _expand(index: Index, per_class: dict[int, int], shape: str) -> Assignment:
    out: Assignment = {}
    for i, count in per_class.items():
        c = index.classes[i]
        m = c.caps[shape]
        for k in range(math.ceil(count / m)):
            out[c.nodes[k].name] = {shape: min(m, count - k * m)}
    return out
