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

import hashlib
import hmac
import json
import logging
import math
import os
import queue
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from app.base.reasons import PLAN_REJECT_REASONS
from app.base.workload import PREFIX, WorkloadError, parse_workload
from app.gang.regroup import Timers, thread_timers
from app.snapshot.store import TERMINAL_PHASES

log = logging.getLogger(__name__)
ANNOTATION = PREFIX + "gang-plan"
# The signing key (docs/gangs.md, "Restored plans"): a file (a mounted Secret) or the value itself.
# Not a settings key on purpose: settings live in a ConfigMap that many can read.
KEY_FILE_ENV, KEY_ENV = "LLMP_GANG_PLAN_KEY_FILE", "LLMP_GANG_PLAN_KEY"
# Why a persisted plan was not restored: the vocabulary lives in app.base.reasons.
REJECT_REASONS = PLAN_REJECT_REASONS
FUTURE_SKEW_SECONDS = 30.0  # a plan "made" further in the future than this is forged or mis-clocked
MAX_EPOCH = 2**31


def load_key(env: dict[str, str] | None = None) -> bytes | None:
    """The gang-plan signing key from the environment, or None (plans unsigned, see docs/gangs.md)."""
    env = dict(os.environ) if env is None else env
    if path := env.get(KEY_FILE_ENV):
        try:
            with open(path, "rb") as f:
                key = f.read().strip()
        except OSError as exc:
            raise RuntimeError(f"cannot read the gang-plan key file {path} ({KEY_FILE_ENV}): "
                               f"{exc.strerror}") from None
    else:
        key = env.get(KEY_ENV, "").strip().encode()
    if key and len(key) < 16:
        raise RuntimeError(f"the gang-plan key ({KEY_FILE_ENV} or {KEY_ENV}) must be at least 16 bytes")
    return key or None


class PlanSigner:
    """HMAC-SHA256 over a plan and the pod it is written on, so a tenant who can annotate its own
    pods cannot forge a reservation that a restarted extender would restore."""

    def __init__(self, key: bytes | None) -> None:
        self.key = key

    def sign(self, pod: str, gang: str, node: str, planned_at: float, epoch: int) -> str:
        if self.key is None:
            return ""
        msg = json.dumps([pod, gang, node, round(planned_at, 3), epoch], separators=(",", ":"))
        return hmac.new(self.key, msg.encode(), hashlib.sha256).hexdigest()[:32]

    def verify(self, pod: str, data: dict[str, Any]) -> bool:
        if self.key is None:
            return True
        sig = data.get("sig")
        want = self.sign(pod, str(data["gang"]), str(data["node"]), float(data.get("planned_at", 0)),
                         int(data.get("epoch", 0)))
        return isinstance(sig, str) and hmac.compare_digest(sig, want)


_signer: PlanSigner | None = None


def default_signer() -> PlanSigner:
    """The process's signer, from the environment on first use."""
    global _signer
    if _signer is None:
        _signer = PlanSigner(load_key())
    return _signer


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


def encode(gang: str, node: str, planned_at: float, epoch: int, pod: str = "",
           signer: PlanSigner | None = None) -> str:
    data: dict[str, Any] = {"gang": gang, "node": node, "planned_at": round(planned_at, 3), "epoch": epoch}
    sig = (signer or default_signer()).sign(pod, gang, node, planned_at, epoch)
    if sig:
        data["sig"] = sig
    return json.dumps(data, separators=(",", ":"), sort_keys=True)


def decode(value: str | None) -> dict[str, Any] | None:
    """The annotation's content, or None when empty, unreadable or not a plan."""
    if not value:
        return None
    try:
        data = json.loads(value)
    except ValueError:
        return None
    if not isinstance(data, dict) or not isinstance(data.get("gang"), str) \
            or not isinstance(data.get("node"), str) or not data["gang"] or not data["node"]:
        return None
    planned_at, epoch = data.get("planned_at", 0), data.get("epoch", 0)
    if isinstance(planned_at, bool) or not isinstance(planned_at, int | float) \
            or not math.isfinite(planned_at) or isinstance(epoch, bool) or not isinstance(epoch, int) \
            or not 0 <= epoch <= MAX_EPOCH:
        return None
    return data


Reject = Callable[[str], None]


def records_from_pods(
    pods: Iterable[dict[str, Any]], gpu_resources: tuple[str, ...], *, now: float | None = None,
    ttl: float | None = None, signer: PlanSigner | None = None, rejected: Reject | None = None,
    skipped: Callable[[Any, BaseException], None] | None = None,
) -> list[PlanRecord]:
    """Plans of pods still waiting to be bound (bound pods are facts, not plans).

    Only plans we could have written are kept (docs/gangs.md, "Restored plans"): signed with our
    key when one is configured, made no later than now (plus clock skew) and, with ``ttl``, not yet
    expired. ``rejected(reason)`` hears of each refused plan; a pod that cannot be read at all costs
    only itself (``skipped``).
    """
    signer = signer or default_signer()
    out: list[PlanRecord] = []
    for pod in pods:
        try:
            rec = _record(pod, gpu_resources, now, ttl, signer, rejected or (lambda _: None))
        except Exception as exc:
            if skipped is not None:
                skipped(pod, exc)
            continue
        if rec is not None:
            out.append(rec)
    return out


