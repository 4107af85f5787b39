"""Nodes of the live cluster, and the GPUs already held on them (the only module of app.plan that talks
to the API server)."""

from __future__ import annotations

import json
from typing import Any

from app.snapshot.store import TERMINAL_PHASES


def live_nodes(
    kubeconfig: str | None, gpu_resources: tuple[str, ...]
) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """Node objects, and per node the GPUs requested by pods bound there and still running."""
    from kubernetes import client

    from app.cluster.client import api_client, raw

    core = client.CoreV1Api(api_client(kubeconfig))
    nodes = json.loads(raw(core.list_node, _request_timeout=60)).get("items") or []
    pods = json.loads(raw(core.list_pod_for_all_namespaces, _request_timeout=60)).get("items") or []
    used: dict[str, int] = {}
    for p in pods:
        node = (p.get("spec") or {}).get("nodeName")
        if not node or (p.get("status") or {}).get("phase") in TERMINAL_PHASES:
            continue
        for c in (p.get("spec") or {}).get("containers") or []:
            req = ((c.get("resources") or {}).get("requests") or {})
            for r in gpu_resources:
                if r in req:
                    try:
                        used[node] = used.get(node, 0) + int(str(req[r]))
                    except ValueError:
                        continue
    return nodes, used
