"""Create Bindings and Events through the API server (the scheduler does not bind for a binder extender).

Bind is idempotent: a retry for a pod already on that node is a success, one already elsewhere is an
error; the pod UID is a precondition so a recreated pod with the same name is never bound by mistake.
"""

from __future__ import annotations

import datetime as dt
import logging
import queue
import threading
import time
from typing import Any
from urllib.parse import quote

import orjson
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from app.base.reasons import EVENT_MESSAGE_CHARS, one_line
from app.base.workload import GANG_GATE
from app.cluster.rest import JsonRest, RestLike

log = logging.getLogger(__name__)
COMPONENT = "llm-placement"
# Events wait here for the writer threads; past this many (an API server outage during a burst) new
# ones are dropped and counted in the log, never blocking a bind.
EVENT_BACKLOG = 10_000
EVENT_WRITERS = 4


def _pod_path(namespace: str, name: str) -> str:
    return f"/api/v1/namespaces/{quote(namespace, safe='')}/pods/{quote(name, safe='')}"


class BindError(RuntimeError):
    pass


class Binder:
    def __init__(self, api: client.ApiClient, rest: RestLike | None = None) -> None:
        # ``rest``: how the calls are sent (tests hand a recorder); raw JSON over keep-alive
        # connections with the client's credentials (app/cluster/rest.py).
        self.rest: RestLike = rest or JsonRest(api)
        # Events are written off the bind path: a Placed event used to double a bind's API time,
        # and kube-scheduler waits for the bind answer. One writer could not keep up once the API
        # server took tens of ms per write (one event per pod at 80+ pods/s); each pod's events go
        # to one writer by its name, so they keep their order.
        self._queues: list[queue.Queue[tuple[str, dict[str, Any]] | None]] = [
            queue.Queue(EVENT_BACKLOG // EVENT_WRITERS) for _ in range(EVENT_WRITERS)]
        self._dropped = 0
        self._writers = [threading.Thread(target=self._write_events, args=(q,), name=f"event-writer-{i}",
                                          daemon=True) for i, q in enumerate(self._queues)]
        for w in self._writers:
            w.start()

    def current_node(self, namespace: str, name: str, uid: str) -> str:
        """The node the pod is bound to ('' if none); raise BindError if it is gone or replaced."""
        pod = self.read_pod(namespace, name, raise_errors=True)
        assert pod is not None
        meta = pod.get("metadata") or {}
        if uid and meta.get("uid") != uid:
            raise BindError(f"llm-placement: pod {namespace}/{name} was recreated (UID changed)")
        return str((pod.get("spec") or {}).get("nodeName") or "")

    def read_pod(self, namespace: str, name: str, raise_errors: bool = False) -> dict[str, Any] | None:
        # Raw JSON, not the client's models: deserialising a V1Pod costs milliseconds of CPU under
        # the GIL, on the same interpreter that answers kube-scheduler's filter calls.
        try:
            data = orjson.loads(self.rest.request("GET", _pod_path(namespace, name)))
        except ApiException as exc:
            if not raise_errors:
                return None
            if exc.status == 404:
                raise BindError(f"llm-placement: pod {namespace}/{name} no longer exists") from None
            raise BindError(f"llm-placement: cannot read pod {namespace}/{name}: {exc.reason}") from None
        return data if isinstance(data, dict) else None

    def annotate(self, namespace: str, name: str, annotations: dict[str, str]) -> None:
        if annotations:
            self.rest.request("PATCH", _pod_path(namespace, name), {"metadata": {"annotations": annotations}},
                              content_type="application/strategic-merge-patch+json")

    def ungate(self, namespace: str, name: str) -> None:
        """Remove the gang's admission gate, leaving any other gate in place (a strategic merge
        patch deletes the one entry by its merge key; removing gates is the one change to
        ``schedulingGates`` the API server allows after creation)."""
        body = {"spec": {"schedulingGates": [{"$patch": "delete", "name": GANG_GATE}]}}
        try:
            self.rest.request("PATCH", _pod_path(namespace, name), body,
                              content_type="application/strategic-merge-patch+json")
        except ApiException as exc:
            if exc.status != 404:  # a deleted member has nothing left to lift
                raise

    def bind(self, namespace: str, name: str, uid: str, node: str,
             annotations: dict[str, str] | None = None) -> bool:
        """Bind; return True if this call bound it, False if it already was bound to ``node``.

        ``annotations`` ride on the Binding: the API server sets them on the pod as it binds it, so
        they need no write of their own.

        One API call on the happy path: the Binding carries the pod UID as a precondition, and the
        API server answers 409 for a pod that is already bound or was recreated, which is when we
        read the pod to tell "already here" (success, idempotent) from "elsewhere" (error).
        """
        body: Any = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": name, "namespace": namespace, **({"uid": uid} if uid else {}),
                         **({"annotations": annotations} if annotations else {})},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }
        try:
            # The pods/{name}/binding subresource: the RBAC grants pods/binding, not the bindings
            # resource that POST namespaces/{ns}/bindings (create_namespaced_binding) would need.
            self.rest.request("POST", _pod_path(namespace, name) + "/binding", body)
        except ApiException as exc:
            if exc.status == 404:
                raise BindError(f"llm-placement: pod {namespace}/{name} no longer exists") from None
            if exc.status == 409:
                current = self.current_node(namespace, name, uid)
                if current == node:
                    return False
                if current:
                    raise BindError(
                        f"llm-placement: pod {namespace}/{name} is already bound to another node"
                    ) from None
                msg = f"llm-placement: binding conflict for {namespace}/{name}: {exc.reason}"
                raise BindError(msg) from None
            raise BindError(f"llm-placement: binding failed: {exc.status} {exc.reason}") from None
        return True

    def event(
        self, namespace: str, name: str, uid: str, reason: str, message: str, warning: bool = False
    ) -> None:
        """Best effort: an event that cannot be written never fails a bind."""
        now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        ev: Any = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{name}.", "namespace": namespace},
            "involvedObject": {"apiVersion": "v1", "kind": "Pod", "name": name, "namespace": namespace,
                               **({"uid": uid} if uid else {})},
            "reason": reason,
            # Escaped and bounded here too, whatever the caller quoted: events are read in terminals.
            "message": one_line(message, EVENT_MESSAGE_CHARS),
            "type": "Warning" if warning else "Normal",
            "source": {"component": COMPONENT},
            "reportingComponent": COMPONENT,
            "reportingInstance": COMPONENT,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        try:
            self._queues[hash((namespace, name)) % EVENT_WRITERS].put_nowait((namespace, ev))
        except queue.Full:
            self._dropped += 1
            if self._dropped in (1, 10, 100) or self._dropped % 1000 == 0:
                log.warning("event backlog full (%d queued): %d event(s) dropped so far",
                            EVENT_BACKLOG, self._dropped)

    def flush(self, timeout: float = 5.0) -> bool:
        """Wait until queued events are written (tests, shutdown); False on timeout."""
        deadline = time.monotonic() + timeout
        marks = []
        for q in self._queues:
            done = threading.Event()
            q.put(("", {"flush": done}))
            marks.append(done)
        return all(m.wait(max(0.0, deadline - time.monotonic())) for m in marks)

    def close(self) -> None:
        for q in self._queues:
            q.put(None)
        for w in self._writers:
            w.join(timeout=5)

    def _write_events(self, events: queue.Queue[tuple[str, dict[str, Any]] | None]) -> None:
        while (item := events.get()) is not None:
            namespace, ev = item
            if "flush" in ev:
                ev["flush"].set()
                continue
            try:
                self.rest.request("POST", f"/api/v1/namespaces/{quote(namespace, safe='')}/events", ev)
            except Exception as exc:
                log.warning("could not record event for %s/%s: %s", namespace,
                            ev["involvedObject"]["name"], exc)
