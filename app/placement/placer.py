"""The placement core: pod + candidate node names -> filter verdicts, scores and explanations.

Used unchanged by the HTTP service, the demo and the simulator. Gangs and data gravity plug in
through two small protocols so each can be developed and tested on its own.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, cast

import numpy as np
import numpy.typing as npt

from app.base.reasons import MESSAGE_CHARS, MESSAGE_PREFIX, ReasonCode, Rejection, clip, reject
from app.base.small_ints import distinct, group
from app.base.workload import TRAINING_STAGES, WorkloadError, WorkloadSpec, parse_workload
from app.config.policy import PlacementPolicy
from app.placement.feasibility import NodeFit, apply_default_target, evaluate
from app.placement.narrowing import soft_preference
from app.placement.score_list import Floats, Ints, ScoreList
from app.placement.scoring import GravityFn, Usage, score_batch, score_nodes
from app.snapshot.nodes import NodeFacts
from app.snapshot.store import ClusterSnapshot, NodeUsage

NOT_CACHED = reject(ReasonCode.NOT_CACHED, "node not in the extender's cache yet", unresolvable=False)
UNKNOWN = reject(ReasonCode.OTHER, "rejected")


class GangHook(Protocol):
    """What the placer needs from gang scheduling (implemented in app.gang)."""

    def reserved_gpus(self, node: str, exclude_gang: str | None) -> int: ...

    def reserved_map(self, exclude_gang: str | None) -> dict[str, int]: ...

    def reservation_reason(self, node: str, exclude_gang: str | None) -> str | None:
        """The gangs keeping ``node``'s GPUs, in words (for a pod refused only because of them)."""
        ...

    def filter_member(
        self,
        spec: WorkloadSpec,
        fits: Mapping[str, NodeFit],
        rejections: dict[str, Rejection],
        node_names: Sequence[str],
    ) -> tuple[Mapping[str, NodeFit], dict[str, Rejection]]: ...

    def undecidable(self, spec: WorkloadSpec) -> Rejection | None:
        """The reason no node can take this gang member yet (gang incomplete or unsized), if any."""
        ...


class GravityHook(Protocol):
    """What the placer needs from data gravity (implemented in app.placement.gravity)."""

    def hard_rejections(self, spec: WorkloadSpec, nodes: Iterable[str]) -> dict[str, Rejection]: ...

    def term(self, spec: WorkloadSpec, nodes: Sequence[str] | None = None) -> GravityFn | None:
        """``nodes``: this request's candidates, so the term can be relative to the best of them."""
        ...


