"""Every GPU candidate is priced in one unit: training per unit of work (hourly price over dense
BF16 throughput), whether or not the GPU is in the catalog (docs/node-facts.md, "Throughput")."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.base.catalog import GpuCatalog, default_catalog
from app.base.objects import node_object
from app.config.policy import NodeLabelKeys
from app.config.settings import Settings
from app.extender.wiring import build_core
from app.gang.instance import _price
from app.placement.scoring import score_nodes
from app.snapshot.nodes import node_facts, penalty_tflops, work_tflops
from tests.unit.gang.test_gang_coordinator import Cluster
from tests.unit.serving.test_sizing_methods import spec_of

A100 = "NVIDIA-A100-SXM4-80GB"
ANON = "Anon-Accelerator-X"  # a product no catalog entry names
CC = "nvidia.com/gpu.compute."
SLOWEST = min(default_catalog(), key=lambda g: g.bf16_tflops)


def facts(product: str, labels: dict[str, str] | None = None, annotations: dict[str, str] | None = None,
          gpus: int = 8) -> Any:
    node = node_object("n", gpus=gpus, product=product, labels=labels, annotations=annotations)
    return node_facts(node, default_catalog(), NodeLabelKeys())


@pytest.mark.parametrize(("product", "labels", "annotations", "tflops", "basis"), [
    (A100, {}, {}, 312.0, "catalog"),
    # The operator's figure wins, for a catalogued product too.
    (ANON, {}, {"llm-placement.io/gpu-bf16-tflops": "1500"}, 1500.0, "declared"),
    (A100, {}, {"llm-placement.io/gpu-bf16-tflops": "400 TFLOPS"}, 400.0, "declared"),
    # A product name extending a catalogued one (whole words: an A10 is never an A100).
    ("NVIDIA-H100-80GB-HBM3-OEM", {}, {}, 989.0, "extends H100-SXM-80GB"),
    ("NVIDIA-A10-Custom", {}, {}, 125.0, "extends A10"),
    # GFD's compute capability and memory: the slowest catalogued GPU consistent with both.
    (ANON, {CC + "major": "9", CC + "minor": "0", "nvidia.com/gpu.memory": "81559"}, {}, 756.0,
     "as slow as H100-PCIe-80GB"),
    (ANON, {CC + "major": "8", CC + "minor": "0", "nvidia.com/gpu.memory": "81920"}, {}, 312.0,
     "compute capability 8.0"),
    (ANON, {CC + "major": "8", CC + "minor": "9"}, {}, 121.0, "as slow as L4"),
    # Nothing known, or nothing consistent with what is known: the penalty figure.
    (ANON, {}, {}, SLOWEST.bf16_tflops, "slowest catalogued GPU"),
    (ANON, {CC + "major": "99", CC + "minor": "0"}, {}, SLOWEST.bf16_tflops, "slowest catalogued GPU"),
    (ANON, {"nvidia.com/gpu.memory": "999999"}, {}, SLOWEST.bf16_tflops, "slowest catalogued GPU"),
])
def test_every_gpu_node_gets_a_throughput_and_says_where_it_comes_from(
        product: str, labels: dict[str, str], annotations: dict[str, str], tflops: float, basis: str) -> None:
    f = facts(product, labels, annotations)
    assert f.gpu_tflops == tflops and work_tflops(f) == tflops
    assert basis in f.gpu_tflops_basis


@pytest.mark.parametrize("raw", ["-3", "0", "fast", "1e9", "nan", "1_000", "\uff17\uff10"])
def test_an_unusable_declared_throughput_is_ignored_with_a_warning(raw: str) -> None:
    f = facts(A100, annotations={"llm-placement.io/gpu-bf16-tflops": raw})
    assert f.gpu_tflops == 312.0 and f.gpu_tflops_basis == "catalog"
    assert any("gpu-bf16-tflops" in w for w in f.warnings)


def test_a_node_without_gpus_has_no_throughput() -> None:
    f = facts("", gpus=0)
    assert f.gpu_tflops == 0.0 and work_tflops(f) == 0.0


@given(price=st.floats(min_value=0.01, max_value=100.0))
def test_an_unknown_gpu_never_ranks_cheaper_per_work_than_a_catalogued_gpu_of_the_same_hourly_price(
        price: float) -> None:
    # The penalty figure is the slowest catalogued GPU's: at equal hourly price no catalogued GPU
    # can be dearer per unit of work than an unknown one.
    unknown = facts(ANON, annotations={"llm-placement.io/hourly-cost": f"{price * 8:.6f}"})
    for g in default_catalog():
        known = facts(g.aliases[0], annotations={"llm-placement.io/hourly-cost": f"{price * 8:.6f}"})
        assert _price(known, True) <= _price(unknown, True)
    assert penalty_tflops(default_catalog())[0] == SLOWEST.bf16_tflops


def gang_cluster(other: str, **labels: str) -> Cluster:
    c = Cluster()
    for name, product in [("a100-0", A100), ("a100-1", A100), ("x-0", other), ("x-1", other)]:
        c.service.absorb_node(node_object(name, gpus=8, product=product, rdma=True, labels={
            "fabric.topograph.run/tier-0": "leaf-1", "fabric.topograph.run/tier-1": "spine-1", **labels}))
    return c


def test_a_training_gang_without_a_model_size_lands_on_catalogued_a100s_not_on_unknown_gpus() -> None:
    # Before one price unit, the unknown GPUs ranked by their plain $4/GPU-hour beside the A100's
    # 10.99 per unit of work and took the gang.
    c = gang_cluster(ANON)
    pods = c.gang("g", 2)
    assert {c.filter(p).passed[0] for p in pods} == {"a100-0", "a100-1"}


def test_a_training_gang_takes_an_unknown_gpu_that_is_declared_cheaper_per_unit_of_work() -> None:
    # The same rule the other way: an operator's figure (4 x the A100's speed at $4) makes it cheaper.
    c = Cluster()
    for name, product, ann in [("a100-0", A100, {}), ("a100-1", A100, {}),
                               ("x-0", ANON, {"llm-placement.io/gpu-bf16-tflops": "1248"}),
                               ("x-1", ANON, {"llm-placement.io/gpu-bf16-tflops": "1248"})]:
        c.service.absorb_node(node_object(name, gpus=8, product=product, rdma=True, annotations=ann, labels={
            "fabric.topograph.run/tier-0": "leaf-1", "fabric.topograph.run/tier-1": "spine-1"}))
    pods = c.gang("g", 2)
    assert {c.filter(p).passed[0] for p in pods} == {"x-0", "x-1"}


@pytest.mark.parametrize(("declared", "cheapest"), [(None, "a100"), ("2000", "x")])
def test_the_scorer_prices_unknown_gpus_per_unit_of_work_too(declared: str | None, cheapest: str) -> None:
    svc = build_core(Settings(cluster_source="none", metrics_port=0), GpuCatalog.load())
    ann = {"llm-placement.io/gpu-bf16-tflops": declared} if declared else {}
    svc.absorb_node(node_object("a100", gpus=8, product=A100))
    svc.absorb_node(node_object("x", gpus=8, product=ANON, annotations=ann))
    spec = spec_of("pretraining", gpus=8)
    fits, _ = svc.placer.evaluate_nodes(spec, ["a100", "x"])
    scores = {s.node: s.terms["cost"] for s in score_nodes(spec, list(fits.values()), {},
                                                           svc.placer.policy.scoring)}
    assert max(scores, key=lambda n: scores[n]) == cheapest


def test_the_planner_estimates_training_on_an_uncatalogued_gpu_from_the_same_throughput() -> None:
    from app.plan.estimate import task_seconds

    svc = build_core(Settings(cluster_source="none", metrics_port=0), GpuCatalog.load())
    svc.absorb_node(node_object("h100", gpus=8, product="NVIDIA-H100-80GB-HBM3"))
    svc.absorb_node(node_object("x", gpus=8, product=ANON, annotations={"llm-placement.io/gpu-bf16-tflops": "989"}))
    svc.absorb_node(node_object("y", gpus=8, product=ANON))
    spec = spec_of("pretraining", gpus=8)
    fits, _ = svc.placer.evaluate_nodes(spec, ["h100", "x", "y"])
    secs = {n: task_seconds("t", spec.model_copy(update={"model_params": 7e9}), f, f.node, duration=None,
                            tokens=1e9, default_concurrency=1) for n, f in fits.items()}
    assert secs["x"] == secs["h100"]  # declared as fast as an H100
    assert secs["y"] == pytest.approx(secs["h100"] * 989 / SLOWEST.bf16_tflops, rel=1e-3)  # penalty
