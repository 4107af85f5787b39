"""The learnt profiles' per-pod windows read back from Prometheus over a look-back period, for
``llm-placement calibrate --from-prometheus`` (docs/stage-policy.md, "Calibrating from your cluster").

The same expressions the live poller asks (``app.cluster.serving_metrics``), through the range query
API at steps of one window, so consecutive points are consecutive, non-overlapping windows.
"""

from __future__ import annotations

import math

import httpx

from app.cluster.serving_metrics import PrometheusError, PrometheusReader
from app.serving.live_profiles import ENGINES, EngineMetrics, PodWindow


class HistoryReader(PrometheusReader):
    """The learnt profiles' per-pod window means, at every window over a look-back period."""

    def query_range(self, expr: str, start: float, end: float, step: float
                    ) -> dict[tuple[str, str], dict[float, float]]:
        s = self.source
        try:
            r = self.client.get(f"{s.url.rstrip('/')}/api/v1/query_range",
                                params={"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}",
                                        "step": f"{step:g}"}, timeout=s.timeout_seconds)
            body = r.json()
        except (httpx.HTTPError, httpx.InvalidURL, ValueError) as exc:  # a body that is not JSON too
            raise PrometheusError(f"{s.url}: {type(exc).__name__}: {' '.join(str(exc).split())[:200]}"
                                  ) from None
        if r.status_code != 200 or not isinstance(body, dict) or body.get("status") != "success":
            err = body.get("error") if isinstance(body, dict) else None
            raise PrometheusError(f"{s.url}: HTTP {r.status_code}: {err or 'not a query result'}")
        out: dict[tuple[str, str], dict[float, float]] = {}
        data = body.get("data") or {}
        for series in (data.get("result") or ()) if isinstance(data, dict) else ():
            if not isinstance(series, dict):
                continue
            labels = series.get("metric") or {}
            ns, pod = labels.get(s.namespace_label), labels.get(s.pod_label)
            if not (isinstance(ns, str) and isinstance(pod, str)):
                continue
            points: dict[float, float] = {}
            for pair in series.get("values") or ():
                try:
                    t, v = float(pair[0]), float(pair[1])
                except (TypeError, ValueError, IndexError):
                    continue
                if math.isfinite(v):
                    points[round(t, 3)] = v
            out[(ns, pod)] = points
        return out

    def engine_history(self, e: EngineMetrics, start: float, end: float
                       ) -> dict[tuple[str, str], dict[float, PodWindow]]:
        step = self.source.window_seconds
        requests = self.query_range(self._count(e.ttft or e.tpot), start, end, step)
        if not requests:
            return {}
        tpot = self.query_range(self._mean(e.tpot), start, end, step)
        ttft = self.query_range(self._mean(e.ttft), start, end, step) if e.ttft else {}
        prompt = self.query_range(self._mean(e.prompt_tokens), start, end, step) \
            if e.prompt_tokens and ttft else {}
        out: dict[tuple[str, str], dict[float, PodWindow]] = {}
        for (ns, pod), counts in requests.items():
            mine = out.setdefault((ns, pod), {})
            for t, n in counts.items():
                mine[t] = PodWindow(ns, pod, e.engine, n, tpot.get((ns, pod), {}).get(t),
                                    ttft.get((ns, pod), {}).get(t), prompt.get((ns, pod), {}).get(t))
        return out

    def history(self, start: float, end: float) -> dict[tuple[str, str], dict[float, PodWindow]]:
        out: dict[tuple[str, str], dict[float, PodWindow]] = {}
        for e in ENGINES:
            if e.engine in self.source.engines:
                for key, windows in self.engine_history(e, start, end).items():
                    out.setdefault(key, {}).update(windows)
        return out
