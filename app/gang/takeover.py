"""Gang plans another replica made, adopted when this extender starts being called.

With two scheduler replicas and leader election (docs/gangs.md, "Two replicas"), only the leader's
kube-scheduler calls its sidecar extender; the standby's extender keeps its watch warm but is asked
nothing, so its ledger holds only what it restored at its own start. When the leader dies mid-gang,
the standby's first filter would hand the dead leader's reserved GPUs to any other pod. Hence: the
first filter after an idle spell (none served yet, or none for ``gang_takeover_idle_seconds``)
first adopts the plans persisted on pending members, read from the watch cache (no extra list), with
the checks of the restore at start (docs/gangs.md, "Restored plans"). Gangs already in the ledger
are left alone.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from app.gang.persist import ANNOTATION, PlanRecord, records_from_pods
from app.snapshot.store import TERMINAL_PHASES

log = logging.getLogger(__name__)


class PlannedPods:
    """Pending pods that carry a gang-plan annotation, as the pod watch last saw them (a few)."""

    def __init__(self) -> None:
        self._pods: dict[str, dict[str, Any]] = {}
        self._lock = threading.Lock()

    def update(self, pod: Any, deleted: bool = False) -> None:
        """Fold one pod event in; never raises (an odd object is simply not kept)."""
        try:
            meta = pod.get("metadata") or {}
            uid = str(meta.get("uid") or "")
            ann = meta.get("annotations") or {}
            spec = pod.get("spec") or {}
            phase = (pod.get("status") or {}).get("phase")
            keep = (not deleted and isinstance(ann, dict) and bool(ann.get(ANNOTATION))
                    and not spec.get("nodeName") and phase not in TERMINAL_PHASES)
        except (AttributeError, TypeError):
            return
        with self._lock:
            if keep and uid:
                self._pods[uid] = {"metadata": meta, "spec": spec, "status": {"phase": phase}}
            else:
                self._pods.pop(uid, None)

    def replace(self, pods: list[Any]) -> None:
        """A fresh list of every pod: keep exactly the planned pending ones."""
        with self._lock:
            self._pods.clear()
        for p in pods:
            if isinstance(p, dict):
                self.update(p)

    def pods(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self._pods.values())

    def __len__(self) -> int:
        return len(self._pods)


@dataclass(eq=False)
class Takeover:
    """Called before each filter; adopts persisted plans after an idle spell. Cheap otherwise."""

    pods: Callable[[], list[dict[str, Any]]]
    adopt: Callable[[list[PlanRecord]], int]
    gpu_resources: tuple[str, ...]
    ttl: float
    idle_seconds: float
    clock: Callable[[], float] = time.monotonic
    last: float | None = field(default=None, init=False)
    adopted: int = field(default=0, init=False)

    def __call__(self) -> int:
        now = self.clock()
        idle = self.last is None or now - self.last >= self.idle_seconds
        self.last = now
        if not idle:
            return 0
        # Refusals are not counted again here: the restore at start already counted what was
        # there then, and a plan refused now is refused the same way (just not restored).
        records = records_from_pods(self.pods(), self.gpu_resources, now=time.time(), ttl=self.ttl)
        n = self.adopt(records) if records else 0
        if n:
            self.adopted += n
            log.info("adopted %d gang plan(s) persisted on pending members (another replica's, or "
                     "made before an idle spell)", n)
        return n
