"""List+watch of Nodes and Pods into the ClusterSnapshot, so names-only requests are served from memory.

Raw JSON streams (``_preload_content=False``) instead of the client's model objects: the placement
core reads plain dicts, and deserialising 100,000 pods into generated classes costs seconds and
hundreds of MB. Each watch keeps its resourceVersion, re-lists on 410 Gone, and reconnects with a
short exponential backoff (app/cluster/backoff.py); node facts are computed here, once per event,
never per request.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from kubernetes import client

from app.base.catalog import GpuCatalog
from app.base.ratelog import RateLimitedLog
from app.base.units import quote
from app.base.workload import (
    PREFIX,
    Precision,
    WorkloadError,
    parse_workload,
    pod_resources,
    unknown_keys,
)
from app.cluster.client import list_all
from app.cluster.reflector import READ_TIMEOUT, WATCH_SECONDS, Reflector
from app.config.policy import Policies
from app.metrics.metrics import Metrics
from app.placement.gravity import SHARE_ANNOTATION
from app.snapshot.nodes import facts_for, node_inputs
from app.snapshot.store import TERMINAL_PHASES, ClusterSnapshot, PlacedPod, serving_spec

log = logging.getLogger(__name__)
KINDS = ("nodes", "pods", "namespaces")
WARNED_MEMORY = 50_000  # pods already warned about (bounded: a uid is never warned twice in a row)


class EventSink(Protocol):
    def event(self, namespace: str, name: str, uid: str, reason: str, message: str,
              warning: bool = False) -> None: ...


def namespace_shares(ns: dict[str, Any]) -> frozenset[str]:
    """Namespaces this one shares its pods' data with (docs/data-gravity.md); empty when not set."""
    meta = ns.get("metadata")
    ann = meta.get("annotations") if isinstance(meta, dict) else None
    raw = ann.get(SHARE_ANNOTATION) if isinstance(ann, dict) else None
    if not isinstance(raw, str):
        return frozenset()
    return frozenset(p.strip() for p in raw.split(",")[:256] if p.strip())


def _slim(kind: str, obj: dict[str, Any]) -> dict[str, Any]:
    """Drop what placement never reads (managedFields, images, pod status details) before keeping it."""
    meta = obj.get("metadata") or {}
    meta.pop("managedFields", None)
    status = obj.get("status") or {}
    if kind == "nodes":
        status.pop("images", None)
    else:
        slim: dict[str, Any] = {"phase": status.get("phase")}
        # The only place a pod names the claims generated from its templates: without it a bound
        # pod's GPUs would be read from the template, not from what was allocated (docs/dra.md).
        if status.get("resourceClaimStatuses"):
            slim["resourceClaimStatuses"] = status["resourceClaimStatuses"]
        # The claim kube-scheduler made for extended resources a DeviceClass backs: once allocated,
        # its devices count on the node, not the pod's extended resources (docs/dra.md).
        if status.get("extendedResourceClaimStatus"):
            slim["extendedResourceClaimStatus"] = status["extendedResourceClaimStatus"]
        obj["status"] = slim
    return obj


def _name_of(obj: dict[str, Any]) -> str:
    meta = obj.get("metadata")
    return str(meta.get("name") or "") if isinstance(meta, dict) else ""


class CacheSettings(Protocol):
    """What the cache reads of the settings (app/config/settings.py's Settings is one): which scheduler's
    pods are ours, and the policies. The settings file sits above the adapters (README, "Layout")."""

    @property
    def scheduler_name(self) -> str: ...

    def policies(self) -> Policies: ...


def _uid_of(obj: dict[str, Any]) -> str:
    meta = obj.get("metadata")
    return str(meta.get("uid") or "") if isinstance(meta, dict) else ""


def apply_node(
    snapshot: ClusterSnapshot, catalog: GpuCatalog, settings: CacheSettings, node: dict[str, Any]
) -> None:
    policy = settings.policies().node_facts
    # GPUs published in ResourceSlices read like GFD labels (docs/dra.md); a no-op without DRA.
    # MIG slices (and how many are free) come from the slices and the allocated claims.
    name = _name_of(node)
    dra = snapshot.dra
    snapshot.upsert_node(facts_for(dra.overlay(node, policy.labels), catalog, policy,
                                   mig=dra.mig_of(name), mig_gpus=dra.mig_parents(name)))
    snapshot.node_inputs[name] = node_inputs(node)
    # GPUs allocated claims hold there, pods or not (docs/dra.md).
    snapshot.refresh_dra((name,))