class FilterDecision:
    """What filter decided for one pod: the passing nodes, why the others failed, and for what rule.

    Per-node reasons are built when first read: the service sends them only when no node passes
    (kube-scheduler reads them for nothing else), so a call that places the pod never builds
    thousands of them; explain, tests and the simulator read them all the same.
    """

    __slots__ = (
        "_reasons",
        "classified",
        "codes",
        "error",
        "fits",
        "invalid",
        "passed",
        "spec",
    )

    def __init__(
        self,
        spec: WorkloadSpec | None,
        *,
        passed: list[str] | None = None,
        failed: dict[str, str] | None = None,
        unresolvable: dict[str, str] | None = None,
        fits: Mapping[str, NodeFit] | None = None,
        classified: Classified | None = None,
        invalid: list[str] | None = None,
    ) -> None:
        self.spec = spec
        self.passed: list[str] = passed if passed is not None else []
        self.error = ""
        self.fits: Mapping[str, NodeFit] = fits if fits is not None else {}
        # The grouped verdicts behind ``fits`` (None on the per-node gang path), reused by scoring.
        self.classified = classified
        # Annotation problems (app.base.reasons.AnnotationProblem: text and key), for metrics.
        self.invalid: list[str] = invalid if invalid is not None else []
        # The rule behind each distinct rejection message of this call, for the metric.
        self.codes: dict[str, ReasonCode] = {}
        # (failed, unresolvable); None until read, when ``classified`` holds the verdicts to build
        # them from.
        self._reasons: tuple[dict[str, str], dict[str, str]] | None = None
        if classified is None:
            self._reasons = (failed if failed is not None else {},
                             unresolvable if unresolvable is not None else {})

    @property
    def failed(self) -> dict[str, str]:
        return self._built_reasons()[0]

    @property
    def unresolvable(self) -> dict[str, str]:
        return self._built_reasons()[1]

    @property
    def rejections(self) -> dict[str, str]:
        return {**self.failed, **self.unresolvable}

    def _built_reasons(self) -> tuple[dict[str, str], dict[str, str]]:
        if self._reasons is None:
            self._reasons = self._build_reasons()
        return self._reasons

    def _build_reasons(self) -> tuple[dict[str, str], dict[str, str]]:
        """Each failing candidate's reason, from its class's verdict (the candidates in ``classified``
        that did not pass filter; a node dropped later by ``narrow`` is not a failure)."""
        failed: dict[str, str] = {}
        unresolvable: dict[str, str] = {}
        c = self.classified
        if c is None or len(c.passing) == len(c.names):
            return failed, unresolvable
        names, verdicts = c.names, c.verdicts
        messages = [v.message if type(v) is Rejection else "" for v in verdicts]
        hopeless = np.array([type(v) is Rejection and v.unresolvable for v in verdicts], dtype=bool)
        failing = c.failing()
        # One comprehension per kind of rejection: a Python step per node, but the cheapest one.
        for mask, into in ((failing & ~hopeless[c.class_of], failed),
                           (failing & hopeless[c.class_of], unresolvable)):
            at = np.flatnonzero(mask)
            if len(at):
                into.update({names[i]: messages[j]
                             for i, j in zip(at.tolist(), c.class_of[at].tolist(), strict=True)})
        return failed, unresolvable


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
        # The watch parsed this very version of the pod already (kube-scheduler's informer and ours
        # see the same object): reuse it rather than read the annotations and resources again.
        meta = pod.get("metadata") if isinstance(pod, dict) else None
        if isinstance(meta, dict):
            uid, version = meta.get("uid"), meta.get("resourceVersion")
            if isinstance(uid, str) and isinstance(version, str) and version:
                spec = self.snapshot.watched_spec(uid, version)
                if spec is not None:
                    return spec
        return parse_workload(pod, self._gpu_resources, self.snapshot.claim_reader())

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
    ) -> tuple[Mapping[str, NodeFit], dict[str, Rejection]]:
        """Every candidate's verdict: the feasible ones (name -> fit) and the rejected ones."""
        c = self.classify(spec, node_names)
        fits: Mapping[str, NodeFit] = FitMap(c, self.snapshot.entries)
        rejections = c.rejections()
        if spec.gang is not None and self.gangs is not None:
            fits, rejections = self.gangs.filter_member(spec, fits, rejections, node_names)
        return fits, rejections

    def classify(self, spec: WorkloadSpec, node_names: Sequence[str]) -> Classified:
        """Group the candidates into classes our rules cannot tell apart, and judge each class once.

        A verdict depends only on the node's shape, whether its free GPUs (net of other gangs'
        reservations) cover the pod, and whether training runs there; those are columns of the
        snapshot's node table, so the grouping is numpy work and Python runs once per class.
        """
        names = node_names if isinstance(node_names, list) else list(node_names)
        table = self.snapshot.table
        rows = table.rows(names)
        known = rows >= 0
        r = np.where(known, rows, 0)
        free = table.gpu_count[r] - table.gpus_used[r]
        hard = self.gravity.hard_rejections(spec, names) if self.gravity else {}
        # Nodes where another gang's reservation is all that leaves too few GPUs: the reason names
        # the gang (few nodes: reservations are whole gangs' members or holds).
        held: dict[int, Rejection] = {}
        if self.gangs is not None and spec.gpus > 0:  # CPU pods do not care about GPU reservations
            exclude = spec.gang.key if spec.gang else None
            reserved = self.gangs.reserved_map(exclude)
            if reserved:
                unreserved = free
                free = np.where(free > 0, free - table.column(reserved)[r], free)
                needed = spec.gpus_needed_free
                for i in np.flatnonzero(known & (unreserved >= needed) & (free < needed)).tolist():
                    if names[i] not in hard:
                        why = self._reserved_here(spec, names[i], int(free[i]), exclude)
                        if why is not None:
                            held[i] = why
        key = table.shape[r] * 4 + np.where(free >= spec.gpus_needed_free, 2, 0) + (table.training[r] > 0)
        key[~known] = -1
        if hard:
            for i, name in enumerate(names):
                if name in hard:
                    key[i] = -2 - i  # a class of its own: the reason names this node's producer
        for i in held:
            key[i] = -2 - i  # a class of its own: the reason names the gang
        uniq, first, class_of = group(key)
        entries = self.snapshot.entries
        verdicts: list[NodeFit | Rejection] = []
        for k, i in zip(uniq.tolist(), first.tolist(), strict=True):
            if k == -1:
                verdicts.append(NOT_CACHED)
            elif k <= -2:
                verdicts.append(held[i] if i in held else hard[names[i]])
            else:
                facts, usage, _ = entries[names[i]]
                verdicts.append(evaluate(spec, facts, usage, int(free[i]), self.policy.feasibility))
        # Needs every candidate's verdict: filtered only when another node meets the target.
        class_fits = {j: v for j, v in enumerate(verdicts) if type(v) is NodeFit}
        class_rejections: dict[int, Rejection] = {}
        apply_default_target(spec, class_fits, class_rejections, self.policy.feasibility)
        for j, why in class_rejections.items():
            verdicts[j] = why
        passes = np.array([type(v) is NodeFit for v in verdicts], dtype=bool)
        passing = np.flatnonzero(passes[class_of])
        return Classified(names, class_of.astype(np.int64), verdicts, r, passing,
                          [names[i] for i in passing.tolist()] if len(passing) < len(names) else names)

    def _reserved_here(self, spec: WorkloadSpec, node: str, free: int, exclude: str | None
                       ) -> Rejection | None:
        """The rejection naming the gangs that keep ``node``'s GPUs, when that is the rule the pod
        fails there (another rule failing first keeps its own reason)."""
        assert self.gangs is not None
        facts, usage, _ = self.snapshot.entries[node]
        verdict = evaluate(spec, facts, usage, free, self.policy.feasibility)
        if not isinstance(verdict, Rejection) or verdict.code is not ReasonCode.GPUS_BUSY:
            return None
        why = self.gangs.reservation_reason(node, exclude)
        return None if why is None else reject(ReasonCode.GPUS_BUSY, why, unresolvable=False)

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
        if spec.gang is not None and self.gangs is not None:
            waiting = self.gangs.undecidable(spec)
            if waiting is not None:
                # Same answer for every node: no node is looked at (an incomplete gang's members
                # are retried by kube-scheduler as often as any pending pod).
                same = dict.fromkeys(node_names, waiting.message)
                decision = (FilterDecision(spec=spec, fits={}, unresolvable=same) if waiting.unresolvable
                            else FilterDecision(spec=spec, fits={}, failed=same))
                decision.codes[waiting.message] = waiting.code
                return decision
            fits, rejections = self.evaluate_nodes(spec, node_names)
            return _decision(spec, node_names, fits, rejections)
        c = self.classify(spec, node_names)
        decision = FilterDecision(spec=spec, fits=FitMap(c, self.snapshot.entries), classified=c)
        names = c.names
        decision.passed = list(c.passing_names)
        if len(decision.passed) < len(names):
            for j in distinct(c.class_of[c.failing()]):
                r = cast(Rejection, c.verdicts[j])
                decision.codes.setdefault(r.message, r.code)
        return decision

    def narrow(self, decision: FilterDecision, pod: dict[str, Any]) -> ScoreList | None:
        """Keep only our best-ranked passing node(s) (policy ``filter_to_best``); return the scores.

        One node when the pod has no soft in-tree preference (kube-scheduler then skips scoring and
        prioritize); all equal-best nodes otherwise, so its own scores still break the tie.
        """
        if not self.policy.filter_to_best or decision.spec is None or len(decision.passed) < 2:
            return None
        c = decision.classified
        if c is not None:
            scores = self._score_positions(decision.spec, c, c.passing)
            best = scores.best_positions()
            tainted = bool(self.snapshot.table.prefer_no_schedule[c.rows[c.passing[best]]].any())
            if len(best) > 1 and not tainted and soft_preference(pod) is None:
                # Hundreds of identical nodes tie on a uniform cluster: name only the one kept.
                best = best[:1]
            keep = [scores.names[i] for i in best.tolist()]
        else:
            scores = self.score(decision.spec, [decision.fits[n] for n in decision.passed])
            keep = scores.best_nodes()
            tainted = any(decision.fits[n].node.prefer_no_schedule for n in keep)
        if len(keep) > 1 and not tainted and soft_preference(pod) is None:
            keep = keep[:1]
        decision.passed = keep  # the others are left out of the answer (docs/scoring.md)
        return scores

    def score(self, spec: WorkloadSpec, fits: Sequence[NodeFit]) -> ScoreList:
        """Scores of nodes given as fits (app.placement.scoring): gangs, explain, plans."""
        term = None
        # Producers (depends-on) and serving-group partners pull through the same term.
        if self.gravity is not None and (spec.depends_on or spec.serving_group):
            term = self.gravity.term(spec, [f.node.name for f in fits])
        return score_nodes(spec, fits, self.snapshot.usage, self.policy.scoring, term)

    def _score_positions(self, spec: WorkloadSpec, c: Classified, positions: Ints) -> ScoreList:
        """Scores of the candidates at ``positions`` (feasible ones), as columns (app.placement.scoring)."""
        names = c.passing_names if positions is c.passing else [c.names[i] for i in positions.tolist()]
        rows = c.rows[positions]
        table = self.snapshot.table
        gravity: Floats | None = None
        if self.gravity is not None and (spec.depends_on or spec.serving_group):
            term = self.gravity.term(spec, names)
            if term is not None:
                gravity = np.array([np.nan if (g := term(n)) is None else g for n in names], dtype=np.float64)
        usage = Usage(table.gpus_used[rows], table.cpu_used[rows], table.training[rows],
                      table.interactive[rows])
        return score_batch(spec, names, cast(list[NodeFit], c.verdicts), c.class_of[positions], usage,
                           self.policy.scoring, gravity)

    def prioritize(
        self,
        pod: dict[str, Any],
        node_names: Sequence[str],
        known_fits: Mapping[str, NodeFit] | None = None,
    ) -> ScoreList:
        """Scores for the nodes kube-scheduler kept; infeasible or unknown nodes score 0.

        ``known_fits``: the filter verdicts of this same pod on an unchanged snapshot, which spares
        evaluating every node twice per scheduling cycle.
        """
        try:
            spec = self.parse(pod)
        except WorkloadError:
            return ScoreList.empty().padded(node_names)
        if spec.gang is not None and self.gangs is not None:
            # Gang members: the plan narrows the verdicts per node (GangHook.filter_member).
            if known_fits is not None and known_fits.keys() >= set(node_names):
                fits: Mapping[str, NodeFit] = {n: known_fits[n] for n in node_names}
            else:
                fits, _ = self.evaluate_nodes(spec, node_names)
            return self.score(spec, list(fits.values())).padded(node_names)
        c = known_fits.classified if isinstance(known_fits, FitMap) else None
        if c is not None and len(c.names) == len(node_names) and c.names == list(node_names):
            pass  # the same candidates filter judged in this cycle
        else:
            c = self.classify(spec, node_names)
        # Every node kept, in request order, is the common case: no re-mapping then.
        return self._score_positions(spec, c, c.passing).padded(node_names)


