"""Prometheus metrics, prefix ``llm_placement_``. Labels are bounded: verbs, stages, outcomes, reasons
from a fixed vocabulary, GPU models from the catalog, topology domains — never pod names.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Generic, TypeVar, cast, overload

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from app.base.reasons import PLAN_REJECT_REASONS, ReasonCode
from app.base.workload import ANNOTATION_KEYS, Stage
from app.placement.gravity import MISSING, Distance
from app.placement.ranking import Agreement
from app.serving.targets import METRICS as TARGET_METRICS

LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
SOLVER_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0)
WAIT_BUCKETS = (0.1, 0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600, 1800)
RATIO_BUCKETS = (0.1, 0.25, 0.5, 0.75, 0.9, 1.0, 1.25, 1.5, 2.0, 3.0, 5.0, 10.0)
# The ``key`` label of invalid annotations: the annotation keys (docs/annotations.md), problems with
# the pod's resources or object shape, and "other" (never expected; counted so it shows up).
INVALID_KEYS = (*ANNOTATION_KEYS, "resources", "pod", "other")


M = TypeVar("M", Counter, Gauge, Histogram)


@dataclass(frozen=True, slots=True)
class _Declared(Generic[M]):
    """One metric of ``Metrics``: declared once in the class body, built on each instance's registry
    (an instance attribute of the same name then stands in front of this declaration)."""

    kind: type[M]
    name: str
    documentation: str
    labels: tuple[str, ...] = ()
    buckets: tuple[float, ...] | None = None

    def build(self, registry: CollectorRegistry) -> M:
        extra: dict[str, Any] = {} if self.buckets is None else {"buckets": self.buckets}
        return self.kind(self.name, self.documentation, self.labels, registry=registry, **extra)

    @overload
    def __get__(self, obj: None, owner: type) -> _Declared[M]: ...

    @overload
    def __get__(self, obj: object, owner: type) -> M: ...

    def __get__(self, obj: object | None, owner: type) -> _Declared[M] | M:
        if obj is None:
            return self
        raise AttributeError(f"{self.name} is built by Metrics.__init__")


class Metrics:
    """All metric objects on one registry (tests create their own to stay isolated).

    Each metric is declared once below, in the order it is registered (and exported).
    """

    request_duration = _Declared(
        Histogram, "llm_placement_request_duration_seconds",
        "Extender request latency by verb, as seen inside the extender.", ("verb",), LATENCY_BUCKETS,
    )
    request_errors = _Declared(
        Counter, "llm_placement_request_errors_total",
        "Extender requests answered with an Error (malformed input, internal failure).", ("verb", "kind"),
    )
    bind_refusals = _Declared(
        Counter, "llm_placement_bind_refusals_total",
        "Binds the extender refused, by reason: the pod or node unknown, another scheduler's pod, "
        "not filtered for that node, GPUs, or a node rule kube-scheduler's filters would have "
        "applied (cordoned, taint, node_selector, node_affinity, cpu, memory).", ("reason",),
    )
    decisions = _Declared(
        Counter, "llm_placement_decisions_total",
        "Placement decisions by stage and outcome (bound, unschedulable, invalid, bind_failed).",
        ("stage", "outcome"),
    )
    agreement = _Declared(
        Counter, "llm_placement_scheduler_agreement_total",
        "Binds by how kube-scheduler's chosen node ranked in our prioritize scores: top (our unique "
        "best or only candidate), tied_top (one of our equal best), lower (in-tree points outweighed "
        "ours), unranked (no ranking remembered).",
        ("outcome",),
    )
    rejections = _Declared(
        Counter, "llm_placement_node_rejections_total", "Nodes rejected in filter, by rule.", ("rule",)
    )
    invalid_annotations = _Declared(
        Counter, "llm_placement_invalid_annotations_total",
        "Pods whose llm-placement annotations could not be understood, by annotation key.", ("key",),
    )
    unknown_gpu_nodes = _Declared(
        Gauge, "llm_placement_unknown_gpu_nodes",
        "Nodes with GPUs whose product is missing from the catalog (handled conservatively).",
    )
    unknown_gpu_product_nodes = _Declared(
        Gauge, "llm_placement_unknown_gpu_product_nodes",
        "Nodes with GPUs whose product is missing from the catalog, by product label value.", ("product",),
    )
    cache_nodes = _Declared(Gauge, "llm_placement_cache_nodes", "Nodes in the extender cache.")
    cache_pods = _Declared(Gauge, "llm_placement_cache_pods", "Pods holding resources in the extender cache.")

    # --- watches and gangs ------------------------------------------------------------------------
    watch_restarts = _Declared(
        Counter, "llm_placement_watch_restarts_total", "Watch streams restarted, by resource and cause.",
        ("resource", "cause"),
    )
    solver_duration = _Declared(
        Histogram, "llm_placement_solver_duration_seconds", "CP-SAT gang plan time.", ("status",),
        SOLVER_BUCKETS,
    )
    solver_runs = _Declared(
        Counter, "llm_placement_solver_runs_total", "Gang plans by solver status.", ("status",)
    )
    gang_wait = _Declared(
        Histogram, "llm_placement_gang_wait_seconds",
        "Time from a gang's first filter call to all members bound.", buckets=WAIT_BUCKETS,
    )
    gangs_bound = _Declared(
        Counter, "llm_placement_gangs_total", "Gangs by outcome (bound, failed, replanned).", ("outcome",)
    )
    reservations = _Declared(
        Gauge, "llm_placement_reserved_gpus", "GPUs held by gang reservations not yet bound."
    )
    reservations_expired = _Declared(
        Counter, "llm_placement_reservations_expired_total", "Gang reservations dropped at TTL."
    )
    gang_queue_length = _Declared(
        Gauge, "llm_placement_gang_queue_length", "Complete gangs waiting in the gang queue (no plan yet)."
    )
    gangs_incomplete = _Declared(
        Gauge, "llm_placement_gangs_incomplete_too_long",
        "Gangs still missing members gang_incomplete_warn_seconds after their first member's creation.",
    )
    gang_queue_oldest = _Declared(
        Gauge, "llm_placement_gang_queue_oldest_seconds",
        "Age (since its first member's or PodGroup's creation) of the oldest gang in the gang queue.",
    )

    # --- placement quality, observed at bind --------------------------------------------------------
    bandwidth_fit = _Declared(
        Histogram, "llm_placement_bandwidth_fit_ratio",
        "Node memory bandwidth / bandwidth the SLO needs, for serving pods with an SLO.",
        ("stage",), RATIO_BUCKETS,
    )
    memory_fit = _Declared(
        Histogram, "llm_placement_memory_fit_ratio",
        "Memory needed / GPU memory offered (right-sizing; 1.0 is a perfect fit).", ("stage",), RATIO_BUCKETS,
    )
    slo_ratio = _Declared(
        Histogram, "llm_placement_predicted_latency_slo_ratio",
        "Predicted ms/token / max-ms-per-token (below 1 meets the SLO).", ("stage",), RATIO_BUCKETS,
    )
    estimate_ratio = _Declared(
        Histogram, "llm_placement_serving_estimate_ratio",
        "Serving model estimate / what the engines measured, per learnt profile and poll "
        "(docs/stage-policy.md, \"Learnt profiles\"); 1 is exact, above 1 pessimistic.",
        ("group", "metric"), RATIO_BUCKETS,
    )
    live_profile_polls = _Declared(
        Counter, "llm_placement_live_profile_polls",
        "Polls of Prometheus for the serving engines' latency metrics, by result (ok, error).", ("result",),
    )
    live_profiles = _Declared(Gauge, "llm_placement_live_profiles", "Learnt serving profiles in effect.")
    # Labelled by metric only (tpot, ttft): which pods is in their events and explain, never a label.
    serving_targets_missed = _Declared(
        Gauge, "llm_placement_serving_targets_missed",
        "Serving pods whose engines measure them missing their own latency target now, by metric "
        "(docs/stage-policy.md, \"Targets the engines measure missed\").", ("metric",),
    )
    serving_target_misses = _Declared(
        Counter, "llm_placement_serving_target_misses",
        "Times a serving pod started missing its own latency target (one per pod and condition "
        "change), by metric.", ("metric",),
    )
    hourly_cost = _Declared(
        Counter, "llm_placement_bound_hourly_cost_dollars_total",
        "Sum of the $/hour of every pod bound, by stage and GPU model.", ("stage", "gpu"),
    )
    bound_gpus = _Declared(
        Counter, "llm_placement_bound_gpus_total", "GPUs bound, by stage and GPU model.", ("stage", "gpu")
    )
    dependency_edges = _Declared(
        Counter, "llm_placement_dependency_edges_total",
        "Data-gravity edges at bind, by stage and the distance to the producer.", ("stage", "distance"),
    )
    cross_node_gb = _Declared(
        Counter, "llm_placement_cross_node_data_gigabytes_total",
        "Estimated GB a consumer reads from a producer on another node.", ("stage",),
    )
    free_gpus = _Declared(
        Gauge, "llm_placement_free_gpus", "Free GPUs per NVLink domain and GPU model.", ("domain", "gpu")
    )

    # --- cluster quality (app.metrics.quality defines each; refreshed periodically from the snapshot) -------
    stranded_gpus = _Declared(
        Gauge, "llm_placement_stranded_gpus",
        "Free GPUs on partly used nodes with fewer free GPUs than any pending GPU pod requests.", ("gpu",),
    )
    gpu_fragmentation = _Declared(
        Gauge, "llm_placement_gpu_fragmentation_ratio",
        "Free GPUs on partly used nodes / all free GPUs, per GPU model (0: all in empty nodes).", ("gpu",),
    )
    allocatable_gpus = _Declared(
        Gauge, "llm_placement_allocatable_gpus", "GPUs on schedulable nodes, per GPU model.", ("gpu",)
    )
    pending_gpus = _Declared(
        Gauge, "llm_placement_pending_gpus", "GPUs requested by known pods not bound yet."
    )
    running_hourly_cost = _Declared(
        Gauge, "llm_placement_running_hourly_cost_dollars",
        "Estimated $/hour of the pods running now (their share of each node's price), by stage.", ("stage",),
    )
    skipped_objects = _Declared(
        Counter, "llm_placement_skipped_objects_total",
        "Watched or restored objects that could not be applied and were skipped (one bad object "
        "costs only itself), by kind.",
        ("kind",),
    )
    rejected_plans = _Declared(
        Counter, "llm_placement_rejected_gang_plans_total",
        "Persisted gang-plan annotations not restored, by reason (unreadable, gang_mismatch, "
        "unsigned, bad_signature, future, expired, unknown_node).",
        ("reason",),
    )
    unknown_annotation_keys = _Declared(
        Counter, "llm_placement_unknown_annotation_keys_total",
        "Pods of ours carrying keys under llm-placement.io/ that the extender does not read "
        "(a warning event names the nearest known key).",
    )

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        for attr, declared in vars(type(self)).items():
            if isinstance(declared, _Declared):
                setattr(self, attr, declared.build(self.registry))
        self._initialise_closed_label_sets()
        self._children: dict[tuple[int, tuple[str, ...]], Any] = {}

    def child(self, metric: M, *values: str) -> M:
        """``metric.labels(*values)``, remembered: the verbs count every pod, and ``labels()`` takes a
        lock and builds its key each time. Only for series that are never removed (the verbs'
        counters and histograms; the quality gauges remove theirs). Bounded as the labels are."""
        key = (id(metric), values)
        got = self._children.get(key)
        if got is None:
            got = self._children[key] = metric.labels(*values)
        return cast(M, got)

    def invalid_annotation(self, key: str) -> None:
        """Count one annotation problem; a key outside the closed set is counted as "other"."""
        self.invalid_annotations.labels(key if key in INVALID_KEYS else "other").inc()

    def _initialise_closed_label_sets(self) -> None:
        """Export 0 for label values known in advance (stages, outcomes, edge distances, rules).

        A labelled series is born at its first increment, and rate()/increase() never see that first
        step (there is no earlier sample): the first bind of a stage, the first data-gravity edge, would
        be missing from every panel and alert. Pre-created series start at 0, so they count.
        """
        stages = [*(s.value for s in Stage), "none"]
        for stage in stages:
            for outcome in ("bound", "unschedulable", "invalid", "bind_failed"):
                self.decisions.labels(stage, outcome)
            self.cross_node_gb.labels(stage)
            for distance in [*(d.label for d in Distance), MISSING]:
                self.dependency_edges.labels(stage, distance)
        for outcome in Agreement:
            self.agreement.labels(outcome.value)
        for code in ReasonCode:
            self.rejections.labels(code.value)
        for key in INVALID_KEYS:
            self.invalid_annotations.labels(key)
        for reason in PLAN_REJECT_REASONS:
            self.rejected_plans.labels(reason)
        # Only serving pods get a latency prediction; only sized GPU stages a memory fit.
        self.bandwidth_fit.labels(Stage.SERVING.value)
        self.slo_ratio.labels(Stage.SERVING.value)
        for stage in (Stage.SERVING, Stage.PRETRAINING, Stage.ALIGNMENT):
            self.memory_fit.labels(stage.value)
        for metric in TARGET_METRICS:
            self.serving_target_misses.labels(metric)
            self.serving_targets_missed.labels(metric).set(0)
