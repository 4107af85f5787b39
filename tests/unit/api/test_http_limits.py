"""Connection limits of the real servers, over real sockets (docs/extender-protocol.md, "Connection
limits"): idle and trickling connections are closed, oversized request heads refused, normal requests
(keep-alive included) answered. The verbs' server is uvicorn exactly as ``serve`` configures it."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from prometheus_client import CollectorRegistry, Counter

from app.api.server import HttpLimits, start_metrics_server
from app.base.catalog import GpuCatalog
from app.config.settings import Settings
from testkit.live_verbs import live_verbs

IDLE, REQUEST, MAX_HEAD = 0.5, 1.5, 4096
# Far above the limits, far below "held for a minute": a missing limit shows up as a hang.
PATIENCE = 8.0
BIG_HEADER = b"X-Big: " + b"a" * (10 * 1024 * 1024) + b"\r\n"
# The standard library's HTTP server refuses lines over 64 KiB and more than 100 headers by itself;
# 90 lines of 60 KB (5.4 MB) pass both checks.
MANY_HEADERS = b"".join(b"X-Big-%d: " % i + b"a" * 60_000 + b"\r\n" for i in range(90))


@dataclass
class Live:
    port: int


def _settings() -> Settings:
    return Settings(cluster_source="none", metrics_port=0, http_idle_timeout_seconds=IDLE,
                    http_request_timeout_seconds=REQUEST, http_max_header_bytes=MAX_HEAD)


@pytest.fixture(scope="module")
def verbs(catalog: GpuCatalog) -> Iterator[Live]:
    settings = _settings()
    with live_verbs(settings, catalog) as port:
        yield Live(port)


@pytest.fixture(scope="module")
def metrics() -> Iterator[Live]:
    registry = CollectorRegistry()
    Counter("llmp_test_total", "a sample", registry=registry).inc()
    httpd, _ = start_metrics_server(0, "127.0.0.1", registry, HttpLimits.from_settings(_settings()))
    yield Live(httpd.server_address[1])
    httpd.shutdown()
    httpd.server_close()


def _connect(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=PATIENCE)


def _closed_after(s: socket.socket) -> float:
    """Seconds until the server closes ``s`` (reading and dropping anything it sends first)."""
    t0 = time.monotonic()
    try:
        while s.recv(65536):
            pass
    except ConnectionResetError:
        pass
    return time.monotonic() - t0


def _response(s: socket.socket) -> bytes:
    """One whole HTTP response (headers and content-length body) from ``s``."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = s.recv(65536)
        assert chunk, f"closed before a response: {data!r}"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                   if line.lower().startswith(b"content-length:")), 0)
    while len(body) < length:
        body += s.recv(65536)
    return head + b"\r\n\r\n" + body


def _get(path: str, extra: bytes = b"") -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: x\r\n".encode() + extra + b"\r\n"


def _refused_big_header(port: int, path: str, headers: bytes) -> bytes:
    """Send a huge head; what came back before the server closed (431 or nothing, never 200)."""
    s = _connect(port)
    request = _get(path, headers)
    sender = threading.Thread(target=lambda: _send_quietly(s, request), daemon=True)
    t0 = time.monotonic()
    sender.start()
    got = b""
    try:
        while chunk := s.recv(65536):
            got += chunk
    except ConnectionResetError:
        pass  # closed with the rest of our header unread: the kernel resets the connection
    assert time.monotonic() - t0 < PATIENCE
    sender.join(PATIENCE)
    s.close()
    return got


def _send_quietly(s: socket.socket, data: bytes) -> None:
    with contextlib.suppress(OSError):  # the server stopped reading and closed: that is the point
        s.sendall(data)


# --- the verbs (uvicorn) ------------------------------------------------------------------------


