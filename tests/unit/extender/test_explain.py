"""Explain tells the truth: what it says matches what filter, prioritize and bind actually did.

The decisions are made through ExtenderService's wire verbs (the bytes kube-scheduler sends, in
non-cache mode with full Node objects), with no API server; explain is then asked about the same pod
through the library, the HTTP route and the ``llm-placement explain`` command.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import orjson
import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from app.api.app import create_app
from app.base.catalog import GpuCatalog
from app.base.objects import node_object, pod_object
from app.base.workload import parse_workload
from app.cli import cli
from app.config.settings import Settings
from app.extender.explain import explain_pod
from app.extender.service import ExtenderService
from app.placement.ranking import bands

ANN = "llm-placement.io/"
NS = "team-a"


def cluster() -> list[dict[str, Any]]:
    """Each node is there to exercise one outcome of a 70B bf16 serving pod with a 25 ms/token SLO."""
    return [
        node_object("h200-0", gpus=8, product="NVIDIA-H200"),  # feasible, fastest
        node_object("h100-0", gpus=8, product="NVIDIA-H100-80GB-HBM3"),  # feasible, cheaper per hour
        node_object("h100-busy", gpus=8, product="NVIDIA-H100-80GB-HBM3"),  # 6 of 8 GPUs taken
        node_object("a100-0", gpus=8, product="NVIDIA-A100-SXM4-80GB"),  # too slow for 25 ms/token
        node_object("l4-0", gpus=4, product="NVIDIA-L4", cpu="48", memory="192Gi"),  # too little HBM
        node_object("cpu-0", node_class="cpu", cpu="64", memory="512Gi"),  # no GPUs
    ]


class MemoryBinder:
    """Records binds and events in memory; serves the pods it was given (no API server)."""

    def __init__(self) -> None:
        self.pods: dict[str, dict[str, Any]] = {}
        self.bound: dict[str, str] = {}
        self.events: list[tuple[str, str, str]] = []

    def bind(self, namespace: str, name: str, uid: str, node: str) -> bool:
        self.bound[f"{namespace}/{name}"] = node
        return True

    def annotate(self, namespace: str, name: str, annotations: dict[str, str]) -> None:
        pass

    def event(self, namespace: str, name: str, uid: str, reason: str, message: str,
              warning: bool = False) -> None:
        self.events.append((f"{namespace}/{name}", reason, message))

    def read_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.pods.get(f"{namespace}/{name}")


@pytest.fixture
def binder() -> MemoryBinder:
    return MemoryBinder()


@pytest.fixture
def svc(binder: MemoryBinder) -> ExtenderService:
    return make_service(binder)


def make_service(binder: MemoryBinder) -> ExtenderService:
    # Every feasible node kept, so explain and filter can be compared node by node (narrowing to the
    # best node is covered in test_filter_to_best.py).
    s = ExtenderService(Settings(cluster_source="none", metrics_port=0, feature_gates={"FilterToBest": False}),
                        GpuCatalog.load(), binder=binder)
    s.ready.set()
    for n in cluster():
        s.absorb_node(n)
    # Someone else's training job holds 6 GPUs of h100-busy.
    s.snapshot.assume(parse_workload(pod_object("other", namespace="x", gpus=6, stage="pretraining")),
                      "h100-busy")
    return s


def serving_pod(name: str, gpus: int = 4, **ann: str) -> dict[str, Any]:
    annotations = {ANN + "model-params": "70B", ANN + "max-ms-per-token": "25"}
    annotations.update({ANN + k.replace("_", "-"): v for k, v in ann.items()})
    return pod_object(name, namespace=NS, stage="serving", gpus=gpus, annotations=annotations)


def decide(svc: ExtenderService, pod: dict[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """filter then prioritize (on the nodes filter kept), exactly as kube-scheduler calls them."""
    nodes = cluster()
    body = orjson.dumps({"Pod": pod, "Nodes": {"metadata": {}, "items": nodes}, "NodeNames": None})
    filtered = orjson.loads(svc.filter(body))
    kept = (filtered["Nodes"] or {}).get("items") or []
    pbody = orjson.dumps({"Pod": pod, "Nodes": {"metadata": {}, "items": kept}, "NodeNames": None})
    return filtered, orjson.loads(svc.prioritize(pbody))


def watch_sees(svc: ExtenderService, pod: dict[str, Any]) -> None:
    """What the cache's pod watch does for a pending pod (explain looks pods up there)."""
    with svc.lock:
        svc.snapshot.track_spec(svc.placer.parse(pod))


