"""A DRA gang replanned after a failed bind: members whose claims kube-scheduler already allocated.

A bind answered with an error after DynamicResources' PreBind (a barrier round given up, a replan,
an aborted round) leaves the member's claims allocated on its old node; kube-scheduler then offers
that member that node alone. The replan must read those GPUs as the member's own and must not take
that one node for what its siblings are offered (docs/gangs.md, "Gangs with DRA claims").
"""

from __future__ import annotations

import json
from typing import Any

from app.base.catalog import GpuCatalog
from app.base.objects import node_object, pod_object
from app.base.workload import parse_workload
from app.cluster.cache import apply_node
from app.config.settings import Settings
from app.extender.service import ExtenderService
from app.extender.wiring import build_core
from tests.unit.dra.dra_fixtures import GPU_CLASS, claim, gpu, request, result, slice_

TIER0 = "fabric.topograph.run/tier-0"
# Leaf a: 8 GPUs; leaf b: 8 + 4. Three 4-GPU members in one leaf fit under leaf b only.
LAYOUT = {"gang-0": ("a", 8), "gang-1": ("b", 8), "gang-2": ("b", 4)}


def _cluster() -> ExtenderService:
    svc = build_core(Settings(cluster_source="none", metrics_port=0), GpuCatalog.load())
    dra = svc.snapshot.dra
    dra.reads_claims = True  # as the claim watch sets it once it has listed
    dra.put_class(GPU_CLASS)
    for name, (leaf, count) in LAYOUT.items():
        dra.put_slice(slice_(name, [gpu(i) for i in range(count)]))
        apply_node(svc.snapshot, svc.catalog, svc.settings,
                   node_object(name, rdma=True, labels={TIER0: f"leaf-{leaf}"}))
    return svc


def _member(i: int) -> dict[str, Any]:
    pod = pod_object(f"g-{i}", namespace="ml", stage="pretraining", gpus=0, uid=f"u-g-{i}",
                     annotations={"llm-placement.io/gang-size": "3",
                                  "llm-placement.io/topology-required-placement": TIER0},
                     labels={"scheduling.x-k8s.io/pod-group": "g"})
    pod["spec"]["resourceClaims"] = [{"name": "gpus", "resourceClaimName": f"c-{i}"}]
    return pod


def _filter(svc: ExtenderService, pod: dict[str, Any], nodes: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = json.loads(svc.filter(json.dumps({"Pod": pod, "NodeNames": nodes}).encode()))
    return out


def _first_claim_allocated_on(node: str, count: int) -> tuple[ExtenderService, list[dict[str, Any]]]:
    """The cluster, with g-0's claim allocated on ``node`` (``count`` GPUs, reserved for nobody:
    its bind failed after PreBind) and the other two members' claims not allocated yet."""
    svc = _cluster()
    dra = svc.snapshot.dra
    dra.put_claim(claim("c-0", request(count=4), namespace="ml", node=node,
                        results=[result(node, f"gpu-{i}") for i in range(count)]))
    for i in (1, 2):
        dra.put_claim(claim(f"c-{i}", request(count=4), namespace="ml"))
    svc.snapshot.refresh_dra(nodes=LAYOUT, claims=[f"ml/c-{i}" for i in range(3)])
    pods = [_member(i) for i in range(3)]
    for p in pods:
        svc.snapshot.track_spec(parse_workload(p, claims=svc.snapshot.claim_reader()))
    return svc, pods


def test_a_member_whose_claim_stayed_allocated_is_planned_on_its_node_with_its_own_gpus() -> None:
    svc, pods = _first_claim_allocated_on("gang-1", 4)
    assert svc.snapshot.free_gpus("gang-1") == 4  # the claim counts as busy on its node
    # kube-scheduler offers g-0 the node its claim is allocated on, and nothing else.
    first = _filter(svc, pods[0], ["gang-1"])
    assert first["NodeNames"] == ["gang-1"], first
    rest = [_filter(svc, p, sorted(LAYOUT))["NodeNames"] for p in pods[1:]]
    # Leaf b holds the gang only if g-0's 4 GPUs on gang-1 count as its own: 8 on gang-1 (g-0 and
    # one more) and 4 on gang-2.
    assert sorted(n for names in rest for n in names) == ["gang-1", "gang-2"], rest


def test_siblings_are_not_confined_to_the_node_a_claim_pins_the_filtered_member_to() -> None:
    # g-0's claim holds the whole of gang-2 (4 GPUs).
    svc, pods = _first_claim_allocated_on("gang-2", 4)
    first = _filter(svc, pods[0], ["gang-2"])
    assert first["NodeNames"] == ["gang-2"], first
    rest = [_filter(svc, p, sorted(LAYOUT))["NodeNames"] for p in pods[1:]]
    assert rest == [["gang-1"], ["gang-1"]], rest