def apply_pod(
    snapshot: ClusterSnapshot, settings: CacheSettings, pod: dict[str, Any], deleted: bool = False
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
    gpu_res = settings.policies().placement.gpu_resources
    try:
        spec = parse_workload(pod, gpu_res, snapshot.claim_reader())
    except WorkloadError:
        spec = None
    # Specs are kept for pods still to be placed, for gang members (membership counts) and for
    # serving-group members (their partners look up each other's role); any other bound pod only
    # needs its usage record, which keeps 100k cached pods within the memory budget.
    if spec is not None and (not node or spec.gang is not None or spec.serving_group is not None):
        snapshot.track_spec(spec, str(meta.get("resourceVersion") or ""))
    elif spec is not None:
        snapshot.untrack_spec(uid)
    if not node:
        return
    if spec is not None:
        placed = PlacedPod(uid=uid, key=key, node=node, gpus=spec.charged_gpus, cpu_millis=spec.cpu_millis,
                           memory_bytes=spec.memory_bytes, stage=spec.stage,
                           latency_class=spec.effective_latency_class,
                           gang=spec.gang.key if spec.gang else None, priority=spec.priority,
                           serving=serving_spec(spec), precision=_assigned_precision(meta),
                           claims=spec.claim_gpus)
    else:
        # Bad annotations must never hide real GPU usage: count resources regardless.
        try:
            gpus, cpu, mem = pod_resources(pod, gpu_res, snapshot.claim_reader())
        except ValueError:
            gpus, cpu, mem = 0, 0.0, 0.0
        claims, shares = _claims(pod, snapshot)
        placed = PlacedPod(uid=uid, key=key, node=node, gpus=max(0, gpus - shares), cpu_millis=cpu,
                           memory_bytes=mem, stage=None, latency_class=None, gang=None, claims=claims)
    snapshot.place(placed)


def _assigned_precision(meta: dict[str, Any]) -> Precision | None:
    raw = (meta.get("annotations") or {}).get(PREFIX + "assigned-precision")
    try:
        return Precision(raw) if isinstance(raw, str) else None
    except ValueError:
        return None


def _claims(pod: dict[str, Any], snapshot: ClusterSnapshot) -> tuple[tuple[tuple[str, int], ...], int]:
    """The pod's DRA claims (ns/name, whole GPUs) and its device shares, for a pod whose
    annotations do not parse (as WorkloadSpec.claim_gpus and shared_gpus)."""
    reader = snapshot.claim_reader()
    if reader is None:
        return (), 0
    try:
        got = reader.pod_devices(pod, ())
        return got.claim_gpus, got.shared_gpus
    except Exception:  # the usage must be counted however odd the pod is
        return (), 0


class PodFollower(Protocol):
    """Something else that follows every pod the watch sees, after the snapshot took it in and
    with the cache lock held: a fresh list, then one event at a time."""

    def replace(self, pods: list[Any]) -> None: ...

    def update(self, pod: Any, deleted: bool = False) -> None: ...


@dataclass(eq=False, repr=False)  # the snapshot is too large to show
class ClusterCache:
    """Background threads that keep ``snapshot`` in step with the API server."""

    api: client.ApiClient
    snapshot: ClusterSnapshot
    lock: threading.RLock
    catalog: GpuCatalog
    settings: CacheSettings
    metrics: Metrics
    on_change: Callable[[], None] | None = None
    # Warnings about one pod (unreadable, unknown annotation keys): the service's binder, or a
    # writer of our own made on first use.
    events: EventSink | None = None
    # Others that follow every pod: a standby replica's planned pods (app/gang/takeover.py),
    # gang members held at admission (app/gang/admission.py).
    followers: tuple[PodFollower, ...] = ()
    core: client.CoreV1Api = field(init=False)
    _stop: threading.Event = field(default_factory=threading.Event, init=False)
    # Namespaces only gate cross-namespace data gravity; placement never waits for them.
    _synced: dict[str, threading.Event] = field(
        default_factory=lambda: {"nodes": threading.Event(), "pods": threading.Event()}, init=False)
    _threads: list[threading.Thread] = field(default_factory=list, init=False)
    _log: RateLimitedLog = field(default_factory=lambda: RateLimitedLog(log), init=False)
    _warned: OrderedDict[str, None] = field(default_factory=OrderedDict, init=False)

    def __post_init__(self) -> None:
        self.core = client.CoreV1Api(self.api)

    @property
    def synced(self) -> bool:
        return all(e.is_set() for e in self._synced.values())

    def sync_gate(self, name: str) -> threading.Event:
        """One more thing ``synced`` waits for (another watcher's first list); set it when done."""
        return self._synced.setdefault(name, threading.Event())

    def start(self) -> None:
        for kind in KINDS:
            t = threading.Thread(target=self._run, args=(kind,), name=f"watch-{kind}", daemon=True)
            t.start()
            self._threads.append(t)

    def stop(self) -> None:
        self._stop.set()

    # --- internals -----------------------------------------------------------------------------
    def _list(self, kind: str) -> tuple[list[dict[str, Any]], str]:
        return list_all(self._lister(kind))

    def _lister(self, kind: str) -> Any:
        if kind == "nodes":
            return self.core.list_node
        if kind == "namespaces":
            return self.core.list_namespace
        return self.core.list_pod_for_all_namespaces

    def _replace(self, kind: str, items: list[dict[str, Any]]) -> None:
        with self.lock:
            if kind == "namespaces":
                shares = {}
                for ns in items:
                    meta = ns.get("metadata")
                    if isinstance(meta, dict) and isinstance(meta.get("name"), str) \
                            and (got := namespace_shares(ns)):
                        shares[meta["name"]] = got
                self.snapshot.namespace_shares = shares
                self.snapshot.generation += 1
                return
            if kind == "nodes":
                seen = set()
                for n in items:
                    # A node that cannot be read is skipped but still counts as seen: an odd label
                    # must not make the cache forget a node that exists.
                    seen.add(_name_of(n))
                    self._guarded(kind, n, self._apply_node, n)
                for name in [n for n in self.snapshot.nodes if n not in seen]:
                    self.snapshot.remove_node(name)
            else:
                live = set()
                for p in items:
                    live.add(_uid_of(p))
                    self._guarded(kind, p, self._apply_pod, _slim(kind, p))
                for f in self.followers:
                    f.replace(items)
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
            if kind == "namespaces":
                name = _name_of(obj)
                got = namespace_shares(obj) if etype != "DELETED" else frozenset()
                if got:
                    self.snapshot.namespace_shares[name] = got
                else:
                    self.snapshot.namespace_shares.pop(name, None)
                self.snapshot.generation += 1
            elif kind == "nodes":
                if etype == "DELETED":
                    self.snapshot.remove_node(_name_of(obj))
                else:
                    apply_node(self.snapshot, self.catalog, self.settings, obj)
                self._update_gauges()
            else:
                deleted = etype == "DELETED"
                if deleted:
                    # A deletion needs only the uid: it must free the pod's GPUs however odd the
                    # rest of the object is.
                    apply_pod(self.snapshot, self.settings, {"metadata": {"uid": _uid_of(obj)}},
                              deleted=True)
                else:
                    self._apply_pod(obj)
                for f in self.followers:
                    f.update(obj, deleted=deleted)
                # Pod events cannot change the node gauges; keep the per-event work O(1).
                self.metrics.cache_pods.set(len(self.snapshot.pods))

    def _apply_pod(self, pod: dict[str, Any]) -> None:
        # On an error the pod's previous state stays as it was (a running pod keeps its usage).
        apply_pod(self.snapshot, self.settings, pod)
        self._warn_unknown_keys(pod)

    def _apply_node(self, node: dict[str, Any]) -> None:
        apply_node(self.snapshot, self.catalog, self.settings, _slim("nodes", node))

    def _guarded(self, kind: str, obj: Any, fn: Callable[..., None], *args: Any) -> bool:
        """Apply one object; on any error skip it, count it and report it (docs/metrics.md)."""
        try:
            fn(*args)
            return True
        except Exception as exc:
            self.skipped(kind, obj, exc)
            return False

    def skipped(self, kind: str, obj: Any, exc: BaseException) -> None:
        """One object that could not be applied: counted, logged (rate-limited), and for a pod of
        ours an event on it, so its owner learns why it waits."""
        self.metrics.skipped_objects.labels(kind).inc()
        meta = obj.get("metadata") if isinstance(obj, dict) else None
        meta = meta if isinstance(meta, dict) else {}
        ns, name, uid = (str(meta.get(k) or "") for k in ("namespace", "name", "uid"))
        what = f"{kind} {quote(ns + '/' + name if ns else name)}"
        self._log.warning(f"skip:{kind}:{uid or name}",
                          f"skipped {what}: {type(exc).__name__}: {quote(str(exc))}")
        spec = obj.get("spec") if isinstance(obj, dict) else None
        if kind == "pods" and isinstance(spec, dict) and self._ours(spec) and name and ns:
            self._warn_once(uid or f"{ns}/{name}", ns, name, uid, "Unreadable",
                            f"llm-placement: pod skipped by the extender's cache: {quote(str(exc))}")

    def _ours(self, spec: dict[str, Any]) -> bool:
        return spec.get("schedulerName") == self.settings.scheduler_name

    def _warn_unknown_keys(self, pod: dict[str, Any]) -> None:
        meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
        if spec.get("nodeName") or not self._ours(spec):
            return
        unknown = unknown_keys(meta.get("annotations"))
        if not unknown:
            return
        uid = str(meta.get("uid") or "")
        if uid in self._warned:
            return
        self.metrics.unknown_annotation_keys.inc()
        parts = [f"{PREFIX}{k}" + (f" (did you mean {PREFIX}{near}?)" if near else "")
                 for k, near in unknown]
        self._warn_once(uid, str(meta.get("namespace") or "default"), str(meta.get("name") or ""), uid,
                        "UnknownAnnotation",
                        "llm-placement: ignored unknown annotation key(s): " + "; ".join(parts))

    def _warn_once(self, key: str, ns: str, name: str, uid: str, reason: str, message: str) -> None:
        if key in self._warned:
            return
        self._warned[key] = None
        while len(self._warned) > WARNED_MEMORY:
            self._warned.popitem(last=False)
        sink = self.events
        if sink is None:
            from app.cluster.binder import Binder

            sink = self.events = Binder(self.api)
        sink.event(ns, name, uid, reason, message, warning=True)

    def _update_gauges(self) -> None:
        self.metrics.cache_nodes.set(len(self.snapshot.nodes))
        self.metrics.cache_pods.set(len(self.snapshot.pods))
        self.metrics.unknown_gpu_nodes.set(
            sum(1 for n in self.snapshot.nodes.values() if n.has_gpus and not n.gpu_known)
        )

    def _run(self, kind: str) -> None:
        def listed() -> None:
            if kind in self._synced:
                self._synced[kind].set()
            if self.on_change:
                self.on_change()

        def apply(etype: str, obj: dict[str, Any]) -> None:
            self._guarded(kind, obj, self._apply, kind, etype, _slim(kind, obj))
            if self.on_change:
                self.on_change()

        Reflector(kind, list_objects=lambda: self._list(kind),
                  open_watch=lambda rv: self._open_watch(kind, rv),
                  replace=lambda items: self._replace(kind, items), apply=apply, stop=self._stop,
                  log=self._log, skipped=lambda obj, exc: self.skipped(kind, obj, exc), listed=listed,
                  restarted=lambda cause: self.metrics.watch_restarts.labels(kind, cause).inc()).run()

    def _open_watch(self, kind: str, rv: str) -> Any:
        return self._lister(kind)(watch=True, resource_version=rv, allow_watch_bookmarks=True,
                                  timeout_seconds=WATCH_SECONDS, _preload_content=False,
                                  _request_timeout=READ_TIMEOUT)
