"""The gang planners on hand-made clusters with known optima, and against each other at random."""

from __future__ import annotations

import itertools
import random
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.gang.diagnose import describe, why_not
from app.gang.dp import tree_dp
from app.gang.greedy import greedy
from app.gang.problem import Assignment, Candidate, Index, Problem, Shape, assess, prune, weights
from app.gang.solver import plan
from testkit.gang_synth import FleetSpec, fleet, gang_problem

TIERS = ("nvlink", "leaf", "spine", "zone")


def node(name: str, leaf: str, spine: str = "s1", zone: str = "z1", free: int = 8, total: int = 8,
         rdma: bool = True, model: str = "H100", **kw: object) -> Candidate:
    return Candidate(name, (name, leaf, spine, zone), free, total, gpu_model=model, rdma=rdma, **kw)  # type: ignore[arg-type]


def block(prefix: str, n: int, leaf: str, **kw: object) -> list[Candidate]:
    return [node(f"{prefix}{i:02d}", leaf, **kw) for i in range(n)]  # type: ignore[arg-type]


def gang(nodes: list[Candidate], pods: int, gpus: int = 8, **kw: object) -> Problem:
    return Problem("ns/g", (Shape("w", pods, gpus),), tuple(nodes), TIERS, **kw)  # type: ignore[arg-type]


def leaves_used(p: Problem, a: Assignment) -> set[str]:
    by = {n.name: n for n in p.nodes}
    return {by[n].path[1] for n in a}


def test_eight_by_eight_lands_in_the_block_with_exactly_eight_free_nodes() -> None:
    # Leaf A: 16 whole free nodes (pristine). Leaf B: exactly 8 free, 4 busy. Leaf C: 7 free.
    nodes = block("a", 16, "A") + block("b", 8, "B") + block("bb", 4, "B", free=0) + block("c", 7, "C")
    p = gang(nodes, 8)
    r = plan(p)
    assert r.assignment is not None and r.status == "optimal"
    assert leaves_used(p, r.assignment) == {"B"}
    assert sum(c["w"] for c in r.assignment.values()) == 8
    assert r.gap == 0.0


def test_fewest_outer_domains_beat_fewer_inner_ones() -> None:
    # 12 pods: spine s1 holds them in two leaves (6+6); spine s2 would need one 8-node leaf plus a
    # leaf of spine s3. One spine with two leaves beats two spines with two leaves.
    nodes = (block("a", 6, "A", spine="s1") + block("b", 6, "B", spine="s1")
             + block("c", 8, "C", spine="s2") + block("d", 4, "D", spine="s3"))
    p = gang(nodes, 12)
    r = plan(p)
    assert r.assignment is not None
    assert leaves_used(p, r.assignment) == {"A", "B"}
    assert r.assessment is not None and r.assessment.domains("spine") == 1


def test_fragmentation_prefers_the_partly_used_domain() -> None:
    # Two leaves each with 4 whole free nodes; leaf P also has busy nodes, leaf Q is pristine.
    nodes = block("p", 4, "P") + block("px", 4, "P", free=2) + block("q", 4, "Q")
    r = plan(gang(nodes, 4))
    assert r.assignment is not None and set(r.assignment) == {f"p{i:02d}" for i in range(4)}


def test_one_node_beats_two_for_a_small_gang() -> None:
    # 4 pods x 2 GPUs: one whole node holds the gang (NVLink inside one box) rather than two halves.
    nodes = [node("half1", "A", free=4), node("half2", "A", free=4), node("whole1", "A")]
    r = plan(gang(nodes, 4, gpus=2))
    assert r.assignment == {"whole1": {"w": 4}}


def test_small_pods_fill_a_partly_used_node_before_opening_a_whole_one() -> None:
    # Both nodes hold the gang alone; the 16-GPU node is half used already, the 8-GPU one pristine.
    nodes = [node("busy16", "A", free=8, total=16), node("whole8", "A")]
    r = plan(gang(nodes, 2, gpus=4))
    assert r.assignment == {"busy16": {"w": 2}}
    assert r.assessment is not None and r.assessment.pristine_nodes_opened == 0


