"""Serving pods whose own engines measure them missing their own latency targets
(docs/stage-policy.md, "Targets the engines measure missed").

The filter admits a serving pod when its estimate (or a measured or learnt profile) meets the pod's
``max-ms-per-token`` and ``max-ttft-ms``. Once the pod runs, its engine measures what it really does
(``app.serving.live_profiles``). This module judges each pod's measurement against the pod's own
targets, with the steadiness rule learnt profiles use: a window counts only with ``min_requests``
requests, and a pod's condition changes only when two consecutive windows agree within
``steady_tolerance`` and are both on the other side of the target (so a load spike, a cold cache or
a measurement hovering at the target never makes a pod flap). Only changes are reported: one event
per pod and condition change, never one per poll.

Pure: no HTTP and no Kubernetes client; the poller hands it pod windows and sends the events.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime

from app.base.reasons import MESSAGE_PREFIX
from app.base.workload import ServingRole, WorkloadSpec
from app.config.policy import LearnPolicy
from app.serving.live_profiles import PodWindow, ServingPod

# Event reasons (docs/stage-policy.md): a pod starts missing a target (Warning), meets it again (Normal).
MISSED_REASON = "ServingTargetMissed"
MET_REASON = "ServingTargetMet"
METRICS = ("tpot", "ttft")
# The pod's annotation each metric is judged against, and how its figures read.
_ANNOTATION = {"tpot": "max-ms-per-token", "ttft": "max-ttft-ms"}
_UNIT = {"tpot": "ms/token", "ttft": "ms to first token"}


def target_of(spec: WorkloadSpec, metric: str) -> float | None:
    """The pod's own target for ``metric``, as the filter holds it: a prefill pod is not held to a
    per-token target, a decode pod not to a first-token one (docs/annotations.md, ``serving-role``)."""
    if metric == "tpot":
        return None if spec.serving_role is ServingRole.PREFILL else spec.max_ms_per_token
    return None if spec.serving_role is ServingRole.DECODE else spec.max_ttft_ms


def _measured_ms(w: PodWindow, metric: str) -> float | None:
    seconds = w.tpot_s if metric == "tpot" else w.ttft_s
    return None if seconds is None or not seconds > 0 else seconds * 1000.0


@dataclass(frozen=True, slots=True)
class Verdict:
    """A pod's condition for one metric, as last established by two steady windows."""

    pod: str  # namespace/name
    uid: str
    metric: str
    missed: bool
    measured_ms: float  # the later of the two windows' means
    previous_ms: float
    target_ms: float
    requests: float
    engine: str
    window_seconds: float
    at: float  # when the later window ended

    @property
    def reason(self) -> str:
        return MISSED_REASON if self.missed else MET_REASON

    def line(self) -> str:
        """One line for explain and the event: what was measured, against what, over which window."""
        when = datetime.fromtimestamp(self.at, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        verb = "misses" if self.missed else "meets"
        return (f"{verb} its {_ANNOTATION[self.metric]} {self.target_ms:g}: {self.engine} measures "
                f"{self.measured_ms:.1f} {_UNIT[self.metric]} (mean over the {self.window_seconds:g} s "
                f"to {when}, {self.requests:.0f} requests; the window before: {self.previous_ms:.1f})")

    def message(self) -> str:
        tail = ("; the target was admitted on an estimate or profile the hardware does not reach here: "
                "docs/stage-policy.md, \"Targets the engines measure missed\""
                if self.missed else "")
        return MESSAGE_PREFIX + "serving pod " + self.line() + tail


@dataclass(slots=True)
class _Track:
    last_ms: float  # the previous window's mean (the steadiness check's other half)
    seen_at: float
    verdict: Verdict | None = None


@dataclass
class TargetWatch:
    """Each serving pod's condition against its own targets, updated once per poll.

    Written by the poller thread, read by explain and the metrics: the table is replaced whole under
    a lock.
    """

    policy: LearnPolicy
    _tracks: dict[tuple[str, str], _Track] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def update(self, windows: Iterable[PodWindow], pods: Callable[[str], ServingPod | None],
               at: float) -> list[Verdict]:
        """Fold one poll in; returns the verdicts that changed (a pod's first verdict counts as a
        change only when it is a miss: a pod meeting its target from the start is not news)."""
        tracks = dict(self._tracks)
        changed: list[Verdict] = []
        p = self.policy
        for w in windows:
            if not w.requests >= p.min_requests:
                continue
            facts = pods(w.key)
            if facts is None:
                continue
            for metric in METRICS:
                target = target_of(facts.spec, metric)
                measured = _measured_ms(w, metric)
                if target is None or measured is None:
                    continue
                key = (w.key, metric)
                track = tracks.get(key)
                tracks[key] = new = _Track(measured, at, track.verdict if track else None)
                if track is None or at - track.seen_at > p.stale_after_seconds:
                    continue  # the first window (or the first after a gap) is one half of a steady pair
                before = track.last_ms
                if abs(measured - before) > p.steady_tolerance * max(measured, before):
                    continue
                if (measured > target) != (before > target):
                    continue  # one window on each side: the condition stands as it was
                verdict = Verdict(w.key, facts.spec.uid, metric, measured > target, measured, before,
                                  target, w.requests, w.engine, p.window_seconds, at)
                old = new.verdict
                new.verdict = verdict
                if (old is None and verdict.missed) or (old is not None and old.missed != verdict.missed):
                    changed.append(verdict)
        fresh = {k: t for k, t in tracks.items() if at - t.seen_at <= p.stale_after_seconds}
        with self._lock:
            self._tracks = fresh
        return changed

    def expire(self, at: float) -> None:
        """A poll that read nothing: pods not measured within ``stale_after_seconds`` are forgotten
        (a deleted pod, or Prometheus down that long), so the gauge does not report them forever."""
        self.update((), lambda _k: None, at)

    def missing(self) -> dict[str, int]:
        """Pods missing their own target now, per metric (every metric present, zeros included)."""
        out = dict.fromkeys(METRICS, 0)
        for (_pod, metric), t in self._tracks.items():
            if t.verdict is not None and t.verdict.missed:
                out[metric] += 1
        return out

    def of(self, pod: str) -> list[Verdict]:
        """The pod's current verdicts (missed or met), per-token first."""
        tracks = self._tracks
        return [t.verdict for m in METRICS if (t := tracks.get((pod, m))) is not None and t.verdict]
