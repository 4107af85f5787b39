"""Data gravity: resolving depends-on edges, the transfer-cost ladder, the score term, the colocation
filter, bind-time metrics and explain output; plus the default-scheduler baseline used to judge it."""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.base.catalog import GpuCatalog
from app.base.objects import node_object, pod_object
from app.base.workload import WorkloadSpec, parse_workload
from app.config.settings import Settings
from app.extender.explain import explain_spec
from app.extender.service import ExtenderService
from app.metrics.metrics import Metrics
from app.placement.gravity import LEVELS, MISSING, Distance, GravityModel, within_level
from app.placement.offer import num_feasible_nodes_to_find
from app.placement.placer import Placer
from app.sim.baseline import (
    DefaultScheduler,
    balanced_allocation,
    least_allocated,
)
from app.sim.scheduler import SimScheduler
from app.snapshot.nodes import NodeFacts, node_facts
from app.snapshot.store import ClusterSnapshot, placed_from_spec

CATALOG = GpuCatalog.load()
SETTINGS = Settings()
H100 = "NVIDIA-H100-80GB-HBM3"
ANN = "llm-placement.io/"
BW = SETTINGS.tier_bandwidth_gbps
# The hop ladder with the default bandwidths and the three default non-zone fabric tiers.
S_NODE = 1 / BW.same_node
S_NVLINK = S_NODE + 1 / BW.same_nvlink_domain
S_FABRIC = [S_NVLINK + (i + 1) / BW.same_fabric_tier for i in range(3)]
S_ZONE = S_FABRIC[-1] + 1 / BW.same_zone
S_CROSS = S_ZONE + 1 / BW.cross_zone


def facts(
    name: str,
    *,
    gpus: int = 8,
    clique: str | None = None,
    t0: str | None = None,
    t1: str | None = None,
    zone: str | None = "zone-a",
    node_class: str | None = None,
) -> NodeFacts:
    labels: dict[str, str] = {}
    if clique:
        labels["nvidia.com/gpu.clique"] = clique
    if t0:
        labels["fabric.topograph.run/tier-0"] = t0
    if t1:
        labels["fabric.topograph.run/tier-1"] = t1
    if zone:
        labels["topology.kubernetes.io/zone"] = zone
    obj = node_object(name, gpus=gpus, product=H100 if gpus else None, labels=labels, node_class=node_class)
    return node_facts(obj, CATALOG, SETTINGS.labels)


def topology() -> list[NodeFacts]:
    """n1 and n2 share an NVLink domain; n3 shares n1's leaf; n4 only its spine; n5 only its zone."""
    return [
        facts("n1", clique="c1", t0="leaf-1", t1="spine-1"),
        facts("n2", clique="c1", t0="leaf-1", t1="spine-1"),
        facts("n3", clique="c3", t0="leaf-1", t1="spine-1"),
        facts("n4", clique="c4", t0="leaf-2", t1="spine-1"),
        facts("n5", clique="c5", t0="leaf-3", t1="spine-2"),
        facts("n6", clique="c6", t0="leaf-9", t1="spine-9", zone="zone-b"),
        facts("cpu1", gpus=0, t0="leaf-1", t1="spine-1", node_class="cpu"),
        facts("cpu2", gpus=0, t0="leaf-3", t1="spine-2", node_class="cpu"),
    ]


