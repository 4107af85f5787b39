"""The extender verbs exactly as kube-scheduler speaks them (shapes from captured requests)."""

from __future__ import annotations

import json
from typing import Any

import orjson
import pytest
from fastapi.testclient import TestClient

from app.api.app import create_app
from app.base.catalog import GpuCatalog
from app.base.objects import node_object, pod_object
from app.config.settings import Settings
from app.extender.service import ExtenderService
from tests.conftest import mixed_nodes, mixed_service

NAMES = [n["metadata"]["name"] for n in mixed_nodes()]


@pytest.fixture
def service(catalog: GpuCatalog) -> ExtenderService:
    # The wire format of answers that keep every feasible node; narrowing to the best node
    # (filter_to_best) has its own tests in test_filter_to_best.py.
    return mixed_service(Settings(cluster_source="none", metrics_port=0, feature_gates={"FilterToBest": False}), catalog)


@pytest.fixture
def client(service: ExtenderService) -> TestClient:
    return TestClient(create_app(service))


def serving_pod(**ann: str) -> dict[str, Any]:
    base = {"llm-placement.io/model-params": "70B", "llm-placement.io/max-ms-per-token": "25"}
    return pod_object("chat", namespace="ml", stage="serving", gpus=4, annotations={**base, **ann})


def test_filter_cache_mode_pascal_case(client: TestClient) -> None:
    body = {"Pod": serving_pod(), "Nodes": None, "NodeNames": NAMES}
    r = client.post("/scheduler/filter", content=json.dumps(body))
    assert r.status_code == 200
    out = r.json()
    assert set(out) == {"NodeNames", "Nodes", "FailedNodes", "FailedAndUnresolvableNodes", "Error"}
    assert out["Error"] == "" and out["Nodes"] is None
    # 70B bf16 at 25 ms/token on 4 GPUs: only the HBM3/HBM3e parts have the bandwidth.
    assert sorted(out["NodeNames"]) == ["h100-0", "h200-0"]
    # A node passed, so no per-node reasons: kube-scheduler reads them only when none passes.
    assert out["FailedNodes"] == {} and out["FailedAndUnresolvableNodes"] == {}
    # Without the nodes that pass, every other node is answered with its reason.
    others = [n for n in NAMES if n not in ("h100-0", "h200-0")]
    out = client.post("/scheduler/filter", content=json.dumps({**body, "NodeNames": others})).json()
    assert out["NodeNames"] == []
    rejected = {**out["FailedNodes"], **out["FailedAndUnresolvableNodes"]}
    assert set(rejected) == set(others)
    assert "ms/token" in rejected["a100-0"]
    # Node-independent messages so the scheduler aggregates them into counts.
    assert all(n not in msg for n, msg in rejected.items())


def test_filter_accepts_lowercase_keys(client: TestClient) -> None:
    body = {"pod": serving_pod(), "nodes": None, "nodenames": NAMES}
    out = client.post("/scheduler/filter", content=json.dumps(body)).json()
    assert sorted(out["NodeNames"]) == ["h100-0", "h200-0"]


def test_filter_non_cache_mode_echoes_full_nodes(client: TestClient) -> None:
    nodes = mixed_nodes()
    body = {"Pod": serving_pod(), "Nodes": {"metadata": {}, "items": nodes}, "NodeNames": None}
    out = client.post("/scheduler/filter", content=json.dumps(body)).json()
    assert out["NodeNames"] is None
    items = out["Nodes"]["items"]
    assert sorted(i["metadata"]["name"] for i in items) == ["h100-0", "h200-0"]
    # A subset of what was received, byte-for-byte equal objects.
    assert all(i in nodes for i in items)


def test_non_cache_mode_learns_unknown_nodes_from_the_request(client: TestClient) -> None:
    extra = node_object("h100-new", gpus=8, product="NVIDIA-H100-80GB-HBM3")
    body = {"Pod": serving_pod(), "Nodes": {"items": [extra]}, "NodeNames": None}
    out = client.post("/scheduler/filter", content=json.dumps(body)).json()
    assert [i["metadata"]["name"] for i in out["Nodes"]["items"]] == ["h100-new"]


def test_both_null_means_no_nodes(client: TestClient) -> None:
    out = client.post("/scheduler/filter", json={"Pod": serving_pod(), "Nodes": None, "NodeNames": None}).json()
    assert out["Error"] == ""
    assert out["Nodes"] == {"metadata": {}, "items": []}


def test_single_node_request(client: TestClient) -> None:
    out = client.post("/scheduler/filter", json={"Pod": serving_pod(), "NodeNames": ["t4-0"]}).json()
    assert out["NodeNames"] == []
    assert "GPU memory too small" in out["FailedAndUnresolvableNodes"]["t4-0"]


def test_unknown_node_name_is_rejected_with_reason_not_dropped(client: TestClient) -> None:
    out = client.post("/scheduler/filter", json={"Pod": serving_pod(), "NodeNames": ["ghost"]}).json()
    assert out["NodeNames"] == []
    assert "cache" in out["FailedNodes"]["ghost"]


