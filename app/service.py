"""The extender service: wire bytes in, placement core, wire bytes out, plus bind, events and metrics.

No FastAPI here (routes are a thin layer over this class), so the same object serves HTTP, the
benchmarks and the tests. One RLock guards the snapshot: watch threads write, request handlers read.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Protocol

from app.api import wire
from app.config import Settings
from app.core.catalog import GpuCatalog
from app.core.feasibility import NodeFit, Rejection, evaluate
from app.core.gravity import MISSING, GravityModel
from app.core.nodes import NodeFacts, facts_for
from app.core.placer import FilterDecision, GangHook, GravityHook, Placer
from app.core.ranking import Agreement, agreement, best_nodes
from app.core.reasons import MESSAGE_PREFIX, problem_key
from app.core.scoring import NodeScore
from app.core.snapshot import ClusterSnapshot, NodeUsage
from app.core.units import quote
from app.core.workload import PREFIX, TRAINING_STAGES, WorkloadError, WorkloadSpec
from app.metrics import Metrics
from app.quality import ClusterQuality, QualityPublisher, capture, compute
from app.ratelog import RateLimitedLog

log = logging.getLogger(__name__)
_RATE_LOG = RateLimitedLog(log)
DECISION_MEMORY = 20_000
AGREEMENT_TEXT = {
    Agreement.TOP: "kube-scheduler followed our ranking (our best node)",
    Agreement.TIED_TOP: "kube-scheduler followed our ranking (one of our equal best nodes)",
    Agreement.LOWER: "kube-scheduler chose a node we ranked lower (its in-tree scores outweighed ours)",
    Agreement.UNRANKED: "no ranking of ours was remembered for this bind",
}
FILTER_REUSE_SECONDS = 2.0


class BinderLike(Protocol):
    def bind(self, namespace: str, name: str, uid: str, node: str) -> bool: ...

    def annotate(self, namespace: str, name: str, annotations: dict[str, str]) -> None: ...

    def event(self, namespace: str, name: str, uid: str, reason: str, message: str,
              warning: bool = False) -> None: ...

    def read_pod(self, namespace: str, name: str) -> dict[str, Any] | None: ...


class GangBindHook(Protocol):
    """The gang binder (app.gang): binds a member all-or-nothing with the bind it was built with."""

    async def bind_member(self, spec: WorkloadSpec, node: str) -> str: ...

    def close(self) -> None:
        """Stop its threads (at shutdown)."""
        ...


@dataclass(slots=True)
class Remembered:
    spec: WorkloadSpec
    fit: NodeFit | None
    at: float
    fits: dict[str, NodeFit] | None = None  # this cycle's filter verdicts, reused by prioritize
    agreement: Agreement | None = None  # set at bind: how kube-scheduler's node ranked in ``scores``
    # prioritize's answer as computed; the by-node map is built only when a bind or explain asks
    # (a dict of 5,000 entries per scheduling cycle was measurable on the hot path).
    score_list: list[NodeScore] = field(default_factory=list)
    _by_node: dict[str, NodeScore] | None = None

    def set_scores(self, scores: list[NodeScore]) -> None:
        self.score_list, self._by_node = scores, None

    @property
    def scores(self) -> dict[str, NodeScore]:
        if self._by_node is None:
            self._by_node = {s.node: s for s in self.score_list}
        return self._by_node

    def agreement_with(self, node: str) -> Agreement:
        """How ``node`` ranks in this cycle's scores (kube-scheduler skips prioritize for one node)."""
        if not self.score_list and self.fits is not None and list(self.fits) == [node]:
            return Agreement.TOP
        return agreement(node, {s.node: s.total for s in self.score_list})


