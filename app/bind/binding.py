"""Binding one pod: the API write, the snapshot update, and what the bind tells metrics and the pod.

Its own object so the gang binder (app.gang) can be handed exactly this capability (bind one member)
and nothing else of the service. Blocking: callers run it on a worker thread.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Protocol

from app.base.reasons import MESSAGE_PREFIX, shown
from app.base.workload import PREFIX, WorkloadSpec
from app.bind.decisions import DecisionMemory, Remembered
from app.config.policy import FeasibilityPolicy
from app.metrics.metrics import Metrics
from app.placement.feasibility import UNCHECKED, NodeFit, evaluate
from app.placement.gravity import MISSING, GravityModel
from app.placement.ranking import Agreement
from app.snapshot.access import SnapshotAccess
from app.snapshot.store import NodeUsage

log = logging.getLogger(__name__)
AGREEMENT_TEXT = {
    Agreement.TOP: "kube-scheduler followed our ranking (our best node)",
    Agreement.TIED_TOP: "kube-scheduler followed our ranking (one of our equal best nodes)",
    Agreement.LOWER: "kube-scheduler chose a node we ranked lower (its in-tree scores outweighed ours)",
    Agreement.UNRANKED: "no ranking of ours was remembered for this bind",
}


class BinderLike(Protocol):
    def bind(self, namespace: str, name: str, uid: str, node: str,
             annotations: dict[str, str] | None = None) -> bool: ...

    def annotate(self, namespace: str, name: str, annotations: dict[str, str]) -> None: ...

    def event(self, namespace: str, name: str, uid: str, reason: str, message: str,
              warning: bool = False) -> None: ...

    def read_pod(self, namespace: str, name: str) -> dict[str, Any] | None: ...


@dataclass(eq=False)
class PodBinding:
    binder: BinderLike | None
    access: SnapshotAccess
    metrics: Metrics
    memory: DecisionMemory
    feasibility: FeasibilityPolicy
    gravity: GravityModel | None = None

    def bind_spec(self, spec: WorkloadSpec, node: str) -> str:
        """Bind a pod known by its spec (the gang barrier's one capability)."""
        return self.bind_one(spec.namespace, spec.name, spec.uid, node, spec)

    def bind_one(self, namespace: str, name: str, uid: str, node: str, spec: WorkloadSpec | None) -> str:
        """Bind one pod (blocking); return '' or an error message. Updates snapshot and metrics."""
        if self.binder is None:
            return MESSAGE_PREFIX + "no API server connection to bind with"
        remembered = self.memory.get(uid)
        fit = _filtered_fit(remembered, node)
        if fit is None and spec is not None:
            fit = self._fit_now(spec, node)
        try:
            if fit is not None and spec is not None and fit.fallback_used:
                # Carried by the Binding, which the API server copies onto the pod: one write, and
                # the annotation is there exactly when the pod is bound.
                chosen = {PREFIX + "assigned-precision": fit.sizing.precision.value}
                bound_now = self.binder.bind(namespace, name, uid, node, annotations=chosen)
            else:
                bound_now = self.binder.bind(namespace, name, uid, node)
        except Exception as exc:
            stage = spec.stage.value if spec and spec.stage else "none"
            self.metrics.decisions.labels(stage, "bind_failed").inc()
            return str(exc) if str(exc).startswith(MESSAGE_PREFIX) else MESSAGE_PREFIX + f"bind failed: {exc}"
        if spec is not None:
            self.access.confirm(spec, node)
            if bound_now:
                self._observe_bound(spec, node, fit, remembered)
        return ""

    def _observe_bound(self, spec: WorkloadSpec, node: str, fit: NodeFit | None,
                       remembered: Remembered | None) -> None:
        stage = spec.stage.value if spec.stage else "none"
        m = self.metrics
        m.child(m.decisions, stage, "bound").inc()
        agreed = remembered.agreement_with(node) if remembered is not None else Agreement.UNRANKED
        if remembered is not None:
            remembered.agreement = agreed
        m.child(m.agreement, agreed.value).inc()
        if agreed is Agreement.LOWER:
            log.warning("kube-scheduler bound %s to %s, below our best node(s) %s: in-tree scores "
                        "outweighed the extender (docs/scoring.md)", spec.key, node,
                        remembered.best_nodes()[:3] if remembered else [])
        if fit is not None:
            gpu = fit.node.gpu.name if fit.node.gpu else ("unknown" if fit.node.has_gpus else "cpu")
            m.child(m.hourly_cost, stage, gpu).inc(fit.pod_hourly_cost)
            if spec.gpus:
                m.child(m.bound_gpus, stage, gpu).inc(spec.gpus)
            if fit.sizing.per_gpu_gb > 0 and fit.node.gpu_memory_gb > 0:
                m.child(m.memory_fit, stage).observe(fit.sizing.per_gpu_gb / fit.node.gpu_memory_gb)
            if fit.ms_per_token and spec.max_ms_per_token:
                m.child(m.slo_ratio, stage).observe(fit.ms_per_token / spec.max_ms_per_token)
                m.child(m.bandwidth_fit, stage).observe(spec.max_ms_per_token / fit.ms_per_token)
        if spec.depends_on or spec.serving_group:
            self._observe_gravity(spec, node, stage)
        if self.binder is not None:
            self.binder.event(spec.namespace, spec.name, spec.uid, "Placed",
                              placed_message(spec, node, fit, remembered))

    def _observe_gravity(self, spec: WorkloadSpec, node: str, stage: str) -> None:
        """Data-gravity quality at bind: each edge's distance, GB read across nodes, lost producers."""
        if self.gravity is None:
            return
        with self.access.view():
            edges = self.gravity.observe(spec, node)
        for e in edges:
            self.metrics.dependency_edges.labels(stage, e.distance).inc()
            if e.cross_node_gb > 0:
                self.metrics.cross_node_gb.labels(stage).inc(e.cross_node_gb)
        missing = [e.producer for e in edges if e.distance == MISSING]
        if missing and self.binder is not None:
            # Not fatal (the pod is placed without their pull), but the user should know why.
            names = ", ".join(map(shown, missing))
            self.binder.event(spec.namespace, spec.name, spec.uid, "ProducerNotFound",
                              MESSAGE_PREFIX + f"depends-on producer {names} not found "
                              "(not running, bound, planned or recently finished); placed without data "
                              "gravity for it",
                              warning=True)

    def _fit_now(self, spec: WorkloadSpec, node: str) -> NodeFit | None:
        with self.access.view() as snap:
            facts = snap.nodes.get(node)
            if facts is None:
                return None
            usage = snap.usage.get(node) or NodeUsage()
            # The pod's own GPUs may already be counted (assumed); evaluate without the GPU check.
            verdict = evaluate(spec, facts, usage, UNCHECKED, self.feasibility)
        return verdict if isinstance(verdict, NodeFit) else None


def _filtered_fit(remembered: Remembered | None, node: str) -> NodeFit | None:
    """The verdict this cycle's filter reached for ``node``, if it judged that node: what the bind
    reports and annotates is then exactly what was decided, and the node is not evaluated again."""
    if remembered is None:
        return None
    if remembered.fit is not None and remembered.fit.node.name == node:
        return remembered.fit
    fits = remembered.fits
    return fits[node] if fits is not None and node in fits else None


def placed_message(spec: WorkloadSpec, node: str, fit: NodeFit | None, remembered: Remembered | None) -> str:
    """The Placed event: where, on what, the predicted speed, why, and whether kube-scheduler agreed."""
    parts = [MESSAGE_PREFIX + f"placed on {node}"]
    if fit is not None:
        hw = fit.node.gpu.name if fit.node.gpu else fit.node.node_class.value
        gpus = f", {spec.gpus} GPU" + ("s" if spec.gpus > 1 else "") if spec.gpus else ""
        parts[0] += f" ({hw}{gpus})"
        if fit.ms_per_token:
            parts.append(f"{fit.ms_per_token:.1f} ms/token predicted")
        if fit.fallback_used:
            parts.append(f"precision {fit.sizing.precision.value} (fallback)")
    score = remembered.score_of(node) if remembered else None
    if score is not None and score.terms:
        parts.append("top terms: " + ", ".join(f"{t} {v:.2f}" for t, v in score.top_terms()))
    if remembered is not None and remembered.agreement is not None:
        parts.append(AGREEMENT_TEXT[remembered.agreement])
    return "; ".join(parts)
