"""API calls (binds, events, annotations) made by a child process instead of threads of ours.

Why a process: the interpreter that answers kube-scheduler's filter and prioritize calls is on the
scheduling cycle's critical path, and every bind and Placed event costs it a TLS write and an HTTP
parse under the GIL (a quarter of the extender's busy samples in the py-spy profile of BENCHMARKS.md,
section 2, "500 nodes"). Here the parent only pickles a small request onto a pipe; the child owns its
own connection pool, credentials (resolved the same way, docs/extender-protocol.md) and GIL. Setting
``api_calls`` (``thread``, the default, or ``process``) chooses; measured on kube-scheduler's
throughput the two are equal so far (BENCHMARKS.md, section 2, "Binds from threads or from a child
process").

Failure handling, so a bind never hangs and never crashes the service: each call has a deadline; if
the child exits, every call waiting on it fails with status 0 ("API process exited") and the next
call starts a new child.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import multiprocessing
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from multiprocessing.connection import Connection
from typing import Any

import orjson
from kubernetes.client.exceptions import ApiException

log = logging.getLogger(__name__)

# Calls the child runs at once: binds from kube-scheduler's parallel binding cycles plus the event
# writer; more would only queue on the API server's own limits.
CHILD_WORKERS = 16
# Extra wait past a call's own timeout before the parent gives up on the child's answer.
GRACE_SECONDS = 2.0

Request = tuple[int, str, str, bytes | None, list[tuple[str, str]] | None, str, float]
Reply = tuple[int, int, str, bytes]


def _child(conn: Connection, kubeconfig: str | None) -> None:  # pragma: no cover - runs in the child
    # Imported here: the child builds its own client from the same credentials source.
    from app.cluster.client import api_client
    from app.cluster.rest import JsonRest

    rest = JsonRest(api_client(kubeconfig))
    send_lock = threading.Lock()

    def run(req: Request) -> None:
        rid, method, path, body, query, content_type, timeout = req
        try:
            data = rest.request(method, path, body, query=query, content_type=content_type,
                                timeout=timeout)
            reply: Reply = (rid, 200, "", data)
        except ApiException as exc:
            reply = (rid, int(exc.status or 0), str(exc.reason or ""), b"")
        except Exception as exc:  # a connection error must reach the caller, not kill the child
            reply = (rid, 0, f"{type(exc).__name__}: {exc}"[:300], b"")
        with send_lock:
            conn.send(reply)

    with ThreadPoolExecutor(CHILD_WORKERS, thread_name_prefix="api") as pool:
        while True:
            try:
                req = conn.recv()
            except (EOFError, OSError):
                return  # the parent is gone
            if req is None:
                return
            pool.submit(run, req)


class ProcessRest:
    """``JsonRest.request`` with the same signature and errors, executed by a child process."""

    def __init__(self, kubeconfig: str | None,
                 start: Callable[[Connection, str | None], Any] | None = None) -> None:
        self.kubeconfig = kubeconfig
        self._start_child = start or self._spawn
        self._lock = threading.Lock()  # guards the pipe, the child and the pending map
        self._ids = itertools.count(1)
        self._pending: dict[int, Future[Reply]] = {}
        self._conn: Connection | None = None
        self._proc: Any = None
        self._closed = False
        # Started now, not at the first bind: the child's imports and client take ~1 s, which would
        # otherwise land inside kube-scheduler's first bind call.
        with self._lock:
            self._ensure_child()

    # ----- child lifecycle ------------------------------------------------------------------------
    @staticmethod
    def _spawn(conn: Connection, kubeconfig: str | None) -> Any:
        # spawn, not fork: forking a process that runs threads (watches, the event loop) can copy a
        # lock held by another thread and deadlock the child.
        proc = multiprocessing.get_context("spawn").Process(
            target=_child, args=(conn, kubeconfig), name="llm-placement-api", daemon=True)
        proc.start()
        conn.close()  # the child holds its own copy; ours would keep the pipe open after it exits
        return proc

    def _ensure_child(self) -> Connection:
        if self._conn is not None and self._proc is not None and self._proc.is_alive():
            return self._conn
        if self._proc is not None:
            log.warning("API process exited (code %s); starting a new one", self._proc.exitcode)
        parent, child = multiprocessing.Pipe()
        self._proc = self._start_child(child, self.kubeconfig)
        self._conn = parent
        # Each child has its own pending map, so a dead child's reader fails only its own calls.
        self._pending = {}
        threading.Thread(target=self._read, args=(parent, self._proc, self._pending),
                         name="api-replies", daemon=True).start()
        return parent

    def _read(self, conn: Connection, proc: Any, pending: dict[int, Future[Reply]]) -> None:
        while True:
            try:
                rid, status, reason, data = conn.recv()
            except (EOFError, OSError):
                break
            with self._lock:
                fut = pending.pop(rid, None)
            if fut is not None:
                fut.set_result((rid, status, reason, data))
        with self._lock:
            if self._proc is proc:
                self._conn = None
            left = list(pending.values())
            pending.clear()
        for fut in left:
            fut.set_result((0, 0, "API process exited", b""))

    # ----- the call -------------------------------------------------------------------------------
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
        payload = None if body is None else (body if isinstance(body, bytes) else orjson.dumps(body))
        fut: Future[Reply] = Future()
        with self._lock:
            if self._closed:
                raise ApiException(status=0, reason="API process closed")
            conn = self._ensure_child()
            rid = next(self._ids)
            pending = self._pending
            pending[rid] = fut
            try:
                conn.send((rid, method, path, payload, query, content_type, timeout))
            except (OSError, ValueError) as exc:
                pending.pop(rid, None)
                self._conn = None
                raise ApiException(status=0, reason=f"API process unreachable: {exc}") from None
        try:
            _, status, reason, data = fut.result(timeout + GRACE_SECONDS)
        except TimeoutError:
            with self._lock:
                pending.pop(rid, None)
            raise ApiException(status=0, reason=f"no answer from the API process in {timeout:.0f} s"
                               ) from None
        if not 200 <= status < 300:
            raise ApiException(status=status, reason=reason)
        return data

    def close(self) -> None:
        with self._lock:
            self._closed = True
            conn, proc = self._conn, self._proc
            self._conn = None
        if conn is not None:
            with contextlib.suppress(OSError, ValueError):
                conn.send(None)
        if proc is not None:
            proc.join(timeout=5)
            if proc.is_alive():
                proc.kill()
