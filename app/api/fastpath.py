"""The extender verbs as a bare ASGI app in front of FastAPI.

kube-scheduler waits for ``filter`` and ``prioritize`` on its synchronous path, once per pod. Through
FastAPI each call passed a dozen middleware and routing layers, request/response objects and
dependency injection before reaching the service: measured in bench/asgi_overhead.py, that is several
times the cost of the bare path for a small request. Here a POST to ``<prefix>/<verb>`` is read, handed
to the service and answered directly; everything else (health, readiness, explain, unknown verbs,
lifespan) goes to the FastAPI app unchanged, so the same contract holds (docs/extender-protocol.md:
always HTTP 200 with the error in the body, bodies over ``max_body_bytes`` refused early).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from app.api.routes import answer
from app.extender.service import ExtenderService

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

VERBS = ("filter", "prioritize", "bind", "preempt")
JSON_HEADERS = [(b"content-type", b"application/json")]


class VerbFastPath:
    def __init__(self, service: ExtenderService, fallback: ASGIApp) -> None:
        self.service = service
        self.fallback = fallback
        self.prefix = service.settings.url_prefix
        self.limit = service.settings.max_body_bytes
        self._paths = {f"{self.prefix}/{v}": v for v in VERBS}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        verb = self._paths.get(scope.get("path", "")) if scope["type"] == "http" else None
        if verb is None or scope.get("method") != "POST":
            await self.fallback(scope, receive, send)
            return
        out = await answer(self.service, verb, await self._read(scope, receive))
        cycle = getattr(send, "__self__", None)
        transport = getattr(cycle, "transport", None)
        held = _OneWrite(transport) if callable(getattr(transport, "write", None)) else None
        if held is not None:
            cycle.transport = held  # type: ignore[union-attr]
        try:
            await send({"type": "http.response.start", "status": 200,
                        "headers": [*JSON_HEADERS, (b"content-length", str(len(out)).encode())]})
            await send({"type": "http.response.body", "body": out})
        finally:
            if held is not None:
                cycle.transport = transport  # type: ignore[union-attr]
                held.flush()

    async def _read(self, scope: Scope, receive: Receive) -> bytes | None:
        """The body, or None past the limit (stop reading early: never buffer a huge body)."""
        for name, value in scope.get("headers") or ():
            if name == b"content-length":
                if value.isdigit() and int(value) > self.limit:
                    return None
                break
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return b""
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.limit:
                return None
            chunks.append(chunk)
            if not message.get("more_body", False):
                return chunks[0] if len(chunks) == 1 else b"".join(chunks)


class _OneWrite:
    """The head of an answer held back and written together with its body, in one socket write.

    uvicorn writes a response's head as soon as the response starts and its body after: two writes,
    so two send calls, and on loopback each one also runs the receiver's TCP path and wakes
    kube-scheduler, twice per answer; a profile of the extender under kube-scheduler put about a fifth
    of its busy time in the head's write. Stands in for the transport of the one request/response
    cycle of a verb (uvicorn's ``send`` belongs to that cycle); everything else goes to the transport.
    """

    def __init__(self, transport: Any) -> None:
        self._transport = transport
        self._head = b""

    def write(self, data: bytes) -> None:
        if not self._head:
            self._head = bytes(data)
            return
        head, self._head = self._head, b""
        self._transport.write(head + data)

    def flush(self) -> None:
        """Whatever is still held (a response that ended without a body write) goes out now."""
        if self._head:
            head, self._head = self._head, b""
            if not self._transport.is_closing():
                self._transport.write(head)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)
