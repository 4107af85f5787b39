"""Gangs named by Volcano (docs/gangs.md): the pod's group-name annotation, the size from Volcano's
PodGroup ``spec.minMember`` (``scheduling.volcano.sh/v1beta1``) unless ``gang-size`` says it."""

from __future__ import annotations

from typing import Any

import pytest

from app.base.objects import pod_object
from app.base.workload import parse_workload
from app.gang.kube import VOLCANO
from tests.unit.gang.test_gang_coordinator import Cluster
from tests.unit.gang.test_gang_native import follow_once

ANN = "llm-placement.io/"


def volcano_pod(name: str, group: str, key: str = "scheduling.k8s.io/group-name", gpus: int = 8,
                annotations: dict[str, str] | None = None) -> dict[str, Any]:
    return pod_object(name, namespace="ml", stage="pretraining", gpus=gpus,
                      annotations={key: group, **(annotations or {})})


def pod_group(name: str, min_member: Any, ns: str = "ml") -> dict[str, Any]:
    return {"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "PodGroup",
            "metadata": {"name": name, "namespace": ns}, "spec": {"minMember": min_member, "queue": "default"}}


@pytest.mark.parametrize("key", ["scheduling.k8s.io/group-name", "scheduling.volcano.sh/group-name"])
def test_either_volcano_annotation_names_the_gang(key: str) -> None:
    gang = parse_workload(volcano_pod("p", "job-a", key=key)).gang
    assert gang is not None and gang.key == "ml/job-a" and gang.volcano and gang.size is None


def test_a_volcano_gang_takes_its_size_from_volcanos_pod_group_only() -> None:
    c = Cluster()
    c.nodes("n", 4, "leaf-1")
    pods = [volcano_pod(f"g-{i}", "g") for i in range(3)]
    for p in pods:
        c.add(p)
    # A coscheduling PodGroup of the same name is another object: its size is not this gang's.
    c.service.snapshot.podgroup_min_member["ml/g"] = 2
    first = c.filter(pods[0])
    assert first.passed == [], first
    c.service.snapshot.volcano_min_member["ml/g"] = 3
    chosen = [c.filter(p).passed for p in pods]
    assert all(len(n) == 1 for n in chosen) and len({n[0] for n in chosen}) == 3, chosen


def test_gang_size_annotation_comes_before_the_pod_group() -> None:
    c = Cluster()
    c.nodes("n", 4, "leaf-1")
    pods = [volcano_pod(f"g-{i}", "g", annotations={ANN + "gang-size": "2"}) for i in range(2)]
    for p in pods:
        c.add(p)
    c.service.snapshot.volcano_min_member["ml/g"] = 5
    assert all(len(c.filter(p).passed) == 1 for p in pods)


def test_watcher_lists_and_follows_volcano_pod_groups() -> None:
    snapshot, calls = follow_once(VOLCANO, [pod_group("g", 3), pod_group("bad", "3")],
                                  [{"type": "ADDED", "object": pod_group("late", 4)},
                                   {"type": "DELETED", "object": pod_group("g", 3)}])
    assert calls[0][:3] == ("scheduling.volcano.sh", "v1beta1", "podgroups")
    assert snapshot.volcano_min_member == {"ml/late": 4}
    assert snapshot.podgroup_min_member == {}
