"""Follow the pods of one namespace: list them, then watch from that version (raw JSON).

The replay's tracker, the soak's resilient tracker and the throughput benchmark's bind watcher all
need the same loop; what they do with each pod, and what they do when the loop fails (report, or
list again), is theirs.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from kubernetes.client import CoreV1Api
from kubernetes.watch.watch import iter_resp_lines

from .rawapi import read_json, send

Pod = dict[str, Any]
CHANGES = ("ADDED", "MODIFIED", "DELETED")


def list_then_watch(
    core: CoreV1Api,
    namespace: str,
    *,
    on_list: Callable[[list[Pod]], None],
    on_event: Callable[[str, Pod], None],
    stop: Callable[[], bool],
    watch_timeout_s: int = 5,
    request_timeout: tuple[float, float] = (10, 30),
) -> None:
    """List the namespace's pods (``on_list``), then follow the watch from that version, calling
    ``on_event(type, pod)`` for every change, until ``stop()``. Raises on a failed call or a watch
    ERROR. Short server-side watch timeouts make ``stop`` noticed within seconds."""
    data = read_json(core.list_namespaced_pod, namespace, _request_timeout=request_timeout)
    on_list(data["items"])
    rv = data["metadata"]["resourceVersion"]
    while not stop():
        resp = send(
            core.list_namespaced_pod, namespace, watch=True, resource_version=rv,
            timeout_seconds=watch_timeout_s, allow_watch_bookmarks=True, _request_timeout=request_timeout,
        )
        try:
            for line in iter_resp_lines(resp):
                ev = json.loads(line)
                obj = ev.get("object") or {}
                if ev.get("type") == "ERROR":
                    raise RuntimeError(f"watch error: {obj.get('message')}")
                rv = obj.get("metadata", {}).get("resourceVersion") or rv
                if ev.get("type") in CHANGES:
                    on_event(ev["type"], obj)
                if stop():
                    break
        finally:
            resp.release_conn()
