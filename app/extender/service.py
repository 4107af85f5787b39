"""The extender service: wire bytes in, placement core, wire bytes out, plus bind, events and metrics.

No FastAPI here (routes are a thin layer over this class), so the same object serves HTTP, the
benchmarks and the tests. Watch threads write the snapshot; each verb decides on one view of it and
writes only its assumptions, both through ``self.access`` (app.snapshot.access).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol

from app.api import wire
from app.base.catalog import GpuCatalog
from app.base.ratelog import RateLimitedLog
from app.base.reasons import MESSAGE_PREFIX, problem_key
from app.base.units import quote
from app.base.workload import WorkloadError, WorkloadSpec
from app.bind.binding import BinderLike, PodBinding
from app.bind.decisions import DecisionMemory, Remembered
from app.bind.gate import BindGate
from app.config.settings import Settings
from app.metrics.metrics import Metrics
from app.metrics.quality import ClusterQuality, QualityPublisher, capture, compute
from app.placement.placer import FilterDecision, GangHook, Placer
from app.placement.score_list import ScoreList
from app.serving.targets import TargetWatch
from app.snapshot.access import SnapshotAccess
from app.snapshot.nodes import NodeFacts, facts_for, node_inputs
from app.snapshot.store import ClusterSnapshot

log = logging.getLogger(__name__)
_RATE_LOG = RateLimitedLog(log)
FILTER_REUSE_SECONDS = 2.0
# Threads for bind's API writes. Each waits on the API server (tens of ms when etcd is slow) without
# the GIL; with the loop's default pool (cores + 4) binds queued behind each other, and every bind
# kube-scheduler still waits on holds one more connection open to us (docs/extender-protocol.md, "Bind").
BIND_THREADS = 16


class GangBindHook(Protocol):
    """The gang binder (app.gang): binds a member all-or-nothing with the bind it was built with."""

    async def bind_member(self, spec: WorkloadSpec, node: str) -> str: ...

    def close(self) -> None:
        """Stop its threads (at shutdown)."""
        ...


class Gangs(GangHook, GangBindHook, Protocol):
    """Gang scheduling as the service uses it: the placer's hook, the all-or-nothing binder, and
    the gang queue explain reports."""

    def queue_info(self, key: str) -> dict[str, object]:
        """A gang's place in the gang queue and what it waits behind (docs/gangs.md)."""
        ...