class Clock:
    def __init__(self, t: float = 1_000_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def world(
    nodes: list[NodeFacts] | None = None, **kw: Any
) -> tuple[ClusterSnapshot, GravityModel, Clock]:
    snap = ClusterSnapshot()
    for f in nodes if nodes is not None else topology():
        snap.upsert_node(f)
    clock = Clock()
    return snap, GravityModel(snap, SETTINGS.policies().gravity, clock=clock, **kw), clock


def spec(
    name: str,
    *,
    namespace: str = "ml",
    stage: str | None = "alignment",
    gpus: int = 1,
    depends: str | None = None,
    gb: float | None = None,
    colocation: str | None = None,
    gang: str | None = None,
    gang_size: int = 2,
) -> WorkloadSpec:
    ann: dict[str, str] = {}
    if depends is not None:
        ann[ANN + "depends-on"] = depends
    if gb is not None:
        ann[ANN + "input-data-gb"] = str(gb)
    if colocation is not None:
        ann[ANN + "colocation"] = colocation
    labels: dict[str, str] = {}
    if gang is not None:
        labels["scheduling.x-k8s.io/pod-group"] = gang
        ann[ANN + "gang-size"] = str(gang_size)
    pod = pod_object(name, namespace=namespace, stage=stage, gpus=gpus, annotations=ann, labels=labels,
                     uid=f"uid-{namespace}-{name}")
    return parse_workload(pod)


def run(snap: ClusterSnapshot, s: WorkloadSpec, node: str) -> None:
    snap.track_spec(s)
    snap.place(placed_from_spec(s, node))


def finish(snap: ClusterSnapshot, s: WorkloadSpec, at: float) -> None:
    snap.untrack_spec(s.uid)
    snap.finish(s.uid, now=at)


# --- distance and the cost ladder -----------------------------------------------------------------
def test_distance_classifies_every_tier() -> None:
    snap, g, _ = world()
    n = snap.nodes
    assert g.distance(n["n1"], n["n1"]) == (Distance.NODE, -1)
    assert g.distance(n["n1"], n["n2"]) == (Distance.NVLINK, -1)
    assert g.distance(n["n1"], n["n3"]) == (Distance.FABRIC, 0)  # same leaf
    assert g.distance(n["n1"], n["n4"]) == (Distance.FABRIC, 1)  # same spine only
    assert g.distance(n["n1"], n["n5"]) == (Distance.ZONE, -1)  # the zone tier is not a fabric tier
    assert g.distance(n["n1"], n["n6"]) == (Distance.CROSS_ZONE, -1)
    assert g.distance(n["cpu1"], n["n3"]) == (Distance.FABRIC, 0)  # CPU->GPU: "next to" = same leaf


def test_unlabelled_nodes_share_a_zone_but_not_a_fabric_tier() -> None:
    snap, g, _ = world([facts("a", zone=None), facts("b", zone=None), facts("c", zone="z")])
    n = snap.nodes
    assert g.distance(n["a"], n["b"]) == (Distance.ZONE, -1)
    assert g.distance(n["a"], n["c"]) == (Distance.CROSS_ZONE, -1)


def test_cost_at_each_tier_follows_the_hop_ladder() -> None:
    snap, g, _ = world()
    run(snap, spec("producer", stage="pretraining", gpus=8), "n1")
    edges = g.resolve(spec("c", depends="producer", gb=100))
    expected = {"n1": S_NODE, "n2": S_NVLINK, "n3": S_FABRIC[0], "n4": S_FABRIC[1], "n5": S_ZONE,
                "n6": S_CROSS}
    for node, s_per_gb in expected.items():
        assert g.cost(edges, node) == pytest.approx(100 * s_per_gb), node
    costs = [g.cost(edges, n) or 0.0 for n in expected]
    assert costs == sorted(costs) and len(set(costs)) == len(costs)  # strictly grows with distance


def test_same_node_is_cheapest_even_when_nvlink_is_configured_faster_than_local_disk() -> None:
    # Defaults: NVLink 50 GB/s > local 20 GB/s. A per-tier figure alone would prefer a neighbour.
    assert BW.same_nvlink_domain > BW.same_node
    snap, g, _ = world()
    run(snap, spec("p", gpus=8), "n1")
    term = g.term(spec("c", depends="p"), ["n1", "n2"])
    assert term is not None
    assert term("n1") == 1.0 and (term("n2") or 1.0) < 1.0


def test_custom_bandwidths_are_used() -> None:
    custom = Settings(tier_bandwidth_gbps={"same_node": 10, "same_nvlink_domain": 10, "same_fabric_tier": 5,
                                           "same_zone": 2, "cross_zone": 1})
    snap = ClusterSnapshot()
    for f in topology():
        snap.upsert_node(f)
    g = GravityModel(snap, custom.policies().gravity)
    assert g.seconds_per_gb(Distance.NODE) == pytest.approx(0.1)
    assert g.seconds_per_gb(Distance.NVLINK) == pytest.approx(0.2)
    assert g.seconds_per_gb(Distance.FABRIC, 0) == pytest.approx(0.4)
    assert g.seconds_per_gb(Distance.ZONE) == pytest.approx(0.2 + 3 * 0.2 + 0.5)


# --- resolution -----------------------------------------------------------------------------------
def test_bare_name_resolves_in_the_consumers_namespace_only() -> None:
    snap, g, _ = world()
    run(snap, spec("prep", namespace="other", stage="data-prep", gpus=0), "cpu2")
    [edge] = g.resolve(spec("c", namespace="ml", depends="prep"))
    assert edge.producer == "ml/prep" and not edge.found
    run(snap, spec("prep", namespace="ml", stage="data-prep", gpus=0), "cpu1")
    [edge] = g.resolve(spec("c", namespace="ml", depends="prep"))
    assert edge.found and edge.sites[0].node == "cpu1"


def test_cross_namespace_name_resolves_there_when_that_namespace_shares() -> None:
    snap, g, _ = world()
    run(snap, spec("prep", namespace="data", stage="data-prep", gpus=0), "cpu2")
    snap.namespace_shares["data"] = frozenset({"ml"})
    [edge] = g.resolve(spec("c", namespace="ml", depends="data/prep"))
    assert edge.producer == "data/prep"
    assert [(s.node, s.state, s.share) for s in edge.sites] == [("cpu2", "bound", 1.0)]
    snap.namespace_shares["data"] = frozenset({"*"})
    assert g.resolve(spec("c", namespace="ml", depends="data/prep"))[0].found


def test_cross_namespace_without_opt_in_is_no_leak_and_no_oracle() -> None:
    snap, g, _ = world()
    run(snap, spec("secret2", namespace="b", stage="data-prep", gpus=0), "cpu2")
    snap.namespace_shares["b"] = frozenset({"c"})  # shares, but not with "a"
    real = spec("x", namespace="a", depends="b/secret2", colocation="node")
    ghost = spec("x", namespace="a", depends="b/does-not-exist", colocation="node")
    [e_real], [e_ghost] = g.resolve(real), g.resolve(ghost)
    assert not e_real.found and not e_ghost.found
    # Same words whether the producer exists or not (only the name the user typed differs).
    assert e_real.note.replace("secret2", "?") == e_ghost.note.replace("does-not-exist", "?")
    nodes = ["cpu1", "cpu2", "n1"]
    r_real, r_ghost = g.hard_rejections(real, nodes), g.hard_rejections(ghost, nodes)
    assert set(r_real) == set(r_ghost) == set(nodes)  # not pulled to secret2's node
    assert g.term(real, nodes) is None
    assert r_real["cpu2"].message.replace("secret2", "?") == r_ghost["cpu2"].message.replace(
        "does-not-exist", "?")


def test_depends_on_dedup_is_linear() -> None:
    import time

    _, g, _ = world()
    many = WorkloadSpec(namespace="ml", name="c", depends_on=tuple(f"p{i % 20000}" for i in range(36_000)))
    t0 = time.perf_counter()
    edges = g.resolve(many)
    assert time.perf_counter() - t0 < 0.5
    assert len(edges) <= 256


def test_missing_producer_is_neutral_and_explained_not_fatal() -> None:
    _, g, _ = world()
    consumer = spec("c", depends="ghost", gb=50)
    [edge] = g.resolve(consumer)
    assert edge.kind == "missing" and "ml/ghost not found" in edge.note
    assert g.term(consumer, ["n1", "n2"]) is None
    assert g.hard_rejections(consumer, ["n1", "n2"]) == {}
    detail = g.explain(consumer, ["n1"])
    assert detail["notes"] and "ml/ghost" in detail["notes"][0]
    assert detail["nodes"]["n1"]["edges"][0]["distance"] == MISSING
    [seen] = g.observe(consumer, "n1")
    assert seen.distance == MISSING and seen.cross_node_gb == 0


def test_finished_producer_is_remembered_then_forgotten_after_the_window() -> None:
    snap, g, clock = world()
    producer = spec("pretrain", stage="pretraining", gpus=8)
    run(snap, producer, "n4")
    finish(snap, producer, at=clock.t)
    consumer = spec("c", depends="pretrain", gb=10)
    clock.t += SETTINGS.producer_memory_seconds - 1
    [edge] = g.resolve(consumer)
    assert [(s.node, s.state) for s in edge.sites] == [("n4", "finished")]
    term = g.term(consumer, ["n4", "n1"])
    assert term is not None and term("n4") == 1.0 and (term("n1") or 1.0) < 1.0
    clock.t += 2  # past the window: the data is assumed cleaned up
    [edge] = g.resolve(consumer)
    assert not edge.found and "finished more than" in edge.note
    assert g.term(consumer, ["n4", "n1"]) is None


def test_forget_finished_before_drops_the_producer() -> None:
    snap, g, clock = world()
    producer = spec("pretrain", stage="pretraining", gpus=8)
    run(snap, producer, "n4")
    finish(snap, producer, at=clock.t)
    assert g.resolve(spec("c", depends="pretrain"))[0].found
    snap.forget_finished_before(clock.t + 1)
    assert not g.resolve(spec("c", depends="pretrain"))[0].found


def test_producer_on_a_deleted_node_is_reported_missing() -> None:
    snap, g, _ = world()
    run(snap, spec("p", gpus=8), "n5")
    snap.remove_node("n5")
    [edge] = g.resolve(spec("c", depends="p"))
    assert not edge.found and "no longer a node" in edge.note


def test_gang_producer_resolves_to_every_members_node_with_shares() -> None:
    snap, g, clock = world()
    members = [spec(f"pt-{i}", stage="pretraining", gpus=8, gang="pt", gang_size=3) for i in range(3)]
    for m, n in zip(members, ["n1", "n1", "n4"], strict=True):
        run(snap, m, n)
    consumer = spec("sft", depends="pt", gb=90)
    [edge] = g.resolve(consumer)
    assert edge.kind == "gang"
    assert {(s.node, round(s.share, 3)) for s in edge.sites} == {("n1", 0.667), ("n4", 0.333)}
    # Each member node holds its share: 60 GB local and 30 GB from the same spine on n1.
    assert g.cost(g.resolve(consumer), "n1") == pytest.approx(60 * S_NODE + 30 * S_FABRIC[1])
    [seen] = g.observe(consumer, "n1")
    assert seen.distance == "node" and seen.cross_node_gb == pytest.approx(30)
    # Members that finished are remembered like pods.
    for m in members:
        finish(snap, m, at=clock.t)
    [edge] = g.resolve(consumer)
    assert {s.state for s in edge.sites} == {"finished"} and len(edge.sites) == 2


def test_gang_producer_falls_back_to_its_reservation_plan() -> None:
    plans = {"ml/pt": ["n2", "n3"]}
    snap, g, _ = world(planned=lambda key: plans.get(key, []))
    for i in range(2):
        snap.track_spec(spec(f"pt-{i}", stage="pretraining", gpus=8, gang="pt"))  # pending, not bound
    [edge] = g.resolve(spec("sft", depends="pt"))
    assert {(s.node, s.state, s.share) for s in edge.sites} == {("n2", "planned", 0.5), ("n3", "planned", 0.5)}


def test_input_is_split_over_edges_and_costs_sum() -> None:
    snap, g, _ = world()
    run(snap, spec("a", gpus=8), "n1")
    run(snap, spec("b", gpus=8), "n5")
    consumer = spec("c", depends="a, b, missing", gb=90)
    edges = g.resolve(consumer)
    assert [e.gb for e in edges] == [30, 30, 30]
    assert g.cost(edges, "n1") == pytest.approx(30 * S_NODE + 30 * S_ZONE)
    term = g.term(consumer, ["n1", "n5", "n3"])
    assert term is not None
    assert term("n1") == term("n5") == 1.0  # symmetric: either producer's node is as good
    assert (term("n3") or 1.0) < 1.0


def test_default_input_when_unset_and_self_edges_ignored() -> None:
    snap, g, _ = world()
    run(snap, spec("a", gpus=8), "n1")
    [edge] = g.resolve(spec("c", depends="a, c, ml/c"))
    assert edge.producer == "ml/a" and edge.gb == 1.0


# --- the score term -------------------------------------------------------------------------------
def pure_ratio(snap: ClusterSnapshot, clock: Clock) -> GravityModel:
    """The term without ``gravity_negligible_seconds``: every speed-up counts fully."""
    return GravityModel(snap, dataclasses.replace(SETTINGS.policies().gravity, negligible_seconds=0.0),
                        clock=clock)


def test_term_is_relative_to_the_best_candidate() -> None:
    snap, _, clock = world()
    g = pure_ratio(snap, clock)
    run(snap, spec("prep", stage="data-prep", gpus=0), "cpu1")
    # A GPU consumer can never share the CPU node: its best candidates (same leaf) score 1.0.
    term = g.term(spec("pt", stage="pretraining", gpus=8, depends="prep"), ["n1", "n3", "n4", "n6"])
    assert term is not None
    assert term("n1") == term("n3") == 1.0
    assert term("n4") == pytest.approx(S_FABRIC[0] / S_FABRIC[1])
    assert term("n6") == pytest.approx(S_FABRIC[0] / S_CROSS)
    assert term("unknown-node") is None
    ideal = g.term(spec("pt", stage="pretraining", gpus=8, depends="prep"))
    assert ideal is not None and ideal("n3") == pytest.approx(S_NODE / S_FABRIC[0])


def test_a_transfer_of_seconds_hardly_pulls_a_transfer_of_hours_does() -> None:
    """The shipped ``gravity_negligible_seconds`` (10 s) is added to both sides of the ratio."""
    snap, g, _ = world()
    t0 = SETTINGS.gravity_negligible_seconds
    assert t0 > 0
    run(snap, spec("prep", stage="data-prep", gpus=0), "cpu1")
    nodes = ["n1", "n6"]
    small = g.term(spec("pt", stage="pretraining", gpus=8, depends="prep", gb=0.5), nodes)
    big = g.term(spec("pt", stage="pretraining", gpus=8, depends="prep", gb=20_000), nodes)
    assert small is not None and big is not None
    assert small("n1") == big("n1") == 1.0
    assert small("n6") == pytest.approx((0.5 * S_FABRIC[0] + t0) / (0.5 * S_CROSS + t0))
    assert small("n6") > 0.9  # seconds either way: packing and price decide
    assert big("n6") == pytest.approx((20_000 * S_FABRIC[0] + t0) / (20_000 * S_CROSS + t0))
    assert big("n6") < 0.5 and big("n6") == pytest.approx(S_FABRIC[0] / S_CROSS, rel=0.05)


def test_placer_places_the_consumer_on_its_producers_node() -> None:
    snap, g, _ = world()
    producer = spec("pretrain", stage="pretraining", gpus=4)
    run(snap, producer, "n5")
    placer = Placer(SETTINGS.policies().placement, snap, gravity=g)
    sim = SimScheduler(placer)
    ann = {ANN + "depends-on": "pretrain", ANN + "input-data-gb": "140", ANN + "model-params": "7B"}
    pod = pod_object("sft", namespace="ml", stage="alignment", gpus=4, annotations=ann)
    placed = sim.schedule(pod)
    assert placed.node == "n5", placed
    assert placed.score is not None and placed.score.terms["gravity"] == 1.0
    # Without the hook the same pod lands by the other terms alone (n1, first by name among equals).
    other = SimScheduler(Placer(SETTINGS.policies().placement, snap))
    assert other.schedule(pod_object("sft2", namespace="ml", stage="alignment", gpus=4,
                                     annotations=ann)).node != "n5"


# --- the colocation filter ------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("level", "allowed"),
    [
        ("required", {"n1"}),
        ("node", {"n1"}),
        ("nvlink", {"n1", "n2"}),
        ("fabric", {"n1", "n2", "n3", "n4", "cpu1"}),
        ("zone", {"n1", "n2", "n3", "n4", "n5", "cpu1", "cpu2"}),
    ],
)
def test_colocation_required_rejects_nodes_outside_the_producers_domain(level: str, allowed: set[str]) -> None:
    snap, g, _ = world()
    run(snap, spec("p", gpus=8), "n1")
    consumer = spec("c", depends="p", colocation=level)
    names = sorted(snap.nodes)
    hard = g.hard_rejections(consumer, names)
    assert set(names) - set(hard) == allowed
    reasons = {r.message for r in hard.values()}
    assert len(reasons) == 1  # node-independent, so kube-scheduler aggregates it
    word = {"required": "node", "node": "node", "nvlink": "NVLink domain", "fabric": "fabric tier",
            "zone": "zone"}[level]
    assert reasons == {f"llm-placement: must run in the same {word} as its producer"}
    assert all(r.unresolvable for r in hard.values())


