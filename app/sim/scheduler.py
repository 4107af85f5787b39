"""A kube-scheduler stand-in for what-if studies: the demo, the benchmarks' simulator rows, the tests.

**What-if only.** Figures it produces are predictions, labelled "what-if (simulator)" wherever they are
printed; placement quality is established on the real kube-scheduler + extender (the integration
suite, and tests/integration/test_sim_vs_real.py checks this loop against it).

One scheduling cycle follows kube-scheduler v1.36 (``pkg/scheduler/schedule_one.go``):

1. Filter: NodeUnschedulable + NodeResourcesFit over the nodes in kube-scheduler's order (zones
   interleaved like its NodeTree), starting where the previous cycle stopped and stopping after
   ``numFeasibleNodesToFind`` (all of them at the chart's ``percentageOfNodesToScore: 100``).
2. The extender's filter (our ``Placer.filter``) over those nodes, if the extender is interested.
3. Score, exactly as kube-scheduler adds it: for each enabled score plugin, its 0-100 score x its
   weight (modelled: NodeResourcesFit and NodeResourcesBalancedAllocation, ``app.sim.baseline``;
   the rest are constant for the generated pods, ``app.sim.profile``), plus the extender's integer
   0-10 (``NodeScore.score``: the rank band our prioritize sends) x extender weight x 10. The float
   total our policy computes never reaches kube-scheduler and is not used here.
4. selectHost: among the nodes with the highest total, one uniformly at random (reservoir sampling
   over the nodes in order), from a seeded RNG so runs are reproducible. A single feasible node is
   taken without scoring, as kube-scheduler does.
5. Assume the pod on the node (the extender binds; no preemption, no retry inside a cycle).

Not modelled, because it cannot change the outcome here: opportunistic batching (1.35+, profiles
without extenders only) reuses the previous cycle's sorted nodes when an identical pod no longer fits
the node chosen last; the other nodes' scores are then unchanged, so the choice is the same up to the
random tie-break.

Which profile: by default the chart's shipped configuration (``app.sim.profile.shipped_profile``).
Without a placer the loop is plain kube-scheduler (``DefaultScheduler``: the default profile).
"""

from __future__ import annotations

import contextlib
import random
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from app.base.workload import WorkloadError, WorkloadSpec, parse_workload, pod_resources
from app.placement.feasibility import NodeFit
from app.placement.offer import num_feasible_nodes_to_find
from app.placement.placer import Placer
from app.placement.scoring import NodeScore
from app.sim.baseline import Req, balanced_score, fit_score, fits, node_requested
from app.sim.profile import EXTENDER_SCALE, SchedulerProfile, default_profile, shipped_profile
from app.snapshot.store import ClusterSnapshot, PlacedPod

WHAT_IF = "what-if (simulator)"
GPU_RESOURCES = ("nvidia.com/gpu", "amd.com/gpu")
# Pod fields that make a constant-assumed score plugin vary (app.sim.profile.CONSTANT_PLUGINS).
_UNMODELLED_FIELDS = ("affinity", "topologySpreadConstraints", "tolerations", "volumes")


@dataclass(slots=True)
class Placement:
    pod: str
    stage: str | None
    node: str | None
    reason: str = ""
    score: NodeScore | None = None
    precision: str | None = None
    ms_per_token: float | None = None
    runner_up: str | None = None
    terms: list[tuple[str, float]] = field(default_factory=list)
    points: int | None = None  # kube-scheduler's total for the chosen node
    tied: int = 0  # how many nodes shared that total (the random tie-break chose among them)
    # What the pod gets on the chosen node (sizing, measured or estimated figures), for the demo.
    fit: NodeFit | None = None
    spec: WorkloadSpec | None = None


@dataclass(slots=True)
class Candidate:
    """One node that passed every filter, with the points kube-scheduler would add up for it."""

    node: str
    in_tree: int  # sum of modelled in-tree plugin score x weight
    band: int | None = None  # the extender's 0..10, None without an extender
    points: int = 0  # in_tree + band x weight x 10
    score: NodeScore | None = None


@dataclass(slots=True)
class Cycle:
    """What one scheduling cycle saw, before the tie-break."""

    key: str
    stage: str | None
    spec: WorkloadSpec | None
    req: Req
    candidates: list[Candidate] = field(default_factory=list)  # in kube-scheduler's node order
    fits: Mapping[str, NodeFit] = field(default_factory=dict)
    reason: str = ""

    def best(self) -> list[Candidate]:
        if not self.candidates:
            return []
        top = max(c.points for c in self.candidates)
        return [c for c in self.candidates if c.points == top]


