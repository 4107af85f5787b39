"""Serving engines' latency histograms over HTTP, for a real Prometheus to scrape in tests.

Each serving pod is one path, ``/metrics/<namespace>/<pod>``, that serves its engine's histograms
with the names and label sets the engines define (vLLM: ``model_name``, ``engine``; SGLang:
``model_name``, ``engine_type``; TGI: none; ``app.serving.live_profiles.ENGINES``). Requests complete at
``rate`` per second; every request observes the pod's current means, so any window's
``rate(X_sum) / rate(X_count)`` is the mean itself however the scrapes fall (and a changed mean
shows in the windows after the change). ``scrape_configs`` is the Prometheus configuration that
labels each path with its pod's namespace and name, as Kubernetes service discovery would.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

_LABELS = {"vllm": 'engine="0",model_name="served-model"',
           "sglang": 'engine_type="unified",model_name="served-model"', "tgi": ""}
_NAMES = {"vllm": ("vllm:time_per_output_token_seconds", "vllm:time_to_first_token_seconds",
                   "vllm:request_prompt_tokens"),
          "sglang": ("sglang:time_per_output_token_seconds", "sglang:time_to_first_token_seconds", None),
          "tgi": ("tgi_request_mean_time_per_token_duration", None, None)}
_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
_PROMPT_BUCKETS = (64.0, 256.0, 1024.0, 4096.0, 16384.0)


@dataclass
class EnginePod:
    """One serving pod's engine and what it measures (seconds; prompt length in tokens)."""

    namespace: str
    pod: str
    engine: str  # vllm, sglang or tgi
    tpot_s: float
    ttft_s: float | None = None
    prompt_tokens: float = 512.0
    rate: float = 20.0  # requests completed per second
    # Running totals: count, and the sums of each histogram (tpot, ttft, prompt).
    _count: int = 0
    _sums: list[float] = field(default_factory=lambda: [0.0, 0.0, 0.0])
    _started: float = field(default_factory=time.monotonic)

    @property
    def path(self) -> str:
        return f"/metrics/{self.namespace}/{self.pod}"

    def advance(self) -> None:
        """Requests completed since the last scrape observe the current means."""
        now = int(self.rate * (time.monotonic() - self._started))
        new = max(0, now - self._count)
        self._count += new
        for i, v in enumerate((self.tpot_s, self.ttft_s, self.prompt_tokens)):
            self._sums[i] += new * (v or 0.0)

    def exposition(self) -> str:
        self.advance()
        names = _NAMES[self.engine]
        labels = _LABELS[self.engine]
        lines: list[str] = []
        values = (self.tpot_s, self.ttft_s, self.prompt_tokens)
        for i, name in enumerate(names):
            if name is None or (i == 1 and self.ttft_s is None):
                continue
            buckets = _PROMPT_BUCKETS if i == 2 else _BUCKETS
            lines += _histogram(name, labels, self._count, self._sums[i], values[i] or 0.0, buckets)
        return "\n".join(lines) + "\n"


def _histogram(name: str, labels: str, count: int, total: float, mean: float,
               buckets: tuple[float, ...]) -> list[str]:
    sep = "," if labels else ""
    out = [f"# HELP {name} Histogram.", f"# TYPE {name} histogram"]
    # Buckets only need to be monotonic and end at the count; the mean is what is read.
    for le in buckets:
        out.append(f'{name}_bucket{{{labels}{sep}le="{le}"}} {count if mean <= le else 0}')
    out.append(f'{name}_bucket{{{labels}{sep}le="+Inf"}} {count}')
    out.append(f"{name}_sum{{{labels}}} {total:.12g}")
    out.append(f"{name}_count{{{labels}}} {count}")
    return out


class EngineExporter:
    """The pods' paths on a loopback port, until ``close``."""

    def __init__(self, pods: list[EnginePod]) -> None:
        self.pods = {p.path: p for p in pods}
        self.lock = threading.Lock()
        exporter = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                with exporter.lock:
                    pod = exporter.pods.get(self.path)
                    body = pod.exposition().encode() if pod is not None else b""
                if pod is None:
                    self.send_error(404)
                    return
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = int(self.server.server_address[1])
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def set(self, namespace: str, pod: str, **values: float) -> None:
        """Change what a pod's engine measures from now on (``tpot_s``, ``ttft_s``...)."""
        with self.lock:
            p = self.pods[f"/metrics/{namespace}/{pod}"]
            p.advance()
            for k, v in values.items():
                setattr(p, k, v)

    def scrape_configs(self) -> list[dict[str, Any]]:
        """One Prometheus job per pod, labelled with its namespace and name."""
        return [{
            "job_name": f"serving-{p.namespace}-{p.pod}",
            "metrics_path": p.path,
            "static_configs": [{"targets": [f"127.0.0.1:{self.port}"],
                                "labels": {"namespace": p.namespace, "pod": p.pod}}],
        } for p in self.pods.values()]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
