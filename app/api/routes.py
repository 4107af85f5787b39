"""HTTP routes: the extender verbs (always HTTP 200, errors in the body), health, explain."""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter, Depends, HTTPException, Request
from fastapi.responses import Response

from app import wire
from app.api.access import ExplainAccess
from app.core.reasons import MESSAGE_PREFIX
from app.service import ExtenderService

JSON = "application/json"


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
        return wire.priority_list([])
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
        from app.explain import explain_pod

        access: ExplainAccess = request.app.state.access
        gate: asyncio.Semaphore = request.app.state.explain_slots
        if gate.locked():
            # Explain is for people and dashboards; the four verbs kube-scheduler waits on come first.
            raise HTTPException(status_code=429, detail="too many explain requests at once; retry shortly",
                                headers={"Retry-After": "1"})
        async with gate:
            status, reason = await asyncio.to_thread(
                access.check, request.headers.get("authorization"), namespace, name)
            if status != 200:
                raise HTTPException(status_code=status, detail=reason)
            # Off the event loop: an explain scores every node, and the verbs share this loop.
            result = await asyncio.to_thread(explain_pod, service, namespace, name)
        if result is None:
            raise HTTPException(status_code=404, detail=f"pod {namespace}/{name} not found")
        return result

    return router
