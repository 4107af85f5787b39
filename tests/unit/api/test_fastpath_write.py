"""The verbs' answers leave in one socket write, head and body together (app/api/fastpath.py), and
still arrive whole and correct through the real uvicorn server."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator
from typing import Any

import orjson
import pytest

from app.api.fastpath import VerbFastPath
from app.base.catalog import GpuCatalog
from app.config.settings import Settings
from app.extender.service import ExtenderService
from testkit.live_verbs import live_verbs

BIND = orjson.dumps({"PodName": "p", "PodNamespace": "ns", "PodUID": "u", "Node": "n"})


class Recorder:
    def __init__(self) -> None:
        self.writes: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.writes.append(bytes(data))

    def is_closing(self) -> bool:
        return False


class Cycle:
    """Writes as uvicorn's request/response cycle does: the head at start, then the body."""

    def __init__(self) -> None:
        self.transport: Any = Recorder()

    async def send(self, message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            self.transport.write(b"HTTP/1.1 200 OK\r\n" + b"".join(
                n + b": " + v + b"\r\n" for n, v in message["headers"]) + b"\r\n")
        else:
            self.transport.write(message["body"])


async def _no_fallback(scope: Any, receive: Any, send: Any) -> None:
    raise AssertionError("a verb must not reach the fallback app")


def _call(path: VerbFastPath, send: Any) -> None:
    messages = [{"type": "http.request", "body": BIND, "more_body": False}]

    async def receive() -> dict[str, Any]:
        return messages.pop(0)

    scope = {"type": "http", "method": "POST", "path": "/scheduler/bind", "headers": []}
    asyncio.run(path(scope, receive, send))


@pytest.fixture
def service(catalog: GpuCatalog) -> ExtenderService:
    return ExtenderService(Settings(cluster_source="none", metrics_port=0), catalog)


def test_head_and_body_leave_in_one_write(service: ExtenderService) -> None:
    cycle = Cycle()
    recorder = cycle.transport
    _call(VerbFastPath(service, _no_fallback), cycle.send)
    assert len(recorder.writes) == 1
    head, _, body = recorder.writes[0].partition(b"\r\n\r\n")
    assert b"content-length: %d" % len(body) in head
    assert "no API server connection" in orjson.loads(body)["Error"]
    assert cycle.transport is recorder  # the cycle gets its own transport back


def test_a_send_without_a_transport_is_used_as_it_is(service: ExtenderService) -> None:
    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    _call(VerbFastPath(service, _no_fallback), send)
    assert [m["type"] for m in sent] == ["http.response.start", "http.response.body"]


@pytest.fixture(scope="module")
def live(catalog: GpuCatalog) -> Iterator[int]:
    settings = Settings(cluster_source="none", metrics_port=0)
    with live_verbs(settings, catalog) as port:
        yield port


def test_answers_through_uvicorn_arrive_whole_on_a_kept_alive_connection(live: int) -> None:
    with socket.create_connection(("127.0.0.1", live), timeout=10) as s:
        for _ in range(3):
            s.sendall(b"POST /scheduler/bind HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      b"Content-Length: %d\r\n\r\n" % len(BIND) + BIND)
            data = b""
            while b"\r\n\r\n" not in data:
                data += s.recv(65536)
            head, _, body = data.partition(b"\r\n\r\n")
            length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                          if line.lower().startswith(b"content-length:"))
            while len(body) < length:
                body += s.recv(65536)
            assert head.startswith(b"HTTP/1.1 200")
            assert "no API server connection" in orjson.loads(body)["Error"]
