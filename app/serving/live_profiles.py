"""Serving profiles learnt from the engines' own latency metrics (docs/stage-policy.md, "Learnt profiles").

A serving engine already measures what the serving model estimates: vLLM, SGLang and TGI export the
time per output token (and, for vLLM and SGLang, the time to first token) as Prometheus histograms.
When the extender is told where Prometheus is (setting ``live_profiles``), a poller
(``app.cluster.serving_metrics``) reads each serving pod's mean over a window; this module turns those
per-pod windows into profiles keyed like a measured profile (model size, active parameters, GPU
product, GPU count, precision), so every later pod of the same kind is judged by what its
predecessors really did rather than by the estimate.

A learnt profile applies only once it is steady: enough requests in the window, and two consecutive
polls within ``steady_tolerance`` of each other (a cold cache, a load spike or a rolling restart does
not become a profile). Profiles not seen again for ``stale_after_seconds`` are dropped, so when
Prometheus is down the estimates come back rather than old measurements living forever.

Pure: no HTTP and no Kubernetes client; the poller hands it plain numbers.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime

from app.base.catalog import GpuSpec, normalize
from app.base.workload import Precision, WorkloadSpec
from app.config.policy import LearnPolicy
from app.serving.profiles import Profile, ProfileSource

# Provenance prefix explain recognises (app.extender.explain): a learnt profile's source starts with it.
LIVE_SOURCE_PREFIX = "live:"


@dataclass(frozen=True, slots=True)
class EngineMetrics:
    """The histogram names one serving engine exports, in seconds, with where they are defined."""

    engine: str
    tpot: str  # time per output token (decode)
    ttft: str | None  # time to first token; TGI has none
    prompt_tokens: str | None  # prompt length per request, to scale a learnt first-token time
    defined_in: str


# Names and label sets as the engines define them (docs/stage-policy.md, "Learnt profiles", cites the
# source files). Every series also carries the pod's namespace and name, which the scrape
# configuration adds (Prometheus Kubernetes service discovery or a PodMonitor).
ENGINES: tuple[EngineMetrics, ...] = (
    EngineMetrics("vllm", "vllm:time_per_output_token_seconds", "vllm:time_to_first_token_seconds",
                  "vllm:request_prompt_tokens", "vllm-project/vllm vllm/v1/metrics/loggers.py"),
    EngineMetrics("sglang", "sglang:time_per_output_token_seconds", "sglang:time_to_first_token_seconds",
                  None, "sgl-project/sglang python/sglang/srt/metrics/collector.py"),
    EngineMetrics("tgi", "tgi_request_mean_time_per_token_duration", None, None,
                  "huggingface/text-generation-inference router/src/server.rs"),
)
ENGINE_NAMES: tuple[str, ...] = tuple(e.engine for e in ENGINES)


@dataclass(frozen=True, slots=True)
class PodWindow:
    """One serving pod's traffic over the window, as Prometheus reported it."""

    namespace: str
    pod: str
    engine: str
    requests: float  # completed requests (first tokens, or per-token observations for TGI)
    tpot_s: float | None  # mean seconds per output token
    ttft_s: float | None = None  # mean seconds to first token
    prompt_tokens: float | None = None  # mean prompt length of those requests

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.pod}"


@dataclass(frozen=True, slots=True)
class ServingPod:
    """What the cluster knows about a running serving pod: its workload and the GPU it got."""

    spec: WorkloadSpec
    precision: Precision
    gpu: GpuSpec


# (GPU product, GPU count, precision, total params, active params): a measured profile's match key.
ProfileKey = tuple[str, int, str, float, float | None]


def profile_key(spec: WorkloadSpec, gpu: GpuSpec, precision: Precision) -> ProfileKey | None:
    if spec.model_params is None or spec.gpus < 1:
        return None
    return (normalize(gpu.name), spec.gpus, precision.value, spec.model_params, spec.active_params)


@dataclass(frozen=True, slots=True)
class Observation:
    """A key's request-weighted means over one poll, with the pods they came from."""

    key: ProfileKey
    spec: WorkloadSpec  # one of the pods' specs (they agree on the key)
    gpu: GpuSpec
    precision: Precision
    engine: str
    requests: float
    ms_per_token: float | None
    ttft_ms: float | None
    prompt_tokens: float | None
    pods: tuple[str, ...]


def _weighted(pairs: Iterable[tuple[float | None, float]]) -> float | None:
    num = den = 0.0
    for value, weight in pairs:
        if value is not None and math.isfinite(value) and value > 0 and weight > 0:
            num += value * weight
            den += weight
    return num / den if den > 0 else None