def _record(pod: Any, gpu_resources: tuple[str, ...], now: float | None, ttl: float | None,
            signer: PlanSigner, rejected: Reject) -> PlanRecord | None:
    meta = pod.get("metadata") or {}
    value = (meta.get("annotations") or {}).get(ANNOTATION)
    if not value:
        return None
    data = decode(value if isinstance(value, str) else None)
    if data is None:
        rejected("unreadable")
        return None
    phase = (pod.get("status") or {}).get("phase")
    if (pod.get("spec") or {}).get("nodeName") or phase in TERMINAL_PHASES:
        return None
    try:
        spec = parse_workload(pod, gpu_resources)
    except WorkloadError:
        return None
    if spec.gang is None or spec.gang.key != data["gang"]:
        rejected("gang_mismatch")  # the pod changed gangs since, or names a gang it is not in
        return None
    if not signer.verify(spec.key, data):
        rejected("bad_signature" if data.get("sig") else "unsigned")
        return None
    planned_at = float(data.get("planned_at", 0))
    if now is not None and planned_at > now + FUTURE_SKEW_SECONDS:
        rejected("future")
        return None
    if now is not None and ttl is not None and planned_at + ttl <= now:
        rejected("expired")
        return None
    return PlanRecord(
        gang=str(data["gang"]), uid=spec.uid or spec.key, pod=spec.key, node=str(data["node"]),
        planned_at=planned_at, epoch=int(data.get("epoch", 0)), gpus=spec.gpus,
    )


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
            self.writer.annotate(ns, name, {ANNOTATION: encode(gang, node, planned_at, epoch, pod)})

    def clear(self, pods: Iterable[str]) -> None:
        """An empty value: "no plan" (the pods must still exist; patching a deleted pod fails)."""
        if self.writer is None:
            return
        for pod in pods:
            ns, name = pod.split("/", 1)
            self.writer.annotate(ns, name, {ANNOTATION: ""})


# Backoff between attempts to lift a gang gate the API server refused (an admission webhook, an
# outage): never given up while the pod exists, since a gate left in place holds a complete gang
# forever (docs/gangs.md, "Held at admission").
UNGATE_RETRY_SECONDS = (1.0, 3.0, 10.0, 30.0, 60.0)


class BackgroundWriter:
    """Annotation patches and events off the request path, a few at a time, newest value wins."""

    def __init__(self, target: PlanWriter, workers: int = 4, timers: Timers | None = None) -> None:
        self.target = target
        self.timers: Timers = timers or thread_timers
        # (namespace, name) -> (the timer of the next attempt, attempts made): gate lifts refused.
        self._ungate_retries: dict[tuple[str, str], tuple[Any, int]] = {}
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

    def ungate(self, namespace: str, name: str) -> None:
        """Lift the gang's admission gate (app/gang/admission.py); the target must offer ``ungate``.
        A lift whose retry is waiting is tried now (a member or gang-object change asks again)."""
        with self._lock:
            self._start()
            retry = self._ungate_retries.pop((namespace, name), None)
            self._inflight += 1
        if retry is not None:
            retry[0].cancel()
        self._queue.put(("ungate", (namespace, name, retry[1] if retry is not None else 0)))

    def drain(self, timeout: float = 10.0) -> bool:
        """Wait until everything queued so far is written (tests, shutdown)."""
        with self._idle:
            return self._idle.wait_for(lambda: self._inflight == 0, timeout)

    def _ungate(self, namespace: str, name: str, attempt: int = 0) -> None:
        try:
            self.target.ungate(namespace, name)  # type: ignore[attr-defined]
        except Exception as exc:  # refused or unreachable: again after a backoff, until it works
            delay = UNGATE_RETRY_SECONDS[min(attempt, len(UNGATE_RETRY_SECONDS) - 1)]
            log.warning("lifting the gang gate of %s/%s failed (%s); again in %.0f s", namespace,
                        name, exc, delay)
            timer = self.timers(delay, lambda: self._retry_ungate(namespace, name))
            with self._lock:
                self._ungate_retries[(namespace, name)] = (timer, attempt + 1)

    def _retry_ungate(self, namespace: str, name: str) -> None:
        with self._lock:
            retry = self._ungate_retries.pop((namespace, name), None)
            if retry is None:
                return  # asked again meanwhile: that attempt is on its way
            self._inflight += 1
        self._queue.put(("ungate", (namespace, name, retry[1])))

    def pending_ungates(self) -> int:
        """Gate lifts waiting for their next attempt."""
        with self._lock:
            return len(self._ungate_retries)

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
                elif kind == "ungate":
                    self._ungate(*args)
                else:
                    self.target.event(*args)
            except Exception as exc:  # best effort: a lost annotation only weakens restart recovery
                log.warning("gang plan write %s %s failed: %s", kind, args[:2], exc)
            finally:
                with self._idle:
                    self._inflight -= 1
                    self._idle.notify_all()