@dataclass(slots=True)
class Classified:
    """One request's candidates, grouped into classes our rules cannot tell apart (Placer.classify)."""

    names: list[str]
    class_of: Ints  # per candidate: its class, an index into ``verdicts``
    verdicts: list[NodeFit | Rejection]  # per class
    rows: Ints  # per candidate: its row in the snapshot's node table
    passing: Ints  # the feasible candidates' positions, in request order
    passing_names: list[str]  # their names

    def failing(self) -> npt.NDArray[np.bool_]:
        failing = np.ones(len(self.names), dtype=bool)
        failing[self.passing] = False
        return failing

    def rejections(self) -> dict[str, Rejection]:
        failing = self.failing()
        at, classes = np.flatnonzero(failing).tolist(), self.class_of[failing].tolist()
        return {self.names[i]: cast(Rejection, self.verdicts[j]) for i, j in zip(at, classes, strict=True)}


SCANS_BEFORE_INDEX = 4


class FitMap(Mapping[str, NodeFit]):
    """The feasible candidates of one request, name -> fit; each ``NodeFit`` is made when asked for.

    A class's fit is shared by all its nodes; only the node facts differ, and few consumers (bind,
    explain, a plan) ever look at more than a handful of nodes.
    """

    def __init__(self, classified: Classified, entries: Mapping[str, tuple[NodeFacts, Any, int]]) -> None:
        self.classified = classified
        self._entries = entries
        self._names = classified.passing_names
        self._pos: dict[str, int] | None = None
        self._made: dict[str, NodeFit] = {}
        self._scans = 0

    def _index(self) -> dict[str, int] | None:
        """The name index once more than a few names were asked about; None before (a scan of the
        names, in C, answers one question for less than indexing every passing node: bind asks
        about the one node it binds, three times)."""
        if self._pos is None:
            self._scans += 1
            if self._scans > SCANS_BEFORE_INDEX:
                self._pos = dict(zip(self._names, self.classified.passing.tolist(), strict=True))
        return self._pos

    def __getitem__(self, name: str) -> NodeFit:
        fit = self._made.get(name)
        if fit is None:
            c = self.classified
            pos = self._index()
            if pos is None:
                try:
                    at = int(c.passing[self._names.index(name)])
                except ValueError:
                    raise KeyError(name) from None
            else:
                at = pos[name]
            shared = cast(NodeFit, c.verdicts[int(c.class_of[at])])
            entry = self._entries.get(name)
            fit = shared if entry is None or shared.node is entry[0] else shared.on(entry[0])
            self._made[name] = fit
        return fit

    def __contains__(self, name: object) -> bool:
        pos = self._index()
        return name in self._names if pos is None else name in pos

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)


def _decision(spec: WorkloadSpec, node_names: Sequence[str], fits: Mapping[str, NodeFit],
              rejections: dict[str, Rejection]) -> FilterDecision:
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
