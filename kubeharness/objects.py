"""Node and pod factories and the waits the tests assert with.

Nodes look like what GPU Feature Discovery, NFD and topograph publish on real clusters; pods look like
what users write (docs/annotations.md). The API is used through the official ``kubernetes`` client with raw JSON
(``_preload_content=False``) for bulk calls: the generated model classes cost far more than the
requests themselves when the benchmark creates thousands of objects.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from kubernetes.client import CoreV1Api
from kubernetes.client.rest import ApiException

from .rawapi import read_json, send

SCHEDULER_NAME = "llm-placement"
ANN = "llm-placement.io/"
GPU_RESOURCE = "nvidia.com/gpu"
NOT_READY_TAINT = "node.kubernetes.io/not-ready"


@dataclass(frozen=True)
class GpuModel:
    product: str  # nvidia.com/gpu.product as GFD writes it
    memory_mib: int  # nvidia.com/gpu.memory as GFD writes it (MiB)
    family: str


# The GFD product strings of the GPUs the tests use, with the per-GPU memory GFD reports.
GPUS: dict[str, GpuModel] = {
    "H100": GpuModel("NVIDIA-H100-80GB-HBM3", 81559, "hopper"),
    "A100": GpuModel("NVIDIA-A100-SXM4-80GB", 81920, "ampere"),
    "L4": GpuModel("NVIDIA-L4", 23034, "ada-lovelace"),
    "T4": GpuModel("Tesla-T4", 15360, "turing"),
    "L40S": GpuModel("NVIDIA-L40S", 46068, "ada-lovelace"),
}
PRODUCT_TO_KEY = {g.product: k for k, g in GPUS.items()}

_TS = "2026-01-01T00:00:00Z"


def _ready_status(capacity: dict[str, str], index: int) -> dict[str, Any]:
    return {
        "capacity": capacity,
        "allocatable": dict(capacity),
        # Ignored by kube-scheduler (it reads taints) but real nodes have it, and the extender may look.
        "conditions": [
            {
                "type": "Ready",
                "status": "True",
                "reason": "KubeletReady",
                "message": "kubelet is posting ready status",
                "lastHeartbeatTime": _TS,
                "lastTransitionTime": _TS,
            }
        ],
        # Documentation-range addresses: data only, nothing connects to them.
        "addresses": [{"type": "InternalIP", "address": f"192.0.2.{index % 250 + 1}"}],
    }


def _node(
    name: str, labels: dict[str, str], annotations: dict[str, str], capacity: dict[str, str], index: int
) -> dict[str, Any]:
    base = {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64"}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {**base, **labels}, "annotations": annotations},
        "status": _ready_status(capacity, index),
    }


def gpu_node(
    name: str,
    gpu: str = "H100",
    *,
    gpus: int = 8,
    cpu: str = "96",
    memory: str = "1Ti",
    pods: int = 110,
    zone: str = "zone-a",
    clique: str | None = None,
    tier0: str | None = None,
    tier1: str | None = None,
    rdma: bool = False,
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    index: int = 0,
) -> dict[str, Any]:
    """A GPU node as GFD/NFD/topograph label it; ``gpu`` is a key of GPUS (H100, A100, L4, T4)."""
    model = GPUS[gpu]
    lab = {
        "nvidia.com/gpu.present": "true",
        "nvidia.com/gpu.product": model.product,
        "nvidia.com/gpu.count": str(gpus),
        "nvidia.com/gpu.memory": str(model.memory_mib),
        "nvidia.com/gpu.family": model.family,
        "topology.kubernetes.io/zone": zone,
    }
    if clique:
        lab["nvidia.com/gpu.clique"] = clique
    if tier0:
        lab["fabric.topograph.run/tier-0"] = tier0
    if tier1:
        lab["fabric.topograph.run/tier-1"] = tier1
    if rdma:
        lab["feature.node.kubernetes.io/rdma.capable"] = "true"
    lab.update(labels or {})
    capacity = {
        "cpu": cpu,
        "memory": memory,
        "pods": str(pods),
        "ephemeral-storage": "2Ti",
        GPU_RESOURCE: str(gpus),
    }
    return _node(name, lab, dict(annotations or {}), capacity, index)


def cpu_node(
    name: str,
    node_class: str = "cpu",
    *,
    cpu: str = "64",
    memory: str = "512Gi",
    pods: int = 110,
    zone: str = "zone-a",
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    index: int = 0,
) -> dict[str, Any]:
    """A node without GPUs, classed ``cpu`` or ``storage`` by the llm-placement.io/node-class annotation."""
    lab = {"topology.kubernetes.io/zone": zone, **(labels or {})}
    ann = {f"{ANN}node-class": node_class, **(annotations or {})}
    capacity = {"cpu": cpu, "memory": memory, "pods": str(pods), "ephemeral-storage": "8Ti"}
    return _node(name, lab, ann, capacity, index)


def bare_node(
    name: str,
    *,
    cpu: str = "96",
    memory: str = "1Ti",
    pods: int = 110,
    zone: str = "zone-a",
    labels: dict[str, str] | None = None,
    index: int = 0,
) -> dict[str, Any]:
    """A node with no GPU label, no GPU resource and no node-class annotation.

    What a node of a cluster whose GPUs are published by a DRA driver looks like (docs/dra.md): its
    GPUs exist only in ResourceSlices, which the test creates separately.
    """
    lab = {"topology.kubernetes.io/zone": zone, **(labels or {})}
    capacity = {"cpu": cpu, "memory": memory, "pods": str(pods), "ephemeral-storage": "2Ti"}
    return _node(name, lab, {}, capacity, index)


def _parallel(fn: Any, items: Sequence[Any], workers: int) -> list[Any]:
    if len(items) <= 1 or workers <= 1:
        return [fn(i) for i in items]
    with ThreadPoolExecutor(max_workers=workers) as ex:
        return list(ex.map(fn, items))


def create_node(core: CoreV1Api, manifest: dict[str, Any]) -> str:
    """Create a Node and remove the not-ready taint admission adds to it.

    TaintNodesByCondition adds ``node.kubernetes.io/not-ready:NoSchedule`` on create and only the
    node-lifecycle controller (kube-controller-manager, not running here) would remove it; the plugin
    acts only on create, so a merge patch that drops the taints sticks (docs/control-plane.md, section 4).
    """
    name = manifest["metadata"]["name"]
    send(core.create_node, manifest)
    core.patch_node(
        name, {"spec": {"taints": None}}, _content_type="application/merge-patch+json", _preload_content=False
    )
    return str(name)


def create_nodes(core: CoreV1Api, manifests: Sequence[dict[str, Any]], workers: int = 8) -> list[str]:
    return _parallel(lambda m: create_node(core, m), manifests, workers)


def delete_nodes(core: CoreV1Api, names: Iterable[str], workers: int = 8, timeout: float = 60) -> None:
    """Delete nodes and wait until the API no longer lists them."""
    names = list(names)

    def delete(n: str) -> None:
        try:
            core.delete_node(n, _preload_content=False)
        except ApiException as exc:
            if exc.status != 404:
                raise

    _parallel(delete, names, workers)
    left = set(names)
    deadline = time.monotonic() + timeout
    while left and time.monotonic() < deadline:
        left &= set(list_node_names(core))
        if left:
            time.sleep(0.2)
    if left:
        raise AssertionError(f"nodes still present {timeout:.0f}s after delete: {sorted(left)[:10]}")


def list_nodes(core: CoreV1Api, label_selector: str | None = None) -> list[dict[str, Any]]:
    kw = {"label_selector": label_selector} if label_selector else {}
    return list(read_json(core.list_node, **kw)["items"])


def list_node_names(core: CoreV1Api) -> list[str]:
    return [n["metadata"]["name"] for n in list_nodes(core)]


def node_gpu_product(node: dict[str, Any]) -> str | None:
    return (node["metadata"].get("labels") or {}).get("nvidia.com/gpu.product")


def node_gpus(node: dict[str, Any]) -> int:
    return int((node.get("status") or {}).get("allocatable", {}).get(GPU_RESOURCE, "0"))


# ----- pods ------------------------------------------------------------------------------------
def llm_pod(
    name: str,
    *,
    stage: str | None = None,
    model_params: str | None = None,
    precision: str | None = None,
    max_ms_per_token: float | None = None,
    gpus: int = 0,
    cpu: str = "100m",
    memory: str = "64Mi",
    annotations: dict[str, str] | None = None,
    labels: dict[str, str] | None = None,
    scheduler_name: str = SCHEDULER_NAME,
    affinity: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A pod for the llm-placement profile, annotated the way docs/annotations.md documents."""
    ann: dict[str, str] = {}
    if stage is not None:
        ann[ANN + "stage"] = stage
    if model_params is not None:
        ann[ANN + "model-params"] = model_params
    if precision is not None:
        ann[ANN + "precision"] = precision
    if max_ms_per_token is not None:
        ann[ANN + "max-ms-per-token"] = f"{max_ms_per_token:g}"
    ann.update(annotations or {})
    requests: dict[str, str] = {"cpu": cpu, "memory": memory}
    limits: dict[str, str] = {}
    if gpus:
        # Extended resources must have limit == request.
        requests[GPU_RESOURCE] = limits[GPU_RESOURCE] = str(gpus)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "annotations": ann,
            "labels": {"app": "llm-placement-it", **(labels or {})},
        },
        "spec": {
            "schedulerName": scheduler_name,
            "terminationGracePeriodSeconds": 0,
            "automountServiceAccountToken": False,
            **({"affinity": affinity} if affinity else {}),
            "containers": [
                {
                    "name": "main",
                    "image": "registry.invalid/llm:latest",
                    "resources": {"requests": requests, **({"limits": limits} if limits else {})},
                }
            ],
        },
    }


