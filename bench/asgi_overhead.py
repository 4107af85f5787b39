"""Per-call cost of the HTTP layer for filter/prioritize: FastAPI routing vs the bare ASGI fast path.

    python bench/asgi_overhead.py --nodes 500 --calls 400

Both apps wrap the same service in the same process; each call is driven through the ASGI interface
directly (no sockets), so the difference is exactly the framework's work per request. Reported as
microseconds per call and the ratio fast/FastAPI; "service only" calls the service method without
any HTTP layer, the floor both approach. Last, one metrics scrape's rendering (what the metrics
server does per scrape, after the calls have filled the series): the time it would hold the verbs'
event loop if /metrics were served there (docs/extender-protocol.md, "One server per job").
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Callable
from typing import Any

import orjson
import typer
from prometheus_client import generate_latest
from rich.console import Console
from rich.table import Table

from app.api.app import create_app, create_fastapi
from app.base.catalog import GpuCatalog
from app.base.objects import node_object, pod_object
from app.config.settings import Settings
from app.extender.wiring import build_core

console = Console()


def _service(nodes: int) -> Any:
    service = build_core(Settings(cluster_source="none", metrics_port=0), GpuCatalog.load())
    products = ["NVIDIA-H100-80GB-HBM3", "NVIDIA-A100-SXM4-80GB", "NVIDIA-L4", "Tesla-T4"]
    for i in range(nodes):
        service.absorb_node(node_object(f"n{i}", gpus=8, product=products[i % 4]))
    service.ready.set()
    return service


def _drive(app: Any, path: str, body: bytes) -> bytes:
    out: list[bytes] = []
    sent = False

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if sent:
            return {"type": "http.disconnect"}
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.body":
            out.append(message.get("body", b""))

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
             "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"",
             "root_path": "", "headers": [(b"content-type", b"application/json"),
                                          (b"content-length", str(len(body)).encode())],
             "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 8888)}
    asyncio.get_event_loop().run_until_complete(app(scope, receive, send))
    return b"".join(out)


def _time(fns: list[Callable[[], object]], calls: int) -> list[list[float]]:
    """Round-robin over ``fns`` so every variant sees the same service state and machine load."""
    for fn in fns:
        fn()
    samples: list[list[float]] = [[] for _ in fns]
    for _ in range(calls):
        for fn, out in zip(fns, samples, strict=True):
            t0 = time.perf_counter()
            fn()
            out.append((time.perf_counter() - t0) * 1e6)
    return samples


def main(nodes: int = 500, calls: int = 400) -> None:
    service = _service(nodes)
    names = [f"n{i}" for i in range(nodes)]
    pod = pod_object("chat", stage="serving", gpus=1, annotations={
        "llm-placement.io/model-params": "7B", "llm-placement.io/precision": "int8"})
    pod["metadata"]["uid"] = "u-chat"
    body = orjson.dumps({"Pod": pod, "NodeNames": names})
    asyncio.set_event_loop(asyncio.new_event_loop())
    fast, slow = create_app(service), create_fastapi(service)
    table = Table(title=f"HTTP layer per call, {nodes} nodes, {calls} calls (median / p99 us)")
    for col in ("verb", "service only", "FastAPI", "fast path", "fast / FastAPI (HTTP layer only)"):
        table.add_column(col)
    for verb, method in (("filter", service.filter), ("prioritize", service.prioritize)):
        path = f"/scheduler/{verb}"
        assert _drive(fast, path, body) == _drive(slow, path, body)
        base, f_api, f_fast = _time([
            lambda m=method: m(body),  # type: ignore[misc]
            lambda p=path: _drive(slow, p, body),  # type: ignore[misc]
            lambda p=path: _drive(fast, p, body),  # type: ignore[misc]
        ], calls)

        def q(xs: list[float], p: float) -> float:
            return statistics.quantiles(xs, n=100)[int(p) - 1]

        b, s, f = statistics.median(base), statistics.median(f_api), statistics.median(f_fast)
        table.add_row(verb, f"{b:.0f} / {q(base, 99):.0f}", f"{s:.0f} / {q(f_api, 99):.0f}",
                      f"{f:.0f} / {q(f_fast, 99):.0f}", f"{(f - b) / max(s - b, 1e-9):.2f}")
    console.print(table)
    [scrape] = _time([lambda: generate_latest(service.metrics.registry)], max(calls // 4, 20))
    size = len(generate_latest(service.metrics.registry))
    console.print(f"one metrics scrape rendered ({size:,} bytes): median {statistics.median(scrape):.0f} us, "
                  f"max {max(scrape):.0f} us")


if __name__ == "__main__":
    typer.run(main)
