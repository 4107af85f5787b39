"""The HTTP servers with connection limits: the verbs (uvicorn) and the metrics (a small WSGI server).

Neither server bounded a connection on its own: uvicorn's httptools protocol holds a connection that
never sends a request, or trickles one a byte at a time, for as long as the client likes, and reads a
request head of any size; the metrics server gives each connection a thread that waits forever. A
few hundred such sockets from one tenant then hold memory and threads indefinitely. Here
(docs/extender-protocol.md, "Connection limits"):

* an idle connection (no request started, before the first one or after a response) is closed after
  ``http_idle_timeout_seconds``;
* a request must arrive whole (head and body) within ``http_request_timeout_seconds`` of its first
  byte, else the connection is closed;
* a request head (request line and headers) over ``http_max_header_bytes`` is answered 431 and the
  connection closed, before more of it is buffered;
* a client that stops reading an answer gets ``http_request_timeout_seconds`` to read on before
  its connection is closed.

The verbs keep httptools (the C parser on kube-scheduler's synchronous path); the limits are a thin
subclass of uvicorn's protocol, pinned by tests/unit/api/test_http_limits.py against a live server.
Why the metrics keep a server of their own (a scrape's rendering off the verbs' event loop):
docs/extender-protocol.md, "One server per job".
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import logging
import socket
import ssl
import threading
import time
from dataclasses import dataclass
from socketserver import BaseServer
from typing import Any, ClassVar
from urllib.parse import unquote
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

import httptools
from prometheus_client import CollectorRegistry, make_wsgi_app
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from app.base.ratelog import RateLimitedLog
from app.config.settings import Settings

# One line a minute per kind of refusal: a client can send bad requests as fast as it likes.
_log = RateLimitedLog(logging.getLogger(__name__))

# Prometheus scrapes one request at a time; past this many open metrics connections new ones are
# closed at once, so slow clients cannot make the metrics server start a thread each.
METRICS_MAX_CONNECTIONS = 32
OPEN_PATHS = frozenset({"/healthz", "/readyz"})
REFUSED_403 = (b"HTTP/1.1 403 Forbidden\r\ncontent-type: text/plain\r\ncontent-length: 45\r\n"
               b"connection: close\r\n\r\nthe verbs need kube-scheduler's certificate\r\n")
REFUSED_431 = (b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: text/plain\r\n"
               b"content-length: 33\r\nconnection: close\r\n\r\nrequest header fields too large\r\n")


@dataclass(frozen=True, slots=True)
class HttpLimits:
    idle_timeout: float
    request_timeout: float
    max_header_bytes: int
    # Every path but OPEN_PATHS (the verbs above all) needs a verified client certificate.
    client_cert_required: bool = False

    @classmethod
    def from_settings(cls, settings: Settings) -> HttpLimits:
        return cls(settings.http_idle_timeout_seconds, settings.http_request_timeout_seconds,
                   settings.http_max_header_bytes, bool(settings.tls_client_ca_file))


class _HeadTooLarge(Exception):
    """Raised from the parser callback to stop parsing a request whose head is over the limit."""


class _NoClientCertificate(Exception):
    """Raised from the parser callback for a verb call over a connection without a verified
    client certificate."""


class LimitedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with an idle timeout from the first byte of the connection, a
    whole-request deadline and a bound on the request head."""

    limits: ClassVar[HttpLimits]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.timeout_keep_alive = self.limits.idle_timeout  # type: ignore[assignment]
        self._deadline: asyncio.TimerHandle | None = None
        self._stalled: asyncio.TimerHandle | None = None  # an answer the client does not read
        self._in_head = True  # the bytes arriving belong to a request head
        self._head_bytes = 0

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        # uvicorn arms its keep-alive timer only after a response: a connection that never sent a
        # request was held forever.
        self.timeout_keep_alive_task = self.loop.call_later(self.timeout_keep_alive,
                                                            self.timeout_keep_alive_handler)

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_deadline()
        self._resume_stall()
        self._unset_keepalive_if_required()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        # As uvicorn's, plus the deadline and the head bound.
        self._unset_keepalive_if_required()
        if self._deadline is None:
            # The deadline is not pushed back by more data: trickling bytes must not keep a
            # connection open.
            self._deadline = self.loop.call_later(self.limits.request_timeout, self._expired)
        if self._in_head:
            self._head_bytes += len(data)
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            if self._should_upgrade():
                self.handle_websocket_upgrade()
            else:
                self._unsupported_upgrade_warning()
            return
        except httptools.HttpParserError as exc:
            if isinstance(exc.__context__, _HeadTooLarge):
                self._refuse_head()
                return
            if isinstance(exc.__context__, _NoClientCertificate):
                self._refuse(REFUSED_403, "http:cert", "verb call without a client certificate refused "
                                                      "(403; tls_client_ca_file)")
                return
            _log.warning("http:invalid", "invalid HTTP request received (answered 400)")
            self.send_400_response("Invalid HTTP request received.")
            return
        if self._in_head and self._head_bytes > self.limits.max_header_bytes:
            # Still no end of the head after this many bytes: refuse before buffering more.
            self._refuse_head()

    def on_headers_complete(self) -> None:
        self._in_head = False
        # The exact size (a whole head can arrive in one read, bigger than the limit).
        size = len(self.url) + sum(len(n) + len(v) + 4 for n, v in self.headers)
        if size > self.limits.max_header_bytes:
            raise _HeadTooLarge()
        if self.limits.client_cert_required and not _open_path(self.url) and not self._client_verified():
            # Refused before the request reaches the application: the verbs bind pods with the
            # extender's credentials, so only kube-scheduler's certificate opens them.
            raise _NoClientCertificate()
        super().on_headers_complete()

    def _client_verified(self) -> bool:
        """The TLS handshake verified a client certificate against tls_client_ca_file (a
        certificate of another CA never gets this far: the handshake fails)."""
        return bool(self.transport.get_extra_info("peercert"))

    def on_message_complete(self) -> None:
        self._cancel_deadline()  # the whole request is in; its processing time is ours
        self._in_head, self._head_bytes = True, 0
        super().on_message_complete()

    def pause_writing(self) -> None:
        # The client stopped reading our answer: it gets the request timeout to start again, or
        # the connection (and the answer held for it) goes.
        super().pause_writing()
        if self._stalled is None:
            self._stalled = self.loop.call_later(self.limits.request_timeout, self._abort)

    def resume_writing(self) -> None:
        self._resume_stall()
        super().resume_writing()

    def _resume_stall(self) -> None:
        if self._stalled is not None:
            self._stalled.cancel()
            self._stalled = None

    def _refuse_head(self) -> None:
        self._refuse(REFUSED_431, "http:head", f"request head over {self.limits.max_header_bytes} bytes "
                                               "refused (431; http_max_header_bytes)")

    def _refuse(self, answer: bytes, key: str, line: str) -> None:
        self._cancel_deadline()
        _log.warning(key, line)
        if not self.transport.is_closing():
            self.transport.write(answer)
            self.transport.close()

    def _expired(self) -> None:
        """A deadline passed: close (connection_lost cancels the other timers)."""
        if not self.transport.is_closing():
            self.transport.close()

    def _abort(self) -> None:
        """Close without flushing: close() would wait for the unread answer to drain."""
        self.transport.abort()

    def _cancel_deadline(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None


def _open_path(url: bytes) -> bool:
    """Served without a client certificate: the probes' paths and explain (bearer tokens). Judged
    on the path as uvicorn hands it to the application (percent-decoded), so that no spelling of a
    verb's path passes for one of these; anything else, unknown paths included, needs one."""
    try:
        path = unquote(httptools.parse_url(url).path.decode("ascii"), errors="strict")
    except (httptools.HttpParserInvalidURLError, UnicodeDecodeError, ValueError):
        return False
    return path in OPEN_PATHS or (path.startswith("/explain/") and "/.." not in path)


def limited_protocol(limits: HttpLimits) -> type[asyncio.Protocol]:
    """The protocol class for uvicorn's ``http`` option (uvicorn instantiates it per connection)."""
    return type("LimitedHttpToolsProtocol", (LimitedHttpToolsProtocol,), {"limits": limits})


def uvicorn_options(settings: Settings) -> dict[str, Any]:
    """``uvicorn.run`` keywords for the verbs: the limits above, no access log (a call per pod),
    and TLS when the settings give a certificate (docs/security.md)."""
    options: dict[str, Any] = {
        "host": settings.host, "port": settings.port, "log_level": settings.log_level,
        "access_log": False, "http": limited_protocol(HttpLimits.from_settings(settings))}
    if settings.tls_cert_file:
        options.update(ssl_certfile=settings.tls_cert_file, ssl_keyfile=settings.tls_key_file)
    if settings.tls_client_ca_file:
        # Optional at the handshake, so that kubelet's probes reach /healthz and /readyz; a
        # certificate that is presented must verify, and the verbs refuse a connection without one.
        options.update(ssl_ca_certs=settings.tls_client_ca_file, ssl_cert_reqs=ssl.CERT_OPTIONAL)
    return options


# --- metrics --------------------------------------------------------------------------------------


class _HeadTooLargeError(OSError):
    """More than the header limit read without the head ending (the metrics server's refusal)."""


class _DeadlineReader(io.RawIOBase):
    """Socket reads that all end by one deadline (a per-read timeout alone lets a client trickle)
    and stop at ``limit`` bytes (a metrics request is a head, no body)."""

    def __init__(self, sock: socket.socket, deadline: float, limit: int, write_timeout: float) -> None:
        self.sock, self.deadline, self.limit, self.write_timeout = sock, deadline, limit, write_timeout
        self.consumed = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("request not received in time")
        if self.consumed > self.limit:
            raise _HeadTooLargeError("request head too large")
        self.sock.settimeout(left)
        try:
            n = self.sock.recv_into(buffer)
        finally:
            self.sock.settimeout(self.write_timeout)  # for the answer, which follows the reads
        self.consumed += n
        return n


class _MetricsHandler(WSGIRequestHandler):
    """One request per connection (HTTP/1.0), read by a deadline; no request log, no tracebacks."""

    limits: ClassVar[HttpLimits]

    def setup(self) -> None:
        super().setup()
        self.rfile.close()  # replaced: reads that share one deadline
        limits = self.limits
        self.rfile = io.BufferedReader(_DeadlineReader(
            self.connection, time.monotonic() + limits.request_timeout, limits.max_header_bytes,
            limits.request_timeout))

    def handle(self) -> None:
        try:
            super().handle()
        except _HeadTooLargeError:
            self.close_connection = True
            with contextlib.suppress(OSError):
                self.wfile.write(REFUSED_431)
        except OSError:  # timed out or reset: the connection is simply closed
            self.close_connection = True

    def log_message(self, format: str, *args: Any) -> None:
        pass


class _MetricsServer(WSGIServer):
    """A thread per connection, at most METRICS_MAX_CONNECTIONS at once."""

    slots: ClassVar[threading.BoundedSemaphore]

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self.slots.acquire(blocking=False):
            self.shutdown_request(request)
            return
        threading.Thread(target=self._serve_one, args=(request, client_address), name="metrics-conn",
                         daemon=True).start()

    def _serve_one(self, request: Any, client_address: Any) -> None:
        try:
            self.finish_request(request, client_address)
        except Exception:
            pass  # one broken connection costs only itself, and no traceback
        finally:
            self.shutdown_request(request)
            self.slots.release()


def start_metrics_server(
    port: int, addr: str, registry: CollectorRegistry, limits: HttpLimits
) -> tuple[BaseServer, threading.Thread]:
    """prometheus_client's start_http_server, with the limits above. Raises OSError (port taken)."""
    # IPv6 listen addresses need their family (as prometheus_client does).
    family = socket.getaddrinfo(addr, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0][0]
    server_cls = type("MetricsServer", (_MetricsServer,), {
        "address_family": family, "slots": threading.BoundedSemaphore(METRICS_MAX_CONNECTIONS)})
    handler_cls = type("MetricsHandler", (_MetricsHandler,), {"limits": limits})
    httpd: WSGIServer = make_server(addr, port, make_wsgi_app(registry), server_cls,
                                    handler_class=handler_cls)
    thread = threading.Thread(target=httpd.serve_forever, name="metrics-http", daemon=True)
    thread.start()
    return httpd, thread
