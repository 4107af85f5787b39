"""Gang plans persisted in the API server, as an annotation on each member pod.

``llm-placement.io/gang-plan: {"gang": "ns/name", "node": "n1", "planned_at": 1767..., "epoch": 3}``

Why annotations on the members rather than a CRD: no extra API to install, the data dies with the
pods, and patching a pending pod is a pod-update event, which makes kube-scheduler requeue members it
had parked as unschedulable: the plan itself wakes the gang up. An empty value means "no plan".

On start the extender lists pods once, rebuilds the ledger from these annotations (members already
bound count as fixed) and only then serves, so a restart never hands reserved GPUs to someone else.

Writes go through a small background pool so filter (synchronous in kube-scheduler) never waits on
the API server; writes to one pod are coalesced (only the newest value matters).
"""

from __future__ import annotations

import json
import logging
import queue
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from app.core.snapshot import TERMINAL_PHASES
from app.core.workload import PREFIX, WorkloadError, parse_workload

log = logging.getLogger(__name__)
ANNOTATION = PREFIX + "gang-plan"


class PlanWriter(Protocol):
    """What persistence needs from the API adapter (the service's Binder has both)."""

    def annotate(self, namespace: str, name: str, annotations: dict[str, str]) -> None: ...

    def event(self, namespace: str, name: str, uid: str, reason: str, message: str,
              warning: bool = False) -> None: ...


@dataclass(frozen=True, slots=True)
class PlanRecord:
    """One member's persisted plan, as read back from its pod."""

    gang: str
    uid: str
    pod: str  # ns/name
    node: str
    planned_at: float
    epoch: int
    gpus: int


def encode(gang: str, node: str, planned_at: float, epoch: int) -> str:
    return json.dumps({"gang": gang, "node": node, "planned_at": round(planned_at, 3), "epoch": epoch},
                      separators=(",", ":"), sort_keys=True)


def decode(value: str | None) -> dict[str, Any] | None:
    """The annotation's content, or None when empty, unreadable or not a plan."""
    if not value:
        return None
    try:
        data = json.loads(value)
    except ValueError:
        return None
    if not isinstance(data, dict) or not data.get("gang") or not data.get("node"):
        return None
    try:
        float(data.get("planned_at", 0))
        int(data.get("epoch", 0))
    except (TypeError, ValueError):
        return None
    return data


def records_from_pods(pods: Iterable[dict[str, Any]], gpu_resources: tuple[str, ...]) -> list[PlanRecord]:
    """Plans of pods still waiting to be bound (bound pods are facts, not plans)."""
    out: list[PlanRecord] = []
    for pod in pods:
        meta = pod.get("metadata") or {}
        data = decode((meta.get("annotations") or {}).get(ANNOTATION))
        if data is None:
            continue
        phase = (pod.get("status") or {}).get("phase")
        if (pod.get("spec") or {}).get("nodeName") or phase in TERMINAL_PHASES:
            continue
        try:
            spec = parse_workload(pod, gpu_resources)
        except WorkloadError:
            continue
        if spec.gang is None or spec.gang.key != data["gang"]:
            continue  # the pod changed gangs since: the record is stale
        out.append(PlanRecord(
            gang=str(data["gang"]), uid=spec.uid or spec.key, pod=spec.key, node=str(data["node"]),
            planned_at=float(data.get("planned_at", 0)), epoch=int(data.get("epoch", 0)), gpus=spec.gpus,
        ))
    return out


class PlanStore:
    """Writes plans onto the member pods and clears them (no-op without an API connection)."""

    def __init__(self, writer: PlanWriter | None) -> None:
        self.writer = writer

    def save(self, gang: str, members: Iterable[tuple[str, str]], planned_at: float, epoch: int) -> None:
        """``members``: (ns/name, node) of every unbound member of the plan."""
        if self.writer is None:
            return
        for pod, node in members:
            ns, name = pod.split("/", 1)
            self.writer.annotate(ns, name, {ANNOTATION: encode(gang, node, planned_at, epoch)})

    def clear(self, pods: Iterable[str]) -> None:
        """An empty value: "no plan" (the pods must still exist; patching a deleted pod fails)."""
        if self.writer is None:
            return
        for pod in pods:
            ns, name = pod.split("/", 1)
            self.writer.annotate(ns, name, {ANNOTATION: ""})


class BackgroundWriter:
    """Annotation patches and events off the request path, a few at a time, newest value wins."""

    def __init__(self, target: PlanWriter, workers: int = 4) -> None:
        self.target = target
        self._pending: dict[tuple[str, str], dict[str, str]] = {}
        self._queue: queue.Queue[tuple[str, tuple[Any, ...]] | None] = queue.Queue()
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._inflight = 0
        self._threads = [threading.Thread(target=self._run, name=f"gang-writer-{i}", daemon=True)
                         for i in range(workers)]
        self._started = False

    def _start(self) -> None:
        if not self._started:
            self._started = True
            for t in self._threads:
                t.start()

    def annotate(self, namespace: str, name: str, annotations: dict[str, str]) -> None:
        with self._lock:
            self._start()
            key = (namespace, name)
            fresh = key not in self._pending
            self._pending[key] = {**self._pending.get(key, {}), **annotations}
            self._inflight += 1 if fresh else 0
        if fresh:
            self._queue.put(("annotate", key))

    def event(self, namespace: str, name: str, uid: str, reason: str, message: str,
              warning: bool = False) -> None:
        with self._lock:
            self._start()
            self._inflight += 1
        self._queue.put(("event", (namespace, name, uid, reason, message, warning)))

    def drain(self, timeout: float = 10.0) -> bool:
        """Wait until everything queued so far is written (tests, shutdown)."""
        with self._idle:
            return self._idle.wait_for(lambda: self._inflight == 0, timeout)

    def stop(self) -> None:
        for _ in self._threads:
            self._queue.put(None)

    def _run(self) -> None:
        while True:
            job = self._queue.get()
            if job is None:
                return
            kind, args = job
            try:
                if kind == "annotate":
                    with self._lock:
                        annotations = self._pending.pop(args, {})
                    if annotations:
                        self.target.annotate(args[0], args[1], annotations)
                else:
                    self.target.event(*args)
            except Exception as exc:  # best effort: a lost annotation only weakens restart recovery
                log.warning("gang plan write %s %s failed: %s", kind, args[:2], exc)
            finally:
                with self._idle:
                    self._inflight -= 1
                    self._idle.notify_all()
