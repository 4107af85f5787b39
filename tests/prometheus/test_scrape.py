"""A real Prometheus scrapes the real extender, and every query users see returns real data.

Two extenders are scraped by one Prometheus (Debian's ``prometheus`` binary, 1 s scrape and rule
evaluation, loaded with deploy/prometheus/rules.yaml):

* a standalone ``llm-placement serve`` with ``LLMP_CLUSTER_SOURCE=none`` (non-cache mode: it learns
  nodes from the full Node objects in each request), driven with kube-scheduler-shaped filter,
  prioritize, bind and preempt bodies built with app.base.objects, invalid pods and malformed bodies;
* the extender of the integration suite's real control plane (etcd, kube-apiserver, kube-scheduler,
  kubeharness), where kube-scheduler schedules real pods through it, so the bind-time
  quality metrics, the watch-fed cache gauges and the data-gravity edges come from the real bind path;
  the API server is restarted once so the watch-restart counter moves.

Then every expression of every dashboard panel, every recording rule and every alert's signal is
queried (Grafana's ``$__rate_interval`` replaced by a window covering the run) and must return at least
one series with a finite value. The only exception is a query over a metric that *nothing in app/
records yet* (for example the gang metrics while gang scheduling is not in the tree): that is reported
as a warning naming the metric, never skipped silently, and the static test in test_dashboards.py
still requires the name to be exported. Once code records such a metric, its panels must show data
here — this scenario creates a gang and a producer/consumer pair so they can.

Run: ``pytest -m prometheus tests/prometheus`` (needs ``prometheus`` on PATH and the control-plane
binaries, built by scripts/build-controlplane.sh on first use). Logs: the temp dir printed on failure.
"""

from __future__ import annotations

import math
import os
import sys
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import yaml

from app.base.objects import node_object, pod_object
from kubeharness import (
    ControlPlane,
    build_binaries,
    cpu_node,
    create_nodes,
    create_pod,
    ensure_namespace,
    find_binaries,
    free_port,
    gpu_node,
    llm_pod,
    wait_for_node_name,
    wait_until,
)
from kubeharness.procs import Component, port_is_free, tail
from tests.prometheus.helpers import (
    RULES,
    Query,
    all_queries,
    generator,
    metric_attrs,
    need_binary,
    recorded_in_app,
    referenced,
)

pytestmark = [pytest.mark.prometheus, pytest.mark.timeout(1200)]

ANN = "llm-placement.io/"
RATE_WINDOW = "10m"  # stands in for $__rate_interval: covers the whole run, so early events still count
DATA_DEADLINE = 180.0  # quality gauges refresh every 10 s; rules evaluate every 1 s
NS = "prom-scrape"


# --- processes ----------------------------------------------------------------------------------
def extender_argv() -> list[str]:
    script = Path(sys.executable).parent / "llm-placement"
    return [str(script), "serve"] if script.is_file() else [sys.executable, "-m", "app.cli", "serve"]


@dataclass
class Standalone:
    proc: Component
    port: int
    metrics_port: int

    @property
    def verbs(self) -> str:
        return f"http://127.0.0.1:{self.port}/scheduler"


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("prom-scrape")


@pytest.fixture(scope="module")
def standalone(workdir: Path) -> Iterator[Standalone]:
    port, mport = free_port(), free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLMP_")}
    env.update({
        "LLMP_CLUSTER_SOURCE": "none", "LLMP_HOST": "127.0.0.1", "LLMP_PORT": str(port),
        "LLMP_METRICS_HOST": "127.0.0.1", "LLMP_METRICS_PORT": str(mport), "LLMP_LOG_LEVEL": "warning",
        "PYTHONUNBUFFERED": "1",
    })
    proc = Component("extender-standalone", extender_argv(), workdir / "extender-standalone.log", env=env)
    proc.start()
    try:
        wait_until(lambda: httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=2).status_code == 200,
                   60, "standalone extender /readyz", interval=0.2, watch=[proc])
        yield Standalone(proc, port, mport)
    finally:
        proc.stop(timeout=15)


@pytest.fixture(scope="module")
def control_plane(workdir: Path) -> Iterator[ControlPlane]:
    build_binaries()  # a no-op when cached (the integration suite builds the same binaries)
    cp = ControlPlane(workdir / "controlplane", find_binaries(build=False),
                      extender_extra_env={"LLMP_METRICS_HOST": "127.0.0.1"})
    cp.start()
    try:
        yield cp
    finally:
        cp.stop()


