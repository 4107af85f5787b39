"""Binds and events sent by a child process (app/cluster/api_process.py): answers, errors, a child that
dies, one that never answers. The first test spawns the real child against a real HTTP server."""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

import app.cluster.api_process as api_process
from app.cluster.api_process import ProcessRest


class _Api(http.server.BaseHTTPRequestHandler):
    seen: list[tuple[str, str, Any]] = []

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        _Api.seen.append(("POST", self.path, body))
        if self.path.endswith("/taken/binding"):
            self.send_response(409, "Conflict")
            self.end_headers()
            return
        out = json.dumps({"kind": "Status", "status": "Success"}).encode()
        self.send_response(201)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def api_server(tmp_path: Path) -> Iterator[Path]:
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Api)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "t",
        "clusters": [{"name": "t", "cluster": {"server": f"http://127.0.0.1:{srv.server_address[1]}"}}],
        "users": [{"name": "t", "user": {"token": "abc"}}],
        "contexts": [{"name": "t", "context": {"cluster": "t", "user": "t"}}],
    }))
    _Api.seen.clear()
    yield kubeconfig
    srv.shutdown()


def test_the_real_child_process_sends_the_request_and_returns_the_answer(api_server: Path) -> None:
    rest = ProcessRest(str(api_server))
    try:
        body = {"apiVersion": "v1", "kind": "Binding", "target": {"name": "gpu-1"}}
        out = rest.request("POST", "/api/v1/namespaces/ns/pods/p/binding", body, timeout=20)
        assert json.loads(out) == {"kind": "Status", "status": "Success"}
        assert _Api.seen == [("POST", "/api/v1/namespaces/ns/pods/p/binding", body)]
        # The API server's refusal reaches the caller with its status, as JsonRest raises it.
        with pytest.raises(ApiException) as err:
            rest.request("POST", "/api/v1/namespaces/ns/pods/taken/binding", body, timeout=20)
        assert err.value.status == 409
        assert rest._proc is not None and rest._proc.pid != threading.get_native_id()
    finally:
        rest.close()


class _ThreadChild:
    """A stand-in for the child process, on a thread: scripted by ``behave`` per request."""

    def __init__(self, conn: Connection, behave: str) -> None:
        self.conn, self.behave, self.exitcode = conn, behave, None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while True:
            try:
                req = self.conn.recv()
            except (EOFError, OSError):
                break
            if req is None:
                break
            if self.behave == "die":
                break
            if self.behave == "answer":
                self.conn.send((req[0], 200, "", b"ok"))
            # "silent": never answers
        self.exitcode = 1
        self.conn.close()

    def is_alive(self) -> bool:
        return self.thread.is_alive()

    def join(self, timeout: float | None = None) -> None:
        self.thread.join(timeout)

    def kill(self) -> None:
        pass


def test_a_child_that_dies_fails_its_calls_and_the_next_call_gets_a_new_child() -> None:
    behaviours = iter(["die", "answer"])
    started: list[_ThreadChild] = []

    def start(conn: Connection, kubeconfig: str | None) -> _ThreadChild:
        started.append(_ThreadChild(conn, next(behaviours)))
        return started[-1]

    rest = ProcessRest(None, start=start)
    with pytest.raises(ApiException) as err:
        rest.request("POST", "/x", {"a": 1}, timeout=5)
    assert err.value.status == 0 and "exited" in str(err.value.reason)
    started[0].join(2)
    assert rest.request("POST", "/x", {"a": 1}, timeout=5) == b"ok"
    assert len(started) == 2
    rest.close()


def test_a_child_that_never_answers_times_out_instead_of_hanging(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(api_process, "GRACE_SECONDS", 0.05)
    rest = ProcessRest(None, start=lambda conn, _: _ThreadChild(conn, "silent"))
    with pytest.raises(ApiException) as err:
        rest.request("POST", "/x", None, timeout=0.1)
    assert err.value.status == 0 and "no answer" in str(err.value.reason)
    assert rest._pending == {}  # nothing left waiting for an answer that will never come
    rest.close()


def test_a_closed_client_refuses_calls() -> None:
    rest = ProcessRest(None, start=lambda conn, _: _ThreadChild(conn, "answer"))
    assert rest.request("GET", "/x") == b"ok"
    rest.close()
    with pytest.raises(ApiException, match="closed"):
        rest.request("GET", "/x")
