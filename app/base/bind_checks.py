"""The node rules kube-scheduler applies before it binds, checked again by the extender at bind.

The bind verb creates Bindings with the extender's service account. kube-scheduler only asks for a
bind after its own filters (NodeUnschedulable, TaintToleration, NodeAffinity, NodeResourcesFit)
passed, so these checks never refuse one of its binds; they refuse a bind that did not come through
kube-scheduler's filters (docs/extender-protocol.md, "Who may bind"). Each check follows
kube-scheduler's semantics exactly where it can refuse, and lets through what it cannot read (an
operator of a newer Kubernetes), so that the extender never narrows what kube-scheduler accepted.

Pure: plain values in (the pod's and the node's fields as the API server stores them), no clients.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

# (key, value, effect) of a node taint; (key, operator, value, effect) of a pod toleration.
Taint = tuple[str, str, str]
Toleration = tuple[str, str, str, str]
# (key, operator, values) of a node selector requirement.
Requirement = tuple[str, str, tuple[str, ...]]
# One nodeSelectorTerm: its matchExpressions (node labels) and its matchFields (metadata.name).
Term = tuple[tuple[Requirement, ...], tuple[Requirement, ...]]

# Taint effects that keep a pod off a node in kube-scheduler's filter (PreferNoSchedule only scores).
HARD_EFFECTS = frozenset({"NoSchedule", "NoExecute"})
# What a cordoned node is treated as by kube-scheduler's NodeUnschedulable filter: a pod that
# tolerates this taint (DaemonSets do) may still go there.
UNSCHEDULABLE_TAINT: Taint = ("node.kubernetes.io/unschedulable", "", "NoSchedule")
KNOWN_TOLERATION_OPERATORS = frozenset({"", "Equal", "Exists"})
MAX_ITEMS = 1024  # tolerations, taints, terms or values read per object (the API server allows fewer)

# Refusal reasons: the ``reason`` label of llm_placement_bind_refusals_total (docs/metrics.md).
CORDONED = "cordoned"
TAINT = "taint"
NODE_SELECTOR = "node_selector"
NODE_AFFINITY = "node_affinity"
CPU = "cpu"
MEMORY = "memory"
NODE_REASONS = (CORDONED, TAINT, NODE_SELECTOR, NODE_AFFINITY, CPU, MEMORY)


@dataclass(frozen=True, slots=True)
class NodeRules:
    """What kube-scheduler's node filters read of a Node, from the API server's object."""

    name: str
    labels: Mapping[str, str]
    unschedulable: bool = False
    taints: tuple[Taint, ...] = ()  # NoSchedule and NoExecute only


@dataclass(frozen=True, slots=True)
class PodRules:
    """What kube-scheduler's node filters read of a Pod."""

    node_selector: tuple[tuple[str, str], ...] = ()
    tolerations: tuple[Toleration, ...] = ()
    # spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution; None: absent.
    required_terms: tuple[Term, ...] | None = None
    cpu_millis: float = 0.0
    memory_bytes: float = 0.0


@dataclass(frozen=True, slots=True)
class Refusal:
    reason: str  # one of NODE_REASONS
    message: str


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _items(value: Any) -> list[Any]:
    return value[:MAX_ITEMS] if isinstance(value, list) else []


def node_rules(node: Mapping[str, Any]) -> NodeRules:
    """NodeRules of a Node object (or of the part of it the cache keeps, app.snapshot.nodes.node_inputs)."""
    meta = node.get("metadata") if isinstance(node.get("metadata"), dict) else {}
    spec = node.get("spec") if isinstance(node.get("spec"), dict) else {}
    assert isinstance(meta, dict) and isinstance(spec, dict)
    raw_labels = meta.get("labels")
    labels = {str(k): v for k, v in raw_labels.items() if isinstance(v, str)} \
        if isinstance(raw_labels, dict) else {}
    taints = tuple((_text(t.get("key")), _text(t.get("value")), _text(t.get("effect")))
                   for t in _items(spec.get("taints"))
                   if isinstance(t, dict) and t.get("effect") in HARD_EFFECTS)
    return NodeRules(_text(meta.get("name")), labels, spec.get("unschedulable") is True, taints)


def tolerations_of(pod_spec: Mapping[str, Any]) -> tuple[Toleration, ...]:
    return tuple((_text(t.get("key")), _text(t.get("operator")), _text(t.get("value")),
                  _text(t.get("effect")))
                 for t in _items(pod_spec.get("tolerations")) if isinstance(t, dict))


def _requirements(raw: Any) -> tuple[Requirement, ...]:
    return tuple((_text(r.get("key")), _text(r.get("operator")),
                  tuple(_text(v) for v in _items(r.get("values"))))
                 for r in _items(raw) if isinstance(r, dict))


def required_terms_of(pod_spec: Mapping[str, Any]) -> tuple[Term, ...] | None:
    affinity = pod_spec.get("affinity")
    node_affinity = affinity.get("nodeAffinity") if isinstance(affinity, dict) else None
    required = node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution") \
        if isinstance(node_affinity, dict) else None
    if not isinstance(required, dict):
        return None
    return tuple((_requirements(t.get("matchExpressions")), _requirements(t.get("matchFields")))
                 for t in _items(required.get("nodeSelectorTerms")) if isinstance(t, dict))


