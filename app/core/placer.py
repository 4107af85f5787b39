"""The placement core: pod + candidate node names -> filter verdicts, scores and explanations.

Used unchanged by the HTTP service, the demo and the simulator. Gangs and data gravity plug in
through two small protocols so each can be developed and tested on its own.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, cast

from app.core.feasibility import NodeFit, apply_default_target, evaluate
from app.core.narrowing import NOT_BEST, soft_preference
from app.core.policy import PlacementPolicy
from app.core.ranking import best_nodes
from app.core.reasons import MESSAGE_CHARS, MESSAGE_PREFIX, ReasonCode, Rejection, clip, reject
from app.core.scoring import GravityFn, NodeScore, score_nodes
from app.core.snapshot import ClusterSnapshot, NodeUsage
from app.core.workload import TRAINING_STAGES, WorkloadError, WorkloadSpec, parse_workload

NOT_CACHED = reject(ReasonCode.NOT_CACHED, "node not in the extender's cache yet", unresolvable=False)
UNKNOWN = reject(ReasonCode.OTHER, "rejected")


class GangHook(Protocol):
    """What the placer needs from gang scheduling (implemented in app.gang)."""

    def reserved_gpus(self, node: str, exclude_gang: str | None) -> int: ...

    def reserved_map(self, exclude_gang: str | None) -> dict[str, int]: ...

    def filter_member(
        self,
        spec: WorkloadSpec,
        fits: dict[str, NodeFit],
        rejections: dict[str, Rejection],
        node_names: Sequence[str],
    ) -> tuple[dict[str, NodeFit], dict[str, Rejection]]: ...


class GravityHook(Protocol):
    """What the placer needs from data gravity (implemented in app.core.gravity)."""

    def hard_rejections(self, spec: WorkloadSpec, nodes: Iterable[str]) -> dict[str, Rejection]: ...

    def term(self, spec: WorkloadSpec, nodes: Sequence[str] | None = None) -> GravityFn | None:
        """``nodes``: this request's candidates, so the term can be relative to the best of them."""
        ...


@dataclass(slots=True)
class FilterDecision:
    spec: WorkloadSpec | None
    passed: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)
    unresolvable: dict[str, str] = field(default_factory=dict)
    error: str = ""
    fits: dict[str, NodeFit] = field(default_factory=dict)
    # Annotation problems (app.core.reasons.AnnotationProblem: text and key), for metrics.
    invalid: list[str] = field(default_factory=list)
    # The rule behind each distinct rejection message of this call, for the metric.
    codes: dict[str, ReasonCode] = field(default_factory=dict)

    @property
    def rejections(self) -> dict[str, str]:
        return {**self.failed, **self.unresolvable}


