"""Profiles learnt from the serving engines' latency metrics (docs/stage-policy.md, "Learnt profiles"):
steady measurements replace the estimate for later pods of the same model, GPU and precision, file
profiles keep precedence, stale ones give way to the estimate, and Prometheus down never blocks."""

from __future__ import annotations

import json
import socket
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.base.catalog import GpuCatalog
from app.base.objects import node_object, pod_object
from app.base.workload import Precision, parse_workload
from app.cluster.serving_metrics import LiveProfilePoller, PrometheusReader, Source
from app.config.policy import LearnPolicy
from app.config.settings import ConfigError, Settings, load_settings
from app.extender.explain import explain_spec
from app.extender.service import ExtenderService
from app.extender.wiring import build_core, serving_pods
from app.metrics.metrics import Metrics
from app.serving.live_profiles import LiveProfileBook, PodWindow, ServingPod, observe

ANN = "llm-placement.io/"
CATALOG = GpuCatalog.load()
T4 = CATALOG.lookup("Tesla-T4")
assert T4 is not None
H100 = CATALOG.lookup("NVIDIA-H100-80GB-HBM3")
assert H100 is not None


def spec_of(name: str = "p", gpus: int = 1, **ann: str) -> Any:
    pod = pod_object(name, stage="serving", gpus=gpus,
                     annotations={ANN + k.replace("_", "-"): v for k, v in ann.items()})
    return parse_workload(pod)


CHAT = spec_of(model_params="7B", precision="int8", max_ms_per_token="30")


def facts(table: dict[str, ServingPod]) -> Any:
    return table.get


def window(pod: str, tpot_ms: float, requests: float = 500, ttft_ms: float | None = None) -> PodWindow:
    return PodWindow("serve", pod, "vllm", requests, tpot_ms / 1000,
                     None if ttft_ms is None else ttft_ms / 1000, 512 if ttft_ms else None)


def test_observations_are_request_weighted_per_model_gpu_and_precision() -> None:
    pods = {"serve/a": ServingPod(CHAT, Precision.INT8, T4), "serve/b": ServingPod(CHAT, Precision.INT8, T4),
            "serve/c": ServingPod(CHAT, Precision.INT8, H100)}
    obs = observe([window("a", 30, 100), window("b", 60, 300), window("c", 9),
                   window("unknown", 1000)], facts(pods))
    by_gpu = {o.gpu.name: o for o in obs}
    assert set(by_gpu) == {T4.name, H100.name}
    t4 = by_gpu[T4.name]
    # (30 x 100 + 60 x 300) / 400: the busier pod counts more; the pod nobody knows is not attributed.
    assert t4.ms_per_token == pytest.approx(52.5)
    assert t4.requests == 400 and t4.pods == ("serve/a", "serve/b")


def test_a_profile_applies_only_once_two_polls_agree_and_enough_requests_came() -> None:
    pods = {"serve/a": ServingPod(CHAT, Precision.INT8, T4)}
    book = LiveProfileBook(LearnPolicy(min_requests=100, steady_tolerance=0.25))
    assert book.update(observe([window("a", 38)], facts(pods)), at=0) == []
    assert book.match(CHAT, T4, Precision.INT8) is None  # one poll is not steady
    book.update(observe([window("a", 60)], facts(pods)), at=60)  # 38 -> 60: still moving
    assert book.match(CHAT, T4, Precision.INT8) is None
    book.update(observe([window("a", 58)], facts(pods)), at=120)
    learnt = book.match(CHAT, T4, Precision.INT8)
    assert learnt is not None and learnt.ms_per_token == pytest.approx(58)
    assert learnt.source.startswith("live:") and "serve/a" in learnt.source
    # Too few requests in the window never become (or confirm) a profile.
    thin = LiveProfileBook(LearnPolicy(min_requests=100))
    for t in (0, 60, 120):
        thin.update(observe([window("a", 38, requests=20)], facts(pods)), at=t)
    assert thin.match(CHAT, T4, Precision.INT8) is None


