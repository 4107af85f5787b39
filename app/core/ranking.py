"""From our weighted totals to the integers kube-scheduler adds: rank bands, not linear rounding.

kube-scheduler accepts 0..10 from an extender and adds ``score x weight x 10`` to its in-tree points.
Rounding ``10 x total`` loses the differences that matter: one more GPU used on a node moves the
packing term by ~0.02 of the weighted mean, so an empty node and a half-full one got the same integer
and kube-scheduler's own LeastAllocated/BalancedAllocation points then spread the pods (measured: 0
whole nodes left of 8, docs/scoring.md). Bands keep the *order*: the best distinct total gets 10, the
next distinct total 9, and so on; the eleventh distinct value and below get 0. With the shipped
profile one band step (weight x 10 points) exceeds every in-tree score that still varies, so the node
kube-scheduler binds is always one of ours with the best total.

Totals closer than ``EQUAL_TOTAL`` count as equal: they come from the same float arithmetic on equal
inputs, and treating 1e-15 noise as a preference would make ties look like decisions.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import StrEnum

MAX_EXTENDER_PRIORITY = 10  # kube-scheduler's extenderv1.MaxExtenderPriority
EQUAL_TOTAL = 1e-9


class ScoreMapping(StrEnum):
    RANK = "rank"  # bands by rank of distinct totals (default)
    LINEAR = "linear"  # round(10 x total): the old mapping, kept for comparisons


def band_scores(totals: Sequence[float], mapping: ScoreMapping = ScoreMapping.RANK) -> list[int]:
    """kube-scheduler's 0..10 for each total, in input order."""
    if mapping is ScoreMapping.LINEAR:
        return [max(0, min(MAX_EXTENDER_PRIORITY, round(MAX_EXTENDER_PRIORITY * t))) for t in totals]
    band_of: dict[float, int] = {}
    band = MAX_EXTENDER_PRIORITY
    previous: float | None = None
    for value in sorted(set(totals), reverse=True):
        if previous is not None and previous - value > EQUAL_TOTAL:
            band = max(0, band - 1)
        band_of[value] = band
        previous = value
    return [band_of[t] for t in totals]


def best_nodes(totals: dict[str, float]) -> set[str]:
    """The nodes whose total equals the best one (within ``EQUAL_TOTAL``)."""
    if not totals:
        return set()
    top = max(totals.values())
    return {n for n, t in totals.items() if top - t <= EQUAL_TOTAL}


class Agreement(StrEnum):
    """How the node kube-scheduler bound compares with our ranking for that pod."""

    TOP = "top"  # our unique best node (or the only feasible one)
    TIED_TOP = "tied_top"  # one of several nodes sharing our best total
    LOWER = "lower"  # a node we ranked below the best: in-tree points outweighed ours
    UNRANKED = "unranked"  # no ranking remembered for the pod (restart, or bound by someone else)


def agreement(chosen: str, totals: dict[str, float] | None) -> Agreement:
    if not totals or chosen not in totals:
        return Agreement.UNRANKED
    best = best_nodes(totals)
    if chosen not in best:
        return Agreement.LOWER
    return Agreement.TOP if len(best) == 1 else Agreement.TIED_TOP
