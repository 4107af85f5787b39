"""Prefill/decode pairs of one serving-group kept close: a data-gravity edge to the placed partners of
the other role, a preference by default and a rule with colocation (docs/data-gravity.md)."""

from __future__ import annotations

from typing import Any

import pytest

from app.base.catalog import GpuCatalog
from app.base.objects import node_object, pod_object
from app.base.workload import WorkloadError, WorkloadSpec, parse_workload
from app.cluster.cache import apply_pod
from app.config.settings import Settings
from app.extender.explain import explain_spec
from app.extender.service import ExtenderService
from app.extender.wiring import build_core
from app.placement.gravity import SERVING_GROUP, GravityModel
from app.snapshot.nodes import node_facts
from app.snapshot.store import ClusterSnapshot, placed_from_spec

CATALOG = GpuCatalog.load()
SETTINGS = Settings(cluster_source="none", metrics_port=0)
ANN = "llm-placement.io/"
H100 = "NVIDIA-H100-80GB-HBM3"


def node(name: str, clique: str, t0: str, t1: str, product: str = H100, zone: str = "zone-a") -> dict[str, Any]:
    labels = {"nvidia.com/gpu.clique": clique, "fabric.topograph.run/tier-0": t0,
              "fabric.topograph.run/tier-1": t1, "topology.kubernetes.io/zone": zone}
    return node_object(name, gpus=8, product=product, labels=labels)


# n1 and n2 share an NVLink domain; n3 shares n1's leaf only; n4 its spine only; n5 its zone only.
NODES = [node("n1", "c1", "leaf-1", "spine-1"), node("n2", "c1", "leaf-1", "spine-1"),
         node("n3", "c3", "leaf-1", "spine-1"), node("n4", "c4", "leaf-2", "spine-1"),
         node("n5", "c5", "leaf-3", "spine-2")]
NAMES = [n["metadata"]["name"] for n in NODES]


def pod(name: str, role: str | None, group: str | None = "chat", *, namespace: str = "ml",
        colocation: str | None = None, **extra: str) -> dict[str, Any]:
    ann = {ANN + "model-params": "8B", ANN + "latency-class": "batch"}
    if role is not None:
        ann[ANN + "serving-role"] = role
    if group is not None:
        ann[ANN + "serving-group"] = group
    if colocation is not None:
        ann[ANN + "colocation"] = colocation
    ann.update({ANN + k: v for k, v in extra.items()})
    return pod_object(name, namespace=namespace, stage="serving", gpus=1, annotations=ann,
                      uid=f"uid-{namespace}-{name}")


def world() -> tuple[ClusterSnapshot, GravityModel]:
    snap = ClusterSnapshot()
    for n in NODES:
        snap.upsert_node(node_facts(n, CATALOG, SETTINGS.labels))
    return snap, GravityModel(snap, SETTINGS.policies().gravity)


def run(snap: ClusterSnapshot, s: WorkloadSpec, at: str) -> None:
    snap.track_spec(s)
    snap.place(placed_from_spec(s, at))


def test_the_annotation_is_parsed_and_validated() -> None:
    assert parse_workload(pod("p", "prefill")).serving_group == "chat"
    with pytest.raises(WorkloadError, match="serving-group applies to stage serving, not alignment"):
        parse_workload(pod_object("t", stage="sft", annotations={ANN + "serving-group": "chat"}))
    with pytest.raises(WorkloadError, match=r"serving-group .* is longer than 317 characters"):
        parse_workload(pod("p", "prefill", group="g" * 400))
    assert parse_workload(pod("p", "decode", colocation="leaf")).colocation_required == "leaf"
    with pytest.raises(WorkloadError, match="not required, node, nvlink, leaf, fabric or zone"):
        parse_workload(pod("p", "decode", colocation="rack"))


def test_a_decode_pod_is_pulled_to_its_prefill_partners_domain_then_leaf() -> None:
    snap, g = world()
    run(snap, parse_workload(pod("prefill-0", "prefill")), "n1")
    term = g.term(parse_workload(pod("decode-0", "decode")), NAMES)
    assert term is not None
    v = {n: term(n) or 0.0 for n in NAMES}
    # Same node, then the NVLink domain, then the leaf switch, then the spine, then the zone.
    assert v["n1"] == 1.0
    assert v["n1"] > v["n2"] > v["n3"] > v["n4"] > v["n5"] > 0
    # And the reverse: a prefill pod follows a placed decode pod.
    snap2, g2 = world()
    run(snap2, parse_workload(pod("decode-0", "decode")), "n4")
    back = g2.term(parse_workload(pod("prefill-0", "prefill")), NAMES)
    assert back is not None and back("n4") == 1.0 and (back("n1") or 0.0) < 1.0


def test_the_negligible_transfer_allowance_does_not_flatten_a_partners_pull() -> None:
    """gravity_negligible_seconds is for one-time reads: a partner edge (nominal 1 GB, a second at
    most) keeps the pure ratio, or prefill and decode would drift apart for a few cents an hour."""
    assert SETTINGS.gravity_negligible_seconds > 0
    snap, g = world()
    run(snap, parse_workload(pod("prefill-0", "prefill")), "n1")
    term = g.term(parse_workload(pod("decode-0", "decode")), NAMES)
    assert term is not None
    edges = [e for e in g.resolve(parse_workload(pod("decode-0", "decode"))) if e.found]
    cost = g.cost_fn(edges)
    best = min(c for n in NAMES if (c := cost(n)) is not None)
    far = cost("n5")
    assert far is not None and term("n5") == pytest.approx(best / far)
    assert (term("n5") or 1.0) < 0.5