def prefer_gpus(*keys: str, weight: int = 100) -> dict[str, Any]:
    """A *preferred* node affinity for GPU models (keys of GPUS), as a user might write one.

    Tests use it to pull kube-scheduler's in-tree scoring towards a wrong answer: only the extender's
    hard rules can then explain a pod landing elsewhere.
    """
    return {
        "nodeAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {
                    "weight": weight,
                    "preference": {
                        "matchExpressions": [
                            {
                                "key": "nvidia.com/gpu.product",
                                "operator": "In",
                                "values": [GPUS[k].product for k in keys],
                            }
                        ]
                    },
                }
            ]
        }
    }


def create_pod(core: CoreV1Api, namespace: str, manifest: dict[str, Any]) -> dict[str, Any]:
    return dict(read_json(core.create_namespaced_pod, namespace, manifest))


def create_pods(
    core: CoreV1Api, namespace: str, manifests: Sequence[dict[str, Any]], workers: int = 8
) -> list[dict[str, Any]]:
    return _parallel(lambda m: create_pod(core, namespace, m), manifests, workers)


def get_pod(core: CoreV1Api, namespace: str, name: str) -> dict[str, Any]:
    return dict(read_json(core.read_namespaced_pod, name, namespace))


def list_pods(core: CoreV1Api, namespace: str, label_selector: str | None = None) -> list[dict[str, Any]]:
    kw = {"label_selector": label_selector} if label_selector else {}
    return list(read_json(core.list_namespaced_pod, namespace, **kw)["items"])


