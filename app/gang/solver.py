"""Plan a whole gang with OR-Tools CP-SAT (pure: no Kubernetes, no HTTP).

The model stays small whatever the cluster size:

* members with identical resources are one *shape* with a count, not one variable per pod;
* nodes that no constraint or objective term can tell apart (same qualified domain path, free GPUs,
  GPU model, RDMA, per-shape capacity, required/preferred domain) are one *class*: the variables
  are "members of shape s in class c" and "nodes used in class c" (:class:`app.gang.problem.Index`);
* :func:`app.gang.problem.prune` first drops classes no optimal plan can use;
* knapsack-cover cuts make the LP bound on "domains used" tight at every tier.

Two paths, one answer:

* the tree DP (:mod:`app.gang.dp`) solves the relaxation without the non-separable terms exactly
  and bounds the full objective from below. When its plan meets that bound (one member shape, no
  bound members, one GPU model, a preferred domain that fits: the common case) the plan is optimal
  and CP-SAT only cross-checks it against the model (every variable fixed, objective >= bound);
* otherwise CP-SAT searches the full model within the time limit, warm-started from the better of
  the DP plan and the greedy plan, with the DP bound as a constraint, and reports its status and gap.

The better of CP-SAT's plan and the warm start (by :func:`assess`) is returned, so the result is
never worse than the greedy baseline, even when CP-SAT runs out of time.

The objective is lexicographic (see ``problem``), encoded as one weighted sum whose weights come
from per-instance bounds (:func:`app.gang.problem.weights`), so a better higher term always wins.
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from ortools.sat.python import cp_model

from app.gang.dp import tree_dp
from app.gang.greedy import greedy
from app.gang.problem import (
    Assessment,
    Assignment,
    Candidate,
    Index,
    NodeClass,
    Problem,
    Shape,
    Weights,
    assess,
    first_fit,
    prune,
    weights,
)

MIB = 1024 * 1024

STATUS = {
    cp_model.OPTIMAL: "optimal",
    cp_model.FEASIBLE: "feasible",
    cp_model.INFEASIBLE: "infeasible",
    cp_model.MODEL_INVALID: "invalid",
    cp_model.UNKNOWN: "unknown",
}


@dataclass(slots=True)
class PlanResult:
    """What the planner produced. ``assignment`` is None when no plan was found."""

    assignment: Assignment | None
    status: str  # optimal | feasible | greedy | infeasible | unknown
    method: str  # cp-sat | dp | greedy | none: where the returned plan came from
    seconds: float
    objective: float = 0.0
    bound: float = 0.0
    assessment: Assessment | None = None
    greedy_assessment: Assessment | None = None
    classes: int = 0
    candidates: int = 0
    stats: dict[str, float] = field(default_factory=dict)

    @property
    def gap(self) -> float:
        """Relative optimality gap of the returned plan (0 when proven optimal)."""
        if self.status == "optimal":
            return 0.0
        if self.assignment is None:
            return math.inf
        if self.objective <= 0:
            return 0.0
        return max(0.0, (self.objective - self.bound) / abs(self.objective))


def plan(
    problem: Problem,
    time_limit: float = 0.5,
    workers: int = 2,
    use_cp_sat: bool = True,
    use_dp: bool = True,
    prefer: set[str] | None = None,
    index: Index | None = None,
) -> PlanResult:
    """Plan ``problem`` (see module docstring).

    ``use_cp_sat=False`` returns the greedy baseline alone; ``use_dp=False`` makes CP-SAT search
    from the greedy warm start with no DP (benchmark comparisons). ``prefer``: nodes to favour
    among identical ones when decoding, so a replan keeps members where they were when it can.
    """
    t0 = time.perf_counter()
    deadline = t0 + time_limit
    index = index or Index(problem)
    everything = set(range(len(index.classes)))
    w = weights(index, everything)
    allowed = prune(index, w.exact)
    stats: dict[str, float] = {"index": time.perf_counter() - t0}
    base = greedy(index, everything)
    base_assessment = assess(index, base) if base is not None else None
    if base_assessment is not None and not base_assessment.feasible:
        base, base_assessment = None, None  # a greedy bug must never become a plan
    result = PlanResult(None, "infeasible", "none", 0.0, greedy_assessment=base_assessment,
                        classes=len(allowed), candidates=sum(index.classes[i].k for i in allowed))
    if not use_cp_sat:
        result.assignment, result.assessment = base, base_assessment
        result.status, result.method = ("greedy", "greedy") if base else ("infeasible", "none")
        return _done(result, t0, stats)

    # Warm start: the exact DP of the separable relaxation when it applies, else the greedy.
    t1 = time.perf_counter()
    dp = tree_dp(index, allowed, w) if use_dp else None
    stats["dp"] = time.perf_counter() - t1
    start, start_method, start_assessment = base, "greedy", base_assessment
    candidates: list[tuple[Assignment, str]] = []
    if dp is not None:
        candidates.append((dp.assignment, "dp"))
    elif use_dp and len(problem.shapes) > 1 and not index.fixed:
        slots = _uniform_hint(problem)
        if slots is not None:
            candidates.append((slots, "greedy"))
    for plan_, method in candidates:
        got = assess(index, plan_)
        if got.feasible and (start_assessment is None or got.key <= start_assessment.key):
            start, start_method, start_assessment = plan_, method, got

    if dp is not None and dp.exact and start_method == "dp" and start is not None:
        # The DP plan is optimal (its value meets the DP's lower bound). CP-SAT cross-checks it:
        # the model restricted to the classes the plan uses, every variable fixed to the plan and
        # the objective bounded below by that bound. It must come back OPTIMAL; anything else
        # means the DP and the model disagree, and CP-SAT searches the full model instead.
        used = {i for i in allowed if any(n.name in start for n in index.classes[i].nodes)}
        check_until = max(deadline, time.perf_counter() + 0.25)
        got_fixed = _solve(index, used, w, start, dp.lower, workers, check_until, prefer, stats, fix=True)
        if got_fixed.status == "optimal":
            return _done(_take(result, index, got_fixed, start, start_assessment, start_method), t0, stats)
        stats["certify_failed"] = 1.0  # never expected: search rather than trust the DP
    lower = dp.lower if dp is not None else None
    if lower is None and use_dp and len(problem.shapes) > 1 and not index.fixed:
        lower = _dominant_bound(problem, w)
    outcome = _solve(index, allowed, w, start, lower, workers, deadline, prefer, stats, fix=False)
    return _done(_take(result, index, outcome, start, start_assessment, start_method), t0, stats)


def _uniform_hint(problem: Problem) -> Assignment | None:
    """A warm start for several member shapes: the exact plan of a gang whose members all take the
    largest of each resource (every slot then fits any real member), members packed into its slots
    largest first. Topologically as compact as the real optimum can be, often its equal."""
    shapes = problem.shapes
    big = Shape("slot", problem.pods, max(s.gpus for s in shapes), max(s.cpu_millis for s in shapes),
                max(s.memory_bytes for s in shapes))
    nodes = tuple(
        replace(n, shapes=frozenset() if n.shapes is not None and not all(s.key in n.shapes for s in shapes)
                else None)
        for n in problem.nodes
    )
    uniform = replace(problem, shapes=(big,), nodes=nodes)
    index = Index(uniform)
    w = weights(index)
    got = tree_dp(index, prune(index, w.exact), w)
    if got is None:
        return None
    out: Assignment = {}
    members = [s.key for s in sorted(shapes, key=lambda s: (-s.gpus, s.key)) for _ in range(s.count)]
    for node in sorted(got.assignment):
        for _ in range(got.assignment[node]["slot"]):
            key = members.pop()
            out.setdefault(node, {})[key] = out.get(node, {}).get(key, 0) + 1
    return out


def _dominant_bound(problem: Problem, w: Weights) -> int | None:
    """A lower bound for several shapes: the optimum of the gang without its smaller members.

    Every objective term only grows when members are added, so placing the dominant shape alone
    can never cost more than placing everyone; the DP gives that optimum exactly, in the full
    problem's units (same nodes, so the same tiers, and the full problem's weights).
    """
    dominant = max(problem.shapes, key=lambda s: (s.count * s.gpus, s.count, s.key))
    sub = Index(replace(problem, shapes=(dominant,)))
    got = tree_dp(sub, prune(sub, w.exact), w)
    return got.lower if got is not None else None


@dataclass(slots=True)
class _Outcome:
    status: str
    assignment: Assignment | None = None
    objective: float = 0.0
    bound: float = 0.0
    start_objective: float | None = None
    lower: float | None = None


def _solve(
    index: Index, allowed: set[int], w: Weights, start: Assignment | None, lower: int | None,
    workers: int, deadline: float, prefer: set[str] | None, stats: dict[str, float], *, fix: bool,
) -> _Outcome:
    t = time.perf_counter()
    model = _Model(index, allowed, w, cuts=not fix)
    out = _Outcome("unknown")
    if start is not None and not model.covers(start):
        start = greedy(index, allowed)  # the baseline left the pruned set: a hint inside it
    if start is not None:
        out.start_objective = objective_of(model, hint(model, start))
    elif fix:
        return out
    if lower is not None:
        # A valid lower bound (an exact relaxation, see the callers) tightens CP-SAT's own.
        out.lower = lower
        model.bound_below(lower)
    stats["certify_model" if fix else "model"] = time.perf_counter() - t
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = max(0.005, deadline - time.perf_counter())
    solver.parameters.num_workers = 1 if fix else workers
    solver.parameters.fix_variables_to_their_hinted_value = fix
    code = solver.solve(model.m)
    stats["certify_solve" if fix else "solve"] = solver.wall_time
    stats["branches"] = float(solver.num_branches)
    out.status = STATUS.get(code, "unknown")
    if code in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        out.assignment = decode(model, solver, prefer or set())
        out.objective = solver.objective_value + model.constant
        out.bound = solver.best_objective_bound + model.constant
        if out.assignment is None:
            out.status = "unknown"  # the relaxed packing did not decode; the warm start stands
    if out.lower is not None:
        out.bound = max(out.bound, out.lower)
    return out


def _take(
    result: PlanResult, index: Index, outcome: _Outcome, start: Assignment | None,
    start_assessment: Assessment | None, start_method: str,
) -> PlanResult:
    """Keep CP-SAT's plan unless the warm start is at least as good (by :func:`assess`)."""
    result.status = outcome.status
    got = assess(index, outcome.assignment) if outcome.assignment is not None else None
    if got is not None and got.feasible and (start_assessment is None or got.key <= start_assessment.key):
        result.assignment, result.assessment = outcome.assignment, got
        result.method = "cp-sat" if start_method != "dp" or got.key < start_assessment.key else "dp"  # type: ignore[union-attr]
        result.objective, result.bound = outcome.objective, outcome.bound
    elif start is not None:
        # CP-SAT found nothing better in time: the warm start is still a valid plan.
        result.assignment, result.assessment, result.method = start, start_assessment, start_method
        result.objective = outcome.start_objective or 0.0
        result.bound = outcome.lower if outcome.lower is not None else outcome.bound
        if outcome.status != "optimal":
            result.status = "greedy" if start_method == "greedy" else "feasible"
    return result


