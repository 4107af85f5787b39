"""List+watch of Nodes and Pods into the ClusterSnapshot, so names-only requests are served from memory.

Raw JSON streams (``_preload_content=False``) instead of the client's model objects: the placement
core reads plain dicts, and deserialising 100,000 pods into generated classes costs seconds and
hundreds of MB. Each watch keeps its resourceVersion, re-lists on 410 Gone, and reconnects with
capped exponential backoff; node facts are computed here, once per event, never per request.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from typing import Any

from kubernetes import client
from kubernetes.watch.watch import iter_resp_lines

from app.cluster.client import raw
from app.config import Settings
from app.core.catalog import GpuCatalog
from app.core.nodes import facts_for
from app.core.snapshot import TERMINAL_PHASES, ClusterSnapshot, PlacedPod
from app.core.workload import WorkloadError, parse_workload, pod_resources
from app.metrics import Metrics

log = logging.getLogger(__name__)


def _slim(kind: str, obj: dict[str, Any]) -> dict[str, Any]:
    """Drop what placement never reads (managedFields, images, pod status details) before keeping it."""
    meta = obj.get("metadata") or {}
    meta.pop("managedFields", None)
    status = obj.get("status") or {}
    if kind == "nodes":
        status.pop("images", None)
    else:
        obj["status"] = {"phase": status.get("phase")}
    return obj


class Gone(Exception):
    """The watch's resourceVersion is too old (HTTP 410): re-list."""


def apply_node(
    snapshot: ClusterSnapshot, catalog: GpuCatalog, settings: Settings, node: dict[str, Any]
) -> None:
    snapshot.upsert_node(facts_for(node, catalog, settings.policies().node_facts))


def apply_pod(
    snapshot: ClusterSnapshot, settings: Settings, pod: dict[str, Any], deleted: bool = False
) -> None:
    """Fold one pod event into the snapshot: usage for bound pods, specs for gang membership."""
    meta = pod.get("metadata") or {}
    uid = str(meta.get("uid") or "")
    key = f"{meta.get('namespace') or 'default'}/{meta.get('name') or ''}"
    phase = (pod.get("status") or {}).get("phase")
    node = (pod.get("spec") or {}).get("nodeName") or ""
    if deleted or phase in TERMINAL_PHASES:
        snapshot.untrack_spec(uid)
        snapshot.finish(uid)
        return
    gpu_res = tuple(settings.labels.gpu_resource)
    try:
        spec = parse_workload(pod, gpu_res)
    except WorkloadError:
        spec = None
    # Specs are kept for pods still to be placed and for gang members (membership counts); a bound
    # pod only needs its usage record, which keeps 100k cached pods within the memory budget.
    if spec is not None and (not node or spec.gang is not None):
        snapshot.track_spec(spec)
    elif spec is not None:
        snapshot.untrack_spec(uid)
    if not node:
        return
    if spec is not None:
        placed = PlacedPod(uid=uid, key=key, node=node, gpus=spec.gpus, cpu_millis=spec.cpu_millis,
                           memory_bytes=spec.memory_bytes, stage=spec.stage,
                           latency_class=spec.effective_latency_class,
                           gang=spec.gang.key if spec.gang else None, priority=spec.priority)
    else:
        # Bad annotations must never hide real GPU usage: count resources regardless.
        try:
            gpus, cpu, mem = pod_resources(pod, gpu_res)
        except ValueError:
            gpus, cpu, mem = 0, 0.0, 0.0
        placed = PlacedPod(uid=uid, key=key, node=node, gpus=gpus, cpu_millis=cpu, memory_bytes=mem,
                           stage=None, latency_class=None, gang=None)
    snapshot.place(placed)


