"""The explain authorization's decisions, against a scripted API server answer (the real one: the
integration test tests/integration/test_explain_access.py)."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import httpx
import orjson
import pytest

import app.extender.explain
from app.api import routes
from app.api.access import (
    DENIALS_PER_WINDOW,
    REJECTED_TTL_SECONDS,
    REVIEW_BURST,
    REVIEWS_PER_SECOND,
    KubernetesAccess,
)
from app.api.app import create_fastapi
from app.base.catalog import GpuCatalog
from app.config.settings import Settings
from app.extender.service import ExtenderService


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


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def reviews(api: CountingApi) -> tuple[int, int]:
    return api.paths.count("tokenreviews"), api.paths.count("subjectaccessreviews")


class CountingApi(Api):
    """The scripted API server, counting each kind of review it is sent."""

    def __init__(self, users: dict[str, str], may_read: dict[str, set[str]]) -> None:
        super().__init__(users, may_read)
        self.paths: list[str] = []

    def request(self, method: str, path: str, body: Any = None) -> bytes:
        self.paths.append(path.rsplit("/", 1)[-1])
        return super().request(method, path, body)


def test_a_thousand_calls_with_a_rejected_token_send_one_token_review() -> None:
    clock = Clock()
    api = CountingApi({"t-alice": "alice"}, {"alice": {"team-a"}})
    access = KubernetesAccess(api, clock=clock)
    for i in range(1000):
        assert access.check("Bearer forged", "team-a", f"p{i}")[0] == 401
    assert reviews(api) == (1, 0)
    clock.now += REJECTED_TTL_SECONDS  # remembered briefly: a token created since then works
    assert access.check("Bearer forged", "team-a", "p")[0] == 401
    assert reviews(api) == (2, 0)


def test_a_valid_token_guessing_pod_names_is_cut_off_after_a_few_denials() -> None:
    clock = Clock()
    api = CountingApi({"t-alice": "alice"}, {"alice": {"team-a"}})
    access = KubernetesAccess(api, clock=clock)
    statuses = [access.check("Bearer t-alice", "team-b", f"p{i}")[0] for i in range(1000)]
    assert statuses[:DENIALS_PER_WINDOW] == [403] * DENIALS_PER_WINDOW
    assert set(statuses[DENIALS_PER_WINDOW:]) == {429}
    assert reviews(api) == (1, DENIALS_PER_WINDOW)  # who alice is: asked once
    clock.now += REJECTED_TTL_SECONDS
    assert access.check("Bearer t-alice", "team-a", "p") == (200, "")


def test_a_flood_of_made_up_tokens_draws_on_one_review_budget() -> None:
    clock = Clock()
    api = CountingApi({}, {})
    access = KubernetesAccess(api, clock=clock)
    statuses = [access.check(f"Bearer made-up-{i}", "ns", "p")[0] for i in range(1000)]
    assert len(api.paths) == REVIEW_BURST and statuses.count(401) == REVIEW_BURST
    assert set(statuses[REVIEW_BURST:]) == {429}
    clock.now += 1.0  # the budget refills at REVIEWS_PER_SECOND
    for i in range(100):
        access.check(f"Bearer later-{i}", "ns", "p")
    assert len(api.paths) == REVIEW_BURST + int(REVIEWS_PER_SECOND)


def test_explain_runs_off_the_event_loop_and_a_full_gate_answers_429(monkeypatch: pytest.MonkeyPatch) -> None:
    # Explains held open on their threads: one more is turned away with Retry-After, and the event
    # loop (the verbs' loop) still answers meanwhile.
    limit = getattr(routes, "EXPLAIN_CONCURRENCY", 2)
    release, threads = threading.Event(), []

    def slow_explain(service: Any, namespace: str, name: str) -> dict[str, Any]:
        threads.append(threading.current_thread().name)
        release.wait(3)
        return {"pod": f"{namespace}/{name}"}

    monkeypatch.setattr(app.extender.explain, "explain_pod", slow_explain)
    api = create_fastapi(ExtenderService(Settings(cluster_source="none", metrics_port=0), GpuCatalog.load()))

    async def scenario() -> None:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=api), base_url="http://x") as c:
            held = [asyncio.create_task(c.get(f"/explain/ns/p{i}")) for i in range(limit)]
            while len(threads) < limit:
                await asyncio.sleep(0.01)
            turned_away = await c.get("/explain/ns/late")
            health = await asyncio.wait_for(c.get("/healthz"), 1)
            release.set()
            answers = await asyncio.gather(*held)
        assert turned_away.status_code == 429 and turned_away.headers["retry-after"] == "1"
        assert health.status_code == 200
        assert [a.status_code for a in answers] == [200] * limit

    try:
        asyncio.run(asyncio.wait_for(scenario(), 20))
    finally:
        release.set()
    assert all(t.startswith("explain") for t in threads), threads
