"""JSON requests with the official client's credentials, without its models or its HTTP stack.

kubernetes-client 37 validates every call with pydantic (``@validate_call``) and turns a dict body
into a model before serialising it again; for a Binding or an Event that is more CPU than the request
itself, spent under the GIL that also answers kube-scheduler's filter calls (a py-spy profile of the
extender under bench/scheduler_throughput.py showed the validation wrapper as the largest item of the
bind path). Here the official ``ApiClient`` still provides the URL and the auth headers
(``param_serialize``: bearer tokens, their refresh) and the TLS settings of its configuration (CA,
client certificate, server name); only the model layer is skipped.

The requests themselves go over keep-alive connections of our own (:class:`KeepAlive`): one socket
write per request (head and body together) and the answer parsed by httptools, the C parser the
verbs' server already uses. Through urllib3 and http.client a Binding or an Event cost 0.5-0.75 ms
of CPU in this process against 0.09-0.14 ms this way (the same TLS, the same API server;
docs/extender-protocol.md, "Bind"); two such writes per pod, both under the GIL. A configuration
this path does not cover (a proxy, a scheme other than http/https) keeps urllib3.
"""

from __future__ import annotations

import select
import socket
import ssl
import threading
import time
from typing import Any, Protocol
from urllib.parse import urlsplit

import httptools
import orjson
import urllib3
from kubernetes import client
from kubernetes.client.exceptions import ApiException

# Idle connections kept per API server: more than the threads that write at once (bind workers,
# the event writer, explain's reviews), so none pays a new TLS handshake in a burst.
MAX_IDLE = 32
READ_CHUNK = 65536


class RestLike(Protocol):
    def request(self, method: str, path: str, body: Any = None, *,
                query: list[tuple[str, str]] | None = None, content_type: str = "application/json",
                timeout: float = 5.0) -> bytes: ...


class JsonRest:
    def __init__(self, api: client.ApiClient) -> None:
        self.api = api
        self.direct = KeepAlive.for_configuration(api.configuration)

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        query: list[tuple[str, str]] | None = None,
        content_type: str = "application/json",
        timeout: float = 5.0,
    ) -> bytes:
        """Send one request; return the body of a 2xx answer, raise ApiException otherwise."""
        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = content_type
        method, url, headers, _, _ = self.api.param_serialize(
            method=method, resource_path=path, query_params=query, header_params=headers,
            auth_settings=["BearerToken"],
        )
        payload = None if body is None else body if isinstance(body, bytes) else orjson.dumps(body)
        if self.direct is not None and (target := self.direct.target(url)) is not None:
            status, reason, data = self.direct.request(method, target, headers, payload, timeout)
        else:
            resp = self.api.rest_client.pool_manager.request(
                method, url, body=payload, headers=headers,
                timeout=urllib3.Timeout(total=timeout), preload_content=True, retries=False,
            )
            status, reason, data = resp.status, str(resp.reason or ""), bytes(resp.data)
        if not 200 <= status < 300:
            raise ApiException(status=status, reason=reason)
        return data


class ResponseError(ConnectionError):
    """The API server's answer ended early or could not be parsed."""


class _Answer:
    """httptools' callbacks: the status line's reason and the body, until the message is complete."""

    __slots__ = ("body", "done", "keep", "parser", "reason")

    def __init__(self) -> None:
        self.reason = ""
        self.body: list[bytes] = []
        self.done = False
        self.keep = False
        self.parser: Any = None

    def on_headers_complete(self) -> None:
        # llhttp answers keep-alive only while the message is open; afterwards it says no.
        self.keep = bool(self.parser.should_keep_alive())

    def on_status(self, reason: bytes) -> None:
        self.reason += reason.decode("latin-1")

    def on_body(self, chunk: bytes) -> None:
        self.body.append(chunk)

    def on_message_complete(self) -> None:
        self.done = True


