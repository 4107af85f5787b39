"""Lift the admission gate of a gang's members once the whole gang exists.

kube-scheduler tries every pending pod in priority, then arrival, order; the members of gangs that
never complete are tried (and turned away) again and again, and another tenant's newer pods wait
behind them however cheap the extender's answer. The chart's admission policy puts the scheduling
gate ``GANG_GATE`` on every pod of an annotated gang at creation, which keeps it out of
kube-scheduler's queue altogether; this pod follower sees each member arrive through the watch and,
once the gang's size is reached, removes the gate from every held member at once, so the gang
enters the queue whole (docs/gangs.md, "Held at admission").
"""

from __future__ import annotations

import logging
from typing import Any, Protocol

from app.gang.book import GangBook

log = logging.getLogger(__name__)


class GateWriter(Protocol):
    def ungate(self, namespace: str, name: str) -> None: ...


class HeldMembers:
    """A ``PodFollower`` of the cluster cache (called with the cache lock held, after the pod was
    applied to the snapshot): lifts the gate of a gang's held members when it is complete."""

    def __init__(self, book: GangBook, writer: GateWriter) -> None:
        self.book = book
        self.writer = writer
        # Members whose gate removal is on its way: one patch each, until the watch shows it done.
        self._lifting: set[str] = set()

    def replace(self, pods: list[Any]) -> None:
        """A fresh list: complete gangs held while the extender was away are let go now."""
        self._lifting.clear()
        for pod in pods:
            self.update(pod)

    def update(self, pod: Any, deleted: bool = False) -> None:
        try:
            uid = str((pod.get("metadata") or {}).get("uid") or "")
        except AttributeError:
            return
        spec = None if deleted else self.book.snapshot.specs.get(uid)
        if spec is None or not spec.held or spec.gang is None:
            self._lifting.discard(uid)
            return
        key = spec.gang.key
        size = self.book.size(key, spec)
        if size is None:
            return  # sized by a PodGroup: the chart's policy holds only pods with gang-size
        members = self.book.members(key)
        if len(members) < size:
            return
        held = [m for m in members if m.held and (m.uid or m.key) not in self._lifting]
        if held:
            log.info("gang %s: all %d members exist; lifting the admission gate of %d", key, size,
                     len(held))
        for m in held:
            self._lifting.add(m.uid or m.key)
            self.writer.ungate(m.namespace, m.name)
