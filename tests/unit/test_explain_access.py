"""The explain authorization's decisions, against a scripted API server answer (the real one: the
integration test tests/integration/test_explain_access.py)."""

from __future__ import annotations

from typing import Any

import orjson

from app.api.access import KubernetesAccess


class Api:
    """Answers TokenReview and SubjectAccessReview the way the API server does, from tables."""

    def __init__(self, users: dict[str, str], may_read: dict[str, set[str]]) -> None:
        self.users, self.may_read, self.calls = users, may_read, 0

    def request(self, method: str, path: str, body: Any = None) -> bytes:
        self.calls += 1
        if path.endswith("/tokenreviews"):
            user = self.users.get(body["spec"]["token"])
            status = {"authenticated": True, "user": {"username": user}} if user else {"authenticated": False}
            return orjson.dumps({"status": status})
        attrs = body["spec"]["resourceAttributes"]
        assert attrs["verb"] == "get" and attrs["resource"] == "pods"
        allowed = attrs["namespace"] in self.may_read.get(body["spec"]["user"], set())
        return orjson.dumps({"status": {"allowed": allowed}})


def test_decisions_and_caching() -> None:
    api = Api({"t-alice": "alice"}, {"alice": {"team-a"}})
    access = KubernetesAccess(api)
    assert access.check(None, "team-a", "p")[0] == 401
    assert access.check("Basic abc", "team-a", "p")[0] == 401
    assert access.check("Bearer nope", "team-a", "p")[0] == 401
    assert access.check("Bearer t-alice", "team-a", "p") == (200, "")
    status, reason = access.check("Bearer t-alice", "team-b", "p")
    assert status == 403 and "alice may not get pod team-b/p" in reason
    calls = api.calls
    assert access.check("Bearer t-alice", "team-a", "p") == (200, "")
    assert api.calls == calls  # answered from the short-lived cache


def test_api_failure_is_503_and_not_cached() -> None:
    class Down:
        calls = 0

        def request(self, method: str, path: str, body: Any = None) -> bytes:
            self.calls += 1
            raise ConnectionError("apiserver down")

    down = Down()
    access = KubernetesAccess(down)
    assert access.check("Bearer t", "ns", "p")[0] == 503
    assert access.check("Bearer t", "ns", "p")[0] == 503
    assert down.calls == 2