@dataclass
class Prometheus:
    proc: Component
    url: str

    def query(self, expr: str) -> list[dict[str, Any]]:
        r = httpx.get(f"{self.url}/api/v1/query", params={"query": expr}, timeout=10)
        body = r.json()
        if r.status_code != 200 or body.get("status") != "success":
            raise AssertionError(f"query failed ({r.status_code}): {body.get('error')}\n  {expr}")
        data = body["data"]
        if data["resultType"] == "scalar":
            return [{"metric": {}, "value": data["result"]}]
        result: list[dict[str, Any]] = data["result"]
        return result

    def api(self, path: str) -> Any:
        r = httpx.get(f"{self.url}/api/v1/{path}", timeout=10)
        r.raise_for_status()
        return r.json()["data"]


@pytest.fixture(scope="module")
def prometheus(workdir: Path, standalone: Standalone, control_plane: ControlPlane) -> Iterator[Prometheus]:
    binary = need_binary("prometheus")
    port = free_port()
    config = {
        # scrape_timeout defaults to 10 s, which must not exceed the interval.
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(RULES)],
        "scrape_configs": [{
            "job_name": "llm-placement",
            "static_configs": [{"targets": [f"127.0.0.1:{standalone.metrics_port}",
                                            f"127.0.0.1:{control_plane.ports.extender_metrics}"]}],
        }],
    }
    cfg = workdir / "prometheus.yml"
    cfg.write_text(yaml.safe_dump(config))
    proc = Component("prometheus", [
        binary, f"--config.file={cfg}", f"--storage.tsdb.path={workdir / 'tsdb'}",
        f"--web.listen-address=127.0.0.1:{port}", "--log.level=info",
    ], workdir / "prometheus.log")
    proc.start()
    prom = Prometheus(proc, f"http://127.0.0.1:{port}")
    try:
        wait_until(lambda: httpx.get(f"{prom.url}/-/ready", timeout=2).status_code == 200, 60,
                   "prometheus /-/ready", interval=0.2, watch=[proc])
        # Both targets scraped successfully before any traffic: every event below lands in a rate.
        wait_until(lambda: len(prom.query("up == 1")) == 2, 30, "prometheus to scrape both extenders",
                   interval=0.5, watch=[proc])
        yield prom
    finally:
        proc.stop(timeout=15)


# --- traffic ------------------------------------------------------------------------------------------
def standalone_nodes() -> list[dict[str, Any]]:
    zone = {"topology.kubernetes.io/zone": "a"}
    return [
        node_object("h100-0", gpus=8, product="NVIDIA-H100-80GB-HBM3", rdma=True,
                    labels={"nvidia.com/gpu.clique": "clq-a", **zone}),
        node_object("h100-1", gpus=8, product="NVIDIA-H100-80GB-HBM3", rdma=True,
                    labels={"nvidia.com/gpu.clique": "clq-a", **zone}),
        node_object("a100-0", gpus=8, product="NVIDIA-A100-SXM4-80GB", labels=zone),
        node_object("l4-0", gpus=4, product="NVIDIA-L4", cpu="48", memory="192Gi", labels=zone),
        node_object("mystery-0", gpus=4, product="ACME-Tensor-9000", labels=zone),  # not in the catalog
        node_object("cpu-0", node_class="cpu", cpu="64", memory="512Gi", labels=zone),
        node_object("storage-0", node_class="storage", cpu="32", memory="256Gi", labels=zone),
    ]


def standalone_pods() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    def p(name: str, stage: str, gpus: int = 0, **ann: str) -> dict[str, Any]:
        return pod_object(name, namespace="team", stage=stage, gpus=gpus,
                          annotations={ANN + k.replace("_", "-"): v for k, v in ann.items()})

    valid = [
        p("chat-70b", "serving", 4, model_params="70B", max_ms_per_token="30"),
        p("chat-7b", "serving", 1, model_params="7B", precision="int8"),
        p("pretrain", "pretraining", 8, model_params="13B"),
        p("sft", "alignment", 2, model_params="7B"),
        p("prep", "data-prep", input_data_gb="100"),
        p("quantize", "deployment", model_params="70B"),
    ]
    invalid = [
        p("bad-params", "serving", 1, model_params="70Q"),
        p("bad-precision", "serving", 1, model_params="7B", precision="fp7"),
        p("bad-stage", "warmup", 1),
    ]
    return valid, invalid


