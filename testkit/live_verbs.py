"""The extender's verbs served by uvicorn on a free loopback port, exactly as ``serve`` runs them
(``app.api.server.uvicorn_options``: the HTTP limits and TLS), for tests that need real sockets."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import uvicorn

from app.api.app import create_app
from app.api.server import uvicorn_options
from app.base.catalog import GpuCatalog
from app.config.settings import Settings
from app.extender.service import ExtenderService


@contextmanager
def live_verbs(settings: Settings, catalog: GpuCatalog, start_timeout: float = 20.0) -> Iterator[int]:
    """A ready ExtenderService behind uvicorn while inside; yields its port."""
    service = ExtenderService(settings, catalog)
    service.ready.set()
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(create_app(service), **uvicorn_options(settings)))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + start_timeout
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.02)
    try:
        yield sock.getsockname()[1]
    finally:
        server.should_exit = True
        thread.join(10)