def pod_events(core: CoreV1Api, namespace: str, name: str) -> list[dict[str, Any]]:
    """Events about one pod, oldest first (kube-scheduler writes them through events.k8s.io; the core
    API serves the same objects)."""
    items = read_json(
        core.list_namespaced_event, namespace, field_selector=f"involvedObject.kind=Pod,involvedObject.name={name}"
    )["items"]
    items.sort(
        key=lambda e: (
            e.get("lastTimestamp") or e.get("eventTime") or e["metadata"].get("creationTimestamp") or ""
        )
    )
    return list(items)


def scheduling_messages(core: CoreV1Api, namespace: str, name: str) -> list[str]:
    """The FailedScheduling messages of a pod, oldest first."""
    return [
        str(e.get("message") or e.get("note") or "")
        for e in pod_events(core, namespace, name)
        if e.get("reason") == "FailedScheduling"
    ]


def _describe(core: CoreV1Api, namespace: str, name: str) -> str:
    try:
        evs = pod_events(core, namespace, name)
    except ApiException as exc:
        return f"(cannot read events: {exc.status})"
    lines = [f"  {e.get('reason')}: {e.get('message')}" for e in evs[-5:]]
    return "\n".join(lines) or "  (no events)"


def wait_for_node_name(core: CoreV1Api, namespace: str, name: str, timeout: float = 60.0) -> str:
    """Wait until kube-scheduler (through the extender) has bound the pod; return the node name.

    Without kubelets a bound pod stays Pending with ``spec.nodeName`` set (docs/control-plane.md, section 4), so binding is
    the observable outcome. On timeout the pod's last events are in the assertion message.
    """
    deadline = time.monotonic() + timeout
    while True:
        node = get_pod(core, namespace, name)["spec"].get("nodeName")
        if node:
            return str(node)
        if time.monotonic() >= deadline:
            raise AssertionError(
                f"pod {namespace}/{name} not bound within {timeout:.0f}s; events:\n"
                + _describe(core, namespace, name)
            )
        time.sleep(0.2)


