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
import math
import time
from collections.abc import Callable
from typing import Any, Protocol

from app.base.reasons import MESSAGE_PREFIX, shown
from app.base.workload import GANG_GATE, PREFIX, WorkloadError, WorkloadSpec, parse_workload
from app.gang.book import GangBook

log = logging.getLogger(__name__)


class GateWriter(Protocol):
    def ungate(self, namespace: str, name: str) -> None: ...

    def event(self, namespace: str, name: str, uid: str, reason: str, message: str,
              warning: bool = False) -> None: ...


# A member still gated this long after its gate's removal was asked for is asked again at its next
# change (or its gang's): the previous attempt was refused or is waiting for its backoff.
REASK_SECONDS = 2.0


class HeldMembers:
    """A ``PodFollower`` of the cluster cache (called with the cache lock held, after the pod was
    applied to the snapshot): lifts the gate of a gang's held members when it is complete, and tells
    a held pod what it waits for (docs/gangs.md, "Held at admission"): kube-scheduler never tries a
    gated pod, so without this it would wait with no word at all."""

    def __init__(self, book: GangBook, writer: GateWriter,
                 clock: Callable[[], float] = time.monotonic,
                 incomplete: Callable[[str], None] | None = None) -> None:
        self.book = book
        self.incomplete = incomplete  # watch a gang still missing members (reported if too long)
        self.writer = writer
        self.clock = clock
        # Members whose gate removal was asked for, and when: asked again at a change after
        # REASK_SECONDS until the watch shows the gate gone.
        self._lifting: dict[str, float] = {}
        self._told: dict[str, str] = {}  # uid -> the last thing its pod was told (no repeats)

    def replace(self, pods: list[Any]) -> None:
        """A fresh list: complete gangs held while the extender was away are let go now."""
        self._lifting.clear()
        for pod in pods:
            self.update(pod)

    def update(self, pod: Any, deleted: bool = False) -> None:
        try:
            meta = pod.get("metadata") or {}
            uid = str(meta.get("uid") or "")
        except AttributeError:
            return
        spec = None if deleted else self.book.snapshot.specs.get(uid)
        if deleted or (spec is not None and not spec.held):
            self._lifting.pop(uid, None)
            self._told.pop(uid, None)
            return
        if spec is None:
            if _gated(pod):
                self._unreadable(pod, uid)
            return
        if spec.gang is None:
            self._tell(spec, "GangGateWithoutGang",
                       f"this pod carries the scheduling gate {GANG_GATE} but names no gang: nothing "
                       "will lift it; remove the gate (kubectl edit) or give the pod a gang")
            return
        key = spec.gang.key
        members = self.book.members(key)
        if (conflict := self.book.size_conflict(key)) is not None:
            for m in members:
                if m.held:
                    self._tell(m, "GangSizeConflict", f"held at admission: {conflict}")
            return
        size = self.book.size(key, spec)
        if size is None:
            self._tell(spec, "GangWaiting", f"held at admission: gang {shown(key)} has no size; set "
                       f"{PREFIX}gang-size on every member")
            return  # sized by a PodGroup: the chart's policy holds only pods with gang-size
        if len(members) < size:
            if self.incomplete is not None:
                self.incomplete(key)
            self._tell(spec, "GangWaiting", f"held at admission: waiting for gang members "
                       f"{len(members)}/{size} of gang {shown(key)}")
            return
        now = self.clock()
        held = [m for m in members if m.held
                and now - self._lifting.get(m.uid or m.key, -math.inf) >= REASK_SECONDS]
        if held:
            log.info("gang %s: all %d members exist; lifting the admission gate of %d", key, size,
                     len(held))
        for m in held:
            self._lifting[m.uid or m.key] = now
            self.writer.ungate(m.namespace, m.name)

    def _tell(self, spec: WorkloadSpec, reason: str, message: str) -> None:
        uid = spec.uid or spec.key
        if self._told.get(uid) == message:
            return
        self._told[uid] = message
        self.writer.event(spec.namespace, spec.name, uid, reason, MESSAGE_PREFIX + message,
                          warning=reason != "GangWaiting")

    def _unreadable(self, pod: dict[str, Any], uid: str) -> None:
        """A gated pod whose annotations do not parse (a gang size of "0", "abc", ""): the gate
        stays, so say why, as filter would say it to an ungated pod."""
        try:
            parse_workload(pod)
            return
        except WorkloadError as exc:
            problems = "; ".join(str(p) for p in exc.problems)
        meta = pod.get("metadata") or {}
        ns, name = str(meta.get("namespace") or "default"), str(meta.get("name") or "")
        message = MESSAGE_PREFIX + f"held at admission, and its gang cannot be read: {problems}"
        if name and self._told.get(uid) != message:
            self._told[uid] = message
            self.writer.event(ns, name, uid, "GangSizeInvalid", message, warning=True)


def _gated(pod: dict[str, Any]) -> bool:
    gates = (pod.get("spec") or {}).get("schedulingGates")
    return isinstance(gates, list) and any(isinstance(g, dict) and g.get("name") == GANG_GATE for g in gates)
