"""Fuzz: hostile and careless input against the ASGI app and every parser (hypothesis).

Wrong JSON types anywhere, infinities, huge and deeply nested values, unknown keys. Properties: no
5xx, no traceback in the log, a bounded response, and each parser raises only its documented error.
``LLMP_FUZZ_EXAMPLES`` sets the examples per property (CI default below; more from the command line).
The figures (examples tried, violations) are printed at the end of the module.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections import Counter
from collections.abc import Iterator
from typing import Any

import orjson
import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.api import wire
from app.api.app import create_app
from app.base.catalog import GpuCatalog
from app.base.objects import node_object, pod_object
from app.base.units import (
    parse_bandwidth_tbs,
    parse_money,
    parse_param_count,
    parse_positive_int,
    parse_positive_number,
    parse_quantity,
)
from app.base.workload import ANNOTATION_KEYS, PREFIX, WorkloadError, parse_workload, unknown_keys
from app.config.settings import Settings
from app.extender.wiring import build_core
from app.gang.persist import decode, records_from_pods
from app.snapshot.nodes import facts_for

EXAMPLES = int(os.environ.get("LLMP_FUZZ_EXAMPLES", "60"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                       HealthCheck.data_too_large])
MAX_RESPONSE = 256 * 1024  # bytes: far above any honest answer for these bodies, far below a flood
STATS: Counter[str] = Counter()
CATALOG = GpuCatalog.load()
NODE_POLICY = Settings(cluster_source="none").policies().node_facts

# --- strategies ------------------------------------------------------------------------------------
weird_numbers = st.one_of(
    st.sampled_from(["1e400", "-1e400", "inf", "nan", "NaN", "9" * 400, "1e308", "0", "-0", "1_000",
                     "0x10", "1e-400", "", " ", "7B", "1.8T", "70Q", "64Gi", "500m", "1e19", "८"]),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False),
)
scalars = st.one_of(st.none(), st.booleans(), weird_numbers, st.text(max_size=40))
huge = st.sampled_from(["x" * 250_000, ",".join(f"p{i}" for i in range(36_000)), "a," * 5000])
json_values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=12), inner, max_size=4)), max_leaves=12)
our_keys = st.sampled_from([*(PREFIX + k for k in ANNOTATION_KEYS), PREFIX + "model-param",
                            PREFIX + "gang-plan", "scheduling.k8s.io/group-name"])
annotations = st.dictionaries(our_keys, st.one_of(weird_numbers.map(str), json_values, huge), max_size=5)


def nested(depth: int) -> Any:
    out: Any = "x"
    for _ in range(depth):
        out = {"a": [out]}
    return out


@st.composite
def hostile_pod(draw: st.DrawFn) -> dict[str, Any]:
    pod = pod_object("p", namespace="ns", stage="serving", gpus=1,
                     annotations={PREFIX + "model-params": "7B"}, uid="u-1")
    meta, spec = pod["metadata"], pod["spec"]
    meta["annotations"].update(draw(annotations))
    container = spec["containers"][0]
    choice = draw(st.integers(0, 9))
    if choice == 0:
        container["resources"]["requests"]["nvidia.com/gpu"] = draw(weird_numbers)
    elif choice == 1:
        container["resources"] = draw(json_values)
    elif choice == 2:
        spec["containers"] = draw(json_values)
    elif choice == 3:
        meta[draw(st.sampled_from(["annotations", "labels", "name", "uid", "namespace"]))] = draw(json_values)
    elif choice == 4:
        pod[draw(st.sampled_from(["metadata", "spec", "status"]))] = draw(json_values)
    elif choice == 5:
        meta["annotations"][PREFIX + "stage"] = nested(draw(st.integers(50, 400)))
    elif choice == 6:
        spec["priority"] = draw(weird_numbers)
    elif choice == 7:
        pod[draw(st.text(max_size=10))] = draw(json_values)  # unknown keys
    return pod


def nodes_body(draw: st.DrawFn) -> Any:
    good = node_object("n1", gpus=8, product="NVIDIA-H100-80GB-HBM3")
    bad = node_object("n2", gpus=8, product="NVIDIA-L4")
    choice = draw(st.integers(0, 4))
    if choice == 0:
        bad["metadata"] = draw(json_values)
    elif choice == 1:
        bad["status"] = {"allocatable": {"nvidia.com/gpu": draw(weird_numbers), "cpu": draw(weird_numbers)}}
    elif choice == 2:
        bad["metadata"]["labels"] = draw(json_values)
    elif choice == 3:
        bad["metadata"]["annotations"] = {PREFIX + "hourly-cost": draw(weird_numbers.map(str)),
                                          PREFIX + "gpu-memory-bandwidth": draw(weird_numbers.map(str))}
    else:
        return draw(json_values)
    return {"items": [good, bad]}


@st.composite
def request_body(draw: st.DrawFn) -> tuple[str, bytes]:
    verb = draw(st.sampled_from(["filter", "prioritize", "bind", "preempt"]))
    pod = draw(hostile_pod())
    mode = draw(st.integers(0, 5))
    if verb == "bind":
        body: Any = {"PodName": draw(st.one_of(st.just("p"), json_values)), "PodNamespace": "ns",
                     "PodUID": draw(st.one_of(st.just("u-1"), json_values)),
                     "Node": draw(st.one_of(st.just("n1"), json_values))}
    elif verb == "preempt":
        body = {"Pod": pod, "NodeNameToMetaVictims": draw(st.one_of(
            json_values, st.just({"n1": {"Pods": [{"UID": "x"}], "NumPDBViolations": "7"}})))}
    elif mode == 0:
        body = {"Pod": pod, "NodeNames": draw(st.one_of(st.just(["n1", "n2"]), json_values))}
    elif mode == 1:
        body = {"Pod": pod, "Nodes": nodes_body(draw)}
    else:
        body = {"Pod": pod, "NodeNames": ["n1", "n2", "nope"]}
    if draw(st.booleans()):
        body[draw(st.text(max_size=8))] = draw(json_values)  # unknown top-level keys
    if mode == 5:
        body = draw(json_values)  # not even an object
    try:
        raw = orjson.dumps(body)
    except (TypeError, orjson.JSONEncodeError):  # integers beyond 64 bits: send them as text
        raw = json.dumps(body, default=str).encode()
    return verb, raw


# --- fixtures --------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    service = build_core(Settings(cluster_source="none", metrics_port=0), GpuCatalog.load())
    for n in (node_object("n1", gpus=8, product="NVIDIA-H100-80GB-HBM3"),
              node_object("n2", gpus=4, product="NVIDIA-L4")):
        service.absorb_node(n)
    service.ready.set()
    with TestClient(create_app(service), raise_server_exceptions=False) as c:
        yield c


class Tracebacks(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        if record.exc_info or "Traceback" in record.getMessage() or "\n" in record.getMessage():
            self.count += 1


@pytest.fixture
def tracebacks() -> Iterator[Tracebacks]:
    h = Tracebacks()
    root = logging.getLogger()
    root.addHandler(h)
    try:
        yield h
    finally:
        root.removeHandler(h)


def _violation(kind: str) -> None:
    STATS["violations"] += 1
    STATS[f"violation:{kind}"] += 1


# --- the defects the fuzzers found, pinned ----------------------------------------------------------
@pytest.mark.parametrize("body", [
    # Nodes.items[].metadata as a string: was a 500 (and a second failure in the error handler).
    {"Pod": pod_object("p", gpus=1, uid="u"), "Nodes": {"items": [{"metadata": "x"}]}},
    {"Pod": {"metadata": "x"}, "NodeNames": ["n1"]},
    {"Pod": {"metadata": {"annotations": ["x"]}}, "NodeNames": ["n1"]},
    {"Pod": pod_object("p", gpus=1, uid="u"),
     "Nodes": {"items": [{"metadata": {"name": "n9"}, "status": {"allocatable": {"nvidia.com/gpu": "1e400"}}}]}},
    {"Pod": pod_object("p", gpus=1, uid="u"), "NodeNameToMetaVictims": {"n1": ["x"]}},
])
@pytest.mark.parametrize("verb", ["filter", "prioritize", "preempt"])
def test_wrong_types_are_answered_without_500_or_traceback(client: TestClient, tracebacks: Tracebacks,
                                                           verb: str, body: dict[str, Any]) -> None:
    resp = client.post(f"/scheduler/{verb}", content=orjson.dumps(body))
    assert resp.status_code == 200, resp.text[:200]
    assert tracebacks.count == 0


# --- properties ------------------------------------------------------------------------------------
@FUZZ
@given(case=request_body())
def test_verbs_never_5xx_never_traceback_bounded(client: TestClient, tracebacks: Tracebacks,
                                                   case: tuple[str, bytes]) -> None:
    verb, body = case
    before = tracebacks.count
    resp = client.post(f"/scheduler/{verb}", content=body, headers={"content-type": "application/json"})
    STATS["requests"] += 1
    if resp.status_code >= 500:
        _violation("5xx")
    if tracebacks.count > before:
        _violation("traceback")
    if len(resp.content) > MAX_RESPONSE:
        _violation("size")
    assert resp.status_code == 200, resp.text[:300]
    assert tracebacks.count == before
    assert len(resp.content) <= MAX_RESPONSE
    orjson.loads(resp.content)  # always a JSON answer kube-scheduler can read


@FUZZ
@given(path=st.text(max_size=30), ns=st.text(max_size=20))
def test_ops_routes_never_5xx(client: TestClient, path: str, ns: str) -> None:
    STATS["requests"] += 1
    from urllib.parse import quote

    for url in ("/healthz", "/readyz", f"/explain/{quote(ns or 'x', safe='')}/{quote(path or 'y', safe='')}"):
        resp = client.get(url)
        if resp.status_code >= 500:
            _violation("5xx")
        assert resp.status_code < 500 and len(resp.content) <= MAX_RESPONSE


@FUZZ
@given(pod=hostile_pod())
def test_parse_workload_only_raises_workload_error(pod: dict[str, Any]) -> None:
    STATS["parser"] += 1
    try:
        spec = parse_workload(pod, ("nvidia.com/gpu",))
    except WorkloadError as exc:
        assert all(len(p) <= 400 for p in exc.problems)
    except Exception:
        _violation("parser")
        raise
    else:
        assert len(spec.depends_on) <= 256
    unknown_keys((pod.get("metadata") or {}).get("annotations") if isinstance(pod.get("metadata"), dict)
                 else None)


@FUZZ
@given(value=st.one_of(weird_numbers, json_values, huge))
def test_unit_parsers_only_raise_value_error(value: Any) -> None:
    for fn in (parse_param_count, parse_quantity, parse_bandwidth_tbs, parse_money,
               lambda v: parse_positive_int("k", v), lambda v: parse_positive_number("k", v)):
        STATS["parser"] += 1
        try:
            out = fn(value)
        except ValueError as exc:
            assert len(str(exc)) < 300
        except Exception:
            _violation("parser")
            raise
        else:
            assert out == out and out not in (float("inf"), float("-inf"))  # finite, not NaN


@FUZZ
@given(data=st.data())
def test_node_facts_and_wire_and_plans_never_crash(data: st.DataObject) -> None:
    body = nodes_body(data.draw)
    STATS["parser"] += 1
    items = body.get("items") if isinstance(body, dict) else None
    for n in items if isinstance(items, list) else []:
        if isinstance(n, dict) and isinstance(n.get("metadata"), dict | None):
            # The service counts and skips a node that cannot be read (app/extender/service.py).
            with contextlib.suppress(ValueError, TypeError, AttributeError):
                facts_for(n, CATALOG, NODE_POLICY)
    raw = data.draw(st.one_of(json_values, st.just('{"gang":"ns/g","node":"n","planned_at":1e400}')))
    decode(raw if isinstance(raw, str) else json.dumps(raw, default=str))
    pods = [data.draw(hostile_pod())]
    records_from_pods(pods, ("nvidia.com/gpu",), skipped=lambda *_: None)
    try:
        raw_body = orjson.dumps({"Pod": pods[0], "Nodes": body}, default=str)
    except TypeError:  # deeper than orjson writes (kube-scheduler could not send it either)
        return
    with contextlib.suppress(wire.WireError):
        wire.parse_extender_args(raw_body)


def test_zz_report() -> None:
    """Print the figures (run with -s to see them): examples tried and violations."""
    print(f"\nfuzz: {STATS['requests']} HTTP requests, {STATS['parser']} parser calls, "
          f"{STATS['violations']} violations {dict((k, v) for k, v in STATS.items() if ':' in k)}")
    assert STATS["violations"] == 0