class ExtenderService:
    def __init__(
        self,
        settings: Settings,
        catalog: GpuCatalog,
        snapshot: ClusterSnapshot | None = None,
        metrics: Metrics | None = None,
        binder: BinderLike | None = None,
        gangs: GangHook | None = None,
        gravity: GravityHook | None = None,
    ) -> None:
        self.settings = settings
        # Each pure component gets its own slice of the settings, built once (app.core.policy).
        self.policies = settings.policies()
        self.catalog = catalog
        self.snapshot = snapshot or ClusterSnapshot()
        self.metrics = metrics or Metrics()
        self.binder = binder
        self.lock = threading.RLock()
        self.placer = Placer(self.policies.placement, self.snapshot, gangs, gravity)
        self.gang_binder: GangBindHook | None = None
        self._memory: OrderedDict[str, Remembered] = OrderedDict()
        self._node_rv: dict[str, str] = {}
        self.ready = threading.Event()
        self._quality = QualityPublisher(self.metrics)

    # --- request verbs -------------------------------------------------------------------------
    def filter(self, body: bytes) -> bytes:
        t0 = time.perf_counter()
        try:
            args = wire.parse_extender_args(body, "filter")
        except wire.WireError as exc:
            self.metrics.request_errors.labels("filter", "malformed").inc()
            return wire.filter_result(None, [], {}, {}, MESSAGE_PREFIX + str(exc))
        try:
            with self.lock:
                self._absorb_nodes(args)
                decision = self.placer.filter(args.pod, args.names())
                self._remember(decision)
            self._count_filter(decision)
            return wire.filter_result(args, decision.passed, decision.failed, decision.unresolvable)
        except Exception as exc:  # never a 500: the message must reach the pod's events
            log.exception("filter failed")
            self.metrics.request_errors.labels("filter", "internal").inc()
            return wire.filter_result(args, [], {}, {}, MESSAGE_PREFIX + f"internal error in filter: {exc}")
        finally:
            self.metrics.request_duration.labels("filter").observe(time.perf_counter() - t0)

    def prioritize(self, body: bytes) -> bytes:
        t0 = time.perf_counter()
        try:
            args = wire.parse_extender_args(body, "prioritize")
            with self.lock:
                self._absorb_nodes(args)
                uid = str((args.pod.get("metadata") or {}).get("uid") or "")
                prior = self._memory.get(uid) if uid else None
                # Reuse this cycle's filter verdicts: prioritize follows filter within milliseconds,
                # and on a busy cluster every bind bumps the snapshot generation in between, so
                # an exact-generation check would recompute every node. Scores still read live usage.
                fresh = prior is not None and time.time() - prior.at < FILTER_REUSE_SECONDS
                known = prior.fits if prior is not None and fresh else None
                scores = self.placer.prioritize(args.pod, args.names(), known)
                self._remember_scores(args.pod, scores)
            return wire.priority_list(scores)
        except Exception as exc:
            # kube-scheduler ignores prioritize errors silently, so count them for alerting.
            kind = "malformed" if isinstance(exc, wire.WireError) else "internal"
            if kind == "internal":
                log.exception("prioritize failed")
            self.metrics.request_errors.labels("prioritize", kind).inc()
            return wire.priority_list([])
        finally:
            self.metrics.request_duration.labels("prioritize").observe(time.perf_counter() - t0)

    async def bind(self, body: bytes) -> bytes:
        t0 = time.perf_counter()
        early, uid = False, ""
        try:
            try:
                args = wire.parse_binding_args(body)
            except wire.WireError as exc:
                self.metrics.request_errors.labels("bind", "malformed").inc()
                return wire.binding_result(MESSAGE_PREFIX + str(exc))
            if self.binder is None:
                self.metrics.request_errors.labels("bind", "refused").inc()
                return wire.binding_result(MESSAGE_PREFIX + "no API server connection to bind with")
            uid = args.pod_uid
            early = self._assume_at_bind_start(uid, args.node)
            spec = await asyncio.to_thread(self._spec_for, args.pod_namespace, args.pod_name, args.pod_uid)
            refusal = self._refuse_bind(args, spec, early)
            if refusal:
                self.metrics.request_errors.labels("bind", "refused").inc()
                if early:
                    with self.lock:
                        self.snapshot.unassume(uid)
                log.warning("bind refused: %s", refusal)
                return wire.binding_result(MESSAGE_PREFIX + refusal)
            if spec is not None and spec.gang is not None and self.gang_binder is not None:
                err = await self.gang_binder.bind_member(spec, args.node)
            else:
                err = await asyncio.to_thread(
                    self.bind_one, args.pod_namespace, args.pod_name, args.pod_uid, args.node, spec
                )
            if err:
                self.metrics.request_errors.labels("bind", "refused").inc()
                if early:
                    with self.lock:
                        self.snapshot.unassume(uid)
            return wire.binding_result(err)
        except Exception as exc:
            log.exception("bind failed")
            if early:
                with self.lock:
                    self.snapshot.unassume(uid)
            self.metrics.request_errors.labels("bind", "internal").inc()
            return wire.binding_result(MESSAGE_PREFIX + f"internal error in bind: {exc}")
        finally:
            self.metrics.request_duration.labels("bind").observe(time.perf_counter() - t0)

    def preempt(self, body: bytes) -> bytes:
        """Keep only candidates where evicting the proposed victims really makes our rules pass."""
        t0 = time.perf_counter()
        try:
            args = wire.parse_preemption_args(body)
            try:
                spec = self.placer.parse(args.pod)
            except WorkloadError:
                return wire.preemption_result({}, {})
            keep: dict[str, list[str]] = {}
            with self.lock:
                for node, victims in args.victims.items():
                    if victims and self._fits_without(spec, node, victims):
                        keep[node] = victims
            return wire.preemption_result(keep, args.pdb_violations)
        except Exception as exc:
            kind = "malformed" if isinstance(exc, wire.WireError) else "internal"
            self.metrics.request_errors.labels("preempt", kind).inc()
            return wire.preemption_result({}, {})
        finally:
            self.metrics.request_duration.labels("preempt").observe(time.perf_counter() - t0)

    # --- binding -------------------------------------------------------------------------------
    def _refuse_bind(self, args: wire.BindingArgs, spec: WorkloadSpec | None, assumed_now: bool) -> str:
        """Why this bind must not happen, or '' (docs/extender-protocol.md, "Who may bind").

        The bind verb creates Bindings with our service account, so anyone who can reach it could
        place any pod anywhere. Only kube-scheduler's binds for pods of our profile pass: the pod is
        known from the API server (watch or a read, never from a request body), uses our scheduler,
        was filtered by this extender for exactly that node, and the node still has its GPUs.
        """
        where = f"{args.pod_namespace}/{args.pod_name}"
        if spec is None or (args.pod_uid and spec.uid != args.pod_uid):
            return f"bind refused: pod {where} (uid {args.pod_uid or '?'}) is not known to the API server"
        if spec.scheduler_name != self.settings.scheduler_name:
            theirs = spec.scheduler_name or "default-scheduler"
            ours = self.settings.scheduler_name
            return f"bind refused: pod {where} uses scheduler {theirs!r}, not {ours!r}"
        with self.lock:
            facts = self.snapshot.nodes.get(args.node)
            remembered = self._memory.get(spec.uid)
            usage = self.placer.usage(args.node)
            # Counted on the node already: by a bind that went through (a retry), or just now by
            # _assume_at_bind_start, whose count must not be held against the pod itself.
            already_here = spec.uid in usage.pods and not assumed_now
            used = usage.gpus - (spec.gpus if assumed_now else 0)
            reserved = 0
            if self.placer.gangs is not None and not already_here:
                reserved = self.placer.gangs.reserved_gpus(args.node, spec.gang.key if spec.gang else None)
        if facts is None:
            return f"bind refused: node {args.node!r} is not known to the extender"
        if already_here:
            return ""  # a retry of a bind that went through: idempotent
        if remembered is None or remembered.fits is None or args.node not in remembered.fits:
            return (f"bind refused: pod {where} was not filtered by this extender for node {args.node} "
                    "(kube-scheduler retries it through filter)")
        free = facts.gpu_count - used - reserved
        if spec.gpus > free:
            return f"bind refused: node {args.node} has {max(free, 0)} free GPUs; {where} needs {spec.gpus}"
        return ""

    def _assume_at_bind_start(self, uid: str, node: str) -> bool:
        """Count the pod on its node before the first await of bind.

        kube-scheduler starts the next pod's cycle while this bind is in flight (~20 ms of API
        calls); without this, that cycle is scored on a snapshot missing this pod, and a burst of
        pods on identical nodes spreads instead of packing. Gang members are counted by their plan.
        """
        remembered = self._memory.get(uid) if uid else None
        if remembered is None or remembered.fits is None or node not in remembered.fits:
            return False
        with self.lock:
            # Identity from the watch, not from the request body the filter call carried.
            spec = self.snapshot.specs.get(uid)
            ours = spec is not None and spec.scheduler_name == self.settings.scheduler_name
            if (spec is None or not ours or spec.gang is not None or uid in self.snapshot.pods
                    or node not in self.snapshot.nodes):
                return False
            self.snapshot.assume(spec, node)
        return True

    def bind_one(self, namespace: str, name: str, uid: str, node: str, spec: WorkloadSpec | None) -> str:
        """Bind one pod (blocking); return '' or an error message. Updates snapshot and metrics."""
        if self.binder is None:
            return MESSAGE_PREFIX + "no API server connection to bind with"
        remembered = self._memory.get(uid) if uid else None
        fit = remembered.fit if remembered and remembered.fit and remembered.fit.node.name == node else None
        if fit is None and spec is not None:
            fit = self._fit_now(spec, node)
        try:
            if fit is not None and spec is not None and fit.fallback_used:
                chosen = {PREFIX + "assigned-precision": fit.sizing.precision.value}
                self.binder.annotate(namespace, name, chosen)
            bound_now = self.binder.bind(namespace, name, uid, node)
        except Exception as exc:
            stage = spec.stage.value if spec and spec.stage else "none"
            self.metrics.decisions.labels(stage, "bind_failed").inc()
            return str(exc) if str(exc).startswith(MESSAGE_PREFIX) else MESSAGE_PREFIX + f"bind failed: {exc}"
        if spec is not None:
            with self.lock:
                self.snapshot.assume(spec, node)
            if bound_now:
                self._observe_bound(spec, node, fit, remembered)
        return ""

    def _observe_bound(self, spec: WorkloadSpec, node: str, fit: NodeFit | None,
                       remembered: Remembered | None) -> None:
        stage = spec.stage.value if spec.stage else "none"
        m = self.metrics
        m.decisions.labels(stage, "bound").inc()
        agreed = remembered.agreement_with(node) if remembered is not None else Agreement.UNRANKED
        if remembered is not None:
            remembered.agreement = agreed
        m.agreement.labels(agreed.value).inc()
        if agreed is Agreement.LOWER:
            log.warning("kube-scheduler bound %s to %s, below our best node(s) %s: in-tree scores "
                        "outweighed the extender (docs/scoring.md)", spec.key, node,
                        sorted(best_nodes({n: s.total for n, s in remembered.scores.items()}))[:3]
                        if remembered else [])
        if fit is not None:
            gpu = fit.node.gpu.name if fit.node.gpu else ("unknown" if fit.node.has_gpus else "cpu")
            m.hourly_cost.labels(stage, gpu).inc(fit.pod_hourly_cost)
            if spec.gpus:
                m.bound_gpus.labels(stage, gpu).inc(spec.gpus)
            if fit.sizing.per_gpu_gb > 0 and fit.node.gpu_memory_gb > 0:
                m.memory_fit.labels(stage).observe(fit.sizing.per_gpu_gb / fit.node.gpu_memory_gb)
            if fit.ms_per_token and spec.max_ms_per_token:
                m.slo_ratio.labels(stage).observe(fit.ms_per_token / spec.max_ms_per_token)
                m.bandwidth_fit.labels(stage).observe(spec.max_ms_per_token / fit.ms_per_token)
        if spec.depends_on:
            self._observe_gravity(spec, node, stage)
        if self.binder is not None:
            self.binder.event(spec.namespace, spec.name, spec.uid, "Placed",
                              self.placed_message(spec, node, fit, remembered))

    def _observe_gravity(self, spec: WorkloadSpec, node: str, stage: str) -> None:
        """Data-gravity quality at bind: each edge's distance, GB read across nodes, lost producers."""
        gravity = self.placer.gravity
        if not isinstance(gravity, GravityModel):
            return
        with self.lock:
            edges = gravity.observe(spec, node)
        for e in edges:
            self.metrics.dependency_edges.labels(stage, e.distance).inc()
            if e.cross_node_gb > 0:
                self.metrics.cross_node_gb.labels(stage).inc(e.cross_node_gb)
        missing = [e.producer for e in edges if e.distance == MISSING]
        if missing and self.binder is not None:
            # Not fatal (the pod is placed without their pull), but the user should know why.
            self.binder.event(spec.namespace, spec.name, spec.uid, "ProducerNotFound",
                              MESSAGE_PREFIX + f"depends-on producer {', '.join(missing)} not found "
                              "(not running, bound, planned or recently finished); placed without data "
                              "gravity for it",
                              warning=True)

    def placed_message(self, spec: WorkloadSpec, node: str, fit: NodeFit | None,
                       remembered: Remembered | None) -> str:
        parts = [MESSAGE_PREFIX + f"placed on {node}"]
        if fit is not None:
            hw = fit.node.gpu.name if fit.node.gpu else fit.node.node_class.value
            gpus = f", {spec.gpus} GPU" + ("s" if spec.gpus > 1 else "") if spec.gpus else ""
            parts[0] += f" ({hw}{gpus})"
            if fit.ms_per_token:
                parts.append(f"{fit.ms_per_token:.1f} ms/token predicted")
            if fit.fallback_used:
                parts.append(f"precision {fit.sizing.precision.value} (fallback)")
        score = remembered.scores.get(node) if remembered else None
        if score is not None and score.terms:
            parts.append("top terms: " + ", ".join(f"{t} {v:.2f}" for t, v in score.top_terms()))
        if remembered is not None and remembered.agreement is not None:
            parts.append(AGREEMENT_TEXT[remembered.agreement])
        return "; ".join(parts)

    # --- cluster quality -----------------------------------------------------------------------
    def refresh_quality(self) -> ClusterQuality:
        """Recompute the cluster-level quality gauges (free/stranded GPUs, fragmentation, $/hour).

        Called by the periodic refresher (app.wiring) and directly by tests. Only reference copies
        happen under the lock; the arithmetic runs outside it so filter latency is not affected.
        """
        gangs = self.placer.gangs
        reserved = None if gangs is None else (lambda node: gangs.reserved_gpus(node, None))
        with self.lock:
            data = capture(self.snapshot, reserved)
        quality = compute(data)
        self._quality.publish(quality)
        return quality

    # --- helpers -------------------------------------------------------------------------------
    def absorb_node(self, node: dict[str, Any]) -> None:
        with self.lock:
            self.snapshot.upsert_node(
                facts_for(node, self.catalog, self.policies.node_facts)
            )

    def _absorb_nodes(self, args: wire.ExtenderArgs) -> None:
        """Non-cache mode: take node facts from the request (only when the node object changed)."""
        for n in args.nodes or []:
            meta = n.get("metadata") or {}
            name, rv = str(meta.get("name") or ""), str(meta.get("resourceVersion") or "")
            if name and (not rv or self._node_rv.get(name) != rv or name not in self.snapshot.nodes):
                facts = self._facts_or_skip(n)
                if facts is None:
                    continue
                self.snapshot.upsert_node(facts)
                self._node_rv[name] = rv

    def _facts_or_skip(self, node: dict[str, Any]) -> NodeFacts | None:
        """A node from a request that cannot be read is skipped (counted, one rate-limited line):
        it is then unknown to us and rejected as not cached, while the other nodes are judged."""
        try:
            return facts_for(node, self.catalog, self.policies.node_facts)
        except Exception as exc:
            self.metrics.skipped_objects.labels("request_nodes").inc()
            _RATE_LOG.warning("absorb", f"request node skipped: {type(exc).__name__}: {quote(str(exc))}")
            return None

    def _remember(self, decision: FilterDecision) -> None:
        spec = decision.spec
        if spec is None or not spec.uid:
            return
        fit = next(iter(decision.fits.values())) if len(decision.fits) == 1 else None
        # A new filter call is a new scheduling cycle: the previous cycle's scores no longer describe
        # the candidates (and kube-scheduler skips prioritize when one node is left).
        self._memory[spec.uid] = Remembered(spec, fit, time.time(), decision.fits)
        self._memory.move_to_end(spec.uid)
        while len(self._memory) > DECISION_MEMORY:
            self._memory.popitem(last=False)

    def _remember_scores(self, pod: dict[str, Any], scores: list[NodeScore]) -> None:
        uid = str((pod.get("metadata") or {}).get("uid") or "")
        if uid and uid in self._memory:
            self._memory[uid].set_scores(scores)

    def _count_filter(self, d: FilterDecision) -> None:
        stage = d.spec.stage.value if d.spec and d.spec.stage else "none"
        if d.invalid:
            self.metrics.decisions.labels(stage, "invalid").inc()
            for problem in d.invalid:
                self.metrics.invalid_annotation(problem_key(problem))
            return
        if not d.passed:
            self.metrics.decisions.labels(stage, "unschedulable").inc()
        for code in d.codes.values():  # once per distinct reason, labelled by its rule
            self.metrics.rejections.labels(code.value).inc()

    def _spec_for(self, namespace: str, name: str, uid: str) -> WorkloadSpec | None:
        """The pod as the API server has it: the watch's copy, else a read (never a request body)."""
        with self.lock:
            spec = self.snapshot.specs.get(uid) if uid else None
        if spec is None and self.binder is not None:
            pod = self.binder.read_pod(namespace, name)
            if pod is not None:
                try:
                    spec = self.placer.parse(pod)
                except WorkloadError:
                    spec = None
        return spec

    def _fit_now(self, spec: WorkloadSpec, node: str) -> NodeFit | None:
        with self.lock:
            facts = self.snapshot.nodes.get(node)
            if facts is None:
                return None
            # The pod's own GPUs may already be counted (assumed); evaluate without the GPU check.
            verdict = evaluate(spec, facts, self.placer.usage(node), 1 << 30,
                               self.policies.placement.feasibility)
        return verdict if isinstance(verdict, NodeFit) else None

    def _fits_without(self, spec: WorkloadSpec, node: str, victims: list[str]) -> bool:
        facts = self.snapshot.nodes.get(node)
        if facts is None:
            return False
        u = self.placer.usage(node)
        known = [u.pods[v] for v in victims if v in u.pods]
        freed = sum(p.gpus for p in known)
        trial = NodeUsage(gpus=u.gpus - freed, cpu_millis=u.cpu_millis, memory_bytes=u.memory_bytes,
                          pods={k: v for k, v in u.pods.items() if k not in victims},
                          stages=u.stages.copy(), interactive=u.interactive, training=u.training)
        for p in known:
            if p.stage is not None:
                trial.stages[p.stage.value] -= 1
                trial.training -= p.stage in TRAINING_STAGES
        free = facts.gpu_count - trial.gpus
        if self.placer.gangs is not None:
            free -= self.placer.gangs.reserved_gpus(node, spec.gang.key if spec.gang else None)
        verdict = evaluate(spec, facts, trial, free, self.policies.placement.feasibility)
        return not isinstance(verdict, Rejection)

    def remembered(self, uid: str) -> Remembered | None:
        return self._memory.get(uid)

    def remembered_by_key(self, key: str) -> WorkloadSpec | None:
        """The newest spec filtered under ``ns/name`` (for pods only ever seen in requests)."""
        with self.lock:
            for r in reversed(self._memory.values()):
                if r.spec.key == key:
                    return r.spec
        return None