def test_colocation_with_a_missing_producer_waits_resolvably() -> None:
    _, g, _ = world()
    consumer = spec("c", depends="ghost", colocation="nvlink")
    hard = g.hard_rejections(consumer, ["n1", "n2"])
    assert {r.message for r in hard.values()} == {
        "llm-placement: producer ml/ghost not found; colocation required"
    }
    assert not any(r.unresolvable for r in hard.values())  # retried once the producer shows up


def test_colocation_with_a_gang_producer_accepts_any_members_domain() -> None:
    snap, g, _ = world()
    for i, n in enumerate(["n1", "n5"]):
        run(snap, spec(f"pt-{i}", stage="pretraining", gpus=8, gang="pt"), n)
    hard = g.hard_rejections(spec("c", depends="pt", colocation="nvlink"), sorted(snap.nodes))
    assert set(snap.nodes) - set(hard) == {"n1", "n2", "n5"}


def test_no_colocation_no_rejections() -> None:
    snap, g, _ = world()
    run(snap, spec("p", gpus=8), "n1")
    assert g.hard_rejections(spec("c", depends="p"), sorted(snap.nodes)) == {}
    assert set(LEVELS) == {"node", "nvlink", "leaf", "fabric", "zone"}


# --- bind-time metrics and explain ----------------------------------------------------------------
class FakeBinder:
    def __init__(self) -> None:
        self.events: list[tuple[str, str, bool]] = []

    def bind(self, namespace: str, name: str, uid: str, node: str) -> bool:
        return True

    def annotate(self, namespace: str, name: str, annotations: dict[str, str]) -> None:
        pass

    def event(self, namespace: str, name: str, uid: str, reason: str, message: str,
              warning: bool = False) -> None:
        self.events.append((reason, message, warning))

    def read_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        return None


