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

log = logging.getLogger(__name__)
COMPONENT = "llm-placement"


class BindError(RuntimeError):
    pass


class Binder:
    def __init__(self, api: client.ApiClient) -> None:
        self.core = client.CoreV1Api(api)

    def current_node(self, namespace: str, name: str, uid: str) -> str:
        """The node the pod is bound to ('' if none); raise BindError if it is gone or replaced."""
        try:
            pod: Any = self.core.read_namespaced_pod(name, namespace, _request_timeout=5)
        except ApiException as exc:
            if exc.status == 404:
                raise BindError(f"llm-placement: pod {namespace}/{name} no longer exists") from None
            raise BindError(f"llm-placement: cannot read pod {namespace}/{name}: {exc.reason}") from None
        if uid and pod.metadata.uid != uid:
            raise BindError(f"llm-placement: pod {namespace}/{name} was recreated (UID changed)")
        return str(pod.spec.node_name or "")

    def read_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            resp: Any = self.core.read_namespaced_pod(
                name, namespace, _preload_content=False, _request_timeout=5
            )
        except ApiException:
            return None
        data = json.loads(resp.data)
        return data if isinstance(data, dict) else None

    def annotate(self, namespace: str, name: str, annotations: dict[str, str]) -> None:
        if annotations:
            self.core.patch_namespaced_pod(
                name, namespace, {"metadata": {"annotations": annotations}}, _request_timeout=5
            )

    def bind(self, namespace: str, name: str, uid: str, node: str) -> bool:
        """Bind; return True if this call bound it, False if it already was bound to ``node``."""
        current = self.current_node(namespace, name, uid)
        if current == node:
            return False
        if current:
            raise BindError(f"llm-placement: pod {namespace}/{name} is already bound to another node")
        body = client.V1Binding(
            metadata=client.V1ObjectMeta(name=name, namespace=namespace, uid=uid or None),
            target=client.V1ObjectReference(api_version="v1", kind="Node", name=node),
        )
        try:
            # The pods/{name}/binding subresource: the RBAC grants pods/binding, not the bindings
            # resource that POST namespaces/{ns}/bindings (create_namespaced_binding) would need.
            self.core.create_namespaced_pod_binding(
                name, namespace, body, _preload_content=False, _request_timeout=5
            )
        except ApiException as exc:
            if exc.status == 409:
                # Lost a race with ourselves (a retried bind): success only if it landed here.
                if self.current_node(namespace, name, uid) == node:
                    return False
                raise BindError(f"llm-placement: pod {namespace}/{name} is already bound") from None
            raise BindError(f"llm-placement: binding failed: {exc.status} {exc.reason}") from None
        return True

    def event(
        self, namespace: str, name: str, uid: str, reason: str, message: str, warning: bool = False
    ) -> None:
        """Best effort: an event that cannot be written never fails a bind."""
        now = dt.datetime.now(dt.UTC)
        ev = client.CoreV1Event(
            metadata=client.V1ObjectMeta(generate_name=f"{name}.", namespace=namespace),
            involved_object=client.V1ObjectReference(
                api_version="v1", kind="Pod", name=name, namespace=namespace, uid=uid or None
            ),
            reason=reason,
            message=message[:1024],
            type="Warning" if warning else "Normal",
            source=client.V1EventSource(component=COMPONENT),
            reporting_component=COMPONENT,
            reporting_instance=COMPONENT,
            first_timestamp=now,
            last_timestamp=now,
            count=1,
        )
        try:
            self.core.create_namespaced_event(namespace, ev, _request_timeout=5)
        except Exception as exc:
            log.warning("could not record event for %s/%s: %s", namespace, name, exc)