def tolerates(toleration: Toleration, taint: Taint) -> bool:
    """Kubernetes' Toleration.ToleratesTaint: an empty effect matches every effect, an empty key
    (with Exists) every key; Equal (or no operator) compares values, Exists ignores them."""
    key, operator, value, effect = toleration
    t_key, t_value, t_effect = taint
    if effect and effect != t_effect:
        return False
    if key and key != t_key:
        return False
    if operator in ("", "Equal"):
        return value == t_value
    if operator == "Exists":
        return True
    # An operator this version does not know (a newer Kubernetes may add some): never refuse on it.
    return True


def untolerated(tolerations: Sequence[Toleration], taints: Sequence[Taint]) -> Taint | None:
    """The first NoSchedule/NoExecute taint no toleration tolerates, or None."""
    for taint in taints:
        if taint[2] in HARD_EFFECTS and not any(tolerates(t, taint) for t in tolerations):
            return taint
    return None


def _integer(text: str) -> int | None:
    try:
        return int(text, 10)
    except ValueError:
        return None


def label_requirement_matches(req: Requirement, labels: Mapping[str, str]) -> bool:
    """One matchExpressions entry against node labels (labels.Selector semantics)."""
    key, operator, values = req
    present = key in labels
    value = labels.get(key, "")
    if operator == "In":
        return present and value in values
    if operator == "NotIn":
        return not present or value not in values
    if operator == "Exists":
        return present
    if operator == "DoesNotExist":
        return not present
    if operator in ("Gt", "Lt"):
        # Exactly one integer value; a label that is not an integer does not match.
        bound = _integer(values[0]) if len(values) == 1 else None
        have = _integer(value) if present else None
        if bound is None or have is None:
            return False
        return have > bound if operator == "Gt" else have < bound
    return False  # kube-scheduler cannot parse the term either: it matches nothing


def field_requirement_matches(req: Requirement, node_name: str) -> bool:
    """One matchFields entry: only metadata.name with In or NotIn exists."""
    key, operator, values = req
    if key != "metadata.name":
        return False
    if operator == "In":
        return node_name in values
    if operator == "NotIn":
        return node_name not in values
    return False


def term_matches(term: Term, labels: Mapping[str, str], node_name: str) -> bool:
    """All requirements of one term; a term with none matches no node (as kube-scheduler)."""
    expressions, fields = term
    if not expressions and not fields:
        return False
    return all(label_requirement_matches(r, labels) for r in expressions) and \
        all(field_requirement_matches(r, node_name) for r in fields)


def affinity_matches(terms: Sequence[Term] | None, labels: Mapping[str, str], node_name: str) -> bool:
    """The terms are ORed; no required affinity at all matches every node."""
    if terms is None:
        return True
    return any(term_matches(t, labels, node_name) for t in terms)


def _show(taint: Taint) -> str:
    key, value, effect = taint
    return f"{key}={value}:{effect}" if value else f"{key}:{effect}"


def _gib(n: float) -> str:
    return f"{n / 2**30:.1f} GiB"


def node_refusal(pod: PodRules, node: NodeRules, allocatable_cpu_millis: float,
                 allocatable_memory_bytes: float, used_cpu_millis: float,
                 used_memory_bytes: float) -> Refusal | None:
    """Why kube-scheduler's node filters would not have chosen ``node`` for ``pod``, or None.

    ``used_*``: what the pods counted on the node already request (the pod itself excluded).
    Allocatable 0 means the node reports none: not checked (the extender cannot tell "none" from
    "not reported" for a node it read without status).
    """
    if node.unschedulable and not any(tolerates(t, UNSCHEDULABLE_TAINT) for t in pod.tolerations):
        return Refusal(CORDONED, f"node {node.name} is cordoned (spec.unschedulable)")
    if (taint := untolerated(pod.tolerations, node.taints)) is not None:
        return Refusal(TAINT, f"node {node.name} has taint {_show(taint)} that the pod does not tolerate")
    for key, value in pod.node_selector:
        if node.labels.get(key) != value:
            return Refusal(NODE_SELECTOR, f"node {node.name} does not match the pod's nodeSelector {key}")
    if not affinity_matches(pod.required_terms, node.labels, node.name):
        return Refusal(NODE_AFFINITY,
                       f"node {node.name} does not match the pod's required node affinity")
    if pod.cpu_millis > 0 and allocatable_cpu_millis > 0:
        free = allocatable_cpu_millis - used_cpu_millis
        if pod.cpu_millis > free:
            return Refusal(CPU, f"node {node.name} has {max(free, 0):.0f}m CPU free; the pod requests "
                                f"{pod.cpu_millis:.0f}m")
    if pod.memory_bytes > 0 and allocatable_memory_bytes > 0:
        free = allocatable_memory_bytes - used_memory_bytes
        if pod.memory_bytes > free:
            return Refusal(MEMORY, f"node {node.name} has {_gib(max(free, 0))} memory free; the pod "
                                   f"requests {_gib(pod.memory_bytes)}")
    return None
