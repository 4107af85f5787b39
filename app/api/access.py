"""Who may ask ``/explain/{namespace}/{pod}``: the same people the API server lets read that pod.

Explain tells where a pod runs, what else is on the candidate nodes and why; open to anyone who can
reach the port, it would show one namespace's placements to another. With the API server as the
authority, a caller presents a bearer token (``kubectl create token``, a ServiceAccount token or the
user's own); the extender asks the API server who that is (TokenReview) and whether they may ``get``
that pod (SubjectAccessReview), and caches both answers briefly so a dashboard refreshing explain does
not turn into an API storm. See docs/extender-protocol.md, "Explain and who may read it".
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from typing import Protocol

import orjson

from app.cluster.rest import RestLike

log = logging.getLogger(__name__)
DECISION_TTL_SECONDS = 30.0
# A rejected token is remembered briefly too: a thousand calls with a bad token must not become a
# thousand TokenReviews (docs/extender-protocol.md, "Explain and who may read it").
REJECTED_TTL_SECONDS = 10.0
MAX_CACHED = 10_000


class ExplainAccess(Protocol):
    def check(self, authorization: str | None, namespace: str, name: str) -> tuple[int, str]:
        """(200, "") when allowed, else an HTTP status (401, 403, 503) and the reason."""
        ...


class OpenAccess:
    """No API server to ask (the demo, ``cluster_source: none``): explain is open."""

    def check(self, authorization: str | None, namespace: str, name: str) -> tuple[int, str]:
        return 200, ""


class KubernetesAccess:
    def __init__(self, rest: RestLike, ttl: float = DECISION_TTL_SECONDS) -> None:
        self.rest = rest
        self.ttl = ttl
        self._lock = threading.Lock()
        self._decisions: dict[tuple[str, str, str], tuple[float, int, str]] = {}
        self._rejected: dict[str, tuple[float, str]] = {}  # token digest -> (when, why)

    def check(self, authorization: str | None, namespace: str, name: str) -> tuple[int, str]:
        scheme, _, token = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return 401, ("explain needs a bearer token of someone allowed to get the pod "
                         "(e.g. `llm-placement explain --token \"$(kubectl create token NAME)\"`)")
        # The token itself is never kept: only a digest keys the cached decision.
        digest = hashlib.sha256(token.strip().encode()).hexdigest()
        key = (digest, namespace, name)
        now = time.monotonic()
        with self._lock:
            rejected = self._rejected.get(digest)
            hit = self._decisions.get(key)
        if rejected is not None and now - rejected[0] < REJECTED_TTL_SECONDS:
            return 401, rejected[1]
        if hit is not None and now - hit[0] < self.ttl:
            return hit[1], hit[2]
        status, reason = self._ask(token.strip(), namespace, name)
        # API failures (503) are not cached: the next call asks again.
        with self._lock:
            if status == 401:
                if len(self._rejected) >= MAX_CACHED:
                    self._rejected.clear()
                self._rejected[digest] = (now, reason)
            elif status in (200, 403):
                if len(self._decisions) >= MAX_CACHED:
                    self._decisions.clear()
                self._decisions[key] = (now, status, reason)
        return status, reason

    def _ask(self, token: str, namespace: str, name: str) -> tuple[int, str]:
        try:
            review = orjson.loads(self.rest.request("POST", "/apis/authentication.k8s.io/v1/tokenreviews", {
                "apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": token}}))
            status = review.get("status") or {}
            if not status.get("authenticated"):
                return 401, "the bearer token was not accepted by the API server"
            user = status.get("user") or {}
            sar = orjson.loads(self.rest.request(
                "POST", "/apis/authorization.k8s.io/v1/subjectaccessreviews", {
                    "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
                    "spec": {"user": user.get("username", ""), "groups": user.get("groups") or [],
                             "uid": user.get("uid", ""), "extra": user.get("extra") or {},
                             "resourceAttributes": {"namespace": namespace, "verb": "get",
                                                    "resource": "pods", "name": name}}}))
        except Exception as exc:
            log.warning("explain authorization could not be checked: %s", exc)
            return 503, "cannot check authorization with the API server right now"
        if (sar.get("status") or {}).get("allowed"):
            return 200, ""
        who = user.get("username", "?")
        return 403, f"{who} may not get pod {namespace}/{name}, so may not see how it was placed"
