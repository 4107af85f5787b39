"""A real Prometheus (Debian's ``prometheus`` binary) scraping given jobs, for the tests that need one."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import yaml

from kubeharness import free_port, wait_until
from kubeharness.procs import Component
from tests.prometheus.helpers import need_binary


@contextmanager
def running_prometheus(workdir: Path, scrape_configs: list[dict[str, Any]],
                       interval: str = "1s") -> Iterator[str]:
    """Prometheus scraping ``scrape_configs`` every ``interval`` while inside; yields its base URL
    once every target is up and scraped twice (so a rate has two points)."""
    workdir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    cfg = workdir / "prometheus.yml"
    cfg.write_text(yaml.safe_dump({"global": {"scrape_interval": interval, "scrape_timeout": interval},
                                   "scrape_configs": scrape_configs}))
    proc = Component("prometheus", [
        need_binary("prometheus"), f"--config.file={cfg}", f"--storage.tsdb.path={workdir / 'tsdb'}",
        f"--web.listen-address=127.0.0.1:{port}",
    ], workdir / "prometheus.log")
    proc.start()
    url = f"http://127.0.0.1:{port}"
    try:
        def scraped() -> bool:
            r = httpx.get(f"{url}/api/v1/query", params={"query": "count(sum_over_time(up[1m]) >= 2)"},
                          timeout=2)
            result = r.json()["data"]["result"] if r.status_code == 200 else []
            return bool(result) and float(result[0]["value"][1]) == len(scrape_configs)
        wait_until(scraped, 60, "prometheus to scrape every target twice", interval=0.3, watch=[proc])
        yield url
    finally:
        proc.stop(timeout=15)
