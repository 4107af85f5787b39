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
    """The best plan found and bounds, in the CP-SAT model's objective units (no bound members)."""

    assignment: Assignment
    value: int  # objective of ``assignment``
    lower: int | None  # no plan can do better (None: unknown, e.g. preferred domain that never fits)
    exact: bool  # value == lower: optimal for the full objective


@dataclass(slots=True)
class _Node:
    """A domain (or the root) in the tree: children are domains or classes."""

    table: Table
    children: list[_Node | int]  # int: class index
    splits: list[npt.NDArray[np.int32]]  # splits[i][j]: members given to child i+1 of j so far


Cells = dict[tuple[str | None, str | None], list[int]]


def tree_dp(index: Index, allowed: set[int], w: Weights) -> DpResult | None:
    """Best plan of the separable relaxation and its bounds (one member shape only).

    Members already bound (a replan) are fixed: their nodes and domains are open whatever happens,
    so their costs are in every entry of their tables, not only in the entries that use them.
    """
    problem = index.problem
    if len(problem.shapes) != 1:
        return None
    shape = problem.shapes[0]
    pods = shape.count
    fixed = index.fixed
    pool = _pool(index, allowed)
    if pool is None:
        return None
    exact = w.exact and not (fixed and problem.preferred_key is not None)
    cells, pref_const, separable = _cells(index, pool, w)
    exact = exact and separable

    def solve(pool_cells: Cells) -> tuple[int, Assignment] | None:
        return _solve_cells(index, pool_cells, shape.key, pods, w)

    relaxed = solve(cells)
    if relaxed is None:
        return None

    fixed_models = {n.gpu_model for n in fixed if n.gpu_model}

    def models_of(a: Assignment) -> set[str]:
        return {index.by_name[n].gpu_model for n in a if index.by_name[n].gpu_model} | fixed_models

    # Mixing GPU models is the one term the tree cannot see: the relaxation bounds it from below,
    # and one DP per model gives the best single-model plans.
    used = len(models_of(relaxed[1]))
    value, assignment = relaxed[0] + pref_const + w.models * used, relaxed[1]
    least = max(min(used, 1), len(fixed_models))  # models any plan must use
    lower = relaxed[0] + pref_const + w.models * least
    if used > least and len(fixed_models) >= 2:
        exact = False  # bound members already mix models: the relaxation is all we know
    elif used > least:
        # Any plan that mixes uses one model more; the best single-model plans come from one DP
        # per model (the bound members' model, if any).
        lower = relaxed[0] + pref_const + w.models * (least + 1)
        models = sorted(fixed_models) or sorted({index.classes[i].first.gpu_model for i in pool})
        for model in models:
            only = {k: [i for i in v if index.classes[i].first.gpu_model == model
                        or index.classes[i].first.fixed] for k, v in cells.items()}
            got = solve(only)
            if got is None:
                continue
            lower = min(lower, got[0] + pref_const + w.models)
            if got[0] + pref_const + w.models < value:
                value, assignment = got[0] + pref_const + w.models, got[1]
    return DpResult(assignment, value, lower if exact else None, exact and value == lower)


def _pool(index: Index, allowed: set[int]) -> list[int] | None:
    """The node classes the one shape may use; None when bound members already rule out any plan."""
    problem, fixed, shape = index.problem, index.fixed, index.problem.shapes[0]
    pool = [i for i in sorted(allowed)
            if index.classes[i].caps[shape.key] > 0 or index.classes[i].first.fixed]
    if problem.required_key is not None:
        pool = [i for i in pool if index.classes[i].first.required is not None]
        pinned = {n.required for n in fixed}
        if len(pinned) > 1 or None in pinned:
            return None  # bound members in no (or several) required domains: nothing is feasible
        if pinned:
            pool = [i for i in pool if index.classes[i].first.required in pinned]
    if fixed and not all(n.rdma for n in fixed):
        # A bound member on a node without RDMA: the gang cannot span nodes; that node or nothing.
        if len(fixed) > 1:
            return None
        pool = [i for i in pool if index.classes[i].first.fixed]
    return pool


def _cells(index: Index, pool: list[int], w: Weights) -> tuple[Cells, int, bool]:
    """The pool cut into cells solved apart (required domain, and preferred domain when one can
    hold the gang), the constant the preference adds, and whether the cells keep the problem
    separable (False: the preferred count would need a non-separable term, relaxation only)."""
    problem, shape = index.problem, index.problem.shapes[0]
    cells: Cells = defaultdict(list)
    if problem.preferred_key is not None and not index.fixed:
        for i in pool:
            f = index.classes[i].first
            cells[(f.required, f.preferred or f"?{f.name}")].append(i)
        fitting = {k: v for k, v in cells.items() if _fits(index, v, shape.key, shape.count)}
        if fitting:
            return defaultdict(list, fitting), w.preferred, True  # one preferred domain, whatever the cell
        cells = defaultdict(list)
        for i in pool:
            cells[(index.classes[i].first.required, None)].append(i)
        return cells, 0, False
    for i in pool:
        cells[(index.classes[i].first.required, None)].append(i)
    return cells, 0, True