def test_explain_matches_filter_and_prioritize(svc: ExtenderService) -> None:
    pod = serving_pod("chat-70b")
    filtered, priorities = decide(svc, pod)
    watch_sees(svc, pod)
    ex = explain_pod(svc, NS, "chat-70b")
    assert ex is not None
    entries = {e["node"]: e for e in ex["nodes"]}
    assert set(entries) == {n["metadata"]["name"] for n in cluster()}

    # Feasible in explain <=> kept by filter.
    kept = {n["metadata"]["name"] for n in filtered["Nodes"]["items"]}
    assert kept == {"h200-0", "h100-0"}
    assert {n for n, e in entries.items() if e["feasible"]} == kept

    # Every rejected node carries the very reason filter decided, in the same map. (The answer
    # itself carries no reasons here: nodes passed, and kube-scheduler reads them only otherwise.)
    assert filtered["FailedNodes"] == {} and filtered["FailedAndUnresolvableNodes"] == {}
    decision = svc.placer.filter(pod, sorted(entries))
    failed, unresolvable = decision.failed, decision.unresolvable
    assert set(failed) | set(unresolvable) == set(entries) - kept
    assert set(failed) == {"h100-busy"}  # preemption could free GPUs there
    for node, reason in {**failed, **unresolvable}.items():
        assert entries[node]["reason"] == reason, node
        assert entries[node]["unresolvable"] is (node in unresolvable), node

    # The score per node is the one prioritize returned, and the chosen node is its top host.
    scores = {p["Host"]: p["Score"] for p in priorities}
    assert {n: entries[n]["score"] for n in kept} == scores
    ranked = sorted(scores, key=lambda n: -scores[n])
    assert scores[ranked[0]] > scores[ranked[1]], "test needs a unique winner to compare against"
    assert ex["chosen"] == ranked[0]
    assert ex["runner_up"] == ranked[1]
    assert ex["summary"].startswith(f"best node {ranked[0]}")
    # The breakdown explains the score: the weighted mean of the terms is the total, and the band
    # kube-scheduler received is that total's rank among the candidates (docs/scoring.md).
    for node in kept:
        e = entries[node]
        weighted = sum(e["terms"][t] * w for t, w in e["weights"].items()) / sum(e["weights"].values())
        assert abs(weighted - e["total"]) < 1e-3, node
    assert bands([entries[n]["total"] for n in ranked]).tolist() == [scores[n] for n in ranked]


def test_explain_after_bind_names_the_bound_node(svc: ExtenderService, binder: MemoryBinder) -> None:
    pod = serving_pod("chat-bound")
    _, priorities = decide(svc, pod)
    watch_sees(svc, pod)
    best = max(priorities, key=lambda p: p["Score"])["Host"]
    meta = pod["metadata"]
    body = orjson.dumps({"PodName": meta["name"], "PodNamespace": NS, "PodUID": meta["uid"], "Node": best})
    assert orjson.loads(asyncio.run(svc.bind(body))) == {"Error": ""}
    assert binder.bound == {f"{NS}/chat-bound": best}
    ex = explain_pod(svc, NS, "chat-bound")
    assert ex is not None
    assert ex["bound_node"] == best
    assert ex["summary"].startswith(f"bound to {best} (kube-scheduler followed our ranking")
    assert ex["scheduler_agreement"] == "top"
    # The user-facing event agrees with explain about where the pod went.
    placed = [m for key, reason, m in binder.events if reason == "Placed"]
    assert placed and placed[0].startswith(f"llm-placement: placed on {best}")


def test_pending_explain_gives_the_dominant_filter_reason_and_free_gpus(svc: ExtenderService) -> None:
    pod = serving_pod("too-big", gpus=16)  # no node has 16 GPUs
    filtered, _ = decide(svc, pod)
    watch_sees(svc, pod)
    ex = explain_pod(svc, NS, "too-big")
    assert ex is not None
    assert not filtered["Nodes"]["items"] and ex["chosen"] is None
    reasons = {**filtered["FailedNodes"], **filtered["FailedAndUnresolvableNodes"]}
    counts: dict[str, int] = {}
    for r in reasons.values():
        counts[r] = counts.get(r, 0) + 1
    reason, count = max(counts.items(), key=lambda kv: kv[1])
    assert ex["summary"].startswith(f"pending: {count}/{len(cluster())} nodes: {reason}")
    # 8 + 8 + 2 (h100-busy) + 8 + 4 free GPUs in 5 single-node domains; the pod needs 16.
    assert ex["free_gpus_by_domain"] == {"node:h200-0": 8, "node:h100-0": 8, "node:h100-busy": 2,
                                         "node:a100-0": 8, "node:l4-0": 4}
    assert ex["summary"].endswith("; 30 GPUs free across 5 domains; pod needs 16")


def test_invalid_pod_explain_repeats_the_filter_message(svc: ExtenderService, binder: MemoryBinder) -> None:
    pod = serving_pod("typo", model_params="70Q")
    binder.pods[f"{NS}/typo"] = pod  # the watch never tracks an unparseable spec: explain reads it
    filtered, _ = decide(svc, pod)
    ex = explain_pod(svc, NS, "typo")
    assert ex is not None
    messages = set(filtered["FailedAndUnresolvableNodes"].values())
    assert len(messages) == 1
    assert messages == {"llm-placement: " + "; ".join(ex["invalid"])}
    assert 'model-params "70Q"' in ex["summary"]


def test_cli_renders_the_same_decision(svc: ExtenderService, monkeypatch: pytest.MonkeyPatch) -> None:
    pod = serving_pod("chat-cli")
    filtered, priorities = decide(svc, pod)
    watch_sees(svc, pod)
    client = TestClient(create_app(svc))

    def get(url: str, **_: Any) -> httpx.Response:
        # The CLI talks HTTP to a running extender; route it to this app in-process instead.
        return client.get(httpx.URL(url).path)

    monkeypatch.setattr(httpx, "get", get)
    runner = CliRunner()
    raw = runner.invoke(cli, ["explain", f"{NS}/chat-cli", "--json"])
    assert raw.exit_code == 0, raw.output
    assert json.loads(raw.output) == json.loads(json.dumps(explain_pod(svc, NS, "chat-cli")))

    monkeypatch.setenv("COLUMNS", "250")  # rich would otherwise wrap the reasons mid-sentence
    table = runner.invoke(cli, ["explain", f"{NS}/chat-cli"])
    assert table.exit_code == 0, table.output
    best = max(priorities, key=lambda p: p["Score"])["Host"]
    assert f"best node {best}" in table.output
    for reason in {**filtered["FailedNodes"], **filtered["FailedAndUnresolvableNodes"]}.values():
        assert reason in table.output

    missing = runner.invoke(cli, ["explain", f"{NS}/nobody"])
    assert missing.exit_code == 1 and "404" in missing.output
