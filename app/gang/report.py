"""What gangs tell the outside world: Kubernetes events on member pods and metrics.

Metrics arrive as the small :class:`GangMetrics` protocol (the service layer adapts its Prometheus
registry to it), so ``app.gang`` never imports the service's metrics module.
"""

from __future__ import annotations

import math
from typing import Protocol

from app.base.reasons import MESSAGE_PREFIX
from app.base.workload import WorkloadSpec
from app.gang.diagnose import Diagnosis
from app.gang.persist import PlanWriter

EVENT_INTERVAL = 30.0  # seconds between "cannot place" events for one gang (same reason)


class GangMetrics(Protocol):
    def solved(self, status: str, seconds: float) -> None: ...

    def outcome(self, outcome: str) -> None:
        """A gang was bound, failed (timeout, abort, deleted member) or replanned."""
        ...

    def waited(self, seconds: float) -> None:
        """A gang completed this long after its first member was filtered."""
        ...

    def reservation_expired(self) -> None: ...

    def reserved(self, gpus: int) -> None:
        """GPUs held by reservations right now."""
        ...

    def plan_rejected(self, reason: str) -> None:
        """A restored plan was dropped (a reason of app.gang.persist.REJECT_REASONS)."""
        ...


class NoMetrics:
    def solved(self, status: str, seconds: float) -> None:
        pass

    def outcome(self, outcome: str) -> None:
        pass

    def waited(self, seconds: float) -> None:
        pass

    def reservation_expired(self) -> None:
        pass

    def reserved(self, gpus: int) -> None:
        pass

    def plan_rejected(self, reason: str) -> None:
        pass


class Reporter:
    def __init__(self, metrics: GangMetrics, writer: PlanWriter | None) -> None:
        self.metrics = metrics
        self.writer = writer
        self._last: dict[str, tuple[float, str]] = {}  # gang -> (time, reason) of its last unplaceable event

    def event(self, pod: str, uid: str, reason: str, message: str, warning: bool = False) -> None:
        if self.writer is None:
            return
        ns, name = pod.split("/", 1)
        self.writer.event(ns, name, uid, reason, message, warning)

    def unplaceable(self, key: str, spec: WorkloadSpec, diag: Diagnosis, now: float) -> None:
        """A GangUnschedulable event, at most one per EVENT_INTERVAL while the reason is the same."""
        at, reason = self._last.get(key, (-math.inf, ""))
        if diag.short == reason and now - at < EVENT_INTERVAL:
            return
        self._last[key] = (now, diag.short)
        self.event(spec.key, spec.uid, "GangUnschedulable", MESSAGE_PREFIX + diag.detail, warning=True)

    def forget(self, key: str) -> None:
        self._last.pop(key, None)
