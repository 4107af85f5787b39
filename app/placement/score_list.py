"""What scoring answers: one request's candidates with their totals and kube-scheduler's bands,
as columns, with a ``NodeScore`` built on demand for the node a bind or explain asks about."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypeVar, cast, overload

import numpy as np
import numpy.typing as npt

from app.placement import ranking
from app.placement.ranking import Agreement

Floats = npt.NDArray[np.float64]
Ints = npt.NDArray[np.int64]
G = TypeVar("G", bound=np.generic)


@dataclass(slots=True)
class NodeScore:
    node: str
    score: int
    total: float  # the unrounded weighted mean in [0, 1]; breaks ties in explain output
    terms: dict[str, float] = field(default_factory=dict)
    weights: dict[str, float] = field(default_factory=dict)
    # Set when the whole-node guard ranked this node below a partly used node of its shape.
    guarded_by: str | None = None
    # Why this node's gravity pull was capped, when it was (scoring.GravityCap): "opens" (the pod
    # would open a node of more than GRAVITY_OPENS_AT_MOST times its GPUs while a partly used or
    # smaller node fits it) or "outclassed" (training, and another candidate's GPU is at least as
    # fast and cheaper per unit of work).
    gravity_capped: str | None = None

    def top_terms(self, n: int = 3) -> list[tuple[str, float]]:
        contrib = {t: self.terms[t] * self.weights.get(t, 0.0) for t in self.terms}
        ranked = sorted(contrib.items(), key=lambda kv: kv[1], reverse=True)
        return [(t, self.terms[t]) for t, c in ranked[:n] if c > 0]


@dataclass(eq=False)
class ScoreList(Sequence[NodeScore]):
    """Scores of one request's candidates, in request order; ``NodeScore`` objects on demand.

    Holds columns, not objects: a bind or explain asks about one or a few nodes, and building 5,000
    objects per scheduling cycle to answer that was measurable.
    """

    names: list[str]
    totals: Floats
    # kube-scheduler's 0..10 per position; None until asked (``bands``): a filter that narrows to one
    # node answers no bands, and ranking 5,000 totals is a sort.
    raw_bands: Ints | None
    class_of: Ints
    class_terms: list[dict[str, float]]
    columns: dict[str, Floats]
    weights: dict[str, float]
    guarded_by: dict[int, str]  # position -> the partly used node that outranked it
    capped: Mapping[int, str] = field(default_factory=dict)  # position -> why its gravity pull was capped
    mapping: ranking.ScoreMapping = ranking.ScoreMapping.RANK  # how ``bands`` are made from totals
    _pos: dict[str, int] | None = field(default=None, init=False, repr=False)
    _scans: int = field(default=0, init=False, repr=False)

    @classmethod
    def empty(cls) -> ScoreList:
        none = np.zeros(0, dtype=np.int64)
        return cls([], np.zeros(0), none, none, [], {}, {}, {})

    @property
    def bands(self) -> Ints:
        if self.raw_bands is None:
            self.raw_bands = ranking.bands(self.totals, self.mapping)
        return self.raw_bands

    def __len__(self) -> int:
        return len(self.names)

    @overload
    def __getitem__(self, i: int) -> NodeScore: ...

    @overload
    def __getitem__(self, i: slice) -> list[NodeScore]: ...

    def __getitem__(self, i: int | slice) -> NodeScore | list[NodeScore]:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        if i < 0:
            i += len(self)
        terms = {**self.class_terms[int(self.class_of[i])],
                 **{t: float(col[i]) for t, col in self.columns.items()}}
        return NodeScore(self.names[i], self.band_at(i), float(self.totals[i]), terms,
                         self.weights, self.guarded_by.get(i), self.capped.get(i))

    def band_at(self, i: int) -> int:
        """The band of position ``i`` without ranking every total: it follows from the totals at
        least as high as its own (bind asks about the node it binds, usually the best)."""
        if self.raw_bands is not None:
            return int(self.raw_bands[i])
        self._scans += 1
        if self._scans > 4:  # many asked about (explain, every NodeScore): rank them all once
            return int(self.bands[i])
        mine = self.totals[i]
        if self.mapping is ranking.ScoreMapping.RANK and mine >= self.totals.max():
            return ranking.MAX_EXTENDER_PRIORITY  # the best total heads the ranking
        higher = self.totals[self.totals >= mine]
        return int(ranking.bands(higher, self.mapping)[int(np.argmin(higher))])

    def __iter__(self) -> Iterator[NodeScore]:
        return (self[i] for i in range(len(self)))

    def position(self, node: str) -> int | None:
        # One or two nodes asked about (bind: agreement and the Placed event): a scan of the names
        # (in C) costs less than indexing all of them; past a few, or for many (take, padded), the
        # index.
        if self._pos is not None:
            return self._pos.get(node)
        self._scans += 1
        if self._scans > 4:
            return self._index().get(node)
        try:
            return self.names.index(node)
        except ValueError:
            return None

    def _index(self) -> dict[str, int]:
        if self._pos is None:
            self._pos = {n: i for i, n in enumerate(self.names)}
        return self._pos

    def get(self, node: str) -> NodeScore | None:
        i = self.position(node)
        return None if i is None else self[i]

    def take(self, names: Sequence[str]) -> ScoreList | None:
        """The scores of ``names``, in that order; None when one of them was not scored here."""
        if len(names) == len(self.names) and names == self.names:
            return self
        found = [self._index().get(n) for n in names]
        if any(p is None for p in found):
            return None
        pos = cast(list[int], found)
        idx = np.array(pos, dtype=np.int64)
        guarded = {k: self.guarded_by[i] for k, i in enumerate(pos) if i in self.guarded_by}
        capped = {k: self.capped[i] for k, i in enumerate(pos) if i in self.capped}
        return ScoreList(list(names), self.totals[idx], self.bands[idx], self.class_of[idx],
                         self.class_terms, {t: c[idx] for t, c in self.columns.items()},
                         self.weights, guarded, capped)

    def padded(self, names: Sequence[str]) -> ScoreList:
        """These scores over ``names`` in that order; a name not scored here (infeasible, unknown)
        scores 0 in band 0 with no terms."""
        if len(names) == len(self.names) and list(names) == self.names:
            return self
        found = [self._index().get(n) for n in names]
        missing = len(self.class_terms)  # an extra, empty class for the unscored
        idx = np.array([-1 if p is None else p for p in found], dtype=np.int64)
        hit = idx >= 0

        def pick(col: npt.NDArray[G], fill: float) -> npt.NDArray[G]:
            out = np.full(len(names), fill, dtype=col.dtype)
            out[hit] = col[idx[hit]]
            return out

        class_of = pick(self.class_of, missing)
        pairs = [(k, i) for k, i in enumerate(found) if i is not None]
        guarded = {k: self.guarded_by[i] for k, i in pairs if i in self.guarded_by}
        capped = {k: self.capped[i] for k, i in pairs if i in self.capped}
        return ScoreList(list(names), pick(self.totals, 0.0), pick(self.bands, 0), class_of,
                         [*self.class_terms, {}], {t: pick(c, 0.0) for t, c in self.columns.items()},
                         self.weights, guarded, capped)

    def best_positions(self) -> Ints:
        """Positions whose total equals the best one (within ``EQUAL_TOTAL``), in request order."""
        return ranking.best_positions(self.totals)

    def best_nodes(self) -> list[str]:
        return [self.names[i] for i in self.best_positions().tolist()]

    def agreement(self, node: str) -> Agreement:
        i = self.position(node)
        return Agreement.UNRANKED if i is None else ranking.agreement_at(self.totals, i)