def test_only_the_same_key_matches_and_a_file_profile_comes_first() -> None:
    pods = {"serve/a": ServingPod(CHAT, Precision.INT8, T4)}
    book = LiveProfileBook(LearnPolicy(min_requests=1))
    for t in (0, 60):
        book.update(observe([window("a", 38)], facts(pods)), at=t)
    assert book.match(CHAT, T4, Precision.INT8) is not None
    assert book.match(CHAT, T4, Precision.INT4) is None
    assert book.match(CHAT, H100, Precision.INT8) is None
    assert book.match(spec_of(model_params="13B", precision="int8"), T4, Precision.INT8) is None
    assert book.match(spec_of(gpus=2, model_params="7B", precision="int8"), T4, Precision.INT8) is None

    class File:
        def match(self, spec: Any, gpu: Any, precision: Any) -> Any:
            return "from the file"

    book.file = File()
    assert book.match(CHAT, T4, Precision.INT8) == "from the file"


def test_learnt_profiles_not_confirmed_go_stale_and_the_estimate_returns() -> None:
    pods = {"serve/a": ServingPod(CHAT, Precision.INT8, T4)}
    book = LiveProfileBook(LearnPolicy(min_requests=1, stale_after_seconds=600))
    for t in (0, 60):
        book.update(observe([window("a", 38)], facts(pods)), at=t)
    book.expire(at=600)  # Prometheus down: still within stale_after of the last confirmation
    assert book.match(CHAT, T4, Precision.INT8) is not None
    book.expire(at=661)
    assert book.match(CHAT, T4, Precision.INT8) is None and book.learnt() == []


def live_service(**live: Any) -> ExtenderService:
    settings = Settings(cluster_source="none", metrics_port=0,
                        live_profiles={"prometheus_url": "http://127.0.0.1:9", "min_requests": 1, **live})
    svc = build_core(settings, CATALOG)
    for name, product in (("t4", "Tesla-T4"), ("h100", "NVIDIA-H100-80GB-HBM3")):
        svc.absorb_node(node_object(name, gpus=4, product=product))
    return svc


class FixedReader:
    def __init__(self, windows: list[PodWindow]) -> None:
        self.windows_ = windows

    def windows(self) -> list[PodWindow]:
        return self.windows_


def test_a_learnt_profile_changes_the_decision_and_explain_names_its_pods() -> None:
    svc = live_service()
    book = svc.placer.policy.feasibility.profiles
    assert isinstance(book, LiveProfileBook)
    # A 7B int8 chat model already running on a T4 node, measured at 28 ms per token.
    running = spec_of("chat-0", model_params="7B", precision="int8")
    with svc.lock:
        svc.snapshot.assume(running, "t4")
    assert serving_pods(svc)("default/chat-0") is not None
    metrics = Metrics()
    poller = LiveProfilePoller(FixedReader([PodWindow("default", "chat-0", "vllm", 800, 0.028)]),  # type: ignore[arg-type]
                               book, serving_pods(svc), svc.placer.policy.feasibility, metrics)
    fits, rejections = svc.placer.evaluate_nodes(CHAT, ["t4", "h100"])
    assert "t4" in rejections  # estimated above 30 ms on a T4
    poller.poll_once()
    poller.poll_once()
    fits, rejections = svc.placer.evaluate_nodes(CHAT, ["t4", "h100"])
    assert "t4" in fits and fits["t4"].ms_per_token == pytest.approx(28)
    note = next(e for e in explain_spec(svc, CHAT)["nodes"] if e["node"] == "t4")["serving_model"]
    assert note["decided_by"].startswith("learnt profile")
    assert "default/chat-0" in note["profile_source"] and "800 requests" in note["profile_source"]
    # How far the estimate was from the measurement is exported per error group.
    text = metrics.registry.get_sample_value(
        "llm_placement_serving_estimate_ratio_count", {"group": "int8/fp8", "metric": "tpot"})
    assert text == 1.0


