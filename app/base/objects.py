"""Node and Pod objects shaped like the API's, from compact cluster and workload descriptions.

The demo, the simulator, the planner and the tests build clusters this way, so every path goes
through the same node_facts / parse_workload code the live service uses.
"""

from __future__ import annotations

import uuid
from importlib.resources import files
from pathlib import Path
from typing import Any

import yaml

from app.base.datafile import load_user_yaml

STAGE = "llm-placement.io/stage"


# A cluster or workload description a user hands the demo: the planner's own limit.
MAX_FILE_BYTES = 64 << 20


def load_yaml(path: str | Path | None, default: str) -> dict[str, Any]:
    """A user's file (no aliases, bounded size) or the packaged description ``default``."""
    if path:
        data = load_user_yaml(path, ValueError, MAX_FILE_BYTES)
    else:
        data = yaml.safe_load((files("app.demo") / default).read_text())
    if not isinstance(data, dict):
        raise ValueError(f"{path or default}: expected a mapping at the top level")
    return data


def node_object(
    name: str,
    *,
    gpus: int = 0,
    product: str | None = None,
    cpu: str = "96",
    memory: str = "1024Gi",
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    rdma: bool = False,
    node_class: str | None = None,
    gpu_resource: str = "nvidia.com/gpu",
) -> dict[str, Any]:
    lab = {"kubernetes.io/hostname": name, **(labels or {})}
    ann = dict(annotations or {})
    if product:
        lab["nvidia.com/gpu.product"] = product
        lab["nvidia.com/gpu.count"] = str(gpus)
    if rdma:
        lab["feature.node.kubernetes.io/rdma.capable"] = "true"
    if node_class:
        ann["llm-placement.io/node-class"] = node_class
    alloc = {"cpu": cpu, "memory": memory, "pods": "110"}
    if gpus:
        alloc[gpu_resource] = str(gpus)
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": lab, "annotations": ann},
        "spec": {},
        "status": {"capacity": dict(alloc), "allocatable": dict(alloc),
                   "conditions": [{"type": "Ready", "status": "True"}]},
    }


def expand_cluster(data: dict[str, Any]) -> list[dict[str, Any]]:
    nodes: list[dict[str, Any]] = []
    for g in data.get("groups") or []:
        for i in range(int(g.get("count", 1))):
            labels = dict(g.get("labels") or {})
            if g.get("gpus"):
                # An HGX box is one NVLink domain unless the group says otherwise.
                labels.setdefault("nvidia.com/gpu.clique", f"{g['prefix']}-{i}")
            nodes.append(node_object(
                f"{g['prefix']}-{i}",
                gpus=int(g.get("gpus", 0)),
                product=g.get("product"),
                cpu=str(g.get("cpu", "96")),
                memory=str(g.get("memory", "1024Gi")),
                labels=labels,
                annotations=g.get("annotations"),
                rdma=bool(g.get("rdma", False)),
                node_class=g.get("node_class"),
            ))
    return nodes


def pod_object(
    name: str,
    *,
    namespace: str = "default",
    stage: str | None = None,
    gpus: int = 0,
    cpu: str = "1",
    memory: str = "4Gi",
    annotations: dict[str, str] | None = None,
    labels: dict[str, str] | None = None,
    scheduler_name: str = "llm-placement",
    uid: str | None = None,
) -> dict[str, Any]:
    ann = dict(annotations or {})
    if stage:
        ann[STAGE] = stage
    requests: dict[str, str] = {"cpu": cpu, "memory": memory}
    limits: dict[str, str] = {}
    if gpus:
        requests["nvidia.com/gpu"] = limits["nvidia.com/gpu"] = str(gpus)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "uid": uid or str(uuid.uuid4()),
                     "annotations": ann, "labels": dict(labels or {})},
        "spec": {"schedulerName": scheduler_name,
                 "containers": [{"name": "main", "image": "busybox",
                                 "resources": {"requests": requests, "limits": limits}}]},
        "status": {"phase": "Pending"},
    }


def expand_workload(data: dict[str, Any], namespace: str = "default") -> list[dict[str, Any]]:
    pods: list[dict[str, Any]] = []
    for p in data.get("pods") or []:
        replicas = int(p.get("replicas", 1))
        for i in range(replicas):
            name = p["name"] if replicas == 1 else f"{p['name']}-{i}"
            ann = {str(k): str(v) for k, v in (p.get("annotations") or {}).items()}
            labels = {}
            if p.get("gang"):
                labels["scheduling.x-k8s.io/pod-group"] = p["name"]
                ann["llm-placement.io/gang-size"] = str(replicas)
            pods.append(pod_object(
                name, namespace=namespace, stage=p.get("stage"), gpus=int(p.get("gpus", 0)),
                cpu=str(p.get("cpu", "4")), memory=str(p.get("memory", "16Gi")),
                annotations=ann, labels=labels,
            ))
    return pods