def _done(result: PlanResult, t0: float, stats: dict[str, float]) -> PlanResult:
    result.stats = stats
    result.seconds = time.perf_counter() - t0
    return result


class _Model:
    """The CP-SAT model over node classes (see module docstring)."""

    def __init__(self, index: Index, allowed: set[int], w: Weights, cuts: bool = True) -> None:
        self.index = index
        self.cuts = cuts
        self.problem = index.problem
        self.w = w
        self.ids = sorted(allowed)  # class indices in the model
        self.m = cp_model.CpModel()
        self.x: dict[tuple[str, int], cp_model.IntVar] = {}
        self.u: dict[int, cp_model.IntVar] = {}
        self.y: dict[tuple[int, str], cp_model.IntVar] = {}
        self.r: dict[str, cp_model.IntVar] = {}
        self.p: dict[str, cp_model.IntVar] = {}
        self.models: dict[str, cp_model.IntVar] = {}
        self.z: cp_model.IntVar | None = None
        self.obj_vars: list[cp_model.IntVar] = []
        self.obj_coefs: list[int] = []
        self.constant = 0  # objective terms fixed by bound members
        self.class_of = {n.name: i for i in self.ids for n in index.classes[i].nodes}
        self._build()

    def covers(self, assignment: Assignment) -> bool:
        return all(n in self.class_of for n in assignment)

    def _obj(self, var: cp_model.IntVar, coef: int) -> None:
        if coef:
            self.obj_vars.append(var)
            self.obj_coefs.append(coef)

    # --- model ----------------------------------------------------------------------------------
    def _build(self) -> None:
        """The model, in the order its variables and constraints were always added (CP-SAT's search
        depends on that order, so the split into steps keeps it)."""
        self._placement_vars()
        self._node_capacity()
        # Node tier: nodes used (bound members' nodes are a constant).
        index, w, fixed = self.index, self.w, self.index.fixed
        for i, u in self.u.items():
            self._obj(u, w.tiers[-1] + index.node_bottom(index.classes[i].first))
        self.constant += len(fixed) * w.tiers[-1] + sum(index.node_bottom(n) for n in fixed)
        n_max = min(self.problem.pods, sum(index.classes[i].k for i in self.u)) + len(fixed)
        self._domain_tiers()
        if self.cuts and not fixed and len(self.problem.shapes) == 1:
            self._cover_cuts()  # (in GPU units they cost several shapes more search than they save)
        # Per member: GPU type (preference rank, then price).
        for (key, i), var in self.x.items():
            self._obj(var, index.shapes[key].gpus * index.type_cost(index.classes[i].first))
        if self.problem.required_key is not None:
            self._required()
        self._rdma(n_max)
        self._gpu_models()
        if self.problem.preferred_key is not None:
            self._preferred()
        self.m.minimize(_wsum(self.obj_vars, self.obj_coefs))

    def _placement_vars(self) -> None:
        """x[shape, class]: members of a shape on a class of identical nodes; u[class]: its nodes used."""
        m, classes, shapes = self.m, self.index.classes, self.problem.shapes
        for i in self.ids:
            c = classes[i]
            for s in shapes:
                cap = c.caps[s.key]
                if cap > 0:
                    self.x[(s.key, i)] = m.new_int_var(0, min(s.count, cap * c.k), f"x_{s.key}_{i}")
            if not c.first.fixed:
                self.u[i] = m.new_int_var(0, c.k, f"u{i}")
        for s in shapes:
            m.add(_sum([self.x[(s.key, i)] for i in self.ids if (s.key, i) in self.x]) == s.count)

    def _node_capacity(self) -> None:
        m, classes, shapes = self.m, self.index.classes, self.problem.shapes
        multi = len(shapes) > 1
        for i in self.ids:
            c = classes[i]
            xs = [(s, self.x[(s.key, i)]) for s in shapes if (s.key, i) in self.x]
            if i in self.u:
                u = self.u[i]
                if not xs:
                    m.add(u == 0)
                    continue
                # A used node holds at least one member; members only go on used nodes.
                m.add(u <= _sum([v for _, v in xs]))
                for s, v in xs:
                    m.add(v <= c.caps[s.key] * u)
            if xs and (multi or c.first.fixed):
                # Several shapes (or bound members) share nodes: every resource, all shapes together,
                # per used node of the class (aggregated over identical nodes; decode packs exactly).
                n = c.first
                vs = [v for _, v in xs]
                per_node = self.u.get(i)
                dims = [([s.gpus for s, _ in xs], max(n.free_gpus, 0))]
                if not math.isinf(n.free_cpu):
                    dims.append(([math.ceil(s.cpu_millis) for s, _ in xs], int(n.free_cpu)))
                if not math.isinf(n.free_memory):
                    dims.append(([math.ceil(s.memory_bytes / MIB) for s, _ in xs], int(n.free_memory // MIB)))
                for coefs, cap in dims:
                    if per_node is not None:
                        m.add(_wsum([*vs, per_node], [*coefs, -cap]) <= 0)
                    else:
                        m.add(_wsum(vs, coefs) <= cap)

    def _domain_tiers(self) -> None:
        """Domains per tier: y = 1 iff a node of the domain is used."""
        m, index, w, classes = self.m, self.index, self.w, self.index.classes
        for ti, tier in enumerate(index.tiers[:-1]):
            members: dict[str, list[int]] = defaultdict(list)
            for i in self.ids:
                members[classes[i].domains[ti]].append(i)
            fixed_doms = {tier.domain_of[n.name] for n in index.fixed}
            for d in fixed_doms:
                self.constant += w.tiers[ti] + index.domain_bottom(tier, d)
            for d, idx in sorted(members.items()):
                us = [i for i in idx if i in self.u]
                if d in fixed_doms or not us:
                    continue
                y = self.y[(ti, d)] = m.new_bool_var(f"y{ti}_{d}")
                for i in us:
                    m.add(self.u[i] <= classes[i].k * y)
                m.add(y <= _sum([self.u[i] for i in us]))
                self._obj(y, w.tiers[ti] + index.domain_bottom(tier, d))

    def _rdma(self, n_max: int) -> None:
        """RDMA whenever the gang spans more than one node."""
        m, classes = self.m, self.index.classes
        non_rdma = [i for i in self.ids if not classes[i].first.rdma]
        if not non_rdma:
            return
        z = self.z = m.new_bool_var("any_non_rdma")
        for i in non_rdma:
            if i in self.u:
                m.add(self.u[i] <= classes[i].k * z)
            else:
                m.add(z == 1)
        used_nodes = _sum(list(self.u.values())) + len(self.index.fixed)
        m.add(used_nodes <= 1 + max(n_max, 1) * (1 - z))

    def _gpu_models(self) -> None:
        """GPU models used (a lockstep gang runs at the speed of its slowest model)."""
        m, classes, w = self.m, self.index.classes, self.w
        fixed_models = {n.gpu_model for n in self.index.fixed if n.gpu_model}
        self.constant += w.models * len(fixed_models)
        for gm in sorted({classes[i].first.gpu_model for i in self.u if classes[i].first.gpu_model}):
            if gm in fixed_models:
                continue
            b = self.models[gm] = m.new_bool_var(f"m_{gm}")
            for i in self.u:
                if classes[i].first.gpu_model == gm:
                    m.add(self.u[i] <= classes[i].k * b)
            self._obj(b, w.models)

    def _cover_cuts(self) -> None:
        """Knapsack-cover cuts: a domain holding ``x`` members uses at least as many children as the
        largest children would need. With child capacities c1 >= c2 >= ... and T_k = c1+..+ck,
        ``n >= k + (x - T_k) / c_{k+1}`` holds for every k (T is concave). These are the facets of
        "children used vs members held", so the LP bound on domains used is tight at every tier
        instead of members / largest capacity. One shape counts members; several count GPUs.
        """
        m, classes, depth = self.m, self.index.classes, len(self.index.tiers) - 1
        need, unit, node_cap = _cover_units(self.problem)
        if need <= 0 or not unit:
            return

        def held_by(idx: list[int]) -> tuple[list[cp_model.IntVar], list[int]]:
            pairs = [(self.x[(k, i)], w) for i in idx for k, w in unit.items() if (k, i) in self.x]
            return [v for v, _ in pairs], [w for _, w in pairs]

        def cap_of(idx: list[int]) -> int:
            return min(need, sum(node_cap(classes[i]) * classes[i].k for i in idx))

        def cuts(count: list[cp_model.IntVar], held: Held, caps: list[int]) -> None:
            _cover_cut(m, count, held, caps, need)

        def walk(level: int, idx: list[int], held: Held) -> None:
            if level == depth:
                cuts([self.u[i] for i in idx if i in self.u], held,
                     [node_cap(classes[i]) for i in idx if i in self.u
                      for _ in range(min(classes[i].k, need))])
                return
            kids: dict[str, list[int]] = defaultdict(list)
            for i in idx:
                kids[classes[i].domains[level]].append(i)
            ys = [self.y[(level, d)] for d in sorted(kids) if (level, d) in self.y]
            cuts(ys, held, [cap_of(k) for k in kids.values()])
            for k in kids.values():
                walk(level + 1, k, held_by(k))

        walk(0, [i for i in self.ids if any((k, i) in self.x for k in unit)], need)

    def _required(self) -> None:
        """The whole gang in one domain of the required label."""
        m, classes, shapes = self.m, self.index.classes, self.problem.shapes
        doms: set[str] = {req for i in self.ids if (req := classes[i].first.required) is not None}
        for d in sorted(doms):
            self.r[d] = m.new_bool_var(f"r_{d}")
        if self.r:
            m.add_exactly_one(list(self.r.values()))
        for i in self.ids:
            first = classes[i].first
            xs = [self.x[(s.key, i)] for s in shapes if (s.key, i) in self.x]
            if first.required is None:
                for v in xs:
                    m.add(v == 0)
                if first.fixed:
                    m.add_bool_or([])  # a bound member outside every required domain: infeasible
                continue
            r = self.r[first.required]
            if i in self.u:
                m.add(self.u[i] <= classes[i].k * r)
            if first.fixed:
                m.add(r == 1)
            for v in xs:
                m.add(v <= self.problem.pods * r)

    def _preferred(self) -> None:
        """Domains of the preferred label used (an unlabelled node counts as a domain of its own)."""
        m, classes, w = self.m, self.index.classes, self.w
        pref_members: dict[str, list[int]] = defaultdict(list)
        for i in self.ids:
            first = classes[i].first
            if first.preferred is None:
                if i in self.u:
                    self._obj(self.u[i], w.preferred)
            else:
                pref_members[first.preferred].append(i)
        fixed = self.index.fixed
        fixed_pref = {n.preferred for n in fixed if n.preferred is not None}
        self.constant += w.preferred * (len(fixed_pref) + sum(1 for n in fixed if n.preferred is None))
        for d, idx in sorted(pref_members.items()):
            us = [i for i in idx if i in self.u]
            if d in fixed_pref or not us:
                continue
            pv = self.p[d] = m.new_bool_var(f"p_{d}")
            for i in us:
                m.add(self.u[i] <= classes[i].k * pv)
            self._obj(pv, w.preferred)

    def bound_below(self, lower: int) -> None:
        self.m.add(_wsum(self.obj_vars, self.obj_coefs) >= lower - self.constant)


# --- between plans and model variables (the warm start in, the solution out) ----------------------
def hint_values(model: _Model, assignment: Assignment) -> dict[cp_model.IntVar, int]:
    """Every model variable's value for ``assignment`` (which must use model classes only)."""
    index = model.index
    values: dict[cp_model.IntVar, int] = {}
    xs: dict[tuple[str, int], int] = defaultdict(int)
    us: dict[int, int] = defaultdict(int)
    used: list[Candidate] = list(index.fixed)
    for node, per_shape in assignment.items():
        i = model.class_of[node]
        for key, cnt in per_shape.items():
            xs[(key, i)] += cnt
        if sum(per_shape.values()) and i in model.u:
            us[i] += 1
            used.append(index.by_name[node])
    for xkey, var in model.x.items():
        values[var] = xs.get(xkey, 0)
    for i, var in model.u.items():
        values[var] = us.get(i, 0)
    used_doms = {(ti, t.domain_of[n.name]) for ti, t in enumerate(index.tiers[:-1]) for n in used}
    for ykey, var in model.y.items():
        values[var] = int(ykey in used_doms)
    for d, var in model.r.items():
        values[var] = int(any(n.required == d for n in used))
    for d, var in model.p.items():
        values[var] = int(any(n.preferred == d for n in used))
    for gm, var in model.models.items():
        values[var] = int(any(n.gpu_model == gm for n in used))
    if model.z is not None:
        values[model.z] = int(any(not n.rdma for n in used))
    return values

def hint(model: _Model, assignment: Assignment) -> dict[cp_model.IntVar, int]:
    values = hint_values(model, assignment)
    for var, value in values.items():
        model.m.add_hint(var, value)
    return values

def objective_of(model: _Model, values: dict[cp_model.IntVar, int]) -> int:
    return model.constant + sum(c * values.get(v, 0) for v, c in zip(model.obj_vars, model.obj_coefs,
                                                                      strict=True))

def decode(model: _Model, solver: cp_model.CpSolver, prefer: set[str]) -> Assignment | None:
    """Members per node. Identical nodes of a class are filled in order (nodes a previous plan
    used first, then by name); several shapes are packed first-fit decreasing. None when the
    aggregated class capacity could not be packed (the caller falls back to the warm start)."""
    out: Assignment = {}
    shapes = sorted(model.problem.shapes, key=lambda s: (-s.gpus, -s.cpu_millis, -s.memory_bytes, s.key))
    for i in model.ids:
        c = model.index.classes[i]
        wanted = {s.key: solver.value(model.x[(s.key, i)]) for s in shapes if (s.key, i) in model.x}
        if not any(wanted.values()):
            continue
        nodes = sorted(c.nodes, key=lambda n: (n.name not in prefer, n.name))
        if len(wanted) == 1:
            (key, cnt), = wanted.items()
            for n in nodes:
                if cnt <= 0:
                    break
                take = min(cnt, c.caps[key])
                out[n.name] = {key: take}
                cnt -= take
            continue
        packed = first_fit(nodes, shapes, wanted)
        if packed is None:
            return None
        out.update(packed)
    return out


def _sum(xs: list[cp_model.IntVar]) -> cp_model.LinearExprT:
    return cp_model.LinearExpr.Sum(xs) if xs else 0


def _wsum(xs: list[cp_model.IntVar], ws: list[int]) -> cp_model.LinearExprT:
    return cp_model.LinearExpr.WeightedSum(xs, ws) if xs else 0


# Members a domain holds: weighted variables (count, weights), or a constant at the top.
Held = tuple[list[cp_model.IntVar], list[int]] | int


def _cover_units(problem: Problem) -> tuple[int, dict[str, int], Callable[[NodeClass], int]]:
    """What the cover cuts count: members of the one shape, or GPUs when there are several; the
    total needed, each shape's weight and a node's capacity in that unit."""
    shapes = problem.shapes
    if len(shapes) == 1:
        key = shapes[0].key
        return shapes[0].count, {key: 1}, lambda c: c.caps[key]
    return (problem.gpus, {s.key: s.gpus for s in shapes if s.gpus},
            lambda c: max(c.first.free_gpus, 0) if any(c.caps.values()) else 0)


def _cover_cut(m: cp_model.CpModel, count: list[cp_model.IntVar], held: Held, caps: list[int],
               need: int) -> None:
    """``c * count - held >= c * k - T_k`` for each k, largest capacities first, until T_k covers."""
    total = 0
    for k, c in enumerate(sorted((c for c in caps if c > 0), reverse=True)):
        if total >= need:
            break
        if isinstance(held, int):
            m.add(_wsum(count, [c] * len(count)) >= c * k - total + held)
        else:
            m.add(_wsum(count + held[0], [c] * len(count) + [-w for w in held[1]]) >= c * k - total)
        total += c