def test_prioritize_integers_in_range_and_best_first(client: TestClient) -> None:
    body = {"Pod": serving_pod(), "NodeNames": ["h100-0", "h200-0"]}
    r = client.post("/scheduler/prioritize", content=orjson.dumps(body))
    raw = r.content.decode()
    assert r.status_code == 200 and "." not in raw  # a float would break Go's int64 decode
    scores = {e["Host"]: e["Score"] for e in r.json()}
    assert set(scores) == {"h100-0", "h200-0"}
    assert all(isinstance(s, int) and 0 <= s <= 10 for s in scores.values())
    # Both meet the SLO; the H100 is cheaper per hour and a tighter memory fit.
    assert scores["h100-0"] > scores["h200-0"]


def test_prioritize_malformed_returns_empty_list(client: TestClient) -> None:
    r = client.post("/scheduler/prioritize", content=b"{not json")
    assert r.status_code == 200 and r.json() == []


def test_filter_malformed_json_is_200_with_error(client: TestClient) -> None:
    r = client.post("/scheduler/filter", content=b'{"Pod": ')
    assert r.status_code == 200
    assert "malformed filter request" in r.json()["Error"]


@pytest.mark.parametrize("body", [b"[]", b'"x"', b'{"Pod": 3, "NodeNames": []}', b'{"Pod": {}, "NodeNames": [1]}'])
def test_filter_wrong_shapes_are_errors_not_crashes(client: TestClient, body: bytes) -> None:
    r = client.post("/scheduler/filter", content=body)
    assert r.status_code == 200 and r.json()["Error"].startswith("llm-placement: malformed")


def test_huge_body_rejected_without_reading_it_all(service: ExtenderService) -> None:
    small = ExtenderService(Settings(cluster_source="none", metrics_port=0, max_body_bytes=1000),
                            service.catalog)
    client = TestClient(create_app(small))
    r = client.post("/scheduler/filter", content=b"x" * 5000)
    assert r.status_code == 200
    assert "larger than 1000 bytes" in r.json()["Error"]


def test_invalid_annotation_reaches_every_node_as_unresolvable(client: TestClient, service: ExtenderService) -> None:
    pod = serving_pod(**{"llm-placement.io/model-params": "70Q"})
    out = client.post("/scheduler/filter", json={"Pod": pod, "NodeNames": NAMES}).json()
    assert out["NodeNames"] == [] and out["Error"] == ""
    msgs = set(out["FailedAndUnresolvableNodes"].values())
    assert msgs == {'llm-placement: model-params "70Q" is not a parameter count like 7B or 1.5T'}
    metric = service.metrics.registry.get_sample_value(
        "llm_placement_invalid_annotations_total", {"key": "model-params"}
    )
    assert metric == 1.0


def test_filter_5000_names(service: ExtenderService) -> None:
    for i in range(5000):
        service.absorb_node(node_object(f"n{i:04d}", gpus=8, product="NVIDIA-H100-80GB-HBM3"))
    names = [f"n{i:04d}" for i in range(5000)]
    client = TestClient(create_app(service))
    out = client.post("/scheduler/filter", json={"Pod": serving_pod(), "NodeNames": names}).json()
    assert len(out["NodeNames"]) == 5000


def test_bind_without_api_server_is_error_not_500(client: TestClient) -> None:
    r = client.post("/scheduler/bind", json={"PodName": "p", "PodNamespace": "ml", "PodUID": "u", "Node": "h100-0"})
    assert r.status_code == 200 and r.json()["Error"]


def test_bind_malformed(client: TestClient) -> None:
    r = client.post("/scheduler/bind", json={"PodName": "p"})
    assert r.status_code == 200 and "malformed bind request" in r.json()["Error"]


def test_unknown_verb_is_404(client: TestClient) -> None:
    assert client.post("/scheduler/nope", json={}).status_code == 404


def test_preempt_only_returns_victims_that_help(client: TestClient, service: ExtenderService) -> None:
    from app.snapshot.store import PlacedPod

    # l4-0 is full of batch pods; h100-0 too. A 7B int8 serving pod asks to preempt on both.
    for i in range(4):
        service.snapshot.place(PlacedPod(f"v{i}", f"ml/v{i}", "l4-0", 1, 0, 0, None, None, None))
    pod = pod_object("small", namespace="ml", stage="serving", gpus=1,
                     annotations={"llm-placement.io/model-params": "7B", "llm-placement.io/precision": "int8"})
    body = {"Pod": pod, "NodeNameToMetaVictims": {
        "l4-0": {"Pods": [{"UID": "v0"}], "NumPDBViolations": 0},
        "cpu-0": {"Pods": [{"UID": "zzz"}], "NumPDBViolations": 0},  # no GPUs: eviction cannot help
        "h100-0": {"Pods": [], "NumPDBViolations": 0},  # placeholder with no victims
    }}
    out = client.post("/scheduler/preempt", json=body).json()
    assert set(out) == {"NodeNameToMetaVictims"}
    assert out["NodeNameToMetaVictims"] == {"l4-0": {"Pods": [{"UID": "v0"}], "NumPDBViolations": 0}}


def test_health_and_ready(client: TestClient, service: ExtenderService) -> None:
    assert client.get("/healthz").status_code == 200
    assert client.get("/readyz").status_code == 503
    service.ready.set()
    assert client.get("/readyz").status_code == 200