def in_tree_fits(snapshot: ClusterSnapshot, spec: WorkloadSpec, node: str) -> bool:
    """NodeResourcesFit's filter for a parsed spec (GPUs, CPU, memory, pod count)."""
    return fits(snapshot, Req(spec.gpus, int(spec.cpu_millis), int(spec.memory_bytes)), node)


def node_order(snapshot: ClusterSnapshot) -> list[str]:
    """kube-scheduler's NodeTree order: zones in order of first appearance, one node of each in turn."""
    zones: dict[str, list[str]] = {}
    for name, facts in snapshot.nodes.items():
        zones.setdefault(facts.zone, []).append(name)
    out: list[str] = []
    lists = list(zones.values())
    for i in range(max((len(v) for v in lists), default=0)):
        out.extend(v[i] for v in lists if i < len(v))
    return out


class SimScheduler:
    """kube-scheduler's cycle over a ClusterSnapshot, with our extender (``placer``) or without it.

    What-if only (see the module docstring). ``SimScheduler(placer)`` runs the chart's shipped
    profile; pass ``profile`` for another (``app.sim.profile``: default, MostAllocated, any file).
    """

    def __init__(
        self,
        placer: Placer | None = None,
        profile: SchedulerProfile | None = None,
        *,
        snapshot: ClusterSnapshot | None = None,
        seed: int = 0,
        gpu_resources: tuple[str, ...] | None = None,
    ) -> None:
        if profile is None:
            profile = shipped_profile() if placer is not None else default_profile()
        if placer is None and profile.has_extender:
            raise ValueError(f"profile {profile.label!r} calls an extender: pass the placer")
        if placer is not None and not profile.has_extender:
            raise ValueError(f"profile {profile.label!r} has no extender: the placer would not be called")
        snap = placer.snapshot if placer is not None else snapshot
        if snap is None:
            raise ValueError("pass a placer or a snapshot")
        self.placer = placer
        self.profile = profile
        self.snapshot: ClusterSnapshot = snap
        self.rng = random.Random(seed)
        if gpu_resources is None:
            gpu_resources = GPU_RESOURCES if placer is None else placer.policy.gpu_resources
        self.gpu_resources = gpu_resources
        self._next_start = 0
        self.unmodelled = 0  # pods with fields that make an assumed-constant plugin vary
        self.decisions = 0
        self.tied_decisions = 0  # decisions where more than one node shared the best total

    def admit(self, pods: list[dict[str, Any]]) -> None:
        """Make pods known the way the extender's watch would (gang membership needs every member)."""
        for pod in pods:
            with contextlib.suppress(WorkloadError):
                self.snapshot.track_spec(self._parse(pod))

    def _parse(self, pod: dict[str, Any]) -> WorkloadSpec:
        if self.placer is not None:
            return self.placer.parse(pod)
        return parse_workload(pod, self.gpu_resources)

    def _interested(self, pod: dict[str, Any]) -> bool:
        managed = self.profile.managed_resources
        return not managed or pod_resources(pod, managed)[0] > 0

    # --- one cycle ---------------------------------------------------------------------------
    def cycle(self, pod: dict[str, Any]) -> Cycle:
        """Filter and score like kube-scheduler (advances the filter's start index, assumes nothing)."""
        meta = pod.get("metadata") or {}
        key = f"{meta.get('namespace') or 'default'}/{meta.get('name')}"
        spec: WorkloadSpec | None = None
        problems: list[str] = []
        try:
            spec = self._parse(pod)
        except WorkloadError as exc:
            problems = exc.problems
        stage = spec.stage.value if spec and spec.stage else None
        try:
            gpus, cpu, mem = pod_resources(pod, self.gpu_resources)
        except ValueError as exc:
            return Cycle(key, stage, spec, Req(0, 0, 0), reason=f"invalid resources: {exc}")
        req = Req(gpus, int(cpu), int(mem))
        cyc = Cycle(key, stage, spec, req)
        pod_spec = pod.get("spec") or {}
        if any(pod_spec.get(f) for f in _UNMODELLED_FIELDS):
            self.unmodelled += 1

        names = node_order(self.snapshot)
        if not names:
            cyc.reason = "no nodes"
            return cyc
        want = num_feasible_nodes_to_find(len(names), self.profile.percentage_of_nodes_to_score)
        feasible: list[str] = []
        start = self._next_start % len(names)
        processed = 0
        for i in range(len(names)):
            name = names[(start + i) % len(names)]
            processed += 1
            if fits(self.snapshot, req, name):
                feasible.append(name)
                if len(feasible) >= want:
                    break
        self._next_start = (start + processed) % len(names)
        if not feasible:
            cyc.reason = f"0/{len(names)} nodes: {req.gpus} free GPUs / CPU / memory not available"
            return cyc

        use_extender = self.placer is not None and self._interested(pod)
        if use_extender and self.placer is not None:
            if self.profile.extender_filters:
                if spec is None:
                    cyc.reason = "invalid: " + "; ".join(problems)
                    return cyc
                decision = self.placer.filter(pod, feasible)
                if not decision.passed:
                    reason, count = Counter(decision.rejections.values()).most_common(1)[0]
                    cyc.reason = f"{count}/{len(feasible)} nodes: {reason}"
                    return cyc
                cyc.fits = decision.fits
                feasible = decision.passed
            elif spec is not None:
                cyc.fits, _ = self.placer.evaluate_nodes(spec, feasible)

        if len(feasible) == 1:  # kube-scheduler skips scoring for a single feasible node
            only = feasible[0]
            cyc.candidates = [Candidate(only, 0, None, 0, self._scores(cyc, feasible).get(only))]
            return cyc
        scores = self._scores(cyc, feasible) if use_extender else {}
        weight = self.profile.extender_weight if use_extender else None
        for name in feasible:
            in_tree = self._in_tree(req, name)
            s = scores.get(name)
            band = (s.score if s is not None else 0) if weight is not None else None
            points = in_tree + (band * weight * EXTENDER_SCALE if band is not None and weight else 0)
            cyc.candidates.append(Candidate(name, in_tree, band, points, s))
        return cyc

    def _scores(self, cyc: Cycle, names: list[str]) -> dict[str, NodeScore]:
        """Our prioritize over the nodes that passed: what the extender would send back."""
        if self.placer is None or cyc.spec is None or self.profile.extender_weight is None:
            return {}
        fits_ = [cyc.fits[n] for n in names if n in cyc.fits]
        return {s.node: s for s in self.placer.score(cyc.spec, fits_)}

    def _in_tree(self, req: Req, node: str) -> int:
        p = self.profile
        if not p.fit_weight and not p.balanced_weight:
            return 0
        used = node_requested(self.snapshot, node)
        total = 0
        if p.fit_weight:
            total += p.fit_weight * fit_score(self.snapshot, req, node, p.fit_strategy, p.fit_resources,
                                              self.gpu_resources, used)
        if p.balanced_weight:
            total += p.balanced_weight * balanced_score(self.snapshot, req, node, p.balanced_resources,
                                                        self.gpu_resources, used)
        return total

    def select(self, candidates: list[Candidate]) -> tuple[Candidate, int]:
        """selectHost: the highest total; ties uniformly at random by reservoir sampling in order."""
        best = candidates[0]
        count = 1
        for c in candidates[1:]:
            if c.points > best.points:
                best, count = c, 1
            elif c.points == best.points:
                count += 1
                if self.rng.randrange(count) == 0:
                    best = c
        return best, count

    def schedule(self, pod: dict[str, Any]) -> Placement:
        cyc = self.cycle(pod)
        if not cyc.candidates:
            return Placement(cyc.key, cyc.stage, None, cyc.reason)
        chosen, tied = self.select(cyc.candidates)
        self.decisions += 1
        self.tied_decisions += tied > 1
        if cyc.spec is not None:
            self.snapshot.assume(cyc.spec, chosen.node)
        else:
            meta = pod.get("metadata") or {}
            uid = str(meta.get("uid") or cyc.key)
            r = cyc.req
            self.snapshot.place(PlacedPod(uid, cyc.key, chosen.node, r.gpus, float(r.cpu), float(r.mem),
                                          None, None, None, assumed=True))
        others = sorted((c for c in cyc.candidates if c is not chosen), key=lambda c: -c.points)
        fit = cyc.fits.get(chosen.node)
        return Placement(
            cyc.key, cyc.stage, chosen.node, "", chosen.score,
            fit.sizing.precision.value if fit else None, fit.ms_per_token if fit else None,
            others[0].node if others else None, chosen.score.top_terms() if chosen.score else [],
            chosen.points, tied, fit, cyc.spec,
        )


class DefaultScheduler(SimScheduler):
    """Plain kube-scheduler with the default profile and no extender (the benchmarks' baseline)."""

    def __init__(
        self,
        snapshot: ClusterSnapshot,
        *,
        seed: int = 0,
        gpu_resources: tuple[str, ...] = GPU_RESOURCES,
        percentage_of_nodes_to_score: int | None = None,
        profile: SchedulerProfile | None = None,
    ) -> None:
        prof = profile or default_profile()
        if percentage_of_nodes_to_score is not None:
            prof = replace(prof, percentage_of_nodes_to_score=percentage_of_nodes_to_score)
        super().__init__(None, prof, snapshot=snapshot, seed=seed, gpu_resources=gpu_resources)
