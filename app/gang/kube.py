"""Kubernetes adapters for gangs: the PodGroup watches (sizes) and the plan restore at start.

The only module of ``app.gang`` that talks to the API server; the rest is pure.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kubernetes import client

from app.base.ratelog import RateLimitedLog
from app.base.units import quote
from app.base.workload import created_at
from app.cluster.reflector import READ_TIMEOUT, WATCH_SECONDS, Reflector
from app.gang.persist import ANNOTATION, PlanRecord, records_from_pods
from app.snapshot.store import ClusterSnapshot

log = logging.getLogger(__name__)

GROUP, VERSION, PLURAL = "scheduling.x-k8s.io", "v1alpha1", "podgroups"
# The native PodGroup of the Workload API (Kubernetes 1.36, feature gate GenericWorkload); pods name
# it in spec.schedulingGroup.podGroupName (docs/gangs.md, native Workload API).
NATIVE_GROUP, NATIVE_VERSION = "scheduling.k8s.io", "v1alpha2"
VOLCANO_GROUP, VOLCANO_VERSION = "scheduling.volcano.sh", "v1beta1"
# Call an API method and return the raw response body (the API adapter's connection-pool-safe
# helper, handed in so this module does not depend on the cluster package).
Raw = Callable[..., bytes]


def min_members(items: list[dict[str, Any]]) -> dict[str, int]:
    """ns/name -> spec.minMember for PodGroup objects (unreadable values are skipped)."""
    out: dict[str, int] = {}
    for pg in items:
        try:
            meta = pg.get("metadata") or {}
            raw = (pg.get("spec") or {}).get("minMember") or 0
            # Whole numbers only: int() of an infinite float ("1e400" in JSON) raises OverflowError.
            value = raw if isinstance(raw, int) and not isinstance(raw, bool) and raw <= 2**31 else 0
            name = meta.get("name")
        except AttributeError:  # metadata or spec of the wrong type: this object only
            continue
        if value > 0 and isinstance(name, str) and name:
            out[f"{meta.get('namespace') or 'default'}/{meta['name']}"] = value
    return out


def native_min_counts(items: list[dict[str, Any]]) -> dict[str, int | None]:
    """ns/name -> spec.schedulingPolicy.gang.minCount of native PodGroups, None for the basic policy.

    kube-scheduler's gang plugin reads the PodGroup, not its Workload's template (the controller
    copies the template's policy into the PodGroup, immutably), so the PodGroup is the only source.
    Objects with neither a readable gang nor a basic policy are skipped.
    """
    out: dict[str, int | None] = {}
    for pg in items:
        try:
            meta = pg.get("metadata") or {}
            policy = (pg.get("spec") or {}).get("schedulingPolicy") or {}
            gang = policy.get("gang")
            name = meta.get("name")
            if not isinstance(name, str) or not name:
                continue
            key = f"{meta.get('namespace') or 'default'}/{name}"
            if isinstance(gang, dict):
                raw = gang.get("minCount")
                if isinstance(raw, int) and not isinstance(raw, bool) and 0 < raw <= 2**31:
                    out[key] = raw
            elif "basic" in policy:
                out[key] = None
        except AttributeError:  # metadata, spec or policy of the wrong type: this object only
            continue
    return out


def _created(obj: Any) -> tuple[str, float]:
    """(ns/name, creationTimestamp in Unix seconds) of a PodGroup; ("", 0) when unreadable."""
    meta = obj.get("metadata") if isinstance(obj, dict) else None
    if not isinstance(meta, dict) or not isinstance(meta.get("name"), str):
        return "", 0.0
    return f"{meta.get('namespace') or 'default'}/{meta['name']}", created_at(meta)


@dataclass(frozen=True)
class WatchedKind:
    """One PodGroup kind the watcher follows and where its sizes go in the snapshot."""

    group: str
    version: str
    label: str  # in log lines
    parse: Callable[[list[dict[str, Any]]], dict[str, Any]]
    target: Callable[[ClusterSnapshot], dict[str, Any]]


COSCHEDULING = WatchedKind(GROUP, VERSION, "podgroups", min_members, lambda s: s.podgroup_min_member)
NATIVE = WatchedKind(NATIVE_GROUP, NATIVE_VERSION, "native podgroups", native_min_counts,
                     lambda s: s.native_min_count)
# Volcano's PodGroup (volcano.sh/apis, pkg/apis/scheduling/v1beta1 types.go): spec.minMember, as
# coscheduling's; pods name it by annotation (workload.VOLCANO_GANG_SOURCE).
VOLCANO = WatchedKind(VOLCANO_GROUP, VOLCANO_VERSION, "volcano podgroups", min_members,
                      lambda s: s.volcano_min_member)


class PodGroupWatcher:
    """Keeps the snapshot's gang sizes in step with PodGroups of each kind whose API is served:
    coscheduling and Volcano ``minMember``, native ``minCount`` (one thread each)."""

    def __init__(self, custom: client.CustomObjectsApi, raw: Raw, snapshot: ClusterSnapshot,
                 lock: threading.RLock, kinds: tuple[WatchedKind, ...] = (COSCHEDULING, NATIVE, VOLCANO),
                 synced: threading.Event | None = None, notify: Callable[[], None] | None = None,
                 resized: Callable[[str], None] | None = None) -> None:
        self.custom = custom
        # Called (lock held) with a gang whose size arrived or changed after its pods: they were
        # told to wait and kube-scheduler hears of no pod change (docs/gangs.md, "Late sizes").
        self._resized = resized
        self.raw = raw
        self.snapshot = snapshot
        self.lock = lock
        self.kinds = kinds
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, args=(k,), name=f"watch-{k.group}-podgroups",
                                          daemon=True) for k in kinds]
        self.present: dict[str, bool] = {k.group: False for k in kinds}
        # Retries come every couple of seconds during an outage: one line a minute.
        self._log = RateLimitedLog(log)
        # Set once every kind was listed or found absent (the extender's readiness waits for it:
        # before the first list a native gang member would be told "waits for PodGroup" and a
        # coscheduling gang read with a wrong size; docs/gangs.md). ``notify`` re-checks readiness.
        self._synced, self._notify = synced, notify
        self._first: set[str] = set()

    def _listed(self, kind: WatchedKind) -> None:
        with self.lock:
            self._first.add(kind.group)
            done = self._first >= {k.group for k in self.kinds}
        if done and self._synced is not None and not self._synced.is_set():
            self._synced.set()
            if self._notify is not None:
                self._notify()

    def start(self) -> None:
        for t in self._threads:
            t.start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self, kind: WatchedKind = COSCHEDULING) -> None:
        told_absent = False

        def replace(items: list[dict[str, Any]]) -> None:
            nonlocal told_absent
            self.present[kind.group], told_absent = True, False
            sizes = kind.parse(items)
            created = {k: t for k, t in map(_created, items) if k}
            with self.lock:
                target = kind.target(self.snapshot)
                changed = [k for k in set(target) | set(sizes) if target.get(k) != sizes.get(k)]
                target.clear()
                target.update(sizes)
                self.snapshot.gang_created.update(created)
                self.snapshot.generation += 1
                if self._resized is not None:
                    for key in sorted(changed):
                        self._resized(key)

        def absent(status: int) -> None:
            # API not served (CRD absent, feature gate off) or no right to read it: the sizes come
            # from the other conventions.
            nonlocal told_absent
            if not told_absent:
                log.info("%s unavailable (%s); gang sizes from the other conventions", kind.label, status)
            self.present[kind.group], told_absent = False, True

        def apply(etype: str, obj: dict[str, Any]) -> None:
            meta = obj.get("metadata") or {}
            key = f"{meta.get('namespace') or 'default'}/{meta.get('name')}"
            with self.lock:
                target = kind.target(self.snapshot)
                if etype == "DELETED":
                    target.pop(key, None)
                    self.snapshot.gang_created.pop(key, None)
                else:
                    got = kind.parse([obj])
                    before = target.get(key)
                    if key in got:
                        target[key] = got[key]
                    if (at := _created(obj)[1]):
                        self.snapshot.gang_created[key] = at
                    if key in got and got[key] != before and self._resized is not None:
                        self._resized(key)
                self.snapshot.generation += 1

        def skipped(obj: dict[str, Any] | None, exc: Exception) -> None:
            log.warning("%s watch: skipped an unreadable event (%s)", kind.label, quote(str(exc)))

        Reflector(kind.label, list_objects=lambda: self._list(kind),
                  open_watch=lambda rv: self._open_watch(kind, rv), replace=replace, apply=apply,
                  stop=self._stop, log=self._log, skipped=skipped, listed=lambda: self._listed(kind),
                  on_absent=absent).run()

    def _list(self, kind: WatchedKind) -> tuple[list[dict[str, Any]], str]:
        # Raw JSON: the client's models would cost milliseconds per object under the GIL.
        data = json.loads(self.raw(self.custom.list_cluster_custom_object, kind.group, kind.version,
                                   PLURAL, _request_timeout=30))
        items = data.get("items") or []
        return (items if isinstance(items, list) else [],
                str((data.get("metadata") or {}).get("resourceVersion") or ""))

    def _open_watch(self, kind: WatchedKind, rv: str) -> Any:
        return self.custom.list_cluster_custom_object(
            kind.group, kind.version, PLURAL, watch=True, resource_version=rv, allow_watch_bookmarks=True,
            timeout_seconds=WATCH_SECONDS, _preload_content=False, _request_timeout=READ_TIMEOUT,
        )


def load_plan_records(
    list_pods: Callable[[], bytes], gpu_resources: tuple[str, ...], attempts: int = 10, delay: float = 2.0,
    ttl: float | None = None, rejected: Callable[[str], None] | None = None,
) -> list[PlanRecord]:
    """Every persisted gang plan of a pending pod (one list of all pods, retried a few times).

    ``list_pods`` returns the raw PodList of every namespace. Raises the last error when the API
    server stays unreachable: serving without the plans could hand reserved GPUs to someone else,
    so the caller decides (the service fails to start). With ``ttl``, plans older than that are
    refused here; ``rejected(reason)`` hears of every refused plan (a reason of REJECT_REASONS).
    """
    last: Exception | None = None
    for i in range(attempts):
        try:
            body = list_pods()
            items = json.loads(body).get("items") or []
        except Exception as exc:
            last = exc
            if i == 0:  # one line, not one per attempt
                log.warning("cannot list pods to restore gang plans (%s); retrying %d times every %.0fs",
                            quote(" ".join(str(exc).split())), attempts - 1, delay)
            if i + 1 < attempts:
                time.sleep(delay)
        else:
            return _restorable(items, gpu_resources, now=time.time(), ttl=ttl, rejected=rejected)
    assert last is not None
    raise last


def _restorable(items: list[Any], gpu_resources: tuple[str, ...], now: float,
                ttl: float | None, rejected: Callable[[str], None] | None = None) -> list[PlanRecord]:
    """The plans worth restoring; every refusal and unreadable pod is summed up in one log line."""
    refused: Counter[str] = Counter()

    def refuse(why: str) -> None:
        refused[why] += 1
        if rejected is not None:
            rejected(why)

    def skipped(pod: Any, exc: BaseException) -> None:
        meta = pod.get("metadata") if isinstance(pod, dict) else None
        ann = meta.get("annotations") if isinstance(meta, dict) else None
        if isinstance(ann, dict) and ann.get(ANNOTATION):
            refuse("unreadable")  # a plan on a pod that cannot be read
        else:
            refused["unreadable pod"] += 1  # most pods carry no plan: not a refused plan
        name = f"{meta.get('namespace')}/{meta.get('name')}" if isinstance(meta, dict) else "?"
        log.warning("gang plan restore: skipped pod %s (%s)", quote(name), quote(str(exc)))

    records = records_from_pods([i for i in items if isinstance(i, dict)], gpu_resources, now=now,
                                ttl=ttl, rejected=refuse, skipped=skipped)
    if refused:
        log.warning("gang plans not restored (docs/gangs.md, restored plans): %s",
                    ", ".join(f"{n} {why}" for why, n in sorted(refused.items())))
    return records