def service_with(nodes: list[NodeFacts]) -> tuple[ExtenderService, FakeBinder]:
    from app.extender.wiring import build_core

    binder = FakeBinder()
    svc = build_core(SETTINGS, CATALOG, Metrics(), binder)
    for f in nodes:
        svc.snapshot.upsert_node(f)
    return svc, binder


def sample(svc: ExtenderService, name: str, labels: dict[str, str]) -> float:
    return svc.metrics.registry.get_sample_value(name, labels) or 0.0


def test_bind_records_edge_distance_and_cross_node_gb() -> None:
    svc, binder = service_with(topology())
    run(svc.snapshot, spec("pt-0", stage="pretraining", gpus=8, gang="pt"), "n1")
    run(svc.snapshot, spec("pt-1", stage="pretraining", gpus=8, gang="pt"), "n3")
    consumer = spec("sft", stage="alignment", gpus=8, depends="pt, ghost", gb=100)
    assert svc.binding.bind_one("ml", "sft", consumer.uid, "n2", consumer) == ""
    edges = "llm_placement_dependency_edges_total"
    assert sample(svc, edges, {"stage": "alignment", "distance": "nvlink"}) == 1
    assert sample(svc, edges, {"stage": "alignment", "distance": MISSING}) == 1
    # 50 GB from the gang, none of it on n2.
    assert sample(svc, "llm_placement_cross_node_data_gigabytes_total", {"stage": "alignment"}) == 50
    warnings = [m for r, m, w in binder.events if r == "ProducerNotFound" and w]
    assert warnings and "ml/ghost" in warnings[0]


