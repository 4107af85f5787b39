"""Read the serving engines' latency histograms from Prometheus and feed the learnt profiles.

Opt-in (setting ``live_profiles``; docs/stage-policy.md, "Learnt profiles"). One daemon thread polls
Prometheus's HTTP query API every ``interval_seconds``; each query has its own timeout, so a Prometheus
that is down or slow costs one failed poll and never a verb: filter, prioritize and bind only read the
book the last good poll left, and learnt profiles not confirmed within ``stale_after_seconds`` give way
to the estimates again.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

import httpx

from app.base.ratelog import RateLimitedLog
from app.metrics.metrics import Metrics
from app.serving.live_profiles import (
    ENGINES,
    EngineMetrics,
    LiveProfileBook,
    Observation,
    PodWindow,
    ServingPod,
    observe,
)
from app.serving.model import ServingDefaults, error_group, serving_estimate
from app.serving.targets import TargetWatch

log = logging.getLogger(__name__)


class PrometheusError(RuntimeError):
    """A query failed: unreachable, too slow, or answered with an error."""


@dataclass(frozen=True, slots=True)
class Source:
    """Where the series are and how they name the pod they came from."""

    url: str
    timeout_seconds: float = 2.0
    window_seconds: float = 600.0
    namespace_label: str = "namespace"
    pod_label: str = "pod"
    engines: tuple[str, ...] = tuple(e.engine for e in ENGINES)


class PrometheusReader:
    """Per-pod means of each engine's histograms over the window, through /api/v1/query."""

    def __init__(self, source: Source, client: httpx.Client | None = None) -> None:
        self.source = source
        self.client = client or httpx.Client(timeout=source.timeout_seconds)

    def query(self, expr: str) -> dict[tuple[str, str], float]:
        s = self.source
        try:
            r = self.client.get(f"{s.url.rstrip('/')}/api/v1/query", params={"query": expr},
                                timeout=s.timeout_seconds)
            body = r.json()
        except (httpx.HTTPError, ValueError) as exc:
            raise PrometheusError(f"{s.url}: {type(exc).__name__}: {exc}") from exc
        if r.status_code != 200 or not isinstance(body, dict) or body.get("status") != "success":
            err = body.get("error") if isinstance(body, dict) else None
            raise PrometheusError(f"{s.url}: HTTP {r.status_code}: {err or 'not a query result'}")
        out: dict[tuple[str, str], float] = {}
        for series in (body.get("data") or {}).get("result") or ():
            labels, value = series.get("metric") or {}, series.get("value") or (None, "nan")
            ns, pod = labels.get(s.namespace_label), labels.get(s.pod_label)
            try:
                v = float(value[1])
            except (TypeError, ValueError, IndexError):
                continue
            if isinstance(ns, str) and isinstance(pod, str) and math.isfinite(v):
                out[(ns, pod)] = v
        return out

    def _by(self) -> tuple[str, str]:
        s = self.source
        return f"{s.namespace_label}, {s.pod_label}", f"{s.window_seconds:.0f}s"

    def _mean(self, histogram: str) -> str:
        by, w = self._by()
        return (f"sum by ({by}) (rate({histogram}_sum[{w}])) / "
                f"sum by ({by}) (rate({histogram}_count[{w}]))")

    def _count(self, histogram: str) -> str:
        by, w = self._by()
        return f"sum by ({by}) (increase({histogram}_count[{w}]))"

    def engine_windows(self, e: EngineMetrics) -> list[PodWindow]:
        requests = self.query(self._count(e.ttft or e.tpot))
        if not requests:
            return []
        tpot = self.query(self._mean(e.tpot))
        ttft = self.query(self._mean(e.ttft)) if e.ttft else {}
        prompt = self.query(self._mean(e.prompt_tokens)) if e.prompt_tokens and ttft else {}
        return [PodWindow(ns, pod, e.engine, n, tpot.get((ns, pod)), ttft.get((ns, pod)),
                          prompt.get((ns, pod)))
                for (ns, pod), n in sorted(requests.items())]

    def windows(self) -> list[PodWindow]:
        out: list[PodWindow] = []
        for e in ENGINES:
            if e.engine in self.source.engines:
                out.extend(self.engine_windows(e))
        return out