class Placer:
    def __init__(
        self,
        policy: PlacementPolicy,
        snapshot: ClusterSnapshot,
        gangs: GangHook | None = None,
        gravity: GravityHook | None = None,
    ) -> None:
        self.policy = policy
        self.snapshot = snapshot
        self.gangs = gangs
        self.gravity = gravity
        self._gpu_resources = policy.gpu_resources

    def parse(self, pod: dict[str, Any]) -> WorkloadSpec:
        return parse_workload(pod, self._gpu_resources)

    def usage(self, node: str) -> NodeUsage:
        return self.snapshot.usage.get(node) or NodeUsage()

    def fits_without(self, spec: WorkloadSpec, node: str, victims: Sequence[str]) -> bool:
        """Would our rules pass on ``node`` once ``victims`` (pod uids) are evicted? (preemption)"""
        facts = self.snapshot.nodes.get(node)
        if facts is None:
            return False
        u = self.usage(node)
        known = [u.pods[v] for v in victims if v in u.pods]
        trial = NodeUsage(gpus=u.gpus - sum(p.gpus for p in known), cpu_millis=u.cpu_millis,
                          memory_bytes=u.memory_bytes,
                          pods={k: v for k, v in u.pods.items() if k not in victims},
                          stages=u.stages.copy(), interactive=u.interactive, training=u.training)
        for p in known:
            if p.stage is not None:
                trial.stages[p.stage.value] -= 1
                trial.training -= p.stage in TRAINING_STAGES
        free = facts.gpu_count - trial.gpus
        if self.gangs is not None:
            free -= self.gangs.reserved_gpus(node, spec.gang.key if spec.gang else None)
        return not isinstance(evaluate(spec, facts, trial, free, self.policy.feasibility), Rejection)

    def evaluate_nodes(
        self, spec: WorkloadSpec, node_names: Sequence[str]
    ) -> tuple[dict[str, NodeFit], dict[str, Rejection]]:
        fits: dict[str, NodeFit] = {}
        rejections: dict[str, Rejection] = {}
        gang_key = spec.gang.key if spec.gang else None
        hard = self.gravity.hard_rejections(spec, node_names) if self.gravity else {}
        entries = self.snapshot.entries
        # CPU pods do not care about GPU reservations; skip the per-node ledger lookup for them.
        reserved = self.gangs.reserved_map(gang_key) if self.gangs is not None and spec.gpus > 0 else {}
        need = spec.gpus
        # Verdicts depend only on the node's shape and two bits of live state; memoise per request.
        memo: dict[int, NodeFit | Rejection] = {}
        for name in node_names:
            entry = entries.get(name)
            if entry is None:
                rejections[name] = NOT_CACHED
                continue
            if hard and name in hard:
                rejections[name] = hard[name]
                continue
            facts, usage, sid = entry
            free = facts.gpu_count - usage.gpus
            if reserved and free > 0:
                free -= reserved.get(name, 0)
            key = sid * 4 + (2 if free >= need else 0) + (1 if usage.training else 0)
            verdict = memo.get(key)
            if verdict is None:
                verdict = memo[key] = evaluate(spec, facts, usage, free, self.policy.feasibility)
            if type(verdict) is Rejection:
                rejections[name] = verdict
            else:
                fit = cast(NodeFit, verdict)
                fits[name] = fit if fit.node is facts else fit.on(facts)
        # Needs every candidate's verdict: filtered only when another node meets the target.
        apply_default_target(spec, fits, rejections, self.policy.feasibility)
        if spec.gang is not None and self.gangs is not None:
            fits, rejections = self.gangs.filter_member(spec, fits, rejections, node_names)
        return fits, rejections

    def filter(self, pod: dict[str, Any], node_names: Sequence[str]) -> FilterDecision:
        try:
            spec = self.parse(pod)
        except WorkloadError as exc:
            # The protocol repeats a reason once per node (an Error would turn the cycle into a
            # scheduler error; docs/extender-protocol.md), so the text is bounded: values are quoted
            # cut short by the parser and the whole is clipped, the full list is in explain.
            msg = clip(MESSAGE_PREFIX + "; ".join(exc.problems), MESSAGE_CHARS)
            return FilterDecision(
                spec=None, unresolvable=dict.fromkeys(node_names, msg), invalid=exc.problems
            )
        fits, rejections = self.evaluate_nodes(spec, node_names)
        decision = FilterDecision(spec=spec, fits=fits)
        codes, last = decision.codes, None
        for name in node_names:
            if name in fits:
                decision.passed.append(name)
            else:
                r = rejections.get(name) or UNKNOWN
                (decision.unresolvable if r.unresolvable else decision.failed)[name] = r.message
                if r is not last:  # verdicts are shared per node shape: a few distinct objects
                    codes.setdefault(r.message, r.code)
                    last = r
        return decision

    def narrow(self, decision: FilterDecision, pod: dict[str, Any]) -> list[NodeScore] | None:
        """Keep only our best-ranked passing node(s) (policy ``filter_to_best``); return the scores.

        One node when the pod has no soft in-tree preference (kube-scheduler then skips scoring and
        prioritize); all equal-best nodes otherwise, so its own scores still break the tie.
        """
        if not self.policy.filter_to_best or decision.spec is None or len(decision.passed) < 2:
            return None
        scores = self.score(decision.spec, [decision.fits[n] for n in decision.passed])
        best = best_nodes({s.node: s.total for s in scores})
        keep = [n for n in decision.passed if n in best]
        if len(keep) > 1 and soft_preference(pod) is None and not any(
                decision.fits[n].node.prefer_no_schedule for n in keep):
            keep = keep[:1]
        if len(keep) < len(decision.passed):
            kept = set(keep)
            for n in decision.passed:
                if n not in kept:
                    decision.failed[n] = NOT_BEST
            decision.passed = keep
        return scores

    def score(self, spec: WorkloadSpec, fits: Sequence[NodeFit]) -> list[NodeScore]:
        term = None
        # Producers (depends-on) and serving-group partners pull through the same term.
        if self.gravity is not None and (spec.depends_on or spec.serving_group):
            term = self.gravity.term(spec, [f.node.name for f in fits])
        return score_nodes(spec, fits, self.snapshot.usage, self.policy.scoring, term)

    def prioritize(
        self,
        pod: dict[str, Any],
        node_names: Sequence[str],
        known_fits: dict[str, NodeFit] | None = None,
    ) -> list[NodeScore]:
        """Scores for the nodes kube-scheduler kept; infeasible or unknown nodes score 0.

        ``known_fits``: the filter verdicts of this same pod on an unchanged snapshot, which spares
        evaluating every node twice per scheduling cycle.
        """
        try:
            spec = self.parse(pod)
        except WorkloadError:
            return [NodeScore(n, 0, 0.0) for n in node_names]
        if known_fits is not None and known_fits.keys() >= set(node_names):
            fits = {n: known_fits[n] for n in node_names}
        else:
            fits, _ = self.evaluate_nodes(spec, node_names)
        scores = self.score(spec, list(fits.values()))
        if len(scores) == len(node_names):
            return scores  # every node kept, in request order: the common case, no re-mapping
        scored = {s.node: s for s in scores}
        return [scored.get(n) or NodeScore(n, 0, 0.0) for n in node_names]
