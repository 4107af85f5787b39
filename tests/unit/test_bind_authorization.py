"""Who may bind: only kube-scheduler's binds of our pods, filtered by us for that node, that still fit."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import pytest

from app.service import ExtenderService
from tests.unit.test_explain import NS, MemoryBinder, decide, make_service, serving_pod, watch_sees


@pytest.fixture
def binder() -> MemoryBinder:
    return MemoryBinder()


@pytest.fixture
def svc(binder: MemoryBinder) -> ExtenderService:
    return make_service(binder)


def bind(svc: ExtenderService, pod: dict[str, Any], node: str, uid: str | None = None) -> str:
    meta = pod["metadata"]
    body = orjson.dumps({"PodName": meta["name"], "PodNamespace": meta.get("namespace", NS),
                         "PodUID": meta["uid"] if uid is None else uid, "Node": node})
    return str(orjson.loads(asyncio.run(svc.bind(body)))["Error"])


def refused(svc: ExtenderService) -> float:
    return svc.metrics.registry.get_sample_value(
        "llm_placement_request_errors_total", {"verb": "bind", "kind": "refused"}) or 0.0


def test_filtered_pod_of_ours_binds(svc: ExtenderService, binder: MemoryBinder) -> None:
    pod = serving_pod("ok")
    decide(svc, pod)
    watch_sees(svc, pod)
    assert bind(svc, pod, "h100-0") == ""
    assert binder.bound == {f"{NS}/ok": "h100-0"}
    # A retry of the same bind (kube-scheduler timed out waiting) stays a success.
    assert bind(svc, pod, "h100-0") == ""


def test_pod_of_another_scheduler_is_refused(svc: ExtenderService, binder: MemoryBinder) -> None:
    pod = serving_pod("theirs")
    decide(svc, pod)  # a forged filter call cannot make it ours: identity comes from the API server
    pod["spec"]["schedulerName"] = "default-scheduler"
    watch_sees(svc, pod)
    err = bind(svc, pod, "h100-0")
    assert "uses scheduler 'default-scheduler'" in err
    assert binder.bound == {} and refused(svc) == 1.0
    assert svc.snapshot.usage["h100-0"].gpus == 0  # nothing left assumed


def test_unknown_pod_or_node_is_refused(svc: ExtenderService, binder: MemoryBinder) -> None:
    ghost = serving_pod("ghost")
    decide(svc, ghost)  # only ever seen in a request body, never by the watch or a read
    assert "not known to the API server" in bind(svc, ghost, "h100-0")
    pod = serving_pod("real")
    decide(svc, pod)
    watch_sees(svc, pod)
    assert "not known to the API server" in bind(svc, pod, "h100-0", uid="someone-else")
    assert "node 'nowhere' is not known" in bind(svc, pod, "nowhere")
    assert binder.bound == {}


def test_node_not_filtered_for_the_pod_is_refused(svc: ExtenderService, binder: MemoryBinder) -> None:
    pod = serving_pod("slo")
    filtered, _ = decide(svc, pod)
    watch_sees(svc, pod)
    assert "a100-0" not in [n["metadata"]["name"] for n in filtered["Nodes"]["items"]]
    err = bind(svc, pod, "a100-0")  # too slow for the SLO: filter rejected it
    assert "was not filtered by this extender for node a100-0" in err
    assert binder.bound == {}


@pytest.mark.parametrize("taken", [5, 8])
def test_no_gpu_over_commit_at_bind(svc: ExtenderService, binder: MemoryBinder, taken: int) -> None:
    pod = serving_pod("late")
    decide(svc, pod)
    watch_sees(svc, pod)
    # Between filter and bind someone else took GPUs on the node filter had kept.
    squatter = serving_pod("squat", gpus=taken)
    squatter["metadata"]["namespace"] = "other"
    svc.snapshot.assume(svc.placer.parse(squatter), "h100-0")
    err = bind(svc, pod, "h100-0")
    assert f"has {8 - taken} free GPUs" in err and "needs 4" in err
    assert binder.bound == {}
    assert svc.snapshot.usage["h100-0"].gpus == taken
