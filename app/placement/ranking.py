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

import numpy as np
import numpy.typing as npt

MAX_EXTENDER_PRIORITY = 10  # kube-scheduler's extenderv1.MaxExtenderPriority
EQUAL_TOTAL = 1e-9

Floats = npt.NDArray[np.float64]
Ints = npt.NDArray[np.int64]


class ScoreMapping(StrEnum):
    RANK = "rank"  # bands by rank of distinct totals (default)
    LINEAR = "linear"  # round(10 x total): the old mapping, kept for comparisons


def bands(totals: Floats | Sequence[float], mapping: ScoreMapping = ScoreMapping.RANK) -> Ints:
    """kube-scheduler's 0..10 for each total, in input order."""
    totals = np.asarray(totals, dtype=np.float64)
    if mapping is ScoreMapping.LINEAR:
        return np.clip(np.round(MAX_EXTENDER_PRIORITY * totals), 0, MAX_EXTENDER_PRIORITY).astype(np.int64)
    distinct = np.unique(totals)[::-1]  # descending
    band_of = np.zeros(len(distinct), dtype=np.int64)
    band, previous = MAX_EXTENDER_PRIORITY, None
    for k, value in enumerate(distinct.tolist()):
        if previous is not None and previous - value > EQUAL_TOTAL:
            band -= 1
            if band <= 0:
                break  # the rest stay 0
        band_of[k] = band
        previous = value
    # Map each total to its distinct value's index (``distinct`` is descending).
    idx = len(distinct) - 1 - np.searchsorted(distinct[::-1], totals)
    return band_of[idx]


def best_positions(totals: Floats) -> Ints:
    """Positions whose total equals the best one (within ``EQUAL_TOTAL``), in input order."""
    if not len(totals):
        return np.zeros(0, dtype=np.int64)
    return np.flatnonzero(totals.max() - totals <= EQUAL_TOTAL)


class Agreement(StrEnum):
    """How the node kube-scheduler bound compares with our ranking for that pod."""

    TOP = "top"  # our unique best node (or the only feasible one)
    TIED_TOP = "tied_top"  # one of several nodes sharing our best total
    LOWER = "lower"  # a node we ranked below the best: in-tree points outweighed ours
    UNRANKED = "unranked"  # no ranking remembered for the pod (restart, or bound by someone else)


def agreement_at(totals: Floats, chosen: int) -> Agreement:
    """How the candidate at position ``chosen`` ranks among ``totals``."""
    if totals.max() - totals[chosen] > EQUAL_TOTAL:
        return Agreement.LOWER
    return Agreement.TOP if len(best_positions(totals)) == 1 else Agreement.TIED_TOP
