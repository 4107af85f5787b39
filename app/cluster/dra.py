"""List+watch of the DRA objects (resource.k8s.io/v1) into ``snapshot.dra`` (docs/dra.md).

ResourceSlices become node facts (the affected Node is re-read and re-applied), DeviceClasses tell
which claims ask for GPUs of the driver, ResourceClaims and ResourceClaimTemplates give a pod's GPU
demand and, once allocated, the devices they hold; DeviceTaintRules taint devices. Clusters without
the API (404) or without the right to read it (403) are looked at again after 1 s, then less often
up to every minute (app/backoff.py); until then placement reads extended resources only.
"""

from __future__ import annotations

import json
import logging
import threading
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from app.backoff import Backoff, absent_backoff
from app.cluster.cache import ClusterCache, apply_node, apply_pod, watch_events
from app.cluster.client import list_all, raw
from app.core import workload
from app.core.units import quote
from app.ratelog import RateLimitedLog

log = logging.getLogger(__name__)
GROUP, VERSION = "resource.k8s.io", "v1"
# Classes first: a claim's demand depends on its class's driver.
KINDS = ("deviceclasses", "resourceslices", "resourceclaimtemplates", "resourceclaims", "devicetaintrules")
# DeviceTaintRule is not in v1 in Kubernetes 1.36; a cluster that does not serve it (404) or does
# not let us read it (403) has its devices' taints read from the slices alone.
VERSIONS = {"devicetaintrules": "v1beta2"}