def test_required_topology_that_fits_no_single_domain_is_infeasible_with_reason() -> None:
    nodes = [node(f"a{i}", "A", required="leaf-a") for i in range(5)]
    nodes += [node(f"b{i}", "B", required="leaf-b") for i in range(4)]
    p = gang(nodes, 8, required_key="fabric.topograph.run/tier-0")
    r = plan(p)
    assert r.assignment is None and r.status == "infeasible"
    diag = why_not(Index(p))
    assert "one fabric.topograph.run/tier-0 domain" in diag.short and "at most 40 free" in diag.short
    assert "leaf-a 40" in diag.detail and "leaf-b 32" in diag.detail


def test_required_topology_picks_the_domain_that_fits() -> None:
    nodes = [node(f"a{i}", "A", required="leaf-a") for i in range(5)]
    nodes += [node(f"b{i}", "A", required="leaf-b") for i in range(8)]
    p = gang(nodes, 8, required_key="k")
    r = plan(p)
    assert r.assignment is not None and set(r.assignment) == {f"b{i}" for i in range(8)}
    # Unlabelled nodes are in no domain of the required label: never used.
    p2 = gang([node(f"u{i}", "A") for i in range(8)], 8, required_key="k")
    assert plan(p2).assignment is None


def test_rdma_required_only_when_the_gang_spans_nodes() -> None:
    # Without RDMA on most nodes a 4x8 gang cannot span them ...
    nodes = block("x", 6, "A", rdma=False) + block("r", 3, "A")
    p = gang(nodes, 4)
    assert plan(p).assignment is None
    assert "needs RDMA" in why_not(Index(p)).short
    # ... but a gang that fits on one node needs none.
    single = plan(gang(block("x", 2, "A", rdma=False), 4, gpus=2))
    assert single.assignment is not None and len(single.assignment) == 1
    # And with enough RDMA nodes only those are used.
    more = block("x", 6, "A", rdma=False) + block("r", 4, "A")
    got = plan(gang(more, 4)).assignment
    assert got is not None and all(n.startswith("r") for n in got)


def test_preferred_topology_is_honoured_when_it_fits() -> None:
    # Same leaf everywhere; the preferred label (e.g. an NVLink clique) splits it in two.
    nodes = [node(f"a{i}", "A", preferred="c1") for i in range(3)]
    nodes += [node(f"b{i}", "A", preferred="c2") for i in range(4)]
    r = plan(gang(nodes, 4, preferred_key="nvidia.com/gpu.clique"))
    assert r.assignment is not None and set(r.assignment) == {f"b{i}" for i in range(4)}
    # When no single preferred domain fits, the gang still lands (soft), using as few as possible.
    r2 = plan(gang(nodes, 6, preferred_key="nvidia.com/gpu.clique"))
    assert r2.assignment is not None and r2.assessment is not None and r2.assessment.preferred == 2


def test_gpu_models_are_not_mixed_and_preference_wins() -> None:
    nodes = block("h", 3, "A", model="H100", pref_rank=0) + block("a", 4, "A", model="A100", pref_rank=1)
    r = plan(gang(nodes, 3))
    assert r.assignment is not None and all(n.startswith("h") for n in r.assignment)
    # 4 pods: mixing (3 H100 + 1 A100) loses to 4 A100 in one model.
    r4 = plan(gang(nodes, 4))
    assert r4.assignment is not None and all(n.startswith("a") for n in r4.assignment)
    assert r4.assessment is not None and r4.assessment.gpu_models == 1


def test_several_member_shapes_share_nodes_exactly() -> None:
    # A launcher (2 GPUs) and 3 workers (2 GPUs): no node has 8 free, so two nodes; the two with
    # 4 free each are filled exactly (best fit), the 6-free one stays as it is.
    nodes = [node("n1", "A", free=4), node("n2", "A", free=4), node("n3", "A", free=6)]
    p = Problem("ns/g", (Shape("launcher", 1, 2), Shape("worker", 3, 2)), tuple(nodes), TIERS)
    r = plan(p)
    assert r.assignment is not None and r.assessment is not None and r.assessment.feasible
    assert set(r.assignment) == {"n1", "n2"}
    assert sum(r.assignment["n1"].values()) + sum(r.assignment["n2"].values()) == 4


