"""API writes of a bind: the precision chosen by a ``precision-fallback`` rides on the Binding (one
write; the API server sets it on the pod as it binds), and a bind reports what filter decided."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import pytest

from app.cluster.binder import Binder
from app.extender.service import ExtenderService
from tests.unit.extender.test_explain import NS, MemoryBinder, make_service, serving_pod, watch_sees

ASSIGNED = "llm-placement.io/assigned-precision"


class Rest:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str, Any]] = []

    def request(self, method: str, path: str, body: Any = None, **_: Any) -> bytes:
        self.calls.append((method, path, body))
        return b"{}"


class WritesBinder(MemoryBinder):
    """Records each bind's annotations and every separate annotate call."""

    def __init__(self) -> None:
        super().__init__()
        self.bind_annotations: list[dict[str, str] | None] = []
        self.annotated: list[dict[str, str]] = []

    def bind(self, namespace: str, name: str, uid: str, node: str,  # type: ignore[override]
             annotations: dict[str, str] | None = None) -> bool:
        self.bind_annotations.append(annotations)
        return super().bind(namespace, name, uid, node)

    def annotate(self, namespace: str, name: str, annotations: dict[str, str]) -> None:
        self.annotated.append(annotations)


@pytest.mark.parametrize("annotations", [{ASSIGNED: "int8"}, None])
def test_binding_carries_the_annotations_in_one_request(annotations: dict[str, str] | None) -> None:
    rest = Rest()
    binder = Binder(None, rest)  # type: ignore[arg-type]
    try:
        assert binder.bind("ns", "p", "uid-1", "n1", annotations=annotations) is True
    finally:
        binder.close()
    assert len(rest.calls) == 1
    method, path, body = rest.calls[0]
    assert (method, path) == ("POST", "/api/v1/namespaces/ns/pods/p/binding")
    assert body["metadata"].get("annotations") == annotations
    assert body["metadata"]["uid"] == "uid-1" and body["target"]["name"] == "n1"


def _filter_and_bind(svc: ExtenderService, pod: dict[str, Any], node: str) -> str:
    nodes = {"metadata": {}, "items": _nodes()}
    passed = orjson.loads(svc.filter(orjson.dumps({"Pod": pod, "Nodes": nodes})))["Nodes"]["items"]
    assert node in [n["metadata"]["name"] for n in passed]
    watch_sees(svc, pod)
    meta = pod["metadata"]
    body = orjson.dumps({"PodName": meta["name"], "PodNamespace": NS, "PodUID": meta["uid"], "Node": node})
    return str(orjson.loads(asyncio.run(svc.bind(body)))["Error"])


def _nodes() -> list[dict[str, Any]]:
    from app.base.objects import node_object
    return [node_object("l4-0", gpus=4, product="NVIDIA-L4", cpu="48", memory="192Gi")]


@pytest.mark.parametrize(("precision", "fallback", "expected"), [
    ("bf16", "int8", {ASSIGNED: "int8"}),  # 13B bf16 is over an L4's 24 GB; int8 fits: annotated
    ("int8", "int4", None),  # fits as declared: nothing to annotate
])
def test_a_bind_makes_no_separate_annotation_write(precision: str, fallback: str,
                                                   expected: dict[str, str] | None) -> None:
    binder = WritesBinder()
    svc = make_service(binder)
    for n in _nodes():
        svc.absorb_node(n)
    pod = serving_pod("p13", gpus=1, model_params="13B", max_ms_per_token="500", precision=precision,
                      precision_fallback=fallback)
    assert _filter_and_bind(svc, pod, "l4-0") == ""
    assert binder.bind_annotations == [expected]
    assert binder.annotated == []
    # The Placed event reports the precision the filter chose, from the filter's own verdict.
    placed = [m for _, reason, m in binder.events if reason == "Placed"]
    assert len(placed) == 1 and ("precision int8 (fallback)" in placed[0]) == (expected is not None)


class SlowRest(Rest):
    """Records events with a varying delay, as an API server under load answers."""

    def __init__(self) -> None:
        super().__init__()
        self.n = 0

    def request(self, method: str, path: str, body: Any = None, **kw: Any) -> bytes:
        import time
        self.n += 1
        time.sleep(0.001 * (self.n % 3))
        return super().request(method, path, body, **kw)


def test_events_of_one_pod_keep_their_order_across_writers_and_flush_waits_for_all() -> None:
    rest = SlowRest()
    binder = Binder(None, rest)  # type: ignore[arg-type]
    try:
        for i in range(6):
            for pod in range(12):
                binder.event("ns", f"p{pod}", f"u{pod}", "Placed", f"step {i}")
        assert binder.flush(10.0)
        written = list(rest.calls)  # nothing may arrive after flush returned
    finally:
        binder.close()
    assert len(written) == 72
    for pod in range(12):
        steps = [b["message"] for _, _, b in written if b["involvedObject"]["name"] == f"p{pod}"]
        assert steps == [f"step {i}" for i in range(6)], steps