class ClusterCache:
    """Background threads that keep ``snapshot`` in step with the API server."""

    def __init__(
        self,
        api: client.ApiClient,
        snapshot: ClusterSnapshot,
        lock: threading.RLock,
        catalog: GpuCatalog,
        settings: Settings,
        metrics: Metrics,
        on_change: Callable[[], None] | None = None,
    ) -> None:
        self.core = client.CoreV1Api(api)
        self.snapshot = snapshot
        self.lock = lock
        self.catalog = catalog
        self.settings = settings
        self.metrics = metrics
        self.on_change = on_change
        self._stop = threading.Event()
        self._synced = {"nodes": threading.Event(), "pods": threading.Event()}
        self._threads: list[threading.Thread] = []

    @property
    def synced(self) -> bool:
        return all(e.is_set() for e in self._synced.values())

    def start(self) -> None:
        for kind in ("nodes", "pods"):
            t = threading.Thread(target=self._run, args=(kind,), name=f"watch-{kind}", daemon=True)
            t.start()
            self._threads.append(t)

    def stop(self) -> None:
        self._stop.set()

    # --- internals -----------------------------------------------------------------------------
    def _list(self, kind: str) -> tuple[list[dict[str, Any]], str]:
        """Paginated list: 100k pods in one response would cost ~1 GB of transient JSON."""
        fn: Any = self.core.list_node if kind == "nodes" else self.core.list_pod_for_all_namespaces
        items: list[dict[str, Any]] = []
        token: str | None = None
        while True:
            kwargs: dict[str, Any] = {"limit": 500, "_request_timeout": 60}
            if token:
                kwargs["_continue"] = token
            data = json.loads(raw(fn, **kwargs))
            items.extend(_slim(kind, i) for i in data.get("items") or [])
            meta = data.get("metadata") or {}
            token = meta.get("continue")
            if not token:
                return items, str(meta.get("resourceVersion") or "")

    def _replace(self, kind: str, items: list[dict[str, Any]]) -> None:
        with self.lock:
            if kind == "nodes":
                seen = set()
                for n in items:
                    apply_node(self.snapshot, self.catalog, self.settings, n)
                    seen.add((n.get("metadata") or {}).get("name"))
                for name in [n for n in self.snapshot.nodes if n not in seen]:
                    self.snapshot.remove_node(name)
            else:
                live = set()
                for p in items:
                    apply_pod(self.snapshot, self.settings, p)
                    live.add((p.get("metadata") or {}).get("uid"))
                # Pods deleted while we were not watching; assumed pods stay until the watch
                # confirms them (we bound them a moment ago and the list may predate that).
                for uid in [u for u, p in self.snapshot.pods.items() if u not in live and not p.assumed]:
                    self.snapshot.untrack_spec(uid)
                    self.snapshot.finish(uid)
                for uid in [u for u in self.snapshot.specs if u not in live]:
                    self.snapshot.untrack_spec(uid)
            self._update_gauges()

    def _apply(self, kind: str, etype: str, obj: dict[str, Any]) -> None:
        with self.lock:
            if kind == "nodes":
                if etype == "DELETED":
                    self.snapshot.remove_node(str((obj.get("metadata") or {}).get("name")))
                else:
                    apply_node(self.snapshot, self.catalog, self.settings, obj)
                self._update_gauges()
            else:
                apply_pod(self.snapshot, self.settings, obj, deleted=etype == "DELETED")
                # Pod events cannot change the node gauges; keep the per-event work O(1).
                self.metrics.cache_pods.set(len(self.snapshot.pods))

    def _update_gauges(self) -> None:
        self.metrics.cache_nodes.set(len(self.snapshot.nodes))
        self.metrics.cache_pods.set(len(self.snapshot.pods))
        self.metrics.unknown_gpu_nodes.set(
            sum(1 for n in self.snapshot.nodes.values() if n.has_gpus and not n.gpu_known)
        )

    def _run(self, kind: str) -> None:
        backoff = 0.5
        rv = ""
        while not self._stop.is_set():
            try:
                if not rv:
                    items, rv = self._list(kind)
                    self._replace(kind, items)
                    self._synced[kind].set()
                    if self.on_change:
                        self.on_change()
                rv = self._watch(kind, rv)
                backoff = 0.5
            except Gone:
                self.metrics.watch_restarts.labels(kind, "gone").inc()
                rv = ""
            except Exception as exc:  # reconnect on anything: the cache must outlive API hiccups
                self.metrics.watch_restarts.labels(kind, "error").inc()
                log.warning("watch %s failed (%s); retrying in %.1fs", kind, exc, backoff)
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 30.0)

    def _watch(self, kind: str, rv: str) -> str:
        fn: Any = self.core.list_node if kind == "nodes" else self.core.list_pod_for_all_namespaces
        resp = fn(watch=True, resource_version=rv, allow_watch_bookmarks=True, timeout_seconds=240,
                  _preload_content=False, _request_timeout=(10, 300))
        try:
            for line in iter_resp_lines(resp):
                if self._stop.is_set():
                    break
                event = json.loads(line)
                etype = event.get("type")
                obj = event.get("object") or {}
                if etype == "ERROR":
                    if obj.get("code") == 410:
                        raise Gone()
                    raise RuntimeError(f"watch error: {obj.get('message')}")
                new_rv = (obj.get("metadata") or {}).get("resourceVersion")
                if etype != "BOOKMARK":
                    self._apply(kind, etype, _slim(kind, obj))
                    if self.on_change:
                        self.on_change()
                if new_rv:
                    rv = str(new_rv)
        finally:
            resp.release_conn()
        return rv
