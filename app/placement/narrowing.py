"""Filter answers only our best node(s), so kube-scheduler binds where we rank best without a
prioritize round trip or its own scoring (setting ``filter_to_best``, docs/scoring.md).

kube-scheduler skips scoring, and our prioritize call, when filter leaves one node. With rank bands
our best nodes already win (docs/scoring.md), so in-tree scores only ever chose *among our equal-best
nodes*; narrowing to one of them changes nothing for a pod that has no soft in-tree preference. A pod
that has one keeps all its equal-best nodes, and kube-scheduler's own scores break the tie as before.
The nodes left out are not listed as failed: kube-scheduler only reads per-node reasons when no node
is feasible (docs/scoring.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# Controllers whose pods kube-scheduler's default PodTopologySpread constraints (ScheduleAnyway, by
# host and zone) spread when the pod names no constraints of its own.
DEFAULT_SPREAD_OWNERS = frozenset({"ReplicaSet", "StatefulSet", "ReplicationController"})


def soft_preference(pod: Mapping[str, Any]) -> str | None:
    """What in-tree scoring would weigh for this pod beyond resources, or None when nothing."""
    spec = pod.get("spec") or {}
    affinity = spec.get("affinity") or {}
    if isinstance(affinity, dict):
        for kind in ("nodeAffinity", "podAffinity", "podAntiAffinity"):
            part = affinity.get(kind) or {}
            if isinstance(part, dict) and part.get("preferredDuringSchedulingIgnoredDuringExecution"):
                return f"preferred {kind}"
    constraints = spec.get("topologySpreadConstraints") or []
    if isinstance(constraints, list) and constraints:
        if any(isinstance(c, dict) and c.get("whenUnsatisfiable") == "ScheduleAnyway" for c in constraints):
            return "topologySpreadConstraints (ScheduleAnyway)"
        return None  # its own constraints replace the defaults
    owners = (pod.get("metadata") or {}).get("ownerReferences") or []
    if isinstance(owners, list):
        for o in owners:
            if isinstance(o, dict) and o.get("kind") in DEFAULT_SPREAD_OWNERS:
                return f"default spreading of {o.get('kind')} pods"
    return None