def _solve_cells(index: Index, pool_cells: Cells, shape_key: str, pods: int,
                 w: Weights) -> tuple[int, Assignment] | None:
    """Best plan over the cells: each cell split at the innermost tier holding the whole gang,
    pieces solved in order of a lower bound until no piece left can beat the best found."""
    pieces = []
    for key in sorted(pool_cells, key=lambda k: (k[0] or "", k[1] or "")):
        if pool_cells[key]:
            cell = pool_cells[key]
            pieces += _split(index, cell, shape_key, pods, w) if not index.fixed else [(0, cell)]
    pieces.sort(key=lambda lp: lp[0])
    best: tuple[int, Assignment] | None = None
    for lb, members in pieces:
        if best is not None and lb >= best[0]:
            break  # bounds only grow from here: nothing left can be better
        got = _solve_cell(index, members, shape_key, pods, w)
        if got is not None and (best is None or got[0] < best[0]):
            best = got
    return best


def _kcover(caps: list[int], need: int) -> int:
    """Fewest of these capacities that add up to ``need`` (largest first); len+1 if impossible."""
    total = 0
    for k, c in enumerate(sorted(caps, reverse=True)):
        total += c
        if total >= need:
            return k + 1
    return len(caps) + 1


def _split(
    index: Index, members: list[int], shape: str, pods: int, w: Weights
) -> list[tuple[int, list[int]]]:
    """Pieces of a cell that can hold the whole gang on their own, each with a lower bound.

    The pieces are the domains of the innermost tier where one domain holds the gang (the optimum
    lies inside one of them, see ``problem.prune``). The bound counts the outer domains exactly and
    the inner ones by knapsack cover (fewest children whose capacity covers the gang); it ignores
    the bottom terms, so it never exceeds the piece's true optimum.
    """
    classes = index.classes
    depth = len(index.tiers) - 1
    level = None
    groups: dict[str, list[int]] = {}
    for ti in range(depth - 1, -1, -1):
        by: dict[str, list[int]] = defaultdict(list)
        for i in members:
            by[classes[i].domains[ti]].append(i)
        fitting = {d: v for d, v in by.items() if _fits(index, v, shape, pods)}
        if fitting:
            level, groups = ti, fitting
            break
    if level is None:
        return [(0, members)]
    out = []
    for idx in groups.values():
        first = classes[idx[0]]
        lb = 0
        for ti in range(level + 1):  # one domain at this tier and every outer one: exact
            lb += w.tiers[ti] + index.domain_bottom(index.tiers[ti], first.domains[ti])
        for ti in range(level + 1, depth):
            caps: dict[str, int] = defaultdict(int)
            for i in idx:
                caps[classes[i].domains[ti]] += classes[i].capacity(shape)
            lb += w.tiers[ti] * _kcover(list(caps.values()), pods)
        node_caps = [classes[i].caps[shape] for i in idx for _ in range(min(classes[i].k, pods))]
        lb += w.tiers[-1] * _kcover(node_caps, pods)
        out.append((lb, idx))
    return out


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
    fixed = bool(index.fixed)
    # The whole gang on one node needs no RDMA (with bound members, only their node could be it:
    # the tree below covers that case).
    for i in members if not fixed else []:
        c = classes[i]
        if c.caps[shape] >= pods:
            cost = _open_cost(index, c, w) + pods * gpus * index.type_cost(c.first)
            if best is None or cost < best[0]:
                best = (cost, {c.first.name: {shape: pods}})
    rdma = [i for i in members if classes[i].first.rdma or (fixed and classes[i].first.fixed)]
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

    fixed_domains = [{t.domain_of[n.name] for n in index.fixed} for t in index.tiers[:-1]]

    def leaf(i: int) -> Table:
        c = classes[i]
        m = c.caps[shape]
        n = min(pods, m * c.k)
        j = np.arange(n + 1, dtype=np.int64)
        per_member = j * (gpus * index.type_cost(c.first))
        node_cost = w.tiers[-1] + index.node_bottom(c.first)
        if c.first.fixed:
            return per_member + node_cost  # a bound member's node is used whatever we add to it
        opened = -(-j // m)  # ceil(j / m): fill nodes before opening another
        return opened * node_cost + per_member

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
        opening = w.tiers[level] + index.domain_bottom(index.tiers[level], d)
        if d in fixed_domains[level]:
            table += opening  # holds bound members: open in every plan
        else:
            table[1:] += opening
        np.minimum(table, INF, out=table)  # keep "impossible" from creeping towards overflow
        return _Node(table, [sub], [])

    return node(0, members)


def _minplus(a: Table, b: Table, limit: int) -> tuple[Table, npt.NDArray[np.int32]]:
    """c[k] = min_j a[k-j] + b[j] for k < limit, and the j chosen for every k (ties: smallest j).

    One vectorised pass: row k of a strided view over ``a`` (padded with INF) holds a[k-j] for
    every j, so the whole convolution is an (n x len(b)) add and a row-wise argmin.
    """
    n = min(len(a) + len(b) - 1, limit)
    m = min(len(b), n)
    if m == 1:
        out = np.full(n, INF, dtype=np.int64)
        k = min(len(a), n)
        out[:k] = np.minimum(a[:k] + b[0], INF)
        return out, np.zeros(n, dtype=np.int32)
    padded = np.full(n + m - 1, INF, dtype=np.int64)
    k = min(len(a), n)
    padded[m - 1:m - 1 + k] = a[:k]
    step = padded.strides[0]
    window = np.lib.stride_tricks.as_strided(padded[m - 1:], shape=(n, m), strides=(step, -step),
                                             writeable=False)
    total = window + b[:m]
    arg = total.argmin(axis=1)
    out = np.minimum(total[np.arange(n), arg], INF)
    return out, arg.astype(np.int32)


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