def observe(windows: Iterable[PodWindow], pods: Callable[[str], ServingPod | None]) -> list[Observation]:
    """Group pod windows by profile key; pods the cluster does not know, or that are not GPU serving
    pods with a model size, are left out (their numbers could not be attributed to hardware)."""
    groups: dict[ProfileKey, list[tuple[PodWindow, ServingPod]]] = {}
    for w in windows:
        if not (w.requests > 0 and math.isfinite(w.requests)):
            continue
        facts = pods(w.key)
        if facts is None:
            continue
        key = profile_key(facts.spec, facts.gpu, facts.precision)
        if key is not None:
            groups.setdefault(key, []).append((w, facts))
    out = []
    for key, members in sorted(groups.items(), key=lambda kv: str(kv[0])):
        ws = [w for w, _ in members]
        tpot = _weighted((w.tpot_s, w.requests) for w in ws)
        ttft = _weighted((w.ttft_s, w.requests) for w in ws)
        prompt = _weighted((w.prompt_tokens, w.requests) for w in ws if w.ttft_s is not None)
        first = members[0][1]
        out.append(Observation(
            key=key, spec=first.spec, gpu=first.gpu, precision=first.precision,
            engine=",".join(sorted({w.engine for w in ws})), requests=sum(w.requests for w in ws),
            ms_per_token=None if tpot is None else tpot * 1000.0,
            ttft_ms=None if ttft is None else ttft * 1000.0, prompt_tokens=prompt,
            pods=tuple(sorted(w.key for w in ws)),
        ))
    return out


def _agree(a: float | None, b: float | None, tolerance: float) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return abs(a - b) <= tolerance * max(a, b)


def _profile(obs: Observation, window_seconds: float, at: float) -> Profile:
    when = datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    shown = ", ".join(obs.pods[:5]) + (f" and {len(obs.pods) - 5} more" if len(obs.pods) > 5 else "")
    params = obs.key[3]
    return Profile(
        model=obs.spec.model or f"{params / 1e9:g}B",
        model_params=params,
        active_params=obs.spec.active_params,
        gpu=obs.gpu.name, gpus=obs.spec.gpus, precision=obs.precision,
        ms_per_token=obs.ms_per_token, ttft_ms=obs.ttft_ms,
        prompt_tokens=round(obs.prompt_tokens) if obs.prompt_tokens and obs.ttft_ms else None,
        source=(f"{LIVE_SOURCE_PREFIX} {obs.engine} metrics over {window_seconds:g}s to {when}, "
                f"{obs.requests:.0f} requests from {shown}"),
    )


@dataclass(slots=True)
class _Learnt:
    profile: Profile
    seen_at: float


@dataclass
class LiveProfileBook:
    """Measured profiles from a file first (the operator's word), then learnt ones, then nothing.

    Read on every filter, written by one poller thread: the learnt table is replaced whole under a
    lock, so a reader sees one poll's table or the next, never half of each.
    """

    policy: LearnPolicy
    file: ProfileSource | None = None
    _learnt: Mapping[tuple[str, int, str], tuple[_Learnt, ...]] = field(default_factory=dict)
    _pending: dict[ProfileKey, Observation] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def match(self, spec: WorkloadSpec, gpu: GpuSpec, precision: Precision) -> Profile | None:
        if self.file is not None:
            found = self.file.match(spec, gpu, precision)
            if found is not None:
                return found
        key = profile_key(spec, gpu, precision)
        if key is None:
            return None
        for entry in self._learnt.get(key[:3], ()):
            p = entry.profile
            if _close(p.model_params, spec.model_params) and _close(p.active_params, spec.active_params):
                return p
        return None

    def expire(self, at: float) -> None:
        """A poll that read nothing (Prometheus down or slow): steadiness restarts, and profiles
        not confirmed within ``stale_after_seconds`` give way to the estimates again."""
        self.update((), at)

    def learnt(self) -> list[Profile]:
        return [e.profile for entries in self._learnt.values() for e in entries]

    def update(self, observations: Iterable[Observation], at: float) -> list[Observation]:
        """Fold one poll in; returns the observations that became (or stayed) profiles."""
        table: dict[ProfileKey, _Learnt] = {
            (*k, e.profile.model_params, e.profile.active_params): e
            for k, entries in self._learnt.items() for e in entries
        }
        applied: list[Observation] = []
        pending: dict[ProfileKey, Observation] = {}
        for obs in observations:
            if obs.requests < self.policy.min_requests or (obs.ms_per_token is None and obs.ttft_ms is None):
                continue
            before = self._pending.get(obs.key)
            tol = self.policy.steady_tolerance
            if before is not None and _agree(before.ms_per_token, obs.ms_per_token, tol) \
                    and _agree(before.ttft_ms, obs.ttft_ms, tol):
                table[obs.key] = _Learnt(_profile(obs, self.policy.window_seconds, at), at)
                applied.append(obs)
            pending[obs.key] = obs
        fresh = {k: e for k, e in table.items() if at - e.seen_at <= self.policy.stale_after_seconds}
        grouped: dict[tuple[str, int, str], list[_Learnt]] = {}
        for k, e in fresh.items():
            grouped.setdefault(k[:3], []).append(e)
        with self._lock:
            self._learnt = {k: tuple(v) for k, v in grouped.items()}
            self._pending = pending
        return applied


def _close(a: float | None, b: float | None) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return math.isclose(a, b, rel_tol=0.01)