def estimate_ratios(observations: Iterable[Observation], defaults: ServingDefaults
                    ) -> list[tuple[str, str, float]]:
    """(error group, metric, estimate / measured) for each observation: how far the model was."""
    out = []
    for obs in observations:
        est = serving_estimate(obs.spec, obs.precision, obs.gpu, obs.gpu.hbm_bandwidth_tbs, defaults)
        group = error_group(obs.spec, obs.precision, obs.spec.concurrency or defaults.default_concurrency)
        if obs.ms_per_token:
            out.append((group, "tpot", est.ms_per_token / obs.ms_per_token))
        if obs.ttft_ms:
            out.append((group, "ttft", est.ttft_ms / obs.ttft_ms))
    return out


class EventSink(Protocol):
    """Where a pod's events go (the service's binder writes them to the API server)."""

    def event(self, namespace: str, name: str, uid: str, reason: str, message: str,
              warning: bool = False) -> None: ...


class LiveProfilePoller:
    """The thread that keeps a LiveProfileBook fed; ``poll_once`` is the whole of one cycle.

    With ``targets``, the same windows also judge each serving pod against its own targets: a pod
    that starts missing one (or meets it again) gets one event through ``events``, and the gauge
    ``llm_placement_serving_targets_missed`` counts the pods missing one now.
    """

    def __init__(self, reader: PrometheusReader, book: LiveProfileBook,
                 pods: Callable[[str], ServingPod | None], defaults: ServingDefaults,
                 metrics: Metrics, interval_seconds: float = 60.0,
                 clock: Callable[[], float] = time.time, targets: TargetWatch | None = None,
                 events: EventSink | None = None) -> None:
        self.reader, self.book, self.pods, self.defaults = reader, book, pods, defaults
        self.metrics, self.interval, self.clock = metrics, interval_seconds, clock
        self.targets, self.events = targets, events
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._warn = RateLimitedLog(log, 300.0)
        self.last_error: str | None = None

    def poll_once(self) -> list[Observation]:
        now = self.clock()
        try:
            windows = self.reader.windows()
        except PrometheusError as exc:
            self.last_error = str(exc)
            self.metrics.live_profile_polls.labels("error").inc()
            self._warn.warning("prometheus", "learnt profiles: poll failed, estimates decide "
                               f"where no learnt profile is current: {exc}")
            self.book.expire(now)
            self.metrics.live_profiles.set(len(self.book.learnt()))
            if self.targets is not None:
                self.targets.expire(now)
                self._publish_targets()
            return []
        self.last_error = None
        if self.targets is not None:
            self._judge_targets(windows, now)
        observations = observe(windows, self.pods)
        applied = self.book.update(observations, now)
        for group, metric, ratio in estimate_ratios(applied, self.defaults):
            self.metrics.estimate_ratio.labels(group, metric).observe(ratio)
        self.metrics.live_profile_polls.labels("ok").inc()
        self.metrics.live_profiles.set(len(self.book.learnt()))
        return applied

    def _judge_targets(self, windows: list[PodWindow], now: float) -> None:
        assert self.targets is not None
        for v in self.targets.update(windows, self.pods, now):
            if v.missed:
                self.metrics.serving_target_misses.labels(v.metric).inc()
                log.warning("serving pod %s %s", v.pod, v.line())
            if self.events is not None:
                namespace, _, name = v.pod.partition("/")
                self.events.event(namespace, name, v.uid, v.reason, v.message(), warning=v.missed)
        self._publish_targets()

    def _publish_targets(self) -> None:
        assert self.targets is not None
        for metric, count in self.targets.missing().items():
            self.metrics.serving_targets_missed.labels(metric).set(count)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="live-profiles", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.poll_once()
            except Exception:  # a bug here must not end learning for the process's lifetime
                log.exception("learnt profiles: poll raised")
            self._stop.wait(self.interval)


def describe(book: LiveProfileBook) -> list[dict[str, Any]]:
    """The learnt profiles in effect, for logs and the debug endpoint."""
    return [p.model_dump(mode="json") for p in book.learnt()]
