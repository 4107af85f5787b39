"""Data gravity never pulls training onto a GPU that another candidate beats on price per unit of
work and on speed (docs/data-gravity.md, "Never onto slower, dearer training hardware")."""

from __future__ import annotations

from typing import Any

from app.base.catalog import GpuCatalog
from app.base.objects import node_object, pod_object
from app.base.workload import parse_workload
from app.config.settings import Settings
from app.extender.explain import explain_spec
from app.extender.service import ExtenderService
from app.extender.wiring import build_core
from tests.unit.placement.test_whole_node_guard import _best, _run

ANN = "llm-placement.io/"


def _service(catalog: GpuCatalog) -> ExtenderService:
    return build_core(Settings(cluster_source="none", metrics_port=0), catalog)


def _case(service: ExtenderService, consumer_stage: str, gb: str = "400") -> tuple[dict[str, Any], list[str]]:
    """A data-prep shard ran on a100-0; its consumer may run on a100-0 (its data) or h100-0."""
    service.absorb_node(node_object("a100-0", gpus=8, product="NVIDIA-A100-SXM4-80GB", cpu="128", memory="1Ti"))
    service.absorb_node(node_object("h100-0", gpus=8, product="NVIDIA-H100-80GB-HBM3", cpu="128", memory="1Ti"))
    _run(service, pod_object("prep", stage="data-prep", gpus=8, uid="u-prep"), "a100-0", finished=True)
    consumer = pod_object("train", stage=consumer_stage, gpus=8, uid="u-train", annotations={
        ANN + "model-params": "7B", ANN + "depends-on": "prep", ANN + "input-data-gb": gb})
    return consumer, ["a100-0", "h100-0"]


def test_pretraining_does_not_follow_its_data_onto_a_slower_dearer_gpu(catalog: GpuCatalog) -> None:
    # The A100 holds the shard, but the H100 trains faster and costs less per unit of work (hourly
    # price over dense BF16 peak, from the catalog): the read saved is not worth the slower hours.
    service = _service(catalog)
    consumer, names = _case(service, "pretraining")
    assert _best(service, consumer, names) == {"h100-0"}
    out = {e["node"]: e for e in explain_spec(service, parse_workload(consumer))["nodes"]}
    note = out["a100-0"].get("gravity_not_counted")
    assert note and "costs less per unit of work" in note
    assert out["a100-0"]["terms"]["gravity"] == out["h100-0"]["terms"]["gravity"]
    # The read from the shard's node is still the shorter one, and explain still says so.
    assert out["a100-0"]["gravity"]["seconds"] < out["h100-0"]["gravity"]["seconds"]
    assert out["h100-0"].get("gravity_not_counted") is None


def test_without_the_cap_the_same_pull_wins(catalog: GpuCatalog) -> None:
    # The trade the cap removes, shown on the score itself: the A100's uncapped pull is the full
    # term, and it outweighs the cost and bandwidth the H100 wins (gravity weighs 3 for training).
    service = _service(catalog)
    consumer, _names = _case(service, "pretraining")
    out = {e["node"]: e for e in explain_spec(service, parse_workload(consumer))["nodes"]}
    terms, weights = out["a100-0"]["terms"], out["a100-0"]["weights"]
    uncapped = 1.0  # the nearest node's pull (docs/data-gravity.md, "Score term")
    gain = (uncapped - terms["gravity"]) * weights["gravity"] / sum(weights.values())
    assert out["a100-0"]["total"] + gain > out["h100-0"]["total"]


def test_a_serving_pod_still_follows_its_data(catalog: GpuCatalog) -> None:
    # Not training: no work to price per TFLOP, so the rule does not apply and no note is given.
    service = _service(catalog)
    consumer, _names = _case(service, "deployment")
    out = {e["node"]: e for e in explain_spec(service, parse_workload(consumer))["nodes"]}
    assert all(e.get("gravity_not_counted") is None for e in out.values())
