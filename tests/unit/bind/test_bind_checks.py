"""Bind-time node rules (app/base/bind_checks.py): kube-scheduler's semantics, table by table."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.base.bind_checks import (
    CORDONED,
    CPU,
    MEMORY,
    NODE_AFFINITY,
    NODE_SELECTOR,
    TAINT,
    NodeRules,
    PodRules,
    Requirement,
    Taint,
    Toleration,
    affinity_matches,
    label_requirement_matches,
    node_refusal,
    node_rules,
    required_terms_of,
    tolerates,
    tolerations_of,
)

GPU_TAINT: Taint = ("nvidia.com/gpu", "present", "NoSchedule")


@pytest.mark.parametrize(("toleration", "taint", "expected"), [
    (("nvidia.com/gpu", "Equal", "present", "NoSchedule"), GPU_TAINT, True),
    (("nvidia.com/gpu", "", "present", "NoSchedule"), GPU_TAINT, True),  # no operator means Equal
    (("nvidia.com/gpu", "Equal", "absent", "NoSchedule"), GPU_TAINT, False),  # value differs
    (("nvidia.com/gpu", "Exists", "", "NoSchedule"), GPU_TAINT, True),  # Exists ignores the value
    (("nvidia.com/gpu", "Exists", "", ""), GPU_TAINT, True),  # empty effect: every effect
    (("nvidia.com/gpu", "Exists", "", "NoExecute"), GPU_TAINT, False),  # other effect
    (("other", "Exists", "", ""), GPU_TAINT, False),  # other key
    (("", "Exists", "", ""), GPU_TAINT, True),  # empty key with Exists: every taint
    (("", "Exists", "", "NoExecute"), GPU_TAINT, False),  # ... of that effect only
    (("dedicated", "Equal", "", "NoExecute"), ("dedicated", "", "NoExecute"), True),  # both empty values
    (("nvidia.com/gpu", "Gt", "1", "NoSchedule"), GPU_TAINT, True),  # unknown operator: never refuse
])
def test_toleration_semantics(toleration: Toleration, taint: Taint, expected: bool) -> None:
    assert tolerates(toleration, taint) is expected


LABELS = {"zone": "a", "cores": "64", "gpu": "h100", "empty": ""}


@pytest.mark.parametrize(("req", "expected"), [
    (("zone", "In", ("a", "b")), True),
    (("zone", "In", ("b",)), False),
    (("missing", "In", ("a",)), False),
    (("zone", "NotIn", ("b",)), True),
    (("zone", "NotIn", ("a",)), False),
    (("missing", "NotIn", ("a",)), True),  # an absent label is not in any set
    (("zone", "Exists", ()), True),
    (("empty", "Exists", ()), True),  # present with an empty value
    (("missing", "Exists", ()), False),
    (("missing", "DoesNotExist", ()), True),
    (("zone", "DoesNotExist", ()), False),
    (("cores", "Gt", ("32",)), True),
    (("cores", "Gt", ("64",)), False),
    (("cores", "Lt", ("65",)), True),
    (("cores", "Lt", ("64",)), False),
    (("zone", "Gt", ("1",)), False),  # a label that is not an integer
    (("missing", "Lt", ("1",)), False),
    (("cores", "Gt", ("1", "2")), False),  # Gt takes exactly one value
    (("zone", "Near", ("a",)), False),  # not an operator: the term matches nothing
])
def test_label_requirement_semantics(req: Requirement, expected: bool) -> None:
    assert label_requirement_matches(req, LABELS) is expected


def _affinity(*terms: dict[str, Any]) -> dict[str, Any]:
    return {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": list(terms)}}}}


@pytest.mark.parametrize(("spec", "node", "expected"), [
    ({}, "n1", True),  # no required affinity: every node
    (_affinity({"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}), "n1", True),
    (_affinity({"matchExpressions": [{"key": "zone", "operator": "In", "values": ["b"]}]}), "n1", False),
    # Terms are ORed.
    (_affinity({"matchExpressions": [{"key": "zone", "operator": "In", "values": ["b"]}]},
               {"matchExpressions": [{"key": "gpu", "operator": "Exists"}]}), "n1", True),
    # Requirements of one term are ANDed.
    (_affinity({"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]},
                                     {"key": "gpu", "operator": "In", "values": ["a100"]}]}), "n1", False),
    # matchFields: metadata.name.
    (_affinity({"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}), "n1", True),
    (_affinity({"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n2"]}]}), "n1", False),
    (_affinity({"matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": ["n2"]}]}), "n1", True),
    (_affinity({"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}],
                "matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n2"]}]}), "n1", False),
    (_affinity({}), "n1", False),  # an empty term matches no node
])
def test_required_node_affinity(spec: dict[str, Any], node: str, expected: bool) -> None:
    assert affinity_matches(required_terms_of(spec), LABELS, node) is expected


BIG = NodeRules("big", {"zone": "a", "kubernetes.io/hostname": "big"})
NODE_CPU, NODE_MEM = 4000.0, 16 * 2.0**30  # a 4-CPU, 16 GiB node


def _pod(**kw: Any) -> PodRules:
    return PodRules(**{"cpu_millis": 1000.0, "memory_bytes": 2.0**30, **kw})


@pytest.mark.parametrize(("pod", "node", "used", "reason"), [
    (_pod(), BIG, (0.0, 0.0), None),
    # Cordoned, unless the pod tolerates the unschedulable taint (as DaemonSets do).
    (_pod(), NodeRules("big", {}, unschedulable=True), (0.0, 0.0), CORDONED),
    (_pod(tolerations=(("node.kubernetes.io/unschedulable", "Exists", "", "NoSchedule"),)),
     NodeRules("big", {}, unschedulable=True), (0.0, 0.0), None),
    (_pod(), NodeRules("big", {}, taints=(GPU_TAINT,)), (0.0, 0.0), TAINT),
    (_pod(), NodeRules("big", {}, taints=(("x", "", "NoExecute"),)), (0.0, 0.0), TAINT),
    (_pod(tolerations=(("nvidia.com/gpu", "Exists", "", ""),)), NodeRules("big", {}, taints=(GPU_TAINT,)),
     (0.0, 0.0), None),
    (_pod(node_selector=(("zone", "b"),)), BIG, (0.0, 0.0), NODE_SELECTOR),
    (_pod(node_selector=(("zone", "a"),)), BIG, (0.0, 0.0), None),
    (_pod(required_terms=(((("zone", "In", ("b",)),), ()),)), BIG, (0.0, 0.0), NODE_AFFINITY),
    (_pod(cpu_millis=64000.0), BIG, (0.0, 0.0), CPU),  # a 64-CPU pod on a 4-CPU node
    (_pod(cpu_millis=1000.0), BIG, (3500.0, 0.0), CPU),  # what others hold counts
    (_pod(cpu_millis=1000.0), BIG, (3000.0, 0.0), None),  # exactly fits
    (_pod(memory_bytes=17 * 2.0**30), BIG, (0.0, 0.0), MEMORY),
    (_pod(cpu_millis=0.0, memory_bytes=0.0), BIG, (9e9, 9e99), None),  # requests nothing: fits anywhere
])
def test_node_refusal(pod: PodRules, node: NodeRules, used: tuple[float, float], reason: str | None) -> None:
    got = node_refusal(pod, node, NODE_CPU, NODE_MEM, *used)
    assert (got.reason if got else None) == reason
    if got is not None:
        assert node.name in got.message


def test_node_rules_keep_only_hard_taints_and_string_labels() -> None:
    rules = node_rules({"metadata": {"name": "n", "labels": {"a": "1", "b": 2}},
                        "spec": {"unschedulable": True, "taints": [
                            {"key": "soft", "effect": "PreferNoSchedule"},
                            {"key": "hard", "value": "v", "effect": "NoSchedule"},
                            {"key": "gone", "effect": "NoExecute"}, "junk"]}})
    assert rules == NodeRules("n", {"a": "1"}, True, (("hard", "v", "NoSchedule"), ("gone", "", "NoExecute")))
    # Odd shapes never raise: they read as nothing.
    assert node_rules({"metadata": "x", "spec": []}) == NodeRules("", {})
    assert tolerations_of({"tolerations": "all"}) == ()
    assert required_terms_of({"affinity": {"nodeAffinity": []}}) is None


keys = st.sampled_from(["a", "b", "c"])
values = st.sampled_from(["1", "2", "x"])


@given(st.dictionaries(keys, values), st.lists(st.tuples(keys, values, st.sampled_from(["NoSchedule", "NoExecute"])),
                                                max_size=4))
def test_a_pod_tolerating_everything_is_never_refused_for_taints(labels: dict[str, str],
                                                                  taints: list[Taint]) -> None:
    # The wildcard toleration (empty key, Exists) tolerates every taint, as in Kubernetes.
    pod = PodRules(tolerations=(("", "Exists", "", ""),))
    assert node_refusal(pod, NodeRules("n", labels, True, tuple(taints)), 0, 0, 0, 0) is None


@given(st.dictionaries(keys, values), keys, st.lists(values, min_size=1, max_size=3))
def test_in_and_not_in_are_complements(labels: dict[str, str], key: str, vals: list[str]) -> None:
    inside = label_requirement_matches((key, "In", tuple(vals)), labels)
    outside = label_requirement_matches((key, "NotIn", tuple(vals)), labels)
    assert inside != outside


def test_tolerations_and_affinity_reach_the_spec_but_do_not_split_a_gangs_shapes() -> None:
    # kube-scheduler applies them through the nodes it offers each member; the gang plan treats
    # members that differ only there as interchangeable (a member tolerating a taint later, as
    # the integration suite's held members do, must not change the plan).
    from app.base.objects import pod_object
    from app.base.workload import parse_workload
    from app.gang.instance import shape_key

    plain = pod_object("m-0", gpus=8, stage="pretraining")
    tolerant = pod_object("m-1", gpus=8, stage="pretraining")
    tolerant["spec"]["tolerations"] = [{"key": "hold", "operator": "Exists", "effect": "NoSchedule"}]
    tolerant["spec"].update(_affinity({"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}))
    a, b = parse_workload(plain), parse_workload(tolerant)
    assert b.tolerations == (("hold", "Exists", "", "NoSchedule"),)
    assert b.required_terms == (((("zone", "In", ("a",)),), ()),)
    assert a.tolerations == () and a.required_terms is None
    assert shape_key(a) == shape_key(b)
