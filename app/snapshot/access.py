"""The one door a verb has to the cluster snapshot: a consistent view to decide on, and assumptions.

Watchers (the cache's reflectors, the DRA and gang-object watchers) write the snapshot under the
service lock, one event at a time. A verb never writes it directly , in kube-scheduler's shape:

* ``view()`` — the snapshot as of one instant: held for the whole decision, so no watcher event
  lands between the first node a filter reads and the last. Taking it costs a lock acquisition
  (~0.1 us uncontended), where a copy of 500 nodes' state would cost more than the filter itself.
  While a thread holds a view, the snapshot refuses writes from that thread
  (:class:`app.snapshot.store.ReadOnlyView`) except the three below.
* ``assume(spec, node)`` — count a pod on the node kube-scheduler asked us to bind it to, before
  the Binding's API write, so the next cycle sees it.
* ``forget(uid)`` — take back an assumption whose bind was refused or failed.
* ``confirm(spec, node)`` — the API server accepted the Binding: the pod stays counted (assumed
  now if it was not at bind start) until the watch shows it bound, which replaces the assumption.

Without a cluster watch (``cluster_source: none``) the filter request's nodes are the only source
of node facts; ``observe_node`` takes them in as the watch would, before the verb takes its view.
"""

from __future__ import annotations

import threading
from types import TracebackType
from typing import Any

from app.base.workload import WorkloadSpec
from app.snapshot.nodes import NodeFacts
from app.snapshot.store import ClusterSnapshot


class _View:
    """Reentrant: a verb may call helpers that take the view again."""

    __slots__ = ("_lock", "_snap")

    def __init__(self, snap: ClusterSnapshot, lock: threading.RLock) -> None:
        self._snap = snap
        self._lock = lock

    def __enter__(self) -> ClusterSnapshot:
        self._lock.acquire()
        viewers = self._snap.viewers
        me = threading.get_ident()
        viewers[me] = viewers.get(me, 0) + 1
        return self._snap

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None,
                 tb: TracebackType | None) -> None:
        viewers = self._snap.viewers
        me = threading.get_ident()
        depth = viewers[me] - 1
        if depth:
            viewers[me] = depth
        else:
            del viewers[me]
        self._lock.release()


class SnapshotAccess:
    """A consistent view for deciding, and the verbs' only writes (see the module docstring)."""

    def __init__(self, snapshot: ClusterSnapshot, lock: threading.RLock) -> None:
        self.snapshot = snapshot
        self.lock = lock
        self._view = _View(snapshot, lock)

    def view(self) -> _View:
        """``with access.view() as snap:`` — the snapshot as of one instant, read-only for this thread."""
        return self._view

    def assume(self, spec: WorkloadSpec, node: str) -> None:
        with self.lock:
            self._write(self.snapshot.assume, spec, node)

    def forget(self, uid: str) -> None:
        with self.lock:
            self._write(self.snapshot.unassume, uid)

    def confirm(self, spec: WorkloadSpec, node: str) -> None:
        with self.lock:
            held = self.snapshot.pods.get(spec.uid or spec.key)
            if held is not None and held.node == node:
                return  # counted there already: assumed at bind start, or shown bound by the watch
            self._write(self.snapshot.assume, spec, node)

    def observe_node(self, facts: NodeFacts, inputs: dict[str, Any]) -> None:
        """A node from the request or another trusted feed, taken in as a watch event would be."""
        with self.lock:
            self._write(self.snapshot.upsert_node, facts)
            self.snapshot.node_inputs[facts.name] = inputs

    def _write(self, fn: Any, *args: Any) -> None:
        snap = self.snapshot
        was, snap.assuming = snap.assuming, True
        try:
            fn(*args)
        finally:
            snap.assuming = was