def test_only_partners_of_the_other_role_in_the_same_namespace_pull() -> None:
    snap, g = world()
    run(snap, parse_workload(pod("decode-a", "decode")), "n1")  # same role as the pod below
    run(snap, parse_workload(pod("prefill-x", "prefill", namespace="other")), "n1")  # another tenant
    run(snap, parse_workload(pod("prefill-y", "prefill", group="other-group")), "n1")
    decode = parse_workload(pod("decode-b", "decode"))
    assert g.term(decode, NAMES) is None  # no placed partner: no pull
    (edge,) = g.resolve(decode)
    assert edge.kind == SERVING_GROUP and not edge.found
    assert "no prefill pod of serving-group ml/chat is placed yet" in edge.note
    # Role "both" (the default) and pods without a group have no edge at all.
    assert g.resolve(parse_workload(pod("mono", None))) == []
    assert g.resolve(parse_workload(pod("solo", "decode", group=None))) == []


def test_colocation_makes_it_a_rule_and_the_first_pod_is_never_blocked() -> None:
    snap, g = world()
    first = parse_workload(pod("prefill-0", "prefill", colocation="leaf"))
    assert g.hard_rejections(first, NAMES) == {}  # nobody to be close to yet
    run(snap, first, "n1")
    leaf = g.hard_rejections(parse_workload(pod("decode-0", "decode", colocation="leaf")), NAMES)
    assert set(NAMES) - set(leaf) == {"n1", "n2", "n3"}  # n1's NVLink domain and its leaf switch
    assert leaf["n4"].message.endswith(
        "must run in the same NVLink domain or leaf switch as its serving-group partner")
    nvlink = g.hard_rejections(parse_workload(pod("decode-1", "decode", colocation="nvlink")), NAMES)
    assert set(NAMES) - set(nvlink) == {"n1", "n2"}
    # Without colocation it stays a preference.
    assert g.hard_rejections(parse_workload(pod("decode-2", "decode")), NAMES) == {}


def test_leaf_also_applies_to_producers() -> None:
    snap, g = world()
    producer = parse_workload(pod_object("ckpt", namespace="ml", stage="pretraining", gpus=8,
                                         uid="uid-ckpt"))
    run(snap, producer, "n1")
    consumer = parse_workload(pod("eval", None, group=None, colocation="leaf", **{"depends-on": "ckpt"}))
    assert set(NAMES) - set(g.hard_rejections(consumer, NAMES)) == {"n1", "n2", "n3"}


@pytest.fixture
def service() -> ExtenderService:
    svc = build_core(SETTINGS, CATALOG)
    # Identical H100 boxes: n1 and n2 in NVLink domain c1, n3 on their leaf, "far" elsewhere.
    for n in NODES[:3]:
        svc.absorb_node(n)
    svc.absorb_node(node("far", "c9", "leaf-9", "spine-9"))
    return svc


def test_the_placer_ranks_the_partners_domain_first(service: ExtenderService) -> None:
    snap = service.snapshot
    run(snap, parse_workload(pod("prefill-0", "prefill")), "n1")
    decode = parse_workload(pod("decode-0", "decode"))
    # The prefill pod's own box is left out (as if full): the best left is its NVLink domain.
    fits, _ = service.placer.evaluate_nodes(decode, ["n2", "n3", "far"])
    scores = {s.node: s for s in service.placer.score(decode, list(fits.values()))}
    assert scores["n2"].total > scores["n3"].total > scores["far"].total
    assert scores["n2"].score == 10
    # The pull is the only difference: without the group the three boxes tie.
    alone = parse_workload(pod("decode-9", "decode", group=None))
    fits, _ = service.placer.evaluate_nodes(alone, ["n2", "n3", "far"])
    totals = {s.total for s in service.placer.score(alone, list(fits.values()))}
    assert len(totals) == 1
    out = explain_spec(service, decode)
    assert out["gravity"]["edges"][0]["producer"] == "ml/chat (prefill)"
    assert {e["node"]: e for e in out["nodes"]}["n2"]["gravity"]["edges"][0]["distance"] == "nvlink"


def test_the_cache_keeps_bound_partners_so_the_group_resolves() -> None:
    # The watch keeps no spec for an ordinary bound pod; a serving-group member's role must stay known.
    snap, g = world()
    bound = pod("prefill-0", "prefill")
    bound["spec"]["nodeName"] = "n3"
    bound["status"]["phase"] = "Running"
    apply_pod(snap, SETTINGS, bound)
    term = g.term(parse_workload(pod("decode-0", "decode")), NAMES)
    assert term is not None and term("n3") == 1.0
    apply_pod(snap, SETTINGS, bound, deleted=True)
    assert snap.serving_groups == {}
    assert g.term(parse_workload(pod("decode-0", "decode")), NAMES) is None
