"""Who may bind: only kube-scheduler's binds of our pods, filtered by us for that node, that still fit."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import pytest

from app.extender.service import ExtenderService
from tests.unit.extender.test_explain import NS, MemoryBinder, decide, make_service, serving_pod, watch_sees


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


def filter_names(svc: ExtenderService, pod: dict[str, Any], names: list[str]) -> list[str]:
    """A filter call naming nodes only (kube-scheduler's nodeCacheCapable shape, or a tenant's)."""
    body = orjson.dumps({"Pod": pod, "Nodes": None, "NodeNames": names})
    return list(orjson.loads(svc.filter(body))["NodeNames"] or [])


def bind_refusals(svc: ExtenderService, reason: str) -> float:
    return svc.metrics.registry.get_sample_value("llm_placement_bind_refusals_total",
                                                 {"reason": reason}) or 0.0


def _tainted(node: dict[str, Any]) -> None:
    node["spec"]["taints"] = [{"key": "maintenance", "value": "yes", "effect": "NoSchedule"}]


def _cordoned(node: dict[str, Any]) -> None:
    node["spec"]["unschedulable"] = True


def _labelled_elsewhere(node: dict[str, Any]) -> None:
    node["metadata"]["labels"]["pool"] = "other"


def _small(node: dict[str, Any]) -> None:
    node["status"]["allocatable"]["cpu"] = node["status"]["capacity"]["cpu"] = "4"


def _pod_selects_pool(pod: dict[str, Any]) -> None:
    pod["spec"]["nodeSelector"] = {"pool": "mine"}


def _pod_requires_pool(pod: dict[str, Any]) -> None:
    pod["spec"]["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [{"key": "pool", "operator": "In", "values": ["mine"]}]}]}}}


def _pod_wants_64_cpus(pod: dict[str, Any]) -> None:
    pod["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "64"


def _pod_wants_2_tib(pod: dict[str, Any]) -> None:
    pod["spec"]["containers"][0]["resources"]["requests"]["memory"] = "2Ti"


def _nothing(_: dict[str, Any]) -> None:
    pass


@pytest.mark.parametrize(("change_node", "change_pod", "reason", "words"), [
    (_tainted, _nothing, "taint", "has taint maintenance=yes:NoSchedule"),
    (_cordoned, _nothing, "cordoned", "is cordoned"),
    (_labelled_elsewhere, _pod_selects_pool, "node_selector", "nodeSelector pool"),
    (_labelled_elsewhere, _pod_requires_pool, "node_affinity", "required node affinity"),
    (_small, _pod_wants_64_cpus, "cpu", "4000m CPU free; the pod requests 64000m"),
    (_nothing, _pod_wants_2_tib, "memory", "memory free; the pod requests 2048.0 GiB"),
])
def test_forged_filter_then_bind_is_refused_by_the_node_rules(
        svc: ExtenderService, binder: MemoryBinder, change_node: Any, change_pod: Any, reason: str,
        words: str) -> None:
    # A tenant creates its own pod, calls filter naming a node kube-scheduler would refuse (our
    # filter judges GPUs, so it passes), then bind with the pod's real UID.
    from tests.unit.extender.test_explain import cluster
    node = next(n for n in cluster() if n["metadata"]["name"] == "h100-0")
    change_node(node)
    svc.absorb_node(node)  # what the node watch says
    pod = serving_pod("forged")
    change_pod(pod)
    watch_sees(svc, pod)
    assert filter_names(svc, pod, ["h100-0"]) == ["h100-0"]
    err = bind(svc, pod, "h100-0")
    assert "bind refused" in err and words in err, err
    assert binder.bound == {}
    assert bind_refusals(svc, reason) == 1.0
    assert svc.snapshot.usage["h100-0"].gpus == 0  # the assumption taken at bind start is undone


def test_a_pod_that_tolerates_and_selects_the_node_binds(svc: ExtenderService, binder: MemoryBinder) -> None:
    # The same node rules met: the bind goes through (kube-scheduler's binds always meet them).
    from tests.unit.extender.test_explain import cluster
    node = next(n for n in cluster() if n["metadata"]["name"] == "h100-0")
    _tainted(node)
    node["metadata"]["labels"]["pool"] = "mine"
    svc.absorb_node(node)
    pod = serving_pod("welcome")
    pod["spec"]["tolerations"] = [{"key": "maintenance", "operator": "Exists", "effect": "NoSchedule"}]
    _pod_selects_pool(pod)
    _pod_requires_pool(pod)
    watch_sees(svc, pod)
    assert filter_names(svc, pod, ["h100-0"]) == ["h100-0"]
    assert bind(svc, pod, "h100-0") == ""
    assert binder.bound == {f"{NS}/welcome": "h100-0"}


def test_cpu_counted_on_the_node_refuses_the_bind(svc: ExtenderService, binder: MemoryBinder) -> None:
    # 96 CPUs, 90 held by another pod: a 8-CPU pod does not fit by the extender's own accounting.
    pod = serving_pod("late-cpu")
    pod["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "8"
    watch_sees(svc, pod)
    assert "h100-0" in filter_names(svc, pod, ["h100-0"])
    other = serving_pod("cpu-hog", gpus=0)
    other["metadata"]["namespace"] = "other"
    other["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "90"
    svc.snapshot.assume(svc.placer.parse(other), "h100-0")
    err = bind(svc, pod, "h100-0")
    assert "6000m CPU free; the pod requests 8000m" in err
    assert binder.bound == {}


def test_request_nodes_are_ignored_when_a_watch_serves_the_nodes() -> None:
    # With a cluster watch, a node in a filter body (anyone can send one) must not replace the
    # watch's facts: a forged copy without its taint or with more CPUs would pass the bind checks.
    from app.base.catalog import GpuCatalog
    from app.base.objects import node_object
    from app.config.settings import Settings
    svc = ExtenderService(Settings(cluster_source="kubernetes", metrics_port=0), GpuCatalog.load())
    real = node_object("n", gpus=8, product="NVIDIA-H100-80GB-HBM3", cpu="4")
    _tainted(real)
    svc.absorb_node(real)
    forged = node_object("n", gpus=8, product="NVIDIA-H100-80GB-HBM3", cpu="512")
    body = orjson.dumps({"Pod": serving_pod("p"), "Nodes": {"metadata": {}, "items": [forged]},
                         "NodeNames": None})
    svc.filter(body)
    assert svc.snapshot.nodes["n"].cpu_millis == 4000
    assert svc.snapshot.node_inputs["n"]["spec"]["taints"]
