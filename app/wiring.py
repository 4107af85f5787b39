"""Assemble the service: the pure core (demo, simulator, tests) or the live one (API server attached)."""

from __future__ import annotations

import gc
import logging
import time

from app.cluster.binder import Binder
from app.cluster.cache import ClusterCache
from app.cluster.client import api_client
from app.config import Settings
from app.core.catalog import GpuCatalog
from app.core.gravity import GravityModel
from app.core.snapshot import ClusterSnapshot
from app.gang.coordinator import GangCoordinator
from app.gang.kube import PodGroupWatcher, load_plan_records
from app.gang.persist import BackgroundWriter
from app.metrics import Metrics
from app.quality import DEFAULT_REFRESH_SECONDS, QualityRefresher
from app.service import BinderLike, ExtenderService

log = logging.getLogger(__name__)


def build_core(
    settings: Settings,
    catalog: GpuCatalog,
    metrics: Metrics | None = None,
    binder: BinderLike | None = None,
) -> ExtenderService:
    snapshot = ClusterSnapshot()
    # Data gravity reads the same snapshot the placer does (producers' nodes, finished producers).
    gravity = GravityModel(snapshot, settings)
    service = ExtenderService(
        settings, catalog, snapshot=snapshot, metrics=metrics, binder=binder, gravity=gravity
    )
    gangs = attach_gangs(service)

    def planned(gang: str) -> list[str]:
        # A gang that holds a reservation but has no member bound yet: its output will be where the
        # plan puts its members, so consumers can already be pulled there.
        plan = gangs.ledger.get(gang)
        return [m.node for m in plan.members.values()] if plan is not None else []

    gravity.planned = planned
    return service


def attach_gangs(service: ExtenderService) -> GangCoordinator:
    """Gang planning (filter), reservations and the all-or-nothing bind barrier (app.gang)."""
    writer = BackgroundWriter(service.binder) if service.binder is not None else None
    gangs = GangCoordinator(service.settings, service.snapshot, service.lock, service.metrics, writer)
    service.placer.gangs = gangs
    service.gang_binder = gangs
    return gangs


def build_live(
    settings: Settings, metrics: Metrics | None = None
) -> tuple[ExtenderService, ClusterCache | None]:
    catalog = GpuCatalog.load()
    if settings.cluster_source == "none":
        service = build_core(settings, catalog, metrics)
        service.ready.set()
        start_quality_refresher(service)
        return service, None
    api = api_client(settings.kubeconfig)
    service = build_core(settings, catalog, metrics, Binder(api))
    gangs = service.gang_binder
    if isinstance(gangs, GangCoordinator):
        # Plans persisted on pods are restored before we serve a single filter, so a restarted
        # extender never hands GPUs reserved for a gang to another pod.
        restored = gangs.restore(load_plan_records(api, tuple(settings.labels.gpu_resource)))
        log.info("restored %d gang plan(s) from pod annotations", restored)
        gangs.synced = service.ready.is_set
        PodGroupWatcher(api, service.snapshot, service.lock).start()
    cache = ClusterCache(api, service.snapshot, service.lock, catalog, settings, service.metrics)

    changes = 0

    def mark_ready() -> None:
        nonlocal changes
        changes += 1
        # A cache of 100k pods makes every full GC pass scan them all: a 40 ms pause inside a
        # filter call. Freezing moves the long-lived cache out of the collector's sight.
        if changes % 5000 == 0:
            gc.freeze()
        if changes % 1000 == 0:
            # Finished producers only matter for data gravity within producer_memory_seconds.
            with service.lock:
                service.snapshot.forget_finished_before(time.time() - settings.producer_memory_seconds)
        if cache.synced and not service.ready.is_set():
            gc.freeze()
            service.ready.set()
            snap = service.snapshot
            log.info("cache synced: %d nodes, %d pods", len(snap.nodes), len(snap.pods))

    cache.on_change = mark_ready
    start_quality_refresher(service)
    return service, cache


def start_quality_refresher(
    service: ExtenderService, interval: float = DEFAULT_REFRESH_SECONDS
) -> QualityRefresher:
    """Keep the cluster-quality gauges fresh (a daemon thread; it dies with the process).

    Nothing is published before the cache has synced: a half-listed cluster would report phantom
    free GPUs and no stranded ones.
    """
    refresher = QualityRefresher(
        lambda: service.refresh_quality() if service.ready.is_set() else None, interval
    )
    refresher.start()
    return refresher


