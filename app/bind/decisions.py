"""What this extender decided for each pod in its current scheduling cycle, kept for bind and explain.

kube-scheduler calls filter, then prioritize, then bind for one pod, each a separate request. The
verdicts of filter are reused by prioritize (same cycle), the scores by bind (agreement, the Placed
event) and by explain. Bounded: the oldest entries go first.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field

from app.base.workload import WorkloadSpec
from app.placement.feasibility import NodeFit
from app.placement.placer import FilterDecision
from app.placement.ranking import Agreement
from app.placement.score_list import NodeScore, ScoreList

DECISION_MEMORY = 20_000


@dataclass(slots=True)
class Remembered:
    spec: WorkloadSpec
    fit: NodeFit | None
    at: float
    fits: Mapping[str, NodeFit] | None = None  # this cycle's filter verdicts, reused by prioritize
    agreement: Agreement | None = None  # set at bind: how kube-scheduler's node ranked in ``scores``
    # prioritize's answer as computed; the by-node map is built only when a bind or explain asks
    # (a dict of 5,000 entries per scheduling cycle was measurable on the hot path).
    score_list: ScoreList = field(default_factory=ScoreList.empty)

    def set_scores(self, scores: ScoreList) -> None:
        self.score_list = scores

    def score_of(self, node: str) -> NodeScore | None:
        return self.score_list.get(node)

    def best_nodes(self) -> list[str]:
        return self.score_list.best_nodes()

    @property
    def scores(self) -> dict[str, NodeScore]:
        """Every scored node by name (explain; builds them all: not for the hot path)."""
        return {s.node: s for s in self.score_list}

    def agreement_with(self, node: str) -> Agreement:
        """How ``node`` ranks in this cycle's scores (kube-scheduler skips prioritize for one node)."""
        if not self.score_list and self.fits is not None and len(self.fits) == 1 and node in self.fits:
            return Agreement.TOP
        return self.score_list.agreement(node)


class DecisionMemory:
    """Per-pod decisions by uid. Callers hold the service lock when they write."""

    def __init__(self, capacity: int = DECISION_MEMORY) -> None:
        self.capacity = capacity
        self._by_uid: OrderedDict[str, Remembered] = OrderedDict()

    def get(self, uid: str) -> Remembered | None:
        return self._by_uid.get(uid) if uid else None

    def remember_filter(self, decision: FilterDecision) -> None:
        spec = decision.spec
        if spec is None or not spec.uid:
            return
        fit = next(iter(decision.fits.values())) if len(decision.fits) == 1 else None
        # A new filter call is a new scheduling cycle: the previous cycle's scores no longer describe
        # the candidates (and kube-scheduler skips prioritize when one node is left).
        self._by_uid[spec.uid] = Remembered(spec, fit, time.time(), decision.fits)
        self._by_uid.move_to_end(spec.uid)
        while len(self._by_uid) > self.capacity:
            self._by_uid.popitem(last=False)

    def remember_scores(self, uid: str, scores: ScoreList) -> None:
        if uid and (r := self._by_uid.get(uid)) is not None:
            r.set_scores(scores)

    def newest_spec(self, key: str) -> WorkloadSpec | None:
        """The newest spec filtered under ``ns/name`` (for pods only ever seen in requests)."""
        for r in reversed(self._by_uid.values()):
            if r.spec.key == key:
                return r.spec
        return None