def test_bind_on_the_producers_node_moves_nothing_across_nodes() -> None:
    svc, binder = service_with(topology())
    run(svc.snapshot, spec("p", gpus=4), "n1")
    consumer = spec("c", gpus=4, depends="p", gb=40)
    assert svc.binding.bind_one("ml", "c", consumer.uid, "n1", consumer) == ""
    assert sample(svc, "llm_placement_dependency_edges_total", {"stage": "alignment", "distance": "node"}) == 1
    assert sample(svc, "llm_placement_cross_node_data_gigabytes_total", {"stage": "alignment"}) == 0
    assert not [r for r, _, _ in binder.events if r == "ProducerNotFound"]


def test_explain_shows_edges_producer_location_and_cost_per_node() -> None:
    svc, _ = service_with(topology())
    run(svc.snapshot, spec("p", gpus=8), "n1")
    consumer = spec("c", gpus=8, depends="p, ghost", gb=20)
    out = explain_spec(svc, consumer)
    g = out["gravity"]
    assert [e["producer"] for e in g["edges"]] == ["ml/p", "ml/ghost"]
    site = g["edges"][0]["sites"][0]
    assert site["node"] == "n1" and site["nvlink_domain"] == "c1" and site["fabric"][:2] == ["leaf-1", "spine-1"]
    assert any("ml/ghost" in n for n in g["notes"])
    per_node = {e["node"]: e for e in out["nodes"]}
    assert per_node["n2"]["gravity"]["edges"][0] == {"producer": "ml/p", "distance": "nvlink",
                                                     "seconds": round(10 * S_NVLINK, 3)}
    assert per_node["n6"]["gravity"]["seconds"] == pytest.approx(10 * S_CROSS, abs=1e-3)
    assert per_node["n2"]["terms"]["gravity"] == 1.0  # n1 is full, so n2 is the best candidate
    assert explain_spec(svc, spec("lonely", gpus=1))["gravity"] is None