def test_replan_joins_the_members_already_bound() -> None:
    # Two members are bound in leaf B; the remaining two must join them rather than fill leaf A.
    nodes = [*block("a", 4, "A"), node("b0", "B", free=0, fixed=1), node("b1", "B", free=0, fixed=1)]
    nodes += block("b", 2, "B")
    p = Problem("ns/g", (Shape("w", 2, 8),), tuple(nodes), TIERS)
    r = plan(p)
    assert r.assignment is not None and leaves_used(p, r.assignment) == {"B"}


def test_decode_keeps_previous_nodes_among_identical_ones() -> None:
    nodes = block("a", 8, "A")
    r = plan(gang(nodes, 2), prefer={"a05", "a07"})
    assert r.assignment is not None and set(r.assignment) == {"a05", "a07"}


def test_describe_names_the_domains_chosen() -> None:
    nodes = block("b", 8, "B")
    p = gang(nodes, 8)
    r = plan(p)
    assert r.assignment is not None
    text = describe(Index(p), r.assignment)
    assert "8 nodes" in text


def test_infeasible_when_capacity_is_short_says_how_short() -> None:
    p = gang(block("a", 3, "A"), 8)
    r = plan(p)
    assert r.assignment is None
    diag = why_not(Index(p), reserved_by_others=16)
    assert diag.short == "gang needs 8 pods x 8 GPUs; eligible nodes have room for 3 of 8 pods"
    assert "needs 64 GPUs" in diag.detail and "16 GPUs are reserved for other gangs" in diag.detail


# --- against each other ------------------------------------------------------------------------
def brute_force(p: Problem) -> tuple[int, ...] | None:
    """The best assessment key over every assignment (tiny single-shape problems only)."""
    index = Index(p)
    shape = p.shapes[0]
    names = [n.name for n in p.nodes]
    caps = [min(n.free_gpus // shape.gpus, shape.count) for n in p.nodes]
    best: tuple[int, ...] | None = None
    for counts in itertools.product(*(range(c + 1) for c in caps)):
        if sum(counts) != shape.count:
            continue
        a = {names[i]: {shape.key: c} for i, c in enumerate(counts) if c}
        got = assess(index, a)
        if got.feasible and (best is None or got.key < best):
            best = got.key
    return best


@pytest.mark.parametrize("seed", range(25))
def test_plan_is_optimal_on_tiny_random_clusters(seed: int) -> None:
    rng = random.Random(seed)
    nodes = []
    for i in range(rng.randint(3, 7)):
        free = rng.choice([0, 2, 4, 8, 8])
        nodes.append(node(f"n{i}", f"L{rng.randint(0, 2)}", spine=f"S{rng.randint(0, 1)}", free=free,
                          rdma=rng.random() > 0.2, model=rng.choice(["H100", "H100", "A100"])))
    gpus = rng.choice([2, 4, 8])
    p = gang(nodes, rng.randint(1, 4), gpus=gpus)
    best = brute_force(p)
    r = plan(p, time_limit=2.0)
    if best is None:
        assert r.assignment is None
    else:
        assert r.assessment is not None and r.assessment.key == best, (r.assessment, best)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), pods=st.sampled_from([4, 16, 48]), gpus=st.sampled_from([1, 2, 4, 8]),
       nodes=st.sampled_from([60, 150]))
def test_never_worse_than_greedy_on_random_fleets(seed: int, pods: int, gpus: int, nodes: int) -> None:
    rng = random.Random(seed)
    p = gang_problem(fleet(FleetSpec(nodes, leaf_size=(6, 14), leaves_per_spine=3, spines_per_zone=2,
                                     models=("H100", "A100")), rng), pods, gpus)
    r = plan(p, time_limit=2.0)
    base = greedy(Index(p))
    if base is None:
        return
    g = assess(Index(p), base)
    assert r.assessment is not None and r.assessment.feasible
    assert r.assessment.key <= g.key