class ExtenderService:
    """The verbs. Built once with every part it uses (app.extender.wiring builds the live set)."""

    def __init__(
        self,
        settings: Settings,
        catalog: GpuCatalog,
        *,
        binding: PodBinding | None = None,
        binder: BinderLike | None = None,
        gangs: Gangs | None = None,
        ready: threading.Event | None = None,
        before_filter: Callable[[], object] | None = None,
    ) -> None:
        """``binding`` brings the snapshot, its lock, the metrics, the decision memory and data
        gravity it was built over, so the service and the binds share them by construction; without
        it (demo, tests, benchmarks) each is made here, binding through ``binder``."""
        self.settings = settings
        # Each pure component gets its own slice of the settings, built once (app.config.policy).
        self.policies = settings.policies()
        self.catalog = catalog
        if binding is None:
            binding = PodBinding(binder, SnapshotAccess(ClusterSnapshot(), threading.RLock()), Metrics(),
                                 DecisionMemory(), self.policies.placement.feasibility)
        self.binding = binding
        self.access = binding.access
        self.snapshot = binding.access.snapshot
        self.lock = binding.access.lock
        self.metrics = binding.metrics
        self.memory = binding.memory
        self.placer = Placer(self.policies.placement, self.snapshot, gangs, binding.gravity)
        self.gang_binder: GangBindHook | None = gangs
        self.gangs = gangs
        self.gate = BindGate(settings.scheduler_name, self.access, self.memory, self.placer,
                             self.binding.binder)
        self._node_rv: dict[str, str] = {}
        # Set once the cluster watch has listed everything (or at once without a cluster).
        self.ready = ready or threading.Event()
        # Runs before each filter: a standby replica's first call adopts the gang plans the dead
        # leader persisted (app/gang/takeover.py); None without a cluster.
        self.before_filter = before_filter
        # Serving pods judged against their own targets by what their engines measure (when
        # live_profiles is set; docs/stage-policy.md, "Targets the engines measure missed"): the
        # live-profile poller feeds it, explain reads it.
        live = settings.live_profiles
        self.serving_targets = TargetWatch(live.learn_policy()) if live is not None else None
        self._quality = QualityPublisher(self.metrics)
        # Each verb's latency series, looked up once: ``labels()`` takes a lock and builds a key on
        # every call, and these are observed once per request.
        self._seconds = {verb: self.metrics.request_duration.labels(verb)
                         for verb in ("filter", "prioritize", "bind", "preempt")}
        # Threads start on first use, so a service that never binds starts none.
        self._bind_pool = ThreadPoolExecutor(max_workers=BIND_THREADS, thread_name_prefix="bind")

    @property
    def binder(self) -> BinderLike | None:
        return self.binding.binder

    # --- request verbs -------------------------------------------------------------------------
    def filter(self, body: bytes) -> bytes:
        t0 = time.perf_counter()
        try:
            args = wire.parse_extender_args(body, "filter")
        except wire.WireError as exc:
            self.metrics.request_errors.labels("filter", "malformed").inc()
            return wire.filter_result(None, [], {}, {}, MESSAGE_PREFIX + str(exc))
        if self.before_filter is not None:
            try:
                self.before_filter()
            except Exception:  # placing without adopted plans beats answering no filter at all
                log.exception("adopting persisted gang plans failed")
        try:
            self._absorb_nodes(args)
            with self.access.view():
                decision = self.placer.filter(args.pod, args.names())
                scores = self.placer.narrow(decision, args.pod)
                self.memory.remember_filter(decision)
                if scores is not None and decision.spec is not None:
                    # Scored here, not in prioritize: bind's agreement and explain read them.
                    self.memory.remember_scores(decision.spec.uid, scores)
            self._count_filter(decision)
            if decision.passed:
                # kube-scheduler reads per-node reasons only when no node passes (the pod's
                # FailedScheduling event, preemption); docs/extender-protocol.md.
                return wire.filter_result(args, decision.passed, {}, {})
            return wire.filter_result(args, decision.passed, decision.failed, decision.unresolvable)
        except Exception as exc:  # never a 500: the message must reach the pod's events
            log.exception("filter failed")
            self.metrics.request_errors.labels("filter", "internal").inc()
            return wire.filter_result(args, [], {}, {}, MESSAGE_PREFIX + f"internal error in filter: {exc}")
        finally:
            self._seconds["filter"].observe(time.perf_counter() - t0)

    def prioritize(self, body: bytes) -> bytes:
        t0 = time.perf_counter()
        try:
            args = wire.parse_extender_args(body, "prioritize")
            self._absorb_nodes(args)
            with self.access.view():
                uid = str((args.pod.get("metadata") or {}).get("uid") or "")
                prior = self.memory.get(uid)
                # Reuse this cycle's filter verdicts: prioritize follows filter within milliseconds,
                # and on a busy cluster every bind bumps the snapshot generation in between, so
                # an exact-generation check would recompute every node. Scores still read live usage.
                fresh = prior is not None and time.time() - prior.at < FILTER_REUSE_SECONDS
                known = prior.fits if prior is not None and fresh else None
                names = args.names()
                reused = prior.score_list.take(names) if prior is not None and fresh else None
                if reused is not None:
                    # filter_to_best scored these nodes in this cycle's filter: reuse, not recompute.
                    scores: ScoreList = reused
                else:
                    scores = self.placer.prioritize(args.pod, names, known)
                    self.memory.remember_scores(uid, scores)
            return wire.priority_pairs(scores.names, scores.bands.tolist())
        except Exception as exc:
            # kube-scheduler ignores prioritize errors silently, so count them for alerting.
            kind = "malformed" if isinstance(exc, wire.WireError) else "internal"
            if kind == "internal":
                log.exception("prioritize failed")
            self.metrics.request_errors.labels("prioritize", kind).inc()
            return wire.priority_pairs([], [])
        finally:
            self._seconds["prioritize"].observe(time.perf_counter() - t0)

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
            early = self.gate.assume_at_start(uid, args.node)
            with self.access.view() as snap:
                spec = snap.specs.get(uid) if uid else None
            if spec is None:
                # Only a pod the watch does not hold needs an API read, and only that goes to a thread:
                # each hop is a queue, a wake-up and a GIL hand-over on the interpreter that also
                # answers filter (docs/extender-protocol.md, "Bind").
                spec = await asyncio.get_running_loop().run_in_executor(
                    self._bind_pool, self.gate.spec_for, args.pod_namespace, args.pod_name, args.pod_uid)
            refusal = self.gate.refuse(args, spec, early)
            if refusal is not None:
                self.metrics.request_errors.labels("bind", "refused").inc()
                self.metrics.bind_refusals.labels(refusal.reason).inc()
                if early:
                    self.access.forget(uid)
                _RATE_LOG.warning(f"bind:{refusal.reason}", quote(refusal.message))
                return wire.binding_result(MESSAGE_PREFIX + refusal.message)
            if spec is not None and spec.gang is not None and self.gang_binder is not None:
                err = await self.gang_binder.bind_member(spec, args.node)
            else:
                err = await asyncio.get_running_loop().run_in_executor(
                    self._bind_pool, self.binding.bind_one, args.pod_namespace, args.pod_name, args.pod_uid,
                    args.node, spec)
            if err:
                self.metrics.request_errors.labels("bind", "refused").inc()
                if early:
                    self.access.forget(uid)
            return wire.binding_result(err)
        except Exception as exc:
            log.exception("bind failed")
            if early:
                self.access.forget(uid)
            self.metrics.request_errors.labels("bind", "internal").inc()
            return wire.binding_result(MESSAGE_PREFIX + f"internal error in bind: {exc}")
        finally:
            self._seconds["bind"].observe(time.perf_counter() - t0)

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
            with self.access.view():
                for node, victims in args.victims.items():
                    if victims and self.placer.fits_without(spec, node, victims):
                        keep[node] = victims
            return wire.preemption_result(keep, args.pdb_violations)
        except Exception as exc:
            kind = "malformed" if isinstance(exc, wire.WireError) else "internal"
            self.metrics.request_errors.labels("preempt", kind).inc()
            return wire.preemption_result({}, {})
        finally:
            self._seconds["preempt"].observe(time.perf_counter() - t0)

    # --- cluster quality -----------------------------------------------------------------------
    def refresh_quality(self) -> ClusterQuality:
        """Recompute the cluster-level quality gauges (free/stranded GPUs, fragmentation, $/hour).

        Called by the periodic refresher (app.extender.wiring) and directly by tests. Only reference copies
        happen under the lock; the arithmetic runs outside it so filter latency is not affected.
        """
        gangs = self.placer.gangs
        reserved = None if gangs is None else (lambda node: gangs.reserved_gpus(node, None))
        with self.access.view() as snap:
            data = capture(snap, reserved)
        quality = compute(data)
        self._quality.publish(quality)
        return quality

    # --- helpers -------------------------------------------------------------------------------
    def absorb_node(self, node: dict[str, Any]) -> None:
        """A node from a trusted source (the demo, tests): its facts and what bind checks read."""
        self.access.observe_node(facts_for(node, self.catalog, self.policies.node_facts), node_inputs(node))

    def _absorb_nodes(self, args: wire.ExtenderArgs) -> None:
        """Non-cache mode: take node facts from the request (only when the node object changed).

        Only without a cluster watch (``cluster_source: none``): with one, the watch is the one
        source of node facts, and nodes in a request body are ignored, since anyone who can reach
        the verbs can send a filter request (docs/extender-protocol.md, "Who may bind")."""
        if self.settings.cluster_source != "none":
            return
        for n in args.nodes or []:
            meta = n.get("metadata") or {}
            name, rv = str(meta.get("name") or ""), str(meta.get("resourceVersion") or "")
            if name and (not rv or self._node_rv.get(name) != rv or name not in self.snapshot.nodes):
                facts = self._facts_or_skip(n)
                if facts is None:
                    continue
                self.access.observe_node(facts, node_inputs(n))
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

    def _count_filter(self, d: FilterDecision) -> None:
        stage = d.spec.stage.value if d.spec and d.spec.stage else "none"
        if d.invalid:
            self.metrics.decisions.labels(stage, "invalid").inc()
            for problem in d.invalid:
                self.metrics.invalid_annotation(problem_key(problem))
            return
        if not d.passed:
            self.metrics.child(self.metrics.decisions, stage, "unschedulable").inc()
        for code in d.codes.values():  # once per distinct reason, labelled by its rule
            self.metrics.child(self.metrics.rejections, code.value).inc()

    def remembered(self, uid: str) -> Remembered | None:
        return self.memory.get(uid)

    def remembered_by_key(self, key: str) -> WorkloadSpec | None:
        """The newest spec filtered under ``ns/name`` (for pods only ever seen in requests)."""
        with self.access.view():
            return self.memory.newest_spec(key)
