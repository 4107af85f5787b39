"""A kube-scheduler stand-in for the demo and the simulator (never for tests of the protocol).

It mirrors the order kube-scheduler uses with an extender: in-tree resource fit, then our filter,
then our prioritize, highest score wins (ties by name, deterministic), then assume. The real
kube-scheduler is what the integration suite uses; this loop exists so placement quality can be
judged offline on traces with the very same placement core.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from app.core.placer import Placer
from app.core.scoring import NodeScore
from app.core.snapshot import ClusterSnapshot
from app.core.workload import WorkloadError, WorkloadSpec


@dataclass(slots=True)
class Placement:
    pod: str
    stage: str | None
    node: str | None
    reason: str = ""
    score: NodeScore | None = None
    precision: str | None = None
    ms_per_token: float | None = None
    runner_up: str | None = None
    terms: list[tuple[str, float]] = field(default_factory=list)


def in_tree_fits(snapshot: ClusterSnapshot, spec: WorkloadSpec, node: str) -> bool:
    """NodeResourcesFit, the part of it that matters here: GPUs, CPU and memory requests."""
    facts = snapshot.nodes[node]
    u = snapshot.usage.get(node)
    used_gpu = u.gpus if u else 0
    used_cpu = u.cpu_millis if u else 0.0
    used_mem = u.memory_bytes if u else 0.0
    return (
        not facts.unschedulable
        and facts.gpu_count - used_gpu >= spec.gpus
        and facts.cpu_millis - used_cpu >= spec.cpu_millis
        and facts.memory_bytes - used_mem >= spec.memory_bytes
    )


class SimScheduler:
    def __init__(self, placer: Placer) -> None:
        self.placer = placer
        self.snapshot = placer.snapshot

    def admit(self, pods: list[dict[str, Any]]) -> None:
        """Make pods known the way the watch would (gang membership needs every member)."""
        for pod in pods:
            with contextlib.suppress(WorkloadError):
                self.snapshot.track_spec(self.placer.parse(pod))

    def schedule(self, pod: dict[str, Any]) -> Placement:
        meta = pod.get("metadata") or {}
        key = f"{meta.get('namespace', 'default')}/{meta.get('name')}"
        try:
            spec = self.placer.parse(pod)
        except WorkloadError as exc:
            return Placement(key, None, None, "invalid: " + "; ".join(exc.problems))
        stage = spec.stage.value if spec.stage else None
        names = sorted(n for n in self.snapshot.nodes if in_tree_fits(self.snapshot, spec, n))
        if not names:
            return Placement(key, stage, None, f"no node has {spec.gpus} free GPUs / enough CPU+memory")
        decision = self.placer.filter(pod, names)
        if not decision.passed:
            reason, count = Counter(decision.rejections.values()).most_common(1)[0]
            return Placement(key, stage, None, f"{count}/{len(names)} nodes: {reason}")
        fits = [decision.fits[n] for n in decision.passed]
        scores = sorted(self.placer.score(spec, fits), key=lambda s: (-s.score, -s.total, s.node))
        best = scores[0]
        fit = decision.fits[best.node]
        self.snapshot.assume(spec, best.node)
        return Placement(
            key, stage, best.node, "", best, fit.sizing.precision.value, fit.ms_per_token,
            scores[1].node if len(scores) > 1 else None, best.top_terms(),
        )