def test_prometheus_down_or_slow_costs_one_failed_poll_never_a_hang() -> None:
    # Nothing listens on the port: refused at once.
    dead = socket.socket()
    dead.bind(("127.0.0.1", 0))
    port = dead.getsockname()[1]
    dead.close()
    metrics = Metrics()
    book = LiveProfileBook(LearnPolicy(min_requests=1))
    reader = PrometheusReader(Source(f"http://127.0.0.1:{port}", timeout_seconds=0.5))
    poller = LiveProfilePoller(reader, book, lambda key: None, Settings().policies().placement.feasibility,
                               metrics)
    assert poller.poll_once() == [] and poller.last_error is not None
    # A server that accepts and never answers: the poll ends at the timeout.
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    try:
        slow = PrometheusReader(Source(f"http://127.0.0.1:{silent.getsockname()[1]}", timeout_seconds=0.5))
        poller.reader = slow
        started = time.monotonic()
        assert poller.poll_once() == []
        assert time.monotonic() - started < 5
    finally:
        silent.close()
    assert metrics.registry.get_sample_value("llm_placement_live_profile_polls_total", {"result": "error"}) == 2


def test_the_reader_asks_per_pod_means_and_skips_series_without_pod_labels() -> None:
    seen: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        q = request.url.params["query"]
        seen.append(q)
        if "increase(vllm:time_to_first_token_seconds_count" in q:
            result = [{"metric": {"namespace": "serve", "pod": "a"}, "value": [0, "1200"]},
                      {"metric": {"job": "no-pod-label"}, "value": [0, "5"]}]
        elif "rate(vllm:time_per_output_token_seconds_sum" in q:
            result = [{"metric": {"namespace": "serve", "pod": "a"}, "value": [0, "0.021"]}]
        elif "rate(vllm:time_to_first_token_seconds_sum" in q:
            result = [{"metric": {"namespace": "serve", "pod": "a"}, "value": [0, "NaN"]}]
        else:
            result = []
        return httpx.Response(200, json={"status": "success", "data": {"resultType": "vector",
                                                                       "result": result}})

    client = httpx.Client(transport=httpx.MockTransport(handler))
    reader = PrometheusReader(Source("http://prom:9090", window_seconds=300), client)
    got = reader.windows()
    assert got == [PodWindow("serve", "a", "vllm", 1200.0, 0.021, None, None)]
    assert any("[300s]" in q and "sum by (namespace, pod)" in q for q in seen)
    assert any("sglang:time_to_first_token_seconds_count" in q for q in seen)
    assert any("tgi_request_mean_time_per_token_duration_count" in q for q in seen)


@pytest.mark.parametrize("live, complaint", [
    ({"prometheus_url": "prometheus:9090"}, "prometheus_url"),
    ({"prometheus_url": "http://p:9090", "interval_seconds": 0}, "interval_seconds"),
    ({"prometheus_url": "http://p:9090", "engines": ["triton"]}, "engines"),
    ({"prometheus_url": "http://p:9090", "steady_tolerance": float("nan")}, "steady_tolerance"),
])
def test_bad_live_profile_settings_are_refused_naming_the_field(
        tmp_path: Path, live: dict[str, Any], complaint: str) -> None:
    cfg = tmp_path / "config.yaml"
    cfg.write_text(json.dumps({"live_profiles": live}))
    with pytest.raises(ConfigError, match=complaint):
        load_settings(str(cfg))


def test_the_poller_thread_keeps_polling_and_stops() -> None:
    calls: list[float] = []
    done = threading.Event()

    class Counting:
        def windows(self) -> list[PodWindow]:
            calls.append(time.monotonic())
            if len(calls) >= 3:
                done.set()
            return []

    poller = LiveProfilePoller(Counting(), LiveProfileBook(LearnPolicy()), lambda key: None,  # type: ignore[arg-type]
                               Settings().policies().placement.feasibility, Metrics(), interval_seconds=0.01)
    poller.start()
    assert done.wait(5)
    poller.stop()