@pytest.mark.parametrize("seed", range(6))
def test_cp_sat_search_alone_matches_the_dp_certified_optimum(seed: int) -> None:
    rng = random.Random(seed)
    p = gang_problem(fleet(FleetSpec(200, leaf_size=(8, 16), leaves_per_spine=4), rng),
                     rng.choice([8, 24]), rng.choice([2, 8]))
    with_dp = plan(p, time_limit=5.0)
    search = plan(p, time_limit=20.0, use_dp=False)
    assert with_dp.status == "optimal" and search.status == "optimal"
    assert with_dp.assessment is not None and search.assessment is not None
    assert with_dp.assessment.key == search.assessment.key


def test_pruning_keeps_an_optimal_plan() -> None:
    rng = random.Random(2)
    p = gang_problem(fleet(FleetSpec(600, busy_leaf_share=0.1, full_share=0.1), rng), 12, 8)
    index = Index(p)
    w = weights(index)
    kept = prune(index, w.exact)
    assert len(kept) < len(index.classes)  # it did prune
    full = tree_dp(index, set(range(len(index.classes))), w)
    pruned = tree_dp(index, kept, w)
    assert full is not None and pruned is not None and full.value == pruned.value


def test_greedy_alone_is_the_kueue_like_baseline() -> None:
    nodes = block("a", 16, "A") + block("b", 8, "B") + block("bb", 4, "B", free=0)
    r = plan(gang(nodes, 8), use_cp_sat=False)
    assert r.method == "greedy" and r.assignment is not None
    # Best fit: the smallest leaf that holds the gang.
    assert leaves_used(gang(nodes, 8), r.assignment) == {"B"}


def test_several_shapes_on_a_fleet_get_a_compact_hint_and_a_real_bound() -> None:
    # A launcher (2 GPUs) plus 47 whole-node workers: no DP applies to two shapes; the hint is the
    # DP plan of 48 "largest" members and the bound is the DP optimum of the workers alone.
    rng = random.Random(4)
    nodes = fleet(FleetSpec(400), rng)
    p = Problem("ns/g", (Shape("launcher", 1, 2), Shape("worker", 47, 8)), tuple(nodes), TIERS)
    r = plan(p, time_limit=5.0)
    assert r.assignment is not None and r.assessment is not None and r.assessment.feasible
    assert r.bound > 0 and r.gap <= 0.01
    base = greedy(Index(p))
    assert base is None or r.assessment.key <= assess(Index(p), base).key


def test_unknown_cpu_or_memory_does_not_limit_capacity() -> None:
    from app.gang.problem import capacity

    n = node("n", "A")  # free_cpu / free_memory unknown (inf)
    assert capacity(n, Shape("s", 3, 0, cpu_millis=4000, memory_bytes=2**30)) == 3
    limited = Candidate("m", ("m",), 8, 8, free_cpu=6000, free_memory=2**40)
    assert capacity(limited, Shape("s", 3, 1, cpu_millis=4000)) == 1


@pytest.mark.parametrize("seed", range(20))
def test_replans_with_bound_members_are_optimal_on_tiny_clusters(seed: int) -> None:
    rng = random.Random(1000 + seed)
    nodes = []
    for i in range(rng.randint(4, 7)):
        free = rng.choice([0, 4, 8, 8])
        nodes.append(node(f"n{i}", f"L{rng.randint(0, 2)}", spine=f"S{rng.randint(0, 1)}", free=free,
                          rdma=rng.random() > 0.15, model=rng.choice(["H100", "H100", "A100"])))
    for i in rng.sample(range(len(nodes)), rng.randint(1, 2)):  # members already bound there
        nodes[i] = replace(nodes[i], fixed=1, free_gpus=max(nodes[i].free_gpus - 4, 0))
    p = gang(nodes, rng.randint(1, 3), gpus=4)
    best = brute_force(p)
    r = plan(p, time_limit=2.0)
    if best is None:
        assert r.assignment is None
    else:
        assert r.assessment is not None and r.assessment.key == best, (r.assessment, best)