def test_live_wiring_resolves_a_planned_gang_through_the_reservation_ledger() -> None:
    from app.gang.coordinator import GangCoordinator
    from app.gang.ledger import GangPlan, MemberPlan

    svc, _ = service_with(topology())
    gravity = svc.placer.gravity
    assert isinstance(gravity, GravityModel) and gravity.planned is not None
    consumer = spec("sft", depends="pt", gb=10)
    assert not gravity.resolve(consumer)[0].found  # no member bound and no plan yet
    gangs = svc.gang_binder
    assert isinstance(gangs, GangCoordinator)
    members = {f"u{i}": MemberPlan(f"u{i}", f"ml/pt-{i}", node, 8) for i, node in enumerate(["n3", "n4"])}
    gangs.ledger.put(GangPlan("ml/pt", members, planned_at=0.0, expires_at=1e12))
    [edge] = gravity.resolve(consumer)
    assert {(s.node, s.state) for s in edge.sites} == {("n3", "planned"), ("n4", "planned")}


# --- properties -----------------------------------------------------------------------------------
_node_st = st.tuples(
    st.sampled_from(["c1", "c2", "c3", None]),
    st.sampled_from(["leaf-1", "leaf-2", None]),
    st.sampled_from(["spine-1", "spine-2", None]),
    st.sampled_from(["zone-a", "zone-b", None]),
)