def drive_standalone(s: Standalone, rounds: int = 3) -> None:
    nodes = standalone_nodes()
    valid, invalid = standalone_pods()
    with httpx.Client(base_url=s.verbs, timeout=10) as c:
        def post(verb: str, body: bytes) -> Any:
            r = c.post(f"/{verb}", content=body, headers={"Content-Type": "application/json"})
            assert r.status_code == 200, (verb, r.status_code, r.text)  # the protocol never uses 500
            return r.json()

        for _ in range(rounds):
            for pod in valid + invalid:
                f = post("filter", orjson.dumps({"Pod": pod, "Nodes": {"items": nodes}, "NodeNames": None}))
                kept = (f.get("Nodes") or {}).get("items") or []
                if pod in invalid:
                    assert not kept and f["FailedAndUnresolvableNodes"], f
                post("prioritize", orjson.dumps({"Pod": pod, "Nodes": {"items": kept}, "NodeNames": None}))
            meta = valid[0]["metadata"]
            # No API server in this mode: bind is refused with a message (request_errors{bind,refused}).
            b = post("bind", orjson.dumps({"PodName": meta["name"], "PodNamespace": meta["namespace"],
                                           "PodUID": meta["uid"], "Node": "h100-0"}))
            assert "no API server" in b["Error"]
            post("preempt", orjson.dumps({"Pod": valid[0], "NodeNameToMetaVictims": {
                "h100-0": {"Pods": [{"UID": "victim-uid"}], "NumPDBViolations": 0}}}))
            for verb in ("filter", "prioritize", "bind", "preempt"):
                post(verb, b"{not json")
            time.sleep(1.5)  # spread over several scrapes


@dataclass
class Scenario:
    notes: list[str]


def drive_control_plane(cp: ControlPlane) -> Scenario:
    notes: list[str] = []
    core = cp.core
    ensure_namespace(core, NS)
    nodes = [
        gpu_node("ps-h100-0", "H100", clique="ps-clq", tier0="ps-leaf", rdma=True, index=41),
        gpu_node("ps-h100-1", "H100", clique="ps-clq", tier0="ps-leaf", rdma=True, index=42),
        gpu_node("ps-l4-0", "L4", gpus=4, cpu="48", memory="192Gi", index=43),
        gpu_node("ps-mystery-0", "T4", gpus=4, labels={"nvidia.com/gpu.product": "ACME-Tensor-9000"},
                 index=44),
        cpu_node("ps-cpu-0", "cpu", index=45),
        cpu_node("ps-storage-0", "storage", cpu="32", memory="256Gi", index=46),
    ]
    create_nodes(core, nodes)
    cp.wait_extender_cache_nodes(len(nodes), timeout=60)

    def make(name: str, **kw: Any) -> str:
        create_pod(core, NS, llm_pod(name, **kw))
        return name

    bound = [
        make("chat-70b", stage="serving", model_params="70B", max_ms_per_token=30, gpus=4),
        make("chat-7b", stage="serving", model_params="7B", precision="int8", gpus=1),
        make("pretrain", stage="pretraining", model_params="1B", gpus=2),
        make("prep", stage="data-prep", cpu="1", memory="1Gi"),
    ]
    for name in bound:
        wait_for_node_name(core, NS, name, timeout=90)
    # Consumers of "prep" once it is bound, so their edges have a producer to measure against: one
    # CPU stage (can sit on prep's node) and one GPU stage (cannot: its data crosses nodes).
    consumers = [
        make("tokenize", stage="data-prep", cpu="1", memory="1Gi",
             annotations={ANN + "depends-on": "prep", ANN + "input-data-gb": "40"}),
        make("sft", stage="alignment", model_params="1B", gpus=1,
             annotations={ANN + "depends-on": "prep", ANN + "input-data-gb": "200"}),
    ]
    for name in consumers:
        wait_for_node_name(core, NS, name, timeout=90)
    # A gang (gang metrics, once app/ records them) and pods that stay pending: an invalid annotation
    # (retried by kube-scheduler, so the invalid-annotation counter keeps rising) and a 16-GPU pod
    # that no node can hold (pending demand, which strands the free GPUs of partly used nodes).
    make("bad-params", stage="serving", model_params="70Q", gpus=1)
    make("too-big", stage="serving", model_params="70B", gpus=16)
    # Two gangs, a few scrapes apart: a status label the solver reports for the first time is born
    # with its first run, which rate() cannot see; the second run is what the panels show.
    for g in ("ps-gang-a", "ps-gang-b"):
        members = [make(f"{g}-{i}", stage="pretraining", model_params="1B", gpus=2,
                        labels={"scheduling.x-k8s.io/pod-group": g},
                        annotations={ANN + "gang-size": "2"}) for i in range(2)]
        for name in members:
            try:
                wait_for_node_name(core, NS, name, timeout=60)
            except AssertionError as exc:  # reported with the data check, which decides what it means
                notes.append(f"gang member {name} not bound within 60 s: {exc}")
        time.sleep(3)
    # Restart the API server: the extender's watches break and reconnect (watch_restarts_total).
    assert cp.apiserver is not None
    cp.apiserver.stop()
    wait_until(lambda: port_is_free(cp.ports.apiserver), 30, "apiserver port to be free")
    cp.start_apiserver()
    return Scenario(notes)


