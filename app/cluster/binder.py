"""Create Bindings and Events through the API server (the scheduler does not bind for a binder extender).

Bind is idempotent: a retry for a pod already on that node is a success, one already elsewhere is an
error; the pod UID is a precondition so a recreated pod with the same name is never bound by mistake.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from app.cluster.client import raw

log = logging.getLogger(__name__)
COMPONENT = "llm-placement"


class BindError(RuntimeError):
    pass


class Binder:
    def __init__(self, api: client.ApiClient) -> None:
        self.core = client.CoreV1Api(api)

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
            data = json.loads(raw(self.core.read_namespaced_pod, name, namespace, _request_timeout=5))
        except ApiException as exc:
            if not raise_errors:
                return None
            if exc.status == 404:
                raise BindError(f"llm-placement: pod {namespace}/{name} no longer exists") from None
            raise BindError(f"llm-placement: cannot read pod {namespace}/{name}: {exc.reason}") from None
        return data if isinstance(data, dict) else None

    def annotate(self, namespace: str, name: str, annotations: dict[str, str]) -> None:
        if annotations:
            self.core.patch_namespaced_pod(
                name, namespace, {"metadata": {"annotations": annotations}}, _request_timeout=5
            )

    def bind(self, namespace: str, name: str, uid: str, node: str) -> bool:
        """Bind; return True if this call bound it, False if it already was bound to ``node``.

        One API call on the happy path: the Binding carries the pod UID as a precondition, and the
        API server answers 409 for a pod that is already bound or was recreated, which is when we
        read the pod to tell "already here" (success, idempotent) from "elsewhere" (error).
        """
        body: Any = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": name, "namespace": namespace, **({"uid": uid} if uid else {})},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }
        try:
            # The pods/{name}/binding subresource: the RBAC grants pods/binding, not the bindings
            # resource that POST namespaces/{ns}/bindings (create_namespaced_binding) would need.
            raw(self.core.create_namespaced_pod_binding, name, namespace, body, _request_timeout=5)
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
            "message": message[:1024],
            "type": "Warning" if warning else "Normal",
            "source": {"component": COMPONENT},
            "reportingComponent": COMPONENT,
            "reportingInstance": COMPONENT,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        try:
            raw(self.core.create_namespaced_event, namespace, ev, _request_timeout=5)
        except Exception as exc:
            log.warning("could not record event for %s/%s: %s", namespace, name, exc)