@settings(max_examples=150, deadline=None)
@given(
    layout=st.lists(_node_st, min_size=2, max_size=9),
    producers=st.lists(st.integers(min_value=0, max_value=8), min_size=1, max_size=3),
    gb=st.floats(min_value=0.001, max_value=1e5),
)
def test_term_in_unit_interval_and_the_producers_node_is_always_best(
    layout: list[tuple[str | None, str | None, str | None, str | None]], producers: list[int], gb: float
) -> None:
    nodes = [facts(f"x{i}", clique=c, t0=t0, t1=t1, zone=z) for i, (c, t0, t1, z) in enumerate(layout)]
    snap, g, _ = world(nodes)
    names = [f.name for f in nodes]
    used = sorted({p % len(nodes) for p in producers})
    for i in used:
        run(snap, spec(f"p{i}", gpus=1), names[i])
    consumer = spec("c", depends=",".join(f"p{i}" for i in used), gb=gb)
    term = g.term(consumer, names)
    assert term is not None
    values = {n: term(n) for n in names}
    assert all(v is not None and 0.0 <= v <= 1.0 for v in values.values())
    assert max(v or 0.0 for v in values.values()) == 1.0
    if len(used) == 1:
        home = names[used[0]]
        assert values[home] == 1.0
        assert all((values[n] or 0.0) < 1.0 for n in names if n != home)
        # The term never increases with distance.
        by_distance = sorted(names, key=lambda n: g.distance(snap.nodes[n], snap.nodes[home]))
        vals = [values[n] or 0.0 for n in by_distance]
        assert all(a >= b for a, b in itertools.pairwise(vals))


@settings(max_examples=100, deadline=None)
@given(
    layout=st.lists(_node_st, min_size=2, max_size=9),
    members=st.lists(st.integers(min_value=0, max_value=8), min_size=1, max_size=5),
    single=st.integers(min_value=0, max_value=8),
    level=st.sampled_from(sorted(LEVELS)),
)
def test_fast_paths_agree_with_the_pairwise_definitions(
    layout: list[tuple[str | None, str | None, str | None, str | None]], members: list[int], single: int,
    level: str,
) -> None:
    """cost_fn's grouped pricing and hard_rejections' set lookups equal distance() pair by pair."""
    nodes = [facts(f"x{i}", clique=c, t0=t0, t1=t1, zone=z) for i, (c, t0, t1, z) in enumerate(layout)]
    snap, g, _ = world(nodes)
    names = [f.name for f in nodes]
    for k, i in enumerate(members):  # a gang, possibly several members on one node
        run(snap, spec(f"g-{k}", gpus=1, gang="g", gang_size=len(members)), names[i % len(names)])
    run(snap, spec("solo", gpus=1), names[single % len(names)])
    consumer = spec("c", depends="g, solo", gb=64, colocation=level)
    edges = g.resolve(consumer)
    fast = g.cost_fn(edges)
    hard = g.hard_rejections(consumer, names)
    for n in names:
        f = snap.nodes[n]
        exact = sum(g.edge_at(e, f).seconds for e in edges)
        assert fast(n) == pytest.approx(exact, rel=1e-9, abs=1e-9)
        sites = [[snap.nodes[s.node] for s in e.sites] for e in edges]
        within = all(any(within_level(level, *g.distance(f, p)) for p in ps) for ps in sites)
        assert (n not in hard) == within


