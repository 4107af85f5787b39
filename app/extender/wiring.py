"""Assemble the service: the pure core (demo, simulator, tests) or the live one (API server attached)."""

from __future__ import annotations

import gc
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from kubernetes import client

from app.base.catalog import GpuCatalog
from app.bind.binding import BinderLike, PodBinding
from app.bind.decisions import DecisionMemory
from app.cluster.binder import Binder
from app.cluster.cache import ClusterCache, PodFollower
from app.cluster.client import api_client, raw
from app.cluster.dra import DraWatcher
from app.cluster.serving_metrics import LiveProfilePoller, PrometheusReader, Source
from app.config.settings import Settings
from app.extender.service import ExtenderService
from app.gang.admission import HeldMembers
from app.gang.book import GangBook
from app.gang.coordinator import GangCoordinator, GangRuntime
from app.gang.kube import PodGroupWatcher, load_plan_records
from app.gang.persist import BackgroundWriter
from app.gang.takeover import PlannedPods, Takeover
from app.metrics.metrics import Metrics
from app.metrics.quality import DEFAULT_REFRESH_SECONDS, QualityRefresher
from app.placement.gravity import GravityModel
from app.serving.live_profiles import LiveProfileBook, ServingPod
from app.snapshot.access import SnapshotAccess
from app.snapshot.store import ClusterSnapshot

log = logging.getLogger(__name__)
# Young objects between collections, then young passes per middle one, middle per full (the
# interpreter's defaults: 700, 10, 10).
GC_THRESHOLDS = (20_000, 20, 20)


@dataclass(frozen=True)
class Core:
    """The service and the gang parts the live wiring attaches the cluster to."""

    service: ExtenderService
    gangs: GangCoordinator
    writer: BackgroundWriter | None  # the gangs' plan writer, with an API server to write to


def build_core(
    settings: Settings,
    catalog: GpuCatalog,
    metrics: Metrics | None = None,
    binder: BinderLike | None = None,
    gang_runtime: GangRuntime | None = None,
    live_gangs: bool = False,
) -> ExtenderService:
    """The service without a cluster attached (demo, simulator, tests, benchmarks)."""
    return assemble(settings, catalog, metrics, binder, gang_runtime, live_gangs=live_gangs).service


def assemble(
    settings: Settings,
    catalog: GpuCatalog,
    metrics: Metrics | None = None,
    binder: BinderLike | None = None,
    gang_runtime: GangRuntime | None = None,
    *,
    live_gangs: bool = False,
    planned: PlannedPods | None = None,
) -> Core:
    """Every part built once, in dependency order, with what it needs (nothing attached later).

    ``live_gangs``: gangs gather at filter and plan off the request path, as against a live cluster.
    ``planned`` (the pods the cache sees carrying gang plans): a standby replica adopts the plans its
    dead leader persisted before its first filter.
    """
    policies = settings.policies()
    snapshot = ClusterSnapshot()
    lock = threading.RLock()
    metrics = metrics or Metrics()
    memory = DecisionMemory()
    # The gangs' reservation book exists first: data gravity pulls consumers to where a planned gang
    # producer's members will run before any of them is bound.
    book = GangBook(snapshot, policies.gang.reservation_ttl_seconds)

    def planned_nodes(gang: str) -> list[str]:
        plan = book.ledger.get(gang)
        return [m.node for m in plan.members.values()] if plan is not None else []

    # Data gravity reads the same snapshot the placer does (producers' nodes, finished producers).
    gravity = GravityModel(snapshot, policies.gravity, planned=planned_nodes)
    binding = PodBinding(binder, SnapshotAccess(snapshot, lock), metrics, memory,
                         policies.placement.feasibility, gravity)
    ready = threading.Event()
    if live_gangs:
        # Member deletions are only trusted once the watch has listed everything (after a restart
        # the snapshot starts empty and every restored member would look deleted), and plans are
        # made off the request path (filter runs on the server's event loop); members gather at
        # filter before any binds (docs/gangs.md, "Gather at filter").
        gang_runtime = replace(gang_runtime or GangRuntime(), synced=ready.is_set, background=True,
                               gather=True)
    writer = BackgroundWriter(binder) if binder is not None else None
    # The bind barrier gets the one capability it needs: bind this member to this node.
    gangs = GangCoordinator(policies.gang, snapshot, lock, binding.bind_spec, GangMetricsAdapter(metrics),
                            writer, gang_runtime, book=book, data_sites=gravity.data_nodes)
    # Read at scrape time (docs/metrics.md): the queue is a view over the gangs, not a counter kept
    # on the filter path.
    metrics.gang_queue_length.set_function(lambda: gangs.queue_status()[0])
    metrics.gang_queue_oldest.set_function(lambda: gangs.queue_status()[1])
    metrics.gangs_incomplete.set_function(gangs.incomplete_too_long)
    # Two replicas: the standby's extender learns the leader's plans only from the pods
    # (docs/gangs.md, "Two replicas").
    takeover = None if planned is None else Takeover(
        planned.pods, gangs.restore, tuple(settings.labels.gpu_resource),
        ttl=settings.gang_reservation_ttl_seconds, idle_seconds=settings.gang_takeover_idle_seconds)
    service = ExtenderService(settings, catalog, binding=binding, gangs=gangs, ready=ready,
                              before_filter=takeover)
    return Core(service, gangs, writer)


