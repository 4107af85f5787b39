"""Learnt profiles through a real Prometheus (docs/stage-policy.md, "Learnt profiles").

A small exporter serves the serving engines' latency histograms with their exact names and label
sets (vLLM: ``model_name``, ``engine``; SGLang: ``model_name``, ``engine_type``; TGI: none), one path per
engine; Debian's ``prometheus`` scrapes each path as one serving pod, adding the pod's namespace and name
as a Kubernetes scrape configuration would. The extender's own poller, started by the same wiring
``llm-placement serve`` uses, reads Prometheus's query API: the learnt figures must equal what the
exporter served, must change the filter's decision, and must give way to the estimate once Prometheus
is gone and they go stale, without a verb ever waiting for Prometheus.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest
import yaml

from app.base.catalog import GpuCatalog
from app.base.objects import node_object, pod_object
from app.base.workload import parse_workload
from app.cluster.serving_metrics import LiveProfilePoller
from app.config.settings import Settings
from app.extender.explain import explain_spec
from app.extender.service import ExtenderService
from app.extender.wiring import build_core, start_live_profiles
from app.serving.live_profiles import LiveProfileBook
from kubeharness import free_port, wait_until
from kubeharness.procs import Component
from tests.prometheus.helpers import need_binary

pytestmark = [pytest.mark.prometheus, pytest.mark.timeout(300)]

ANN = "llm-placement.io/"
RATE = 20.0  # requests per second each fake engine completes
# What each fake engine measures: mean seconds per output token and to first token.
SERVED = {"vllm": (0.028, 0.180), "sglang": (0.009, 0.070), "tgi": (0.017, None)}
VLLM_TPOT_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0)


def histogram(name: str, labels: str, count: float, mean: float, buckets: tuple[float, ...]) -> list[str]:
    # Whole requests, and a sum that is exactly their number x the mean: any window's rate(sum) /
    # rate(count) is then the mean itself, however the scrapes fall.
    count = float(int(count))
    sep = "," if labels else ""
    lines = [f"# HELP {name} Histogram.", f"# TYPE {name} histogram"]
    for le in buckets:
        lines.append(f'{name}_bucket{{{labels}{sep}le="{le}"}} {count if mean <= le else 0:.0f}')
    lines.append(f'{name}_bucket{{{labels}{sep}le="+Inf"}} {count:.0f}')
    lines.append(f"{name}_sum{{{labels}}} {count * mean:.6f}")
    lines.append(f"{name}_count{{{labels}}} {count:.0f}")
    return lines


def exposition(engine: str, count: float) -> str:
    tpot, ttft = SERVED[engine]
    if engine == "vllm":
        labels = 'engine="0",model_name="meta-llama/Llama-2-7b-chat-hf"'
        lines = (histogram("vllm:time_per_output_token_seconds", labels, count, tpot, VLLM_TPOT_BUCKETS)
                 + histogram("vllm:time_to_first_token_seconds", labels, count, ttft or 0, (0.1, 0.25, 0.5))
                 + histogram("vllm:request_prompt_tokens", labels, count, 512, (100, 200, 500, 1000)))
    elif engine == "sglang":
        labels = 'engine_type="unified",model_name="Qwen/Qwen2.5-72B-Instruct"'
        lines = (histogram("sglang:time_per_output_token_seconds", labels, count, tpot, (0.005, 0.01, 0.1))
                 + histogram("sglang:time_to_first_token_seconds", labels, count, ttft or 0, (0.1, 1.0)))
    else:
        lines = histogram("tgi_request_mean_time_per_token_duration", "", count, tpot, (0.01, 0.05, 0.1))
    return "\n".join(lines) + "\n"


class Exporter:
    """/vllm, /sglang, /tgi: counters that grow at RATE requests per second since start."""

    def __init__(self) -> None:
        self.started = time.monotonic()
        exporter = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                engine = self.path.strip("/")
                if engine not in SERVED:
                    self.send_error(404)
                    return
                body = exposition(engine, RATE * (time.monotonic() - exporter.started)).encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@dataclass
class Prom:
    proc: Component
    url: str


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Prom]:
    workdir = tmp_path_factory.mktemp("live-profiles")
    exporter = Exporter()
    port = free_port()
    jobs = [{
        "job_name": f"serving-{engine}",
        "metrics_path": f"/{engine}",
        # What a Kubernetes pod scrape configuration (or a PodMonitor) adds to every series.
        "static_configs": [{"targets": [f"127.0.0.1:{exporter.port}"],
                            "labels": {"namespace": "serve", "pod": f"chat-{engine}"}}],
    } for engine in SERVED]
    config = {"global": {"scrape_interval": "1s", "scrape_timeout": "1s"}, "scrape_configs": jobs}
    cfg = workdir / "prometheus.yml"
    cfg.write_text(yaml.safe_dump(config))
    proc = Component("prometheus", [
        need_binary("prometheus"), f"--config.file={cfg}", f"--storage.tsdb.path={workdir / 'tsdb'}",
        f"--web.listen-address=127.0.0.1:{port}",
    ], workdir / "prometheus.log")
    proc.start()
    prom = Prom(proc, f"http://127.0.0.1:{port}")
    try:
        def scraped() -> bool:
            r = httpx.get(f"{prom.url}/api/v1/query", params={"query": "count(up == 1)"}, timeout=2)
            result = r.json()["data"]["result"] if r.status_code == 200 else []
            return bool(result) and float(result[0]["value"][1]) == len(SERVED)
        wait_until(scraped, 60, "prometheus to scrape the three engines", interval=0.3, watch=[proc])
        time.sleep(3)  # a few scrapes each, so rates have two points
        yield prom
    finally:
        proc.stop(timeout=15)
        exporter.server.shutdown()


def serving(name: str, gpus: int = 1, **ann: str) -> dict[str, Any]:
    return pod_object(name, namespace="serve", stage="serving", gpus=gpus,
                      annotations={ANN + k.replace("_", "-"): v for k, v in ann.items()})


def service(prom_url: str) -> ExtenderService:
    settings = Settings(cluster_source="none", metrics_port=0, live_profiles={
        "prometheus_url": prom_url, "interval_seconds": 1, "window_seconds": 30, "min_requests": 1,
        "timeout_seconds": 2, "stale_after_seconds": 60,
    })
    svc = build_core(settings, GpuCatalog.load())
    for name, product in (("t4", "Tesla-T4"), ("h100", "NVIDIA-H100-80GB-HBM3"), ("l4", "NVIDIA-L4")):
        svc.absorb_node(node_object(name, gpus=4, product=product))
    # The pods the engines run in, as the watch would have them (bound, with their annotations).
    with svc.lock:
        for pod, node in ((serving("chat-vllm", model_params="7B", precision="int8"), "t4"),
                          (serving("chat-sglang", gpus=2, model_params="72B", precision="fp8"), "h100"),
                          (serving("chat-tgi", model_params="8B", precision="bf16"), "l4")):
            svc.snapshot.assume(parse_workload(pod), node)
    return svc


def test_prometheus_stores_the_engines_names_and_labels(prometheus: Prom) -> None:
    # What the poller reads is what a real engine's series look like once scraped from a pod.
    r = httpx.get(f"{prometheus.url}/api/v1/series",
                  params={"match[]": "vllm:time_per_output_token_seconds_count"}, timeout=5)
    series = r.json()["data"]
    assert series and {"engine", "model_name", "namespace", "pod"} <= set(series[0])


def test_learnt_profiles_equal_the_engines_measurements_and_decide(prometheus: Prom) -> None:
    svc = service(prometheus.url)
    book = svc.placer.policy.feasibility.profiles
    assert isinstance(book, LiveProfileBook)
    chat = parse_workload(serving("next", model_params="7B", precision="int8", max_ms_per_token="30"))
    _, rejections = svc.placer.evaluate_nodes(chat, ["t4"])
    assert "t4" in rejections, "the estimate alone keeps a 30 ms/token 7B int8 pod off the T4"
    poller = start_live_profiles(svc)
    assert poller is not None
    try:
        wait_until(lambda: len(book.learnt()) == len(SERVED), 30, "three learnt profiles", interval=0.3)
    finally:
        poller.stop()
    learnt = {p.gpu: p for p in book.learnt()}
    t4, h100, l4 = (learnt[n] for n in ("T4", "H100-SXM-80GB", "L4"))
    assert t4.ms_per_token == pytest.approx(28.0, rel=1e-3)
    assert t4.ttft_ms == pytest.approx(180.0, rel=1e-3) and t4.prompt_tokens == 512
    assert h100.gpus == 2 and h100.ms_per_token == pytest.approx(9.0, rel=1e-3)
    assert h100.ttft_ms == pytest.approx(70.0, rel=1e-3)
    assert l4.ms_per_token == pytest.approx(17.0, rel=1e-3) and l4.ttft_ms is None
    fits, _ = svc.placer.evaluate_nodes(chat, ["t4"])
    assert "t4" in fits and fits["t4"].ms_per_token == pytest.approx(28.0, rel=1e-3)
    note = next(e for e in explain_spec(svc, chat)["nodes"] if e["node"] == "t4")["serving_model"]
    assert note["decided_by"].startswith("learnt profile") and "serve/chat-vllm" in note["profile_source"]
    assert svc.metrics.registry.get_sample_value("llm_placement_live_profiles") == 3


def test_prometheus_gone_falls_back_to_the_estimate_without_blocking(prometheus: Prom) -> None:
    svc = service(prometheus.url)
    book = svc.placer.policy.feasibility.profiles
    assert isinstance(book, LiveProfileBook)
    clock = [time.time()]
    start = start_live_profiles(svc)
    assert start is not None
    start.stop()
    poller = LiveProfilePoller(start.reader, book, start.pods, start.defaults, svc.metrics,
                               clock=lambda: clock[0])
    poller.poll_once()
    clock[0] += 1
    poller.poll_once()
    chat = parse_workload(serving("next", model_params="7B", precision="int8", max_ms_per_token="30"))
    assert "t4" in svc.placer.evaluate_nodes(chat, ["t4"])[0]
    prometheus.proc.stop(timeout=15)
    began = time.monotonic()
    clock[0] += 61
    assert poller.poll_once() == [] and poller.last_error is not None
    assert time.monotonic() - began < 5
    assert book.learnt() == []
    assert "t4" in svc.placer.evaluate_nodes(chat, ["t4"])[1], "stale: the estimate decides again"
    assert svc.metrics.registry.get_sample_value(
        "llm_placement_live_profile_polls_total", {"result": "error"}) == 1
