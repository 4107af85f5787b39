"""The API client's keep-alive path (app/cluster/rest.py) against a live local HTTP/1.1 server."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from typing import Any

import orjson
import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from app.cluster.rest import JsonRest, KeepAlive, ResponseError


class Server:
    """A raw HTTP/1.1 server: answers each request with ``script[n]`` (bytes), records what it got,
    and can close a connection after its answer (``close_after``)."""

    def __init__(self, script: list[bytes], close_after: set[int] | None = None,
                 silent: set[int] | None = None) -> None:
        self.script = script
        self.close_after = close_after or set()
        # Requests (by index) read and then dropped with the connection, unanswered: the race of a
        # server closing an idle keep-alive connection just as a request arrives on it.
        self.silent = silent or set()
        self.requests: list[bytes] = []
        self.connections = 0
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn: socket.socket) -> None:
        buf = b""
        with conn:
            while True:
                while b"\r\n\r\n" not in buf:
                    chunk = conn.recv(65536)
                    if not chunk:
                        return
                    buf += chunk
                head, _, rest = buf.partition(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n")[1:]:
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                while len(rest) < length:
                    rest += conn.recv(65536)
                self.requests.append(head + b"\r\n\r\n" + rest[:length])
                buf = rest[length:]
                n = len(self.requests) - 1
                if n in self.silent:
                    return
                conn.sendall(self.script[min(n, len(self.script) - 1)])
                if n in self.close_after:
                    return

    def close(self) -> None:
        self.sock.close()


def ok(body: bytes = b"{}", status: str = "200 OK", extra: str = "") -> bytes:
    return f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n{extra}\r\n".encode() + body


def chunked(parts: list[bytes]) -> bytes:
    body = b"".join(f"{len(p):x}\r\n".encode() + p + b"\r\n" for p in parts) + b"0\r\n\r\n"
    return b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n" + body


def rest_for(port: int) -> JsonRest:
    cfg = client.Configuration()
    cfg.host = f"http://127.0.0.1:{port}"
    cfg.api_key = {"BearerToken": "t0ken"}
    cfg.api_key_prefix = {"BearerToken": "Bearer"}
    return JsonRest(client.ApiClient(cfg))


@pytest.fixture
def serve() -> Iterator[Any]:
    made: list[Server] = []

    def make(script: list[bytes], close_after: set[int] | None = None,
             silent: set[int] | None = None) -> tuple[Server, JsonRest]:
        s = Server(script, close_after, silent)
        made.append(s)
        return s, rest_for(s.port)

    yield make
    for s in made:
        s.close()


def test_one_write_per_request_with_credentials_and_body(serve: Any) -> None:
    srv, rest = serve([ok(b'{"kind":"Binding"}', "201 Created")])
    assert rest.direct is not None
    body = {"apiVersion": "v1", "kind": "Binding", "target": {"name": "n1"}}
    assert orjson.loads(rest.request("POST", "/api/v1/namespaces/a/pods/p/binding", body)) == {"kind": "Binding"}
    head, _, sent = srv.requests[0].partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    assert lines[0] == "POST /api/v1/namespaces/a/pods/p/binding HTTP/1.1"
    assert f"Host: 127.0.0.1:{srv.port}" in lines
    assert "authorization: Bearer t0ken" in lines
    assert "Content-Type: application/json" in lines
    assert f"Content-Length: {len(sent)}" in lines
    assert orjson.loads(sent) == body


def test_query_reaches_the_server(serve: Any) -> None:
    srv, rest = serve([ok()])
    rest.request("GET", "/api/v1/pods", query=[("limit", "5"), ("fieldSelector", "spec.nodeName=a")])
    assert srv.requests[0].startswith(b"GET /api/v1/pods?limit=5&fieldSelector=spec.nodeName%3Da HTTP/1.1")


def test_connection_is_kept_alive_across_requests(serve: Any) -> None:
    srv, rest = serve([ok()])
    for _ in range(5):
        rest.request("POST", "/api/v1/namespaces/a/events", {"n": 1})
    assert len(srv.requests) == 5
    assert srv.connections == 1


@pytest.mark.parametrize(("status", "reason"), [("404 Not Found", "Not Found"), ("409 Conflict", "Conflict"),
                                                ("500 Internal Server Error", "Internal Server Error"),
                                                ("301 Moved Permanently", "Moved Permanently")])
def test_non_2xx_raises_with_status_and_reason(serve: Any, status: str, reason: str) -> None:
    _, rest = serve([ok(b'{"kind":"Status"}', status)])
    with pytest.raises(ApiException) as err:
        rest.request("GET", "/api/v1/namespaces/a/pods/p")
    assert err.value.status == int(status.split()[0])
    assert err.value.reason == reason


def test_chunked_answer_is_joined(serve: Any) -> None:
    _, rest = serve([chunked([b'{"a":', b'1,"b":', b"2}"])])
    assert orjson.loads(rest.request("GET", "/x")) == {"a": 1, "b": 2}


def test_connection_close_answer_is_not_reused(serve: Any) -> None:
    srv, rest = serve([ok(extra="Connection: close\r\n")], close_after={0, 1})
    rest.request("GET", "/x")
    rest.request("GET", "/x")
    assert srv.connections == 2


def test_server_closing_an_idle_connection_costs_a_new_one_not_an_error(serve: Any) -> None:
    # The server closes after the first answer without saying so: the next request finds the idle
    # connection dropped and goes out on a fresh one.
    srv, rest = serve([ok()], close_after={0})
    rest.request("GET", "/x")
    rest.request("GET", "/y")
    assert len(srv.requests) == 2
    assert srv.connections == 2


def test_request_dropped_unanswered_on_a_reused_connection_is_sent_once_more() -> None:
    srv = Server([ok(b'{"n":1}'), ok(b'{"n":2}'), ok(b'{"n":3}')], silent={1})
    try:
        rest = rest_for(srv.port)
        assert rest.request("GET", "/a") == b'{"n":1}'
        assert rest.request("POST", "/b", {"x": 1}) == b'{"n":3}'  # request 1 was dropped, 2 answered
        assert len(srv.requests) == 3 and srv.requests[1] == srv.requests[2]
        assert srv.connections == 2
    finally:
        srv.close()


def test_request_dropped_unanswered_on_a_new_connection_is_an_error() -> None:
    srv = Server([ok()], silent={0})
    try:
        with pytest.raises(ResponseError, match="before answering"):
            rest_for(srv.port).request("POST", "/b", {"x": 1})
        assert len(srv.requests) == 1
    finally:
        srv.close()


def test_answer_cut_short_is_an_error_and_the_connection_is_dropped(serve: Any) -> None:
    srv, rest = serve([b"HTTP/1.1 200 OK\r\nContent-Length: 50\r\n\r\n{\"a\"", ok()], close_after={0})
    with pytest.raises(ResponseError, match="mid-answer"):
        rest.request("GET", "/x")
    assert rest.request("GET", "/x") == b"{}"
    assert srv.connections == 2


def test_silent_server_times_out(serve: Any) -> None:
    listener = socket.create_server(("127.0.0.1", 0))  # accepts (backlog) but never answers
    try:
        rest = rest_for(listener.getsockname()[1])
        with pytest.raises(TimeoutError):
            rest.request("GET", "/x", timeout=0.3)
    finally:
        listener.close()


def test_header_with_line_break_is_refused(serve: Any) -> None:
    _, rest = serve([ok()])
    assert rest.direct is not None
    with pytest.raises(ValueError, match="line break"):
        rest.direct.request("GET", "/x", {"X-Evil": "a\r\nInjected: 1"}, None, 1.0)


@pytest.mark.parametrize(("host", "proxy", "direct"), [
    ("https://10.0.0.1:6443", None, True),
    ("http://127.0.0.1:8080", None, True),
    ("https://10.0.0.1:6443", "http://proxy:3128", False),
])
def test_direct_path_only_where_it_covers_the_configuration(host: str, proxy: str | None, direct: bool) -> None:
    cfg = client.Configuration()
    cfg.host = host
    cfg.proxy = proxy
    assert (KeepAlive.for_configuration(cfg) is not None) is direct


def test_other_server_in_url_goes_through_urllib3(serve: Any) -> None:
    _, rest = serve([ok()])
    assert rest.direct is not None
    assert rest.direct.target("http://elsewhere:1/x") is None
    assert rest.direct.target(f"http://127.0.0.1:{rest.direct.port}/a/b?c=d") == "/a/b?c=d"
