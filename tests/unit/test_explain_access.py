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


def test_a_rejected_token_is_remembered_briefly() -> None:
    api = Api({"t-alice": "alice"}, {"alice": {"team-a"}})
    access = KubernetesAccess(api)
    for i in range(1000):
        assert access.check("Bearer stolen", "team-a", f"p-{i}")[0] == 401
    assert api.calls == 1  # one TokenReview for a thousand calls with the same bad token
    assert access.check("Bearer t-alice", "team-a", "p") == (200, "")


def test_explain_runs_off_the_event_loop_and_sheds_load_with_429() -> None:
    import asyncio
    import threading

    import httpx

    from app.api.app import EXPLAIN_CONCURRENCY, create_app
    from app.config import Settings
    from app.core.catalog import GpuCatalog
    from app.wiring import build_core

    release = threading.Event()

    class Slow:
        def check(self, authorization: str | None, namespace: str, name: str) -> tuple[int, str]:
            release.wait(5)  # a slow API server
            return 403, "no"

    svc = build_core(Settings(cluster_source="none", metrics_port=0), GpuCatalog.load())
    svc.ready.set()
    app = create_app(svc, Slow())

    async def run() -> tuple[list[int], float]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://x") as client:
            calls = [asyncio.create_task(client.get(f"/explain/ns/p{i}")) for i in range(EXPLAIN_CONCURRENCY + 3)]
            await asyncio.sleep(0.3)
            # While every explain slot waits on the API server, the event loop still answers.
            loop = asyncio.get_running_loop()
            t0 = loop.time()
            health = await client.get("/healthz")
            waited = loop.time() - t0
            assert health.status_code == 200
            release.set()
            return [r.status_code for r in await asyncio.gather(*calls)], waited

    codes, waited = asyncio.run(run())
    assert sorted(codes).count(429) == 3 and codes.count(403) == EXPLAIN_CONCURRENCY, codes
    assert waited < 2.0
