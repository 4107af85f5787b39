"""Distinct values and groups of columns of small non-negative integers (class keys, shape ids, GPU
counts), by counting instead of sorting.

``np.unique`` sorts and builds its answer in a dozen small numpy calls: on the 500 candidates of a
filter call that is ~0.1 ms each time, several times per call, for keys that are small integers.
Counting them (``np.bincount``) gives the same answers in a few microseconds. Keys that are negative
or far larger than the column go to ``np.unique`` unchanged.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

Ints = npt.NDArray[np.int64]


def _countable(values: npt.NDArray[np.integer]) -> bool:
    return bool(values.size) and int(values.min()) >= 0 and int(values.max()) <= 4 * values.size + 1024


def distinct(values: npt.NDArray[np.integer]) -> list[int]:
    """The sorted distinct values, as ``np.unique(values).tolist()``."""
    if not _countable(values):
        return [int(v) for v in np.unique(values).tolist()]
    return np.flatnonzero(np.bincount(values)).tolist()


def group(values: npt.NDArray[np.integer]) -> tuple[Ints, Ints, Ints]:
    """(distinct values sorted, the first position of each, each position's group index): as
    ``np.unique(values, return_index=True, return_inverse=True)``."""
    if not _countable(values):
        uniq, first, inverse = np.unique(values, return_index=True, return_inverse=True)
        return uniq.astype(np.int64), first.astype(np.int64), inverse.reshape(-1).astype(np.int64)
    n = values.size
    counts = np.bincount(values)
    uniq = np.flatnonzero(counts)
    index = np.zeros(counts.size, dtype=np.int64)
    index[uniq] = np.arange(uniq.size)
    first = np.full(counts.size, n, dtype=np.int64)
    np.minimum.at(first, values, np.arange(n))
    return uniq.astype(np.int64), first[uniq], index[values]
