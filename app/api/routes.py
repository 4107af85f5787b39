"""HTTP routes: the extender verbs (always HTTP 200, errors in the body), health, explain."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from fastapi import APIRouter, Depends, HTTPException, Request
from fastapi.responses import Response

from app.api import wire
from app.api.access import RETRY_AFTER_SECONDS, ExplainAccess
from app.base.reasons import MESSAGE_PREFIX
from app.extender.service import ExtenderService

JSON = "application/json"
# Explains at once: each scores every node under the service lock the verbs also take, so more would
# only queue there; two keeps a person and a dashboard served on the 2-core nodes we measure on.
EXPLAIN_CONCURRENCY = 2


def get_service(request: Request) -> ExtenderService:
    service: ExtenderService = request.app.state.service
    return service


async def read_body(request: Request, limit: int) -> bytes | None:
    """The body, or None when it exceeds ``limit`` (stop reading early: never buffer a huge body)."""
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        return None
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
    return b"".join(chunks)


def too_large(verb: str, limit: int) -> bytes:
    msg = MESSAGE_PREFIX + f"{verb} request body larger than {limit} bytes (max_body_bytes)"
    if verb == "prioritize":
        return wire.priority_pairs([], [])
    if verb == "preempt":
        return wire.preemption_result({}, {})
    if verb == "bind":
        return wire.binding_result(msg)
    return wire.filter_result(None, [], {}, {}, msg)


async def answer(service: ExtenderService, verb: str, body: bytes | None) -> bytes:
    """The response body for one verb call (``body`` None: it was over ``max_body_bytes``)."""
    if body is None:
        service.metrics.request_errors.labels(verb, "too_large").inc()
        return too_large(verb, service.settings.max_body_bytes)
    if verb == "filter":
        return service.filter(body)
    if verb == "prioritize":
        return service.prioritize(body)
    if verb == "bind":
        return await service.bind(body)
    return service.preempt(body)


def extender_router() -> APIRouter:
    router = APIRouter()

    @router.post("/{verb}")
    async def verb(verb: str, request: Request, service: ExtenderService = Depends(get_service)) -> Response:
        limit = service.settings.max_body_bytes
        if verb not in ("filter", "prioritize", "bind", "preempt"):
            raise HTTPException(status_code=404, detail=f"unknown extender verb {verb!r}")
        return Response(await answer(service, verb, await read_body(request, limit)), media_type=JSON)

    return router


def ops_router() -> APIRouter:
    router = APIRouter()

    @router.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @router.get("/readyz")
    async def readyz(service: ExtenderService = Depends(get_service)) -> Response:
        if service.ready.is_set():
            return Response(b'{"status":"ready"}', media_type=JSON)
        return Response(b'{"status":"cache not synced"}', status_code=503, media_type=JSON)

    @router.get("/explain/{namespace}/{name}")
    async def explain(namespace: str, name: str, request: Request,
                      service: ExtenderService = Depends(get_service)) -> Any:
        gate: ExplainGate = request.app.state.explain_gate
        if gate.full():
            # Explain is for people and dashboards; the four verbs kube-scheduler waits on come first.
            raise HTTPException(status_code=429, detail="too many explain requests at once; retry shortly",
                                headers={"Retry-After": "1"})
        async with gate:
            return await gate.run(_explain, service, request.app.state.access,
                                  request.headers.get("authorization"), namespace, name)

    return router


def _explain(service: ExtenderService, access: ExplainAccess, authorization: str | None,
             namespace: str, name: str) -> Any:
    """Authorize, then explain: on a gate thread, never the event loop (an explain scores every node,
    and a TokenReview is a round trip to the API server)."""
    from app.extender.explain import explain_pod

    status, reason = access.check(authorization, namespace, name)
    if status != 200:
        headers = {"Retry-After": str(RETRY_AFTER_SECONDS)} if status == 429 else None
        raise HTTPException(status_code=status, detail=reason, headers=headers)
    result = explain_pod(service, namespace, name)
    if result is None:
        raise HTTPException(status_code=404, detail=f"pod {namespace}/{name} not found")
    return result


class ExplainGate:
    """At most ``limit`` explains at once, each on one of ``limit`` threads of its own.

    Its own threads: binds run on the event loop's default executor (a handful of threads on a small
    node), which explain must never fill. A full gate answers 429 at once instead of queueing, so a
    burst of explain calls costs the verbs nothing but the 429s.
    """

    def __init__(self, limit: int = EXPLAIN_CONCURRENCY) -> None:
        self.limit = limit
        self.running = 0
        self._pool = ThreadPoolExecutor(max_workers=limit, thread_name_prefix="explain")

    def full(self) -> bool:
        return self.running >= self.limit

    async def __aenter__(self) -> ExplainGate:
        # No await between full() and here: on one event loop the check and the count are atomic.
        self.running += 1
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.running -= 1

    async def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
