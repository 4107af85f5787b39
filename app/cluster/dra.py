"""List+watch of the DRA objects (resource.k8s.io/v1) into ``snapshot.dra`` (docs/dra.md).

ResourceSlices become node facts, DeviceClasses tell which claims ask for GPUs of the driver,
ResourceClaims and ResourceClaimTemplates give a pod's GPU demand and, once allocated, the devices
they hold; DeviceTaintRules taint devices; ComputeDomainCliques (resource.nvidia.com) name nodes'
NVLink cliques. Watch events are all it takes: a node's facts are computed
again from what its last Node event said (``snapshot.node_inputs``), a pod's charge from what its
last Pod event said (``ClusterSnapshot.refresh_dra``), and a watch that times out is resumed from
its last resourceVersion; the objects are listed again only after 410 Gone or a failed watch that
cannot be resumed. Clusters without the API (404) or without the right to read it (403) are looked
at again after 1 s, then less often up to every minute (app/cluster/backoff.py); until then placement reads
extended resources only.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from kubernetes import client

from app.base.ratelog import RateLimitedLog
from app.base.units import quote
from app.cluster.cache import ClusterCache, apply_node
from app.cluster.client import list_all
from app.cluster.reflector import READ_TIMEOUT, WATCH_SECONDS, Reflector
from app.dra.index import MAX_NODE_DEVICES, parse_slice

log = logging.getLogger(__name__)
GROUP, VERSION = "resource.k8s.io", "v1"
# Classes first: a claim's demand depends on its class's driver.
COALESCE_SECONDS = 0.1  # slice events within this long re-apply their node once
KINDS = ("deviceclasses", "resourceslices", "resourceclaimtemplates", "resourceclaims", "devicetaintrules",
         "computedomaincliques", "computedomains")
# (group, version) of the kinds not in resource.k8s.io/v1. DeviceTaintRule is not in v1 in
# Kubernetes 1.36; NVIDIA's driver reports each node's NVLink clique in ComputeDomainCliques (or,
# without them, in the ComputeDomain's status). A cluster that does not serve one (404) or does not
# let us read it (403) goes without it.
APIS = {"devicetaintrules": (GROUP, "v1beta2"), "computedomaincliques": ("resource.nvidia.com", "v1beta1"),
        "computedomains": ("resource.nvidia.com", "v1beta1")}
DOMAINS = ("computedomaincliques", "computedomains")


class DraWatcher:
    """Background threads keeping ``cache.snapshot.dra`` in step with the resource.k8s.io objects."""

    def __init__(self, api: client.ApiClient, cache: ClusterCache) -> None:
        self.custom = client.CustomObjectsApi(api)
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
        self._dirty: set[str] = set()
        self._wake = threading.Event()

    def start(self) -> None:
        for kind in KINDS:
            t = threading.Thread(target=self._run, args=(kind,), name=f"watch-{kind}", daemon=True)
            t.start()
            self._threads.append(t)
        t = threading.Thread(target=self._flusher, name="dra-flush", daemon=True)
        t.start()
        self._threads.append(t)

    # --- coalescing: a burst of slice events re-applies each node once (docs/dra.md, "Churn") -------
    def mark(self, nodes: set[str]) -> None:
        """Remember nodes an event changed (lock held); the flusher re-applies them shortly."""
        if nodes:
            self._dirty |= nodes
            self._wake.set()

    def flush(self) -> None:
        with self.lock:
            nodes, self._dirty = self._dirty, set()
            self._reapply(nodes)
        self._notify()

    def _flusher(self) -> None:
        while not self._stop.is_set():
            if self._wake.wait(1.0):
                self._wake.clear()
                self._stop.wait(COALESCE_SECONDS)  # let the rest of a burst arrive
                try:
                    self.flush()
                except Exception:  # one bad node costs its own facts, never the flusher
                    log.exception("DRA: re-applying changed nodes failed")

    def stop(self) -> None:
        self._stop.set()

    # --- applying (lock held) ----------------------------------------------------------------------
    def _put(self, kind: str, obj: dict[str, Any], deleted: bool, parsed: Any = None) -> set[str]:
        """Fold one object in; returns the nodes whose facts must be computed again."""
        dra = self.snapshot.dra
        meta = obj.get("metadata") or {}
        name = str(meta.get("name") or "")
        key = f"{meta.get('namespace') or 'default'}/{name}"
        nodes: set[str] = set()
        if kind == "resourceslices":
            node = (dra.drop_slice(name) if deleted else dra.put_slice(obj) if parsed is None
                    else dra.put_parsed_slice(obj, parsed))
            nodes |= {node} if node else set()
        elif kind == "deviceclasses":
            if deleted:
                dra.drop_class(name)
            else:
                dra.put_class(obj)
        elif kind == "resourceclaimtemplates":
            if deleted:
                dra.drop_template(key)
            else:
                dra.put_template(obj)
        elif kind == "devicetaintrules":
            nodes |= dra.drop_taint_rule(name) if deleted else dra.put_taint_rule(obj)
        elif kind in DOMAINS:
            nodes |= dra.drop_domain(kind, obj) if deleted else dra.put_domain(kind, obj)
        else:
            # The nodes whose devices this claim takes or gives back count them as used or free,
            # and the pods naming the claim are charged for it only while it is not allocated: both
            # at once (docs/dra.md). Only free MIG slices are node facts to compute again.
            changed = dra.drop_claim(key) if deleted else dra.put_claim(obj)
            self.snapshot.refresh_dra(changed, (key,))
            nodes |= {n for n in changed if (f := self.snapshot.nodes.get(n)) is not None and f.mig}
        self.snapshot.generation += 1
        return nodes

    def _reapply(self, nodes: set[str]) -> None:
        """Compute the facts of ``nodes`` again, from what their last Node event said: no request to
        the API server. A node not seen yet gets its DRA facts when it is."""
        dra = self.snapshot.dra
        for name in sorted(nodes):
            if dra.over_limit(name):
                self._log.warning(f"dra:limit:{name}", f"node {quote(name)} publishes "
                                  f"{dra.slice_store.node_devices.get(name, 0)} DRA devices, more than "
                                  f"{MAX_NODE_DEVICES}: its DRA GPUs are not read (docs/dra.md, \"Churn\")")
                self.cache.metrics.skipped_objects.labels("resourceslices").inc()
            node = self.snapshot.node_inputs.get(name)
            if node is not None:
                self.cache._guarded("nodes", node, apply_node, self.snapshot, self.cache.catalog,
                                    self.cache.settings, node)

    def _replace(self, kind: str, items: list[dict[str, Any]]) -> None:
        dra = self.snapshot.dra
        nodes: set[str] = set()
        with self.lock:
            if kind == "resourceslices":
                nodes |= set(dra.slice_store.by_node)
                dra.clear_slices()
            elif kind == "deviceclasses":
                dra.clear_classes()
            elif kind == "resourceclaimtemplates":
                dra.clear_templates()
            elif kind == "devicetaintrules":
                nodes |= dra.clear_taint_rules()
            elif kind in DOMAINS:
                nodes |= dra.clear_domains(kind)
            else:
                nodes |= dra.clear_claims()
            for obj in items:
                try:
                    nodes |= self._put(kind, obj, False)
                except Exception as exc:  # one unreadable object costs only itself
                    self.cache.skipped(kind, obj, exc)
            if kind == "resourceslices":
                dra.enabled = True
            if kind == "resourceclaims":
                nodes |= {n for n, f in self.snapshot.nodes.items() if f.mig}
            self._reapply(nodes)
            self.snapshot.refresh_dra(list(self.snapshot.usage), list(self.snapshot.claim_pods))
            # Pods parsed from now on count their claims' GPUs.
            dra.reads_claims = True

    # --- list + watch ------------------------------------------------------------------------------
    def _list(self, kind: str) -> tuple[list[dict[str, Any]], str]:
        return list_all(self.custom.list_cluster_custom_object, *APIS.get(kind, (GROUP, VERSION)), kind)

    def _run(self, kind: str) -> None:
        told_absent = False

        def replace(items: list[dict[str, Any]]) -> None:
            nonlocal told_absent
            self.present[kind], told_absent = True, False
            self._replace(kind, items)

        def listed() -> None:
            self._listed(kind)  # after the nodes' facts were computed with their slices
            self._notify()

        def absent(status: int) -> None:
            # No DRA API on this cluster (or no right to read it): extended resources only.
            nonlocal told_absent
            if not told_absent:
                log.info("DRA %s unavailable (%s); GPUs from extended resources only", kind, status)
            self.present[kind], told_absent = False, True

        def apply(etype: str, obj: dict[str, Any]) -> None:
            deleted = etype == "DELETED"
            # Read a slice's devices before taking the lock filter answers need.
            parsed = parse_slice(obj) if kind == "resourceslices" and not deleted else None
            with self.lock:
                self.mark(self._put(kind, obj, deleted, parsed))

        Reflector(f"DRA {kind}", list_objects=lambda: self._list(kind),
                  open_watch=lambda rv: self._open_watch(kind, rv), replace=replace, apply=apply,
                  stop=self._stop, log=self._log, skipped=lambda obj, exc: self.cache.skipped(kind, obj, exc),
                  listed=listed, on_absent=absent,
                  restarted=lambda cause: self.cache.metrics.watch_restarts.labels(kind, cause).inc()).run()

    def _listed(self, kind: str) -> None:
        with self.lock:
            self._first.add(kind)
            if self._first >= set(KINDS):
                self._synced.set()

    def _notify(self) -> None:
        if self.cache.on_change:
            self.cache.on_change()

    def _open_watch(self, kind: str, rv: str) -> Any:
        return self.custom.list_cluster_custom_object(
            *APIS.get(kind, (GROUP, VERSION)), kind, watch=True, resource_version=rv,
            allow_watch_bookmarks=True, timeout_seconds=WATCH_SECONDS, _preload_content=False,
            _request_timeout=READ_TIMEOUT,
        )
