"""The snapshot's nodes as columns (numpy), so one request's work is per *class* of node, not per node.

Filter and prioritize see up to thousands of node names per call, and almost everything our rules
read about a node is its shape (one small int) plus a few usage counters. Kept as arrays, a request
turns its names into row numbers once and then groups, compares and gathers with numpy; Python only
runs for each distinct class of node (docs/extender-protocol.md, "Targets"). The snapshot keeps the
columns in step with its own dictionaries: every usage change goes through it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

Ints = npt.NDArray[np.int64]
Floats = npt.NDArray[np.float64]

UNKNOWN_ROW = -1


class NodeTable:
    def __init__(self, capacity: int = 1024) -> None:
        self.index: dict[str, int] = {}
        self.shape = np.full(capacity, -1, dtype=np.int64)
        self.gpu_count = np.zeros(capacity, dtype=np.int64)
        self.gpus_used = np.zeros(capacity, dtype=np.int64)
        self.cpu_used = np.zeros(capacity, dtype=np.float64)
        self.training = np.zeros(capacity, dtype=np.int64)
        self.interactive = np.zeros(capacity, dtype=np.int64)
        self.prefer_no_schedule = np.zeros(capacity, dtype=bool)  # not part of the shape
        self._free_rows: list[int] = []
        self._size = 0
        # Bumps when a name gains or loses a row: the cached name -> row translation is then stale.
        self.version = 0
        # (version, names, rows) of the last translation, one tuple so a reader never pairs one
        # call's names with another's rows.
        self._last: tuple[int, list[str], Ints] | None = None

    # --- writes (the snapshot calls these under its callers' lock) ---------------------------------
    def set_node(self, name: str, shape_id: int, gpu_count: int, prefer_no_schedule: bool) -> None:
        row = self.index.get(name)
        if row is None:
            row = self._free_rows.pop() if self._free_rows else self._grow()
            self.index[name] = row
            self.version += 1
            self.gpus_used[row] = 0
            self.cpu_used[row] = 0.0
            self.training[row] = 0
            self.interactive[row] = 0
        self.shape[row] = shape_id
        self.gpu_count[row] = gpu_count
        self.prefer_no_schedule[row] = prefer_no_schedule

    def remove_node(self, name: str) -> None:
        row = self.index.pop(name, None)
        if row is not None:
            self.shape[row] = -1
            self._free_rows.append(row)
            self.version += 1

    def set_usage(self, name: str, gpus: int, cpu_millis: float, training: int, interactive: int) -> None:
        row = self.index.get(name)
        if row is not None:
            self.gpus_used[row] = gpus
            self.cpu_used[row] = cpu_millis
            self.training[row] = training
            self.interactive[row] = interactive

    def _grow(self) -> int:
        if self._size == len(self.shape):
            n = 2 * len(self.shape)
            self.shape = _grown(self.shape, n, -1)
            self.gpu_count = _grown(self.gpu_count, n, 0)
            self.gpus_used = _grown(self.gpus_used, n, 0)
            self.cpu_used = _grown(self.cpu_used, n, 0.0)
            self.training = _grown(self.training, n, 0)
            self.interactive = _grown(self.interactive, n, 0)
            self.prefer_no_schedule = _grown(self.prefer_no_schedule, n, False)
        self._size += 1
        return self._size - 1

    # --- reads -----------------------------------------------------------------------------------
    def rows(self, names: Sequence[str]) -> Ints:
        """Row of each name (``UNKNOWN_ROW`` for names the snapshot does not hold), in order.

        kube-scheduler often sends the same candidate list again (every node that passed its own
        filters), so the last translation is kept: comparing two lists of names is several times
        cheaper than hashing every name again. (Its parallel filters reorder the list from cycle to
        cycle on a large cluster, so the translation itself must be cheap too.)
        """
        last = self._last
        if last is not None and last[0] == self.version and len(names) == len(last[1]) and names == last[1]:
            return last[2]
        try:  # every name known: the loop runs in C
            rows = np.fromiter(map(self.index.__getitem__, names), dtype=np.int64, count=len(names))
        except KeyError:
            get = self.index.get
            rows = np.fromiter((get(n, UNKNOWN_ROW) for n in names), dtype=np.int64, count=len(names))
        self._last = (self.version, list(names), rows)  # a copy: the caller may reuse its list
        return rows

    def column(self, values: dict[str, int]) -> Ints:
        """A per-row column from a sparse name -> value map (names without a row are dropped)."""
        out = np.zeros(len(self.shape), dtype=np.int64)
        for name, v in values.items():
            row = self.index.get(name)
            if row is not None:
                out[row] = v
        return out


def _grown(a: npt.NDArray[Any], n: int, fill: float) -> Any:
    out = np.full(n, fill, dtype=a.dtype)
    out[: len(a)] = a
    return out