@pytest.fixture(scope="module")
def traffic(prometheus: Prometheus, standalone: Standalone, control_plane: ControlPlane) -> Scenario:
    drive_standalone(standalone)
    scenario = drive_control_plane(control_plane)
    drive_standalone(standalone, rounds=1)  # recent traffic for the 5-minute recording rules
    return scenario


# --- checks ---------------------------------------------------------------------------------------------
def concrete(expr: str) -> str:
    return expr.replace("$__rate_interval", RATE_WINDOW)


def finite(series: list[dict[str, Any]]) -> bool:
    return any(math.isfinite(float(s["value"][1])) for s in series)


def gap_reason(q: Query) -> str | None:
    """Why ``q`` cannot have data in any run today (None: it must). See the module docstring."""
    attrs = metric_attrs()
    records = {r.record: r.expr for r in generator().RECORDS}
    names = set(referenced(q.expr))
    for name in list(names):
        if name in records:
            names |= referenced(records[name])
    unrecorded = sorted({attrs[n] for n in names if n in attrs and not recorded_in_app(attrs[n])})
    return f"nothing in app/ records Metrics.{', Metrics.'.join(unrecorded)} yet" if unrecorded else None


def report(prom: Prometheus, cp: ControlPlane, s: Standalone) -> str:
    return "\n".join([
        f"--- prometheus log:\n{tail(prom.proc.log_path, 30)}",
        f"--- standalone extender log:\n{tail(s.proc.log_path, 30)}",
        cp.log_report(30),
    ])


def test_every_dashboard_and_rule_query_returns_data(
    traffic: Scenario, prometheus: Prometheus, control_plane: ControlPlane, standalone: Standalone
) -> None:
    queries = all_queries()
    assert len(queries) > 40  # the four dashboards and the rules, not an empty list by accident
    status: dict[Query, list[dict[str, Any]]] = {}
    deadline = time.monotonic() + DATA_DEADLINE
    while True:
        for q in queries:
            if q not in status or not finite(status[q]):
                status[q] = prometheus.query(concrete(q.expr))  # also proves the expression parses
        missing = [q for q in queries if not finite(status[q]) and gap_reason(q) is None]
        if not missing or time.monotonic() > deadline:
            break
        time.sleep(2)
    gaps = [(q, gap_reason(q)) for q in queries if not finite(status[q]) and gap_reason(q) is not None]
    for q, reason in gaps:
        warnings.warn(f"no data yet for {q.where}: {reason}", stacklevel=1)
    assert not missing, (
        "queries without data from a real extender:\n"
        + "\n".join(f"  {q.where}: {q.expr}  ->  {status[q]}" for q in missing)
        + ("\nscenario notes: " + "; ".join(traffic.notes) if traffic.notes else "")
        + "\n" + report(prometheus, control_plane, standalone)
    )


def test_rules_load_and_evaluate_cleanly(traffic: Scenario, prometheus: Prometheus) -> None:
    gen = generator()
    want = {r.record for r in gen.RECORDS} | {a.alert for a in gen.ALERTS}

    def healthy() -> list[dict[str, Any]] | None:
        rules = [r for g in prometheus.api("rules")["groups"] for r in g["rules"]]
        return rules if all(r.get("health") == "ok" for r in rules) else None

    rules = wait_until(healthy, 30, "every rule to evaluate once without error", interval=1)
    assert {r["name"] for r in rules} == want
    assert not [r for r in rules if r.get("lastError")]


def test_alerts_fire_on_real_conditions(traffic: Scenario, prometheus: Prometheus) -> None:
    # Both clusters have a node whose GPU is not in the catalog, and kube-scheduler keeps retrying the
    # pod with model-params "70Q": these alerts must be pending (their "for" is minutes) or firing.
    expected = {"LLMPlacementUnknownGPUModels", "LLMPlacementInvalidAnnotations"}

    def active() -> set[str] | None:
        alerts = prometheus.api("alerts")["alerts"]
        names = {a["labels"]["alertname"] for a in alerts if a["state"] in ("pending", "firing")}
        return names if expected <= names else None

    wait_until(active, 60, f"alerts {sorted(expected)} to be active", interval=1)
    invalid = prometheus.query('ALERTS{alertname="LLMPlacementInvalidAnnotations"}')
    assert {s["metric"].get("key") for s in invalid} >= {"model-params"}
