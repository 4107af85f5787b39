"""Serving pods judged against their own targets by what their engines measure (docs/stage-policy.md,
"Targets the engines measure missed"): two steady windows on the same side of the target set the
condition, only changes are reported, and the poller turns them into one event each, a gauge and an
explain line."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.base.catalog import GpuCatalog
from app.base.objects import node_object, pod_object
from app.base.workload import Precision, parse_workload
from app.cluster.serving_metrics import LiveProfilePoller, PrometheusError
from app.config.policy import LearnPolicy
from app.config.settings import Settings
from app.extender.explain import explain_spec
from app.extender.wiring import build_core, serving_pods
from app.metrics.metrics import Metrics
from app.serving.live_profiles import LiveProfileBook, PodWindow, ServingPod
from app.serving.targets import MET_REASON, MISSED_REASON, TargetWatch, target_of

ANN = "llm-placement.io/"
T4 = GpuCatalog.load().lookup("Tesla-T4")
assert T4 is not None
POLICY = LearnPolicy(min_requests=100, steady_tolerance=0.25, stale_after_seconds=300, window_seconds=600)


def spec_of(name: str = "chat", **ann: str) -> Any:
    pod = pod_object(name, namespace="serve", stage="serving", gpus=1, uid=f"uid-{name}",
                     annotations={ANN + k.replace("_", "-"): v for k, v in ann.items()})
    return parse_workload(pod)


CHAT = spec_of(model_params="7B", precision="int8", max_ms_per_token="40", max_ttft_ms="500")


def pods(*specs: Any) -> Any:
    table = {s.key: ServingPod(s, Precision.INT8, T4) for s in specs}
    return table.get


def w(tpot_ms: float | None, ttft_ms: float | None = None, requests: float = 500,
      pod: str = "chat") -> PodWindow:
    return PodWindow("serve", pod, "vllm", requests, None if tpot_ms is None else tpot_ms / 1000,
                     None if ttft_ms is None else ttft_ms / 1000)


def run(seq: list[PodWindow | None], spec: Any = CHAT, policy: LearnPolicy = POLICY
        ) -> tuple[TargetWatch, list[list[tuple[str, bool]]]]:
    """One poll per entry, 60 s apart (None: a poll without this pod); the changes of each poll."""
    watch = TargetWatch(policy)
    out = []
    for i, window in enumerate(seq):
        got = watch.update([window] if window else [], pods(spec), 1000.0 + 60 * i)
        out.append([(v.metric, v.missed) for v in got])
    return watch, out


@pytest.mark.parametrize(("seq", "changes", "missing"), [
    # Two steady windows over 40 ms: one miss, reported once however many polls follow.
    ([w(55), w(57), w(56), w(58)], [[], [("tpot", True)], [], []], 1),
    # Within the target from the start: nothing to tell.
    ([w(30), w(31), w(30)], [[], [], []], 0),
    # A spike: 30 then 60 (not steady), then 31: never a verdict.
    ([w(30), w(60), w(31)], [[], [], []], 0),
    # Steady but one window each side of the target (39, 41): the condition stands (none yet).
    ([w(39), w(41), w(39.5)], [[], [], []], 0),
    # Too few requests in the window: not judged at all.
    ([w(80, requests=50), w(80, requests=99)], [[], []], 0),
    # Missed, then met again: one Warning and one recovery, nothing in between.
    ([w(55), w(56), w(35), w(34), w(33)], [[], [("tpot", True)], [], [("tpot", False)], []], 0),
    # Missed, then one good window only: still missing (hysteresis).
    ([w(55), w(56), w(35), w(56)], [[], [("tpot", True)], [], []], 1),
    # First token judged on its own: 400 ms meets 500, 700 ms misses it.
    ([w(30, 700), w(31, 720)], [[], [("ttft", True)]], 0),
    # A poll without the pod in between breaks nothing (the tracks persist until stale).
    ([w(55), None, w(56)], [[], [], [("tpot", True)]], 1),
])
def test_two_steady_windows_set_the_condition_and_only_changes_are_reported(
        seq: list[PodWindow | None], changes: list[list[tuple[str, bool]]], missing: int) -> None:
    watch, got = run(seq)
    assert got == changes
    assert watch.missing()["tpot"] == missing


def test_a_gap_longer_than_stale_after_starts_steadiness_again() -> None:
    watch = TargetWatch(POLICY)
    watch.update([w(55)], pods(CHAT), 0)
    assert watch.update([w(56)], pods(CHAT), 400) == []  # 400 s after: not the window before
    assert [v.reason for v in watch.update([w(56)], pods(CHAT), 460)] == [MISSED_REASON]


def test_a_pod_not_measured_for_stale_after_is_forgotten() -> None:
    watch, _ = run([w(55), w(56)])
    assert watch.missing()["tpot"] == 1 and watch.of("serve/chat")
    watch.expire(1060 + POLICY.stale_after_seconds + 1)
    assert watch.missing() == {"tpot": 0, "ttft": 0} and watch.of("serve/chat") == []


@pytest.mark.parametrize(("ann", "judged"), [
    ({"max_ms_per_token": "40"}, {"tpot"}),
    ({"max_ttft_ms": "500"}, {"ttft"}),
    ({"max_ms_per_token": "40", "max_ttft_ms": "500"}, {"tpot", "ttft"}),
    ({"max_ms_per_token": "40", "max_ttft_ms": "500", "serving_role": "prefill"}, {"ttft"}),
    ({"max_ms_per_token": "40", "max_ttft_ms": "500", "serving_role": "decode"}, {"tpot"}),
    ({}, set()),  # no target of its own: never judged (the default interactive target is a preference)
])
def test_only_the_pods_own_targets_are_judged_as_the_filter_holds_them(
        ann: dict[str, str], judged: set[str]) -> None:
    spec = spec_of(model_params="7B", precision="int8", **ann)
    assert {m for m in ("tpot", "ttft") if target_of(spec, m) is not None} == judged
    _, got = run([w(90, 900), w(91, 910)], spec)
    assert {m for m, missed in got[1] if missed} == judged


def test_unknown_pods_are_not_judged() -> None:
    watch = TargetWatch(POLICY)
    for at in (0.0, 60.0):
        assert watch.update([w(90, pod="stranger")], pods(CHAT), at) == []


def test_the_verdict_says_measured_target_window_and_requests() -> None:
    watch = TargetWatch(POLICY)
    watch.update([w(55)], pods(CHAT), 1_796_000_000)
    (v,) = watch.update([w(57.25, requests=1200)], pods(CHAT), 1_796_000_060)
    assert v.reason == MISSED_REASON and v.uid == "uid-chat"
    msg = v.message()
    for part in ("misses its max-ms-per-token 40", "vllm measures 57.2 ms/token", "600 s",
                 "1200 requests", "the window before: 55.0", "Targets the engines measure missed"):
        assert part in msg, (part, msg)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.floats(10, 90), st.sampled_from([50, 500])), min_size=1, max_size=30))
def test_changes_alternate_so_each_condition_change_is_told_once(
        polls: list[tuple[float, int]]) -> None:
    _, got = run([w(ms, requests=n) for ms, n in polls])
    # A poll that does not measure a pod (too few requests) more than stale_after_seconds after it
    # was last measured forgets it, and what is told after that starts afresh: split what was told
    # at such gaps (polls are 60 s apart; the poll that measures it again forgets nothing).
    runs: list[list[bool]] = [[]]
    last_judged: int | None = None
    for i, ((_, n), poll) in enumerate(zip(polls, got, strict=True)):
        if n < POLICY.min_requests:
            continue
        if last_judged is not None and 60 * (i - 1 - last_judged) > POLICY.stale_after_seconds:
            runs.append([])
        last_judged = i
        runs[-1].extend(missed for _, missed in poll)
    for told in runs:
        assert all(a != b for a, b in itertools.pairwise(told))
        assert not told or told[0] is True  # the first thing told about a pod is a miss


class Windows:
    def __init__(self) -> None:
        self.now: list[PodWindow] | Exception = []

    def windows(self) -> list[PodWindow]:
        if isinstance(self.now, Exception):
            raise self.now
        return self.now


class Events:
    def __init__(self) -> None:
        self.sent: list[tuple[str, str, str, str, str, bool]] = []

    def event(self, namespace: str, name: str, uid: str, reason: str, message: str,
              warning: bool = False) -> None:
        self.sent.append((namespace, name, uid, reason, message, warning))


def test_the_poller_sends_one_event_per_change_sets_the_gauge_and_explain_says_it() -> None:
    svc = build_core(Settings(cluster_source="none", metrics_port=0), GpuCatalog.load())
    svc.absorb_node(node_object("t4", gpus=4, product="Tesla-T4"))
    with svc.lock:
        svc.snapshot.assume(CHAT, "t4")
    reader, events, metrics = Windows(), Events(), Metrics()
    clock = [1000.0]
    watch = TargetWatch(POLICY)
    svc.serving_targets = watch
    poller = LiveProfilePoller(reader, LiveProfileBook(POLICY), serving_pods(svc),  # type: ignore[arg-type]
                               svc.placer.policy.feasibility, metrics, clock=lambda: clock[0],
                               targets=watch, events=events)

    def gauge(metric: str) -> float | None:
        return metrics.registry.get_sample_value("llm_placement_serving_targets_missed", {"metric": metric})

    for tpot in (55, 56, 57, 56):  # four polls over the target: one event
        reader.now = [w(tpot, 300)]
        poller.poll_once()
        clock[0] += 60
    assert [(e[1], e[2], e[3], e[5]) for e in events.sent] == [("chat", "uid-chat", MISSED_REASON, True)]
    assert gauge("tpot") == 1 and gauge("ttft") == 0
    assert metrics.registry.get_sample_value(
        "llm_placement_serving_target_misses_total", {"metric": "tpot"}) == 1
    lines = explain_spec(svc, CHAT)["serving_targets"]
    assert lines and lines[0].startswith("misses its max-ms-per-token 40") and "meets its max-ttft-ms" in lines[1]
    # Prometheus gone past stale_after: the pod is forgotten, the gauge falls, no event is sent.
    reader.now = PrometheusError("down")
    clock[0] += POLICY.stale_after_seconds + 1
    poller.poll_once()
    assert gauge("tpot") == 0 and len(events.sent) == 1
    # Measured again, now within the target: steadiness starts over, and a pod first seen meeting
    # its target is not news.
    for tpot in (35, 34):
        reader.now = [w(tpot, 300)]
        poller.poll_once()
        clock[0] += 60
    assert len(events.sent) == 1 and explain_spec(svc, CHAT)["serving_targets"][0].startswith("meets")


def test_recovery_is_a_normal_event() -> None:
    reader, events = Windows(), Events()
    watch = TargetWatch(POLICY)
    clock = [0.0]
    poller = LiveProfilePoller(reader, LiveProfileBook(POLICY), pods(CHAT),  # type: ignore[arg-type]
                               Settings().policies().placement.feasibility, Metrics(),
                               clock=lambda: clock[0], targets=watch, events=events)
    for tpot in (55, 56, 30, 31):
        reader.now = [w(tpot)]
        poller.poll_once()
        clock[0] += 60
    assert [(e[3], e[5]) for e in events.sent] == [(MISSED_REASON, True), (MET_REASON, False)]


def test_the_explain_command_prints_the_verdicts_under_the_summary(capsys: pytest.CaptureFixture[str]) -> None:
    from app.cli import render_explain

    watch, _ = run([w(55, 300), w(56, 310)])
    lines = [v.line() for v in watch.of("serve/chat")]
    render_explain({"pod": "serve/chat", "summary": "bound to t4", "serving_targets": lines, "nodes": []})
    out = capsys.readouterr().out
    assert "engine: misses its max-ms-per-token 40: vllm measures 56.0 ms/token" in out
    assert "engine: meets its max-ttft-ms 500: vllm measures 310.0 ms to first token" in out