class DraWatcher:
    """Background threads keeping ``cache.snapshot.dra`` in step with the resource.k8s.io objects."""

    def __init__(self, api: client.ApiClient, cache: ClusterCache) -> None:
        self.custom = client.CustomObjectsApi(api)
        self.core = client.CoreV1Api(api)
        self.cache = cache
        self.snapshot = cache.snapshot
        self.lock = cache.lock
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self.present: dict[str, bool] = {k: False for k in KINDS}
        # Retries come every couple of seconds during an outage: one line a minute per kind.
        self._log = RateLimitedLog(log)
        # Not ready before every kind was listed or found absent: until the slices are read, a DRA
        # GPU node looks like a CPU node and a claim pod like a CPU pod (docs/dra.md).
        self._first: set[str] = set()
        self._synced = cache.sync_gate("dra")

    def start(self) -> None:
        for kind in KINDS:
            t = threading.Thread(target=self._run, args=(kind,), name=f"watch-{kind}", daemon=True)
            t.start()
            self._threads.append(t)

    def stop(self) -> None:
        self._stop.set()

    # --- applying ----------------------------------------------------------------------------------
    def _put(self, kind: str, obj: dict[str, Any], deleted: bool) -> tuple[set[str], list[dict[str, Any]]]:
        """Fold one object in (lock held); returns (nodes to re-read, pods whose usage may change)."""
        dra = self.snapshot.dra
        meta = obj.get("metadata") or {}
        name = str(meta.get("name") or "")
        key = f"{meta.get('namespace') or 'default'}/{name}"
        nodes: set[str] = set()
        pods: list[dict[str, Any]] = []
        if kind == "resourceslices":
            node = dra.drop_slice(name) if deleted else dra.put_slice(obj)
            if node:
                nodes.add(node)
                self.snapshot.refresh_dra(nodes)
        elif kind == "deviceclasses":
            if deleted:
                dra.drop_class(name)
            else:
                dra.put_class(obj)
        elif kind == "resourceclaimtemplates":
            if deleted:
                dra.templates.pop(key, None)
            else:
                dra.put_template(obj)
        elif kind == "devicetaintrules":
            nodes |= dra.drop_taint_rule(name) if deleted else dra.put_taint_rule(obj)
            self.snapshot.refresh_dra(nodes)
        else:
            # Nodes whose devices this claim takes or gives back: their free MIG slices are node
            # facts, their held full GPUs are usage (docs/dra.md); the pods naming the claim are
            # charged for it only while it is not allocated.
            nodes |= dra.drop_claim(key) if deleted else dra.put_claim(obj)
            self.snapshot.refresh_dra(nodes, (key,))
            if not deleted:
                reserved = (obj.get("status") or {}).get("reservedFor") or []
                pods = [r for r in reserved if isinstance(r, dict) and r.get("resource") == "pods"]
                for r in pods:
                    r.setdefault("namespace", meta.get("namespace") or "default")
        self.snapshot.generation += 1
        return nodes, pods

    def _refresh(self, nodes: set[str], pods: list[dict[str, Any]]) -> None:
        """Re-apply nodes whose slices changed and pods whose claims' usage changed."""
        for name in sorted(nodes):
            try:
                node = json.loads(raw(self.core.read_node, name, _request_timeout=30))
            except ApiException as exc:
                if exc.status != 404:
                    log.warning("DRA: node %s not re-read (%s)", quote(name), exc.status)
                continue
            with self.lock:
                if name in self.snapshot.nodes:
                    self.cache._guarded("nodes", node, apply_node, self.snapshot, self.cache.catalog,
                                        self.cache.settings, node)
        for ref in pods:
            uid = str(ref.get("uid") or "")
            with self.lock:
                placed = self.snapshot.pods.get(uid)
            if placed is None:
                continue  # not bound yet: its demand is read afresh on every filter
            try:
                pod = json.loads(raw(self.core.read_namespaced_pod, str(ref.get("name")),
                                     str(ref.get("namespace")), _request_timeout=30))
            except ApiException:
                continue
            if not (pod.get("spec") or {}).get("nodeName"):
                # Allocated in PreBind, bound a moment later: the pod watch's bind event counts
                # the claim as allocated; until then the assumption made at bind stands.
                continue
            with self.lock:
                if self.snapshot.pods.get(uid) is not None:
                    # The claim was allocated (or changed) after the pod was counted: the pod as it
                    # is now replaces its record (never "finished": it still runs).
                    apply_pod(self.snapshot, self.cache.settings, pod)

    def _replace(self, kind: str, items: list[dict[str, Any]]) -> tuple[set[str], list[dict[str, Any]]]:
        dra = self.snapshot.dra
        nodes: set[str] = set()
        pods: list[dict[str, Any]] = []
        with self.lock:
            if kind == "resourceslices":
                nodes |= set(dra.by_node)
                dra.slices.clear()
                dra.by_node.clear()
            elif kind == "deviceclasses":
                dra.clear_classes()
            elif kind == "resourceclaimtemplates":
                dra.templates.clear()
            elif kind == "devicetaintrules":
                nodes |= dra.clear_taint_rules()
            else:
                nodes |= dra.clear_claims()
            for obj in items:
                try:
                    n, p = self._put(kind, obj, False)
                except Exception as exc:  # one unreadable object costs only itself
                    self.cache.skipped(kind, obj, exc)
                    continue
                nodes |= n
                pods += p
            if kind == "resourceslices":
                dra.enabled = True
            self.snapshot.refresh_dra(nodes, list(self.snapshot.claim_pods))
            # Pods parsed from now on count their claims' GPUs.
            workload.CLAIM_GPUS = dra.pod_gpus
            workload.CLAIM_DEVICES = dra.pod_devices
        return nodes, pods

    # --- list + watch ------------------------------------------------------------------------------
    def _list(self, kind: str) -> tuple[list[dict[str, Any]], str]:
        return list_all(self.custom.list_cluster_custom_object, GROUP, VERSIONS.get(kind, VERSION), kind)

    def _run(self, kind: str) -> None:
        backoff = Backoff()  # short and reset when the API server answers (app/backoff.py)
        absent = absent_backoff()  # 403/404: soon at first, then every minute (app/backoff.py)
        told_absent = False
        while not self._stop.is_set():
            try:
                items, rv = self._list(kind)
                backoff.reset()
                absent.reset()
                self.present[kind], told_absent = True, False
                self._refresh(*self._replace(kind, items))
                self._listed(kind)  # after the nodes were re-read with their slices
                self._notify()
                self._watch(kind, rv)
            except ApiException as exc:
                if exc.status in (403, 404):
                    # No DRA API on this cluster (or no right to read it): extended resources only.
                    if not told_absent:
                        log.info("DRA %s unavailable (%s); GPUs from extended resources only",
                                 kind, exc.status)
                    self.present[kind], told_absent = False, True
                    self._listed(kind)
                    self._notify()
                    backoff.reset()
                    self._stop.wait(absent.next())
                    continue
                delay = backoff.next()
                self._log.warning(f"dra:{kind}", f"DRA {kind} watch failed ({quote(str(exc.reason))}); "
                                  f"retrying in {delay:.1f}s")
                self._stop.wait(delay)
            except Exception as exc:  # the watch must outlive API hiccups
                delay = backoff.next()
                self._log.warning(f"dra:{kind}", f"DRA {kind} watch failed ({quote(str(exc))}); "
                                  f"retrying in {delay:.1f}s")
                self._stop.wait(delay)

    def _listed(self, kind: str) -> None:
        with self.lock:
            self._first.add(kind)
            if self._first >= set(KINDS):
                self._synced.set()

    def _notify(self) -> None:
        if self.cache.on_change:
            self.cache.on_change()

    def _watch(self, kind: str, rv: str) -> None:
        resp: Any = self.custom.list_cluster_custom_object(
            GROUP, VERSIONS.get(kind, VERSION), kind, watch=True, resource_version=rv,
            allow_watch_bookmarks=True, timeout_seconds=240, _preload_content=False,
            _request_timeout=(10, 300),
        )
        try:
            for etype, obj in watch_events(resp, self._stop, lambda exc: self.cache.skipped(kind, None, exc)):
                if etype == "ERROR":
                    return  # 410 Gone and friends: re-list
                if etype == "BOOKMARK":
                    continue
                try:
                    with self.lock:
                        changed = self._put(kind, obj, etype == "DELETED")
                except Exception as exc:
                    self.cache.skipped(kind, obj, exc)
                    continue
                self._refresh(*changed)
                self._notify()
        finally:
            resp.release_conn()
