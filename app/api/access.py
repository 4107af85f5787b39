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
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

import orjson

from app.cluster.rest import RestLike

K = TypeVar("K")
V = TypeVar("V")

log = logging.getLogger(__name__)
DECISION_TTL_SECONDS = 30.0
# Negative answers are remembered briefly too: without it a thousand calls with one bad token are a
# thousand TokenReviews, each a round trip the API server also owes kube-scheduler. Short, so a
# token just granted access (or just created) works again within seconds.
REJECTED_TTL_SECONDS = 10.0
# A valid token may still be denied pod after pod (a caller guessing names): after this many denials
# within REJECTED_TTL_SECONDS the token is refused (429) without asking, until the window passes.
DENIALS_PER_WINDOW = 5
# Reviews sent for explain, all tokens together: a bucket of REVIEW_BURST refilled at this rate, so
# a flood of distinct made-up tokens costs the API server a bounded trickle, not one review each.
REVIEWS_PER_SECOND = 5.0
REVIEW_BURST = 20
MAX_CACHED = 10_000
RETRY_AFTER_SECONDS = int(REJECTED_TTL_SECONDS)
BUSY = "too many explain authorizations at once; retry shortly"
API_DOWN = "cannot check authorization with the API server right now"
NO_TOKEN = ("explain needs a bearer token of someone allowed to get the pod "
            "(e.g. `llm-placement explain --token \"$(kubectl create token NAME)\"`)")


class ExplainAccess(Protocol):
    def check(self, authorization: str | None, namespace: str, name: str) -> tuple[int, str]:
        """(200, "") when allowed, else an HTTP status (401, 403, 429, 503) and the reason."""
        ...


class OpenAccess:
    """No API server to ask (the demo, ``cluster_source: none``): explain is open."""

    def check(self, authorization: str | None, namespace: str, name: str) -> tuple[int, str]:
        return 200, ""


class TtlCache(Generic[K, V]):
    """At most ``size`` entries, each valid until its own expiry; the oldest goes first when full, so
    a flood of new keys evicts itself instead of clearing every decision at once."""

    def __init__(self, size: int = MAX_CACHED) -> None:
        self.size = size
        self._items: OrderedDict[K, tuple[float, V]] = OrderedDict()

    def get(self, key: K, now: float) -> V | None:
        hit = self._items.get(key)
        if hit is None:
            return None
        if now >= hit[0]:
            del self._items[key]
            return None
        return hit[1]

    def put(self, key: K, value: V, expires: float) -> None:
        self._items.pop(key, None)
        self._items[key] = (expires, value)
        while len(self._items) > self.size:
            self._items.popitem(last=False)

    def __len__(self) -> int:
        return len(self._items)


@dataclass(frozen=True, slots=True)
class Identity:
    """A TokenReview's answer: who the token belongs to, or None and why not."""

    user: dict[str, Any] | None
    reason: str = ""