class KeepAlive:
    """HTTP/1.1 keep-alive connections to one API server, each used by one thread at a time."""

    def __init__(self, scheme: str, host: str, port: int, netloc: str,
                 context: ssl.SSLContext | None, server_name: str | None, max_idle: int = MAX_IDLE) -> None:
        self.scheme, self.host, self.port, self.netloc = scheme, host, port, netloc
        self.context, self.server_name = context, server_name
        self.max_idle = max_idle
        self._idle: list[socket.socket] = []
        self._lock = threading.Lock()

    @classmethod
    def for_configuration(cls, cfg: client.Configuration) -> KeepAlive | None:
        """The direct path for this configuration, or None where urllib3 must stay (a proxy)."""
        parts = urlsplit(str(cfg.host or ""))
        if getattr(cfg, "proxy", None) or parts.scheme not in ("http", "https") or not parts.hostname:
            return None
        port = parts.port or (443 if parts.scheme == "https" else 80)
        context: ssl.SSLContext | None = None
        server_name: str | None = None
        if parts.scheme == "https":
            if cfg.verify_ssl:
                context = ssl.create_default_context(cafile=cfg.ssl_ca_cert or None)
                if getattr(cfg, "assert_hostname", None) is False:
                    context.check_hostname = False
            else:
                context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
                context.check_hostname = False
                context.verify_mode = ssl.CERT_NONE
            if cfg.cert_file:
                context.load_cert_chain(cfg.cert_file, cfg.key_file or None)
            server_name = getattr(cfg, "tls_server_name", None) or parts.hostname
        return cls(parts.scheme, parts.hostname, port, parts.netloc, context, server_name,
                   max(MAX_IDLE, int(getattr(cfg, "connection_pool_maxsize", 0) or 0)))

    def target(self, url: str) -> str | None:
        """The request target of ``url`` if it is on this server, else None."""
        parts = urlsplit(url)
        if parts.scheme != self.scheme or parts.netloc != self.netloc:
            return None
        return (parts.path or "/") + (f"?{parts.query}" if parts.query else "")

    def request(self, method: str, target: str, headers: dict[str, str], body: bytes | None,
                timeout: float) -> tuple[int, str, bytes]:
        """(status, reason, body) of one request. A connection the server closed while it sat idle
        is retried once on a new one, as only a request the server never saw can fail that way."""
        head = [f"{method} {target} HTTP/1.1", f"Host: {self.netloc}"]
        for name, value in headers.items():
            if "\r" in value or "\n" in value or "\r" in name or "\n" in name:
                raise ValueError(f"header {name!r} holds a line break")
            head.append(f"{name}: {value}")
        if body is not None or method in ("POST", "PUT", "PATCH"):
            head.append(f"Content-Length: {len(body or b'')}")
        data = ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + (body or b"")
        deadline = time.monotonic() + timeout
        sock, reused = self._take(timeout)
        try:
            return self._exchange(sock, data, deadline)
        except _Unanswered:
            if not reused:
                raise ResponseError(f"{self.host}:{self.port} closed the connection before answering"
                                    ) from None
            sock = self._connect(max(0.1, deadline - time.monotonic()))
            return self._exchange(sock, data, deadline)

    # --- connections ----------------------------------------------------------------------------
    def _take(self, timeout: float) -> tuple[socket.socket, bool]:
        while True:
            with self._lock:
                sock = self._idle.pop() if self._idle else None
            if sock is None:
                return self._connect(timeout), False
            if _dropped(sock):
                sock.close()
                continue
            return sock, True

    def _connect(self, timeout: float) -> socket.socket:
        sock = socket.create_connection((self.host, self.port), timeout=timeout)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if self.context is not None:
            try:
                sock = self.context.wrap_socket(sock, server_hostname=self.server_name)
            except BaseException:
                sock.close()
                raise
        return sock

    def _give_back(self, sock: socket.socket) -> None:
        with self._lock:
            if len(self._idle) < self.max_idle:
                self._idle.append(sock)
                return
        sock.close()

    def _exchange(self, sock: socket.socket, data: bytes, deadline: float) -> tuple[int, str, bytes]:
        answer = _Answer()
        parser = answer.parser = httptools.HttpResponseParser(answer)
        got = 0
        try:
            sock.settimeout(max(0.001, deadline - time.monotonic()))
            try:
                sock.sendall(data)
            except (BrokenPipeError, ConnectionResetError):
                raise _Unanswered from None
            while not answer.done:
                sock.settimeout(max(0.001, deadline - time.monotonic()))
                try:
                    chunk = sock.recv(READ_CHUNK)
                except ConnectionResetError:
                    if got:
                        raise
                    raise _Unanswered from None
                if not chunk:
                    if got:
                        raise ResponseError(f"{self.host}:{self.port} closed the connection mid-answer")
                    raise _Unanswered
                got += len(chunk)
                try:
                    parser.feed_data(chunk)
                except httptools.HttpParserError as exc:
                    raise ResponseError(f"unreadable answer from {self.host}:{self.port}: {exc}") from None
        except BaseException:
            sock.close()
            raise
        if answer.keep:
            self._give_back(sock)
        else:
            sock.close()
        body = answer.body[0] if len(answer.body) == 1 else b"".join(answer.body)
        return parser.get_status_code(), answer.reason, body


class _Unanswered(Exception):
    """The connection ended before any byte of the answer."""


def _dropped(sock: socket.socket) -> bool:
    """An idle connection with something to read was closed by the server (or is out of step)."""
    try:
        readable, _, _ = select.select([sock], [], [], 0)
    except (OSError, ValueError):
        return True
    return bool(readable)