def wait_for_node_names(
    core: CoreV1Api,
    namespace: str,
    names: Iterable[str],
    timeout: float = 120.0,
    label_selector: str | None = None,
) -> dict[str, str]:
    """Wait until every named pod is bound; return pod name -> node name."""
    want = set(names)
    deadline = time.monotonic() + timeout
    while True:
        bound = {
            p["metadata"]["name"]: p["spec"]["nodeName"]
            for p in list_pods(core, namespace, label_selector)
            if p["metadata"]["name"] in want and p["spec"].get("nodeName")
        }
        if len(bound) == len(want):
            return bound
        if time.monotonic() >= deadline:
            missing = sorted(want - set(bound))
            raise AssertionError(
                f"{len(missing)} of {len(want)} pods in {namespace} not bound within {timeout:.0f}s, e.g. "
                f"{missing[0]}; its events:\n{_describe(core, namespace, missing[0])}"
            )
        time.sleep(0.25)


def wait_for_event(
    core: CoreV1Api, namespace: str, name: str, reason: str, contains: str, timeout: float = 60.0
) -> str:
    """Wait for an event of ``reason`` on the pod whose message contains ``contains``; return it."""
    deadline = time.monotonic() + timeout
    while True:
        for e in pod_events(core, namespace, name):
            msg = str(e.get("message") or "")
            if e.get("reason") == reason and contains in msg:
                return msg
        if time.monotonic() >= deadline:
            raise AssertionError(
                f"no {reason} event containing {contains!r} on {namespace}/{name} within {timeout:.0f}s; "
                f"events:\n{_describe(core, namespace, name)}"
            )
        time.sleep(0.25)


def assert_stays_unbound(core: CoreV1Api, namespace: str, name: str, seconds: float) -> None:
    """Assert the pod is still not bound after ``seconds`` (polled, so an early bind fails fast)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        node = get_pod(core, namespace, name)["spec"].get("nodeName")
        assert not node, f"pod {namespace}/{name} was bound to {node}, expected it to stay Pending"
        time.sleep(0.25)


def delete_pods(core: CoreV1Api, namespace: str, label_selector: str | None = None) -> None:
    """Delete a namespace's pods (those matching ``label_selector``) at once (grace period 0).

    The answer is read: the API server deletes a collection item by item while the request is
    open, and a client that goes away before the answer stops it half-way (seen under load: one of
    ten gang members left bound, holding its node's GPUs).
    """
    kw = {"label_selector": label_selector} if label_selector else {}
    resp = send(core.delete_collection_namespaced_pod, namespace, grace_period_seconds=0, **kw)
    resp.data  # noqa: B018  (reading the body waits for the API server to finish)


def delete_all_pods(core: CoreV1Api, namespace: str, timeout: float = 60.0) -> None:
    """Delete every pod of the namespace at once and wait until they are gone.

    Grace period 0: with no kubelet, a bound pod's graceful deletion would never complete.
    """
    delete_pods(core, namespace)
    deadline = time.monotonic() + timeout
    while list_pods(core, namespace):
        if time.monotonic() >= deadline:
            raise AssertionError(f"pods in {namespace} still present {timeout:.0f}s after delete")
        time.sleep(0.2)


def gpus_requested(pod: dict[str, Any]) -> int:
    total = 0
    for c in pod["spec"].get("containers") or []:
        total += int(((c.get("resources") or {}).get("requests") or {}).get(GPU_RESOURCE, "0"))
    return total