class KubernetesAccess:
    """Asks the API server (TokenReview, then SubjectAccessReview); remembers answers by token digest.

    Not more than a handful of reviews per bad token: a rejected token is remembered for
    REJECTED_TTL_SECONDS, a token denied DENIALS_PER_WINDOW pods is refused for the rest of that
    window, and all reviews together draw on one budget (REVIEWS_PER_SECOND, REVIEW_BURST).
    """

    def __init__(self, rest: RestLike, ttl: float = DECISION_TTL_SECONDS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.rest = rest
        self.ttl = ttl
        self.clock = clock
        self._lock = threading.Lock()
        self._identities: TtlCache[str, Identity] = TtlCache()
        self._decisions: TtlCache[tuple[str, str, str], tuple[int, str]] = TtlCache()
        # digest -> (end of the window, denials in it)
        self._denials: TtlCache[str, tuple[float, int]] = TtlCache()
        self._budget = float(REVIEW_BURST)
        self._refilled = clock()

    def check(self, authorization: str | None, namespace: str, name: str) -> tuple[int, str]:
        scheme, _, token = (authorization or "").partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            return 401, NO_TOKEN
        # The token itself is never kept: only a digest keys the cached answers.
        digest = hashlib.sha256(token.encode()).hexdigest()
        now = self.clock()
        with self._lock:
            who = self._identities.get(digest, now)
            decided = self._decisions.get((digest, namespace, name), now)
            denials = self._denials.get(digest, now)
        if who is not None and who.user is None:
            return 401, who.reason
        if decided is not None:
            return decided
        if denials is not None and denials[1] >= DENIALS_PER_WINDOW:
            return 429, f"this token was denied {denials[1]} pods in a row; retry in {RETRY_AFTER_SECONDS} s"
        if who is None:
            if not self._spend():
                return 429, BUSY
            who = self._review_token(token)
            if who is None:
                return 503, API_DOWN
            self._remember_identity(digest, who, now)
        if who.user is None:
            return 401, who.reason
        if not self._spend():
            return 429, BUSY
        return self._authorize(digest, who.user, namespace, name, now)

    def _authorize(self, digest: str, user: dict[str, Any], namespace: str, name: str,
                   now: float) -> tuple[int, str]:
        status, reason = self._review_access(user, namespace, name)
        if status == 503:  # API failures are not cached: the next call asks again
            return status, reason
        with self._lock:
            self._decisions.put((digest, namespace, name), (status, reason),
                                now + (self.ttl if status == 200 else REJECTED_TTL_SECONDS))
            if status == 403:
                # The window opens at the first denial; later denials count in it, never extend it.
                end, count = self._denials.get(digest, now) or (now + REJECTED_TTL_SECONDS, 0)
                self._denials.put(digest, (end, count + 1), end)
        return status, reason

    def _remember_identity(self, digest: str, who: Identity, now: float) -> None:
        ttl = self.ttl if who.user is not None else REJECTED_TTL_SECONDS
        with self._lock:
            self._identities.put(digest, who, now + ttl)

    def _spend(self) -> bool:
        """Take one review from the shared budget; False when it is spent (the caller answers 429)."""
        with self._lock:
            now = self.clock()
            self._budget = min(float(REVIEW_BURST),
                               self._budget + (now - self._refilled) * REVIEWS_PER_SECOND)
            self._refilled = now
            if self._budget < 1:
                return False
            self._budget -= 1
            return True

    def _review_token(self, token: str) -> Identity | None:
        """Who the token is (TokenReview); None when the API server could not be asked."""
        try:
            review = orjson.loads(self.rest.request("POST", "/apis/authentication.k8s.io/v1/tokenreviews", {
                "apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": token}}))
        except Exception as exc:
            log.warning("explain authorization could not be checked: %s", exc)
            return None
        status = review.get("status") if isinstance(review, dict) else None
        if not isinstance(status, dict) or not status.get("authenticated"):
            return Identity(None, "the bearer token was not accepted by the API server")
        user = status.get("user")
        return Identity(user if isinstance(user, dict) else {})

    def _review_access(self, user: dict[str, Any], namespace: str, name: str) -> tuple[int, str]:
        try:
            sar = orjson.loads(self.rest.request(
                "POST", "/apis/authorization.k8s.io/v1/subjectaccessreviews", {
                    "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
                    "spec": {"user": user.get("username", ""), "groups": user.get("groups") or [],
                             "uid": user.get("uid", ""), "extra": user.get("extra") or {},
                             "resourceAttributes": {"namespace": namespace, "verb": "get",
                                                    "resource": "pods", "name": name}}}))
        except Exception as exc:
            log.warning("explain authorization could not be checked: %s", exc)
            return 503, API_DOWN
        if isinstance(sar, dict) and (sar.get("status") or {}).get("allowed"):
            return 200, ""
        who = user.get("username", "?")
        return 403, f"{who} may not get pod {namespace}/{name}, so may not see how it was placed"