def test_kept_alive_connection_is_answered_then_closed_once_idle(verbs: Live) -> None:
    with _connect(verbs.port) as s:
        for _ in range(2):
            s.sendall(_get("/healthz"))
            assert _response(s).startswith(b"HTTP/1.1 200")
            time.sleep(IDLE / 3)  # within the idle timeout, the connection stays usable
        body = json.dumps({"Pod": {"metadata": {"name": "p", "namespace": "ns", "uid": "u"},
                                   "spec": {"containers": [{"name": "c"}]}},
                           "NodeNames": []}).encode()
        s.sendall(b"POST /scheduler/filter HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        answer = _response(s)
        assert answer.startswith(b"HTTP/1.1 200") and b'"Error"' in answer
        assert _closed_after(s) < IDLE + 2


def test_connection_that_never_sends_a_request_is_closed_after_the_idle_timeout(verbs: Live) -> None:
    with _connect(verbs.port) as s:
        assert IDLE * 0.5 < _closed_after(s) < IDLE + 2


@pytest.mark.parametrize("part", ["head", "body"])
def test_trickled_request_is_closed_at_the_request_deadline(verbs: Live, part: str) -> None:
    """A byte every 0.1 s never lets a connection go idle; the whole request still has a deadline."""
    with _connect(verbs.port) as s:
        if part == "head":
            s.sendall(b"GET /healthz HTTP/1.1\r\n")
        else:
            s.sendall(b"POST /scheduler/filter HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n")
        s.settimeout(0.1)
        t0 = time.monotonic()
        while time.monotonic() - t0 < PATIENCE:
            try:
                s.sendall(b"X" if part == "body" else b"a")
                got = s.recv(65536)
            except TimeoutError:
                continue
            except (BrokenPipeError, ConnectionResetError):
                break
            if not got or got.startswith(b"HTTP/1.1 200"):
                break
        elapsed = time.monotonic() - t0
    assert REQUEST * 0.5 < elapsed < REQUEST + 2, elapsed


def test_client_that_stops_reading_an_answer_is_closed_at_the_deadline(verbs: Live) -> None:
    """A large answer the client never reads must not hold the connection (and the answer)."""
    names = [f"node-{i}" for i in range(200_000)]  # every one unknown: a 12 MB answer
    body = json.dumps({"Pod": {"metadata": {"name": "p", "namespace": "ns", "uid": "u"},
                               "spec": {"containers": [{"name": "c"}]}}, "NodeNames": names}).encode()
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connecting: a small window
    s.settimeout(PATIENCE)
    with s:
        s.connect(("127.0.0.1", verbs.port))
        s.sendall(b"POST /scheduler/filter HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        time.sleep(REQUEST + 3)  # not reading; the server is stuck writing past its deadline
        got = 0
        try:
            while chunk := s.recv(1 << 20):
                got += len(chunk)
        except ConnectionResetError:
            pass
    assert got < 10_000_000, f"the whole answer ({got} bytes) waited for a client that did not read"


def test_hundreds_of_slow_connections_are_all_closed_and_others_still_answered(verbs: Live) -> None:
    """What one tenant did: a few hundred connections that send half a request and wait."""
    slow = []
    for i in range(300):
        s = _connect(verbs.port)
        if i % 2:
            s.sendall(b"POST /scheduler/filter HTTP/1.1\r\nHost: x\r\n")  # half a head
        slow.append(s)
    t0 = time.monotonic()
    with _connect(verbs.port) as s:  # meanwhile a normal request is answered
        s.sendall(_get("/healthz"))
        assert _response(s).startswith(b"HTTP/1.1 200")
    closed = 0
    for s in slow:
        s.settimeout(max(0.1, t0 + REQUEST + 3 - time.monotonic()))
        try:
            closed += s.recv(1) == b""
        except ConnectionResetError:
            closed += 1
        except TimeoutError:
            pass
        s.close()
    assert closed == len(slow), f"{len(slow) - closed} of {len(slow)} slow connections still open"


def test_head_over_the_limit_in_one_read_is_answered_431(verbs: Live) -> None:
    with _connect(verbs.port) as s:
        s.sendall(_get("/healthz", b"X-Big: " + b"a" * (2 * MAX_HEAD) + b"\r\n"))
        assert _response(s).startswith(b"HTTP/1.1 431")
        assert _closed_after(s) < 2


def test_ten_megabyte_header_is_refused_without_being_read(verbs: Live) -> None:
    got = _refused_big_header(verbs.port, "/healthz", BIG_HEADER)
    assert got == b"" or got.startswith(b"HTTP/1.1 431"), got[:200]
    with _connect(verbs.port) as s:  # and the server goes on answering
        s.sendall(_get("/healthz"))
        assert _response(s).startswith(b"HTTP/1.1 200")


# --- the metrics server ----------------------------------------------------------------------------


def test_metrics_connection_that_never_sends_is_closed(metrics: Live) -> None:
    with _connect(metrics.port) as s:
        assert _closed_after(s) < REQUEST + 2


def test_metrics_trickled_request_is_closed_at_the_deadline(metrics: Live) -> None:
    with _connect(metrics.port) as s:
        s.sendall(b"GET /metrics HTTP/1.1\r\n")
        s.settimeout(0.1)
        t0 = time.monotonic()
        while time.monotonic() - t0 < PATIENCE:
            try:
                s.sendall(b"a")
                if not s.recv(65536):
                    break
            except TimeoutError:
                continue
            except (BrokenPipeError, ConnectionResetError):
                break
        elapsed = time.monotonic() - t0
    assert elapsed < REQUEST + 2, elapsed


def test_metrics_oversized_head_is_refused(metrics: Live) -> None:
    got = _refused_big_header(metrics.port, "/metrics", MANY_HEADERS)
    assert got == b"" or got.startswith((b"HTTP/1.1 431", b"HTTP/1.0 431")), got[:200]
    with _connect(metrics.port) as s:  # and the server goes on answering
        s.sendall(_get("/metrics"))
        answer = _closed_after_reading(s)
    assert answer.startswith(b"HTTP/1.0 200") and b"llmp_test_total 1.0" in answer


def _closed_after_reading(s: socket.socket) -> bytes:
    data = b""
    while chunk := s.recv(65536):
        data += chunk
    return data