class GangMetricsAdapter:
    """The service's Prometheus metrics as app.gang's GangMetrics protocol."""

    def __init__(self, metrics: Metrics) -> None:
        self.m = metrics

    def solved(self, status: str, seconds: float) -> None:
        self.m.solver_duration.labels(status).observe(seconds)
        self.m.solver_runs.labels(status).inc()

    def outcome(self, outcome: str) -> None:
        self.m.gangs_bound.labels(outcome).inc()

    def waited(self, seconds: float) -> None:
        self.m.gang_wait.observe(seconds)

    def reservation_expired(self) -> None:
        self.m.reservations_expired.inc()

    def reserved(self, gpus: int) -> None:
        self.m.reservations.set(gpus)

    def plan_rejected(self, reason: str) -> None:
        self.m.rejected_plans.labels(reason).inc()


def build_live(
    settings: Settings, metrics: Metrics | None = None
) -> tuple[ExtenderService, ClusterCache | None]:
    catalog = GpuCatalog.load()
    if settings.cluster_source == "none":
        service = build_core(settings, catalog, metrics)
        service.ready.set()
        start_quality_refresher(service)
        start_live_profiles(service)
        return service, None
    api = api_client(settings.kubeconfig)
    planned = PlannedPods()
    core = assemble(settings, catalog, metrics, Binder(api), live_gangs=True, planned=planned)
    service, gangs = core.service, core.gangs
    # Plans persisted on pods are restored before we serve a single filter, so a restarted
    # extender never hands GPUs reserved for a gang to another pod.
    pods = client.CoreV1Api(api)
    # Plans past the reservation TTL are refused at the listing, and every refusal is counted
    # (docs/gangs.md, "Restored plans").
    records = load_plan_records(lambda: raw(pods.list_pod_for_all_namespaces, _request_timeout=60),
                                tuple(settings.labels.gpu_resource),
                                ttl=settings.gang_reservation_ttl_seconds,
                                rejected=GangMetricsAdapter(service.metrics).plan_rejected)
    restored = gangs.restore(records)
    log.info("restored %d gang plan(s) from pod annotations", restored)
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
            # Each pod allocates a few thousand short-lived objects (its parse, the filter's arrays,
            # the answers); at the default 700 the collector ran several times per pod and its
            # older generations every few pods. Collected in fewer, larger young passes instead:
            # GC time per pod 0.11 -> 0.04 ms in BENCHMARKS.md section 2's in-process replay.
            gc.set_threshold(*GC_THRESHOLDS)
            service.ready.set()
            snap = service.snapshot
            log.info("cache synced: %d nodes, %d pods", len(snap.nodes), len(snap.pods))

    # Warnings about one pod (unreadable, unknown annotation keys) go out through the service's
    # event writer, not a second one of the cache's own.
    followers: tuple[PodFollower, ...] = (planned,)
    if core.writer is not None:
        # Members the chart's admission policy gated enter kube-scheduler's queue together, once
        # the whole gang exists (docs/gangs.md, "Held at admission").
        followers += (HeldMembers(gangs.book, core.writer, incomplete=gangs.requeue.watch_incomplete),)
    cache = ClusterCache(api, service.snapshot, service.lock, catalog, settings, service.metrics,
                         on_change=mark_ready, events=service.binder, followers=followers)
    # Gang sizes from PodGroups (coscheduling, and the native Workload API's): ready only once
    # each kind was listed or found not served (docs/gangs.md).
    PodGroupWatcher(client.CustomObjectsApi(api), raw, service.snapshot, service.lock,
                    synced=cache.sync_gate("podgroups"), notify=mark_ready,
                    resized=gangs.requeue.resized).start()
    # GPUs through Dynamic Resource Allocation, when the cluster serves resource.k8s.io (docs/dra.md).
    DraWatcher(api, cache).start()
    start_quality_refresher(service)
    start_live_profiles(service)
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




def serving_pods(service: ExtenderService) -> Callable[[str], ServingPod | None]:
    """namespace/name -> the running GPU serving pod's workload and GPU, from the snapshot."""

    def find(key: str) -> ServingPod | None:
        with service.lock:
            snap = service.snapshot
            uid = snap.by_key.get(key)
            pod = snap.pods.get(uid) if uid is not None else None
            if pod is None or pod.serving is None:
                return None
            node = snap.nodes.get(pod.node)
            if node is None or node.gpu is None:
                return None
            return ServingPod(pod.serving, pod.precision or pod.serving.precision, node.gpu)

    return find


def start_live_profiles(service: ExtenderService) -> LiveProfilePoller | None:
    """Learn serving profiles from Prometheus when the settings ask for it (docs/stage-policy.md,
    "Learnt profiles"); a daemon thread that never blocks a verb."""
    live = service.settings.live_profiles
    book = service.placer.policy.feasibility.profiles
    targets = service.serving_targets
    if live is None or not isinstance(book, LiveProfileBook) or targets is None:
        return None
    source = Source(live.prometheus_url, live.timeout_seconds, live.window_seconds,
                    live.namespace_label, live.pod_label, live.engines)
    # The same windows judge each serving pod against its own targets (docs/stage-policy.md,
    # "Targets the engines measure missed"); explain reads the verdicts from the service.
    poller = LiveProfilePoller(PrometheusReader(source), book, serving_pods(service),
                               service.placer.policy.feasibility, service.metrics, live.interval_seconds,
                               targets=targets, events=service.binder)
    poller.start()
    log.info("learning serving profiles from %s every %gs", live.prometheus_url, live.interval_seconds)
    return poller