# --- the default-scheduler baseline ---------------------------------------------------------------
def test_least_allocated_and_balanced_match_the_go_formulas() -> None:
    # (cap-req)*100/cap per resource, integer, averaged: cpu (4000-1000)*100/4000=75, mem 50 -> 62.
    assert least_allocated([1000, 2 << 30], [4000, 4 << 30]) == 62
    assert least_allocated([5000, 0], [4000, 4 << 30]) == 50  # over capacity scores 0
    # Balance before: |0.25-0.5|/2 -> 87; after adding 1 CPU: both 0.5 -> 100; 50 + (50+100-87)/2 = 81.
    assert balanced_allocation([2000, 2 << 30], [1000, 2 << 30], [4000, 4 << 30]) == 81
    assert num_feasible_nodes_to_find(99) == 99
    assert num_feasible_nodes_to_find(1000) == 420  # (50 - 1000/125)% of 1000
    assert num_feasible_nodes_to_find(5000) == 500  # 10% of 5000
    assert num_feasible_nodes_to_find(150) == 100
    assert num_feasible_nodes_to_find(1000, 100) == 1000


def test_default_scheduler_spreads_ignores_gpus_in_scoring_and_our_annotations() -> None:
    snap = ClusterSnapshot()
    for f in [facts("g1"), facts("g2"), facts("cpu", gpus=0, node_class="cpu")]:
        snap.upsert_node(f)
    sched = DefaultScheduler(snap, seed=1)
    # A data-prep pod: the default scheduler knows no stage rules and may pick a GPU node.
    busy = pod_object("busy", stage="serving", gpus=1, cpu="48", memory="512Gi")
    assert sched.schedule(busy).node in {"g1", "g2", "cpu"}
    first = snap.node_of("default/busy")
    assert first is not None
    # The next GPU pod avoids the busier node (LeastAllocated), whatever its depends-on says.
    ann = {ANN + "depends-on": "busy", ANN + "input-data-gb": "500"}
    placed = sched.schedule(pod_object("next", stage="alignment", gpus=8, annotations=ann))
    assert placed.node in {"g1", "g2"} and placed.node != first[0]
    # GPUs are filtered: a ninth 8-GPU pod on two 8-GPU nodes cannot fit anywhere.
    sched.schedule(pod_object("fill", gpus=8))
    assert sched.schedule(pod_object("nope", gpus=8)).node is None


def test_default_scheduler_ties_are_random_but_seeded() -> None:
    def pick(seed: int) -> list[str | None]:
        snap = ClusterSnapshot()
        for i in range(6):
            snap.upsert_node(facts(f"g{i}"))
        sched = DefaultScheduler(snap, seed=seed)
        return [sched.schedule(pod_object(f"p{j}", gpus=1, cpu="1", memory="1Gi")).node for j in range(3)]

    assert pick(7) == pick(7)
    assert len({tuple(pick(s)) for s in range(6)}) > 1


def test_explain_shows_the_tradeoff_when_the_chosen_node_is_not_the_closest() -> None:
    svc, _ = service_with(topology())
    run(svc.snapshot, spec("p", gpus=1), "n1")
    run(svc.snapshot, spec("other", gpus=7), "n4")
    # A small input: moving it costs a few seconds, so packing the nearly full n4 wins.
    out = explain_spec(svc, spec("c", gpus=1, depends="p", gb=0.5))
    t = out["gravity"]["tradeoff"]
    assert out["chosen"] == "n4" and t["chosen_is_closest"] is False and t["closest"] == "n1"
    per_node = {e["node"]: e for e in out["nodes"]}
    extra = per_node["n4"]["gravity"]["seconds"] - per_node["n1"]["gravity"]["seconds"]
    assert t["extra_transfer_seconds"] == pytest.approx(extra, abs=1e-3) and extra > 0
    assert "reads the inputs" in t["summary"] and "n1" in t["summary"]
    # Where the data decides, the chosen node is the closest and nothing is traded.
    near = explain_spec(svc, spec("big", gpus=1, depends="p", gb=2000))
    assert near["gravity"]["tradeoff"] == {"chosen_is_closest": True}
