"""The whole-node guard: a GPU pod never opens a whole node while a partly used node that may stand in
for it fits: one of the same shape, or across shapes one at least as fast within the stranding allowance."""

from __future__ import annotations

import json
import time
from typing import Any

from app.base.catalog import GpuCatalog
from app.base.objects import node_object, pod_object
from app.base.workload import parse_workload
from app.config.settings import Settings
from app.extender.explain import explain_spec
from app.extender.service import ExtenderService
from app.extender.wiring import build_core
from app.snapshot.store import placed_from_spec

ANN = "llm-placement.io/"
H100 = "NVIDIA-H100-80GB-HBM3"


def _service(catalog: GpuCatalog, guard: bool = True, cross_shape: bool = False) -> ExtenderService:
    gates = {"WholeNodeGuard": guard, "CrossShapeGuard": cross_shape}
    return build_core(Settings(cluster_source="none", metrics_port=0, feature_gates=gates), catalog)


def _run(service: ExtenderService, pod: dict[str, Any], node: str, finished: bool = False) -> None:
    spec = parse_workload(pod)
    service.snapshot.track_spec(spec)
    service.snapshot.place(placed_from_spec(spec, node))
    if finished:
        service.snapshot.untrack_spec(spec.uid)
        service.snapshot.finish(spec.uid, now=time.time())


def _best(service: ExtenderService, pod: dict[str, Any], names: list[str]) -> set[str]:
    body = json.dumps({"Pod": pod, "NodeNames": names}).encode()
    service.filter(body)
    prio = {e["Host"]: e["Score"] for e in json.loads(service.prioritize(body))}
    top = max(prio.values())
    return {n for n, s in prio.items() if s == top}


def _gravity_case(service: ExtenderService, gpus: int = 4) -> tuple[dict[str, Any], list[str]]:
    """Eight H100s; a finished producer's node (h100-5) is whole again, h100-3 runs one small job.
    The consumer asks for ``gpus``; at 4 (half a node) data gravity may open a whole node, so only
    the guard keeps h100-5 whole (docs/data-gravity.md)."""
    names = [f"h100-{i}" for i in range(8)]
    for n in names:
        service.absorb_node(node_object(n, gpus=8, product=H100, cpu="128", memory="1Ti"))
    _run(service, pod_object("busy", stage="alignment", gpus=1, uid="u-busy",
                             annotations={ANN + "model-params": "1B"}), "h100-3")
    _run(service, pod_object("pretrain", stage="pretraining", gpus=8, uid="u-pre",
                             annotations={ANN + "model-params": "1B"}), "h100-5", finished=True)
    consumer = pod_object("sft", stage="alignment", gpus=gpus, uid="u-sft",
                          annotations={ANN + "model-params": "1B", ANN + "depends-on": "pretrain",
                                       ANN + "input-data-gb": "40"})
    return consumer, names


def test_gravity_does_not_open_a_whole_node_of_the_same_shape(catalog: GpuCatalog) -> None:
    service = _service(catalog)
    consumer, names = _gravity_case(service)
    assert _best(service, consumer, names) == {"h100-3"}
    out = explain_spec(service, parse_workload(consumer))
    guarded = {e["node"]: e.get("whole_node_guard") for e in out["nodes"]}
    assert guarded["h100-5"] and "h100-3" in guarded["h100-5"]
    assert guarded["h100-3"] is None


def test_without_the_guard_gravity_opens_the_producers_whole_node(catalog: GpuCatalog) -> None:
    # The trade the guard removes: the same case picks the producer's (whole) node.
    service = _service(catalog, guard=False)
    consumer, names = _gravity_case(service)
    assert _best(service, consumer, names) == {"h100-5"}


def test_gravity_opens_no_whole_node_far_bigger_than_the_pod(catalog: GpuCatalog) -> None:
    # Without the guard, a 2-GPU consumer still does not open its producer's whole 8-GPU node: its
    # pull there is capped at that of the partly used h100-3, so packing puts it beside the small job.
    service = _service(catalog, guard=False)
    consumer, names = _gravity_case(service, gpus=2)
    assert _best(service, consumer, names) == {"h100-3"}
    out = {e["node"]: e for e in explain_spec(service, parse_workload(consumer))["nodes"]}
    note = out["h100-5"].get("gravity_not_counted")
    assert note and "8-GPU node for 2 GPU(s)" in note
    assert out["h100-5"]["terms"]["gravity"] == out["h100-3"]["terms"]["gravity"]
    assert out["h100-5"]["gravity"]["seconds"] < out["h100-3"]["gravity"]["seconds"]
    # The partly used node and the far whole nodes keep their own gravity, with no note.
    assert out["h100-3"].get("gravity_not_counted") is None and out["h100-0"].get("gravity_not_counted") is None
    # A half-node consumer is still pulled there: test_without_the_guard_gravity_opens_the_producers_whole_node.


def test_a_pod_that_fills_a_whole_node_is_not_held_back(catalog: GpuCatalog) -> None:
    service = _service(catalog)
    _, names = _gravity_case(service)
    full = pod_object("train8", stage="alignment", gpus=8, uid="u-8", annotations={ANN + "model-params": "1B",
                      ANN + "depends-on": "pretrain", ANN + "input-data-gb": "40"})
    assert _best(service, full, names) == {"h100-5"}


def test_other_shapes_still_compete_on_cost(catalog: GpuCatalog) -> None:
    # Serving a small model: a whole L4 node stays cheaper than a partly used H100 node.
    service = _service(catalog)
    service.absorb_node(node_object("h100-0", gpus=8, product=H100, cpu="128", memory="1Ti"))
    service.absorb_node(node_object("l4-0", gpus=4, product="NVIDIA-L4", cpu="48", memory="192Gi"))
    _run(service, pod_object("busy", stage="serving", gpus=1, uid="u-busy",
                             annotations={ANN + "model-params": "1B"}), "h100-0")
    serve = pod_object("chat", stage="serving", gpus=1, uid="u-chat",
                       annotations={ANN + "model-params": "1B", ANN + "latency-class": "interactive"})
    assert _best(service, serve, ["h100-0", "l4-0"]) == {"l4-0"}


def test_isolation_is_worth_a_whole_node(catalog: GpuCatalog) -> None:
    # Interactive serving keeps away from training even if that opens a whole node of the same shape.
    service = _service(catalog)
    names = ["h100-0", "h100-1"]
    for n in names:
        service.absorb_node(node_object(n, gpus=8, product=H100, cpu="128", memory="1Ti"))
    _run(service, pod_object("sft", stage="alignment", gpus=1, uid="u-sft",
                             annotations={ANN + "model-params": "1B"}), "h100-0")
    chat = pod_object("chat", stage="serving", gpus=1, uid="u-chat",
                      annotations={ANN + "model-params": "1B", ANN + "latency-class": "interactive"})
    assert _best(service, chat, names) == {"h100-1"}


def test_a_sibling_without_cpu_for_its_gpus_does_not_hold_the_pod_back(catalog: GpuCatalog) -> None:
    # h100-3 has GPUs free but almost no CPU left: filling it would strand its remaining GPUs, so the
    # packing term prefers a whole node and the guard must not override that.
    service = _service(catalog)
    consumer, names = _gravity_case(service)
    _run(service, pod_object("cpu-hog", cpu="126", uid="u-hog"), "h100-3")
    best = _best(service, consumer, names)
    assert "h100-3" not in best
    out = explain_spec(service, parse_workload(consumer))
    assert not any(e.get("whole_node_guard") for e in out["nodes"])


# ----- across shapes (docs/scoring.md, "Across shapes") ------------------------------------------
def _serving_fleet(service: ExtenderService, partly: str, product: str) -> list[str]:
    """Two whole L4 nodes and one node of ``product`` already serving one replica."""
    names = ["l4-0", "l4-1", partly]
    for n in names[:2]:
        service.absorb_node(node_object(n, gpus=4, product="NVIDIA-L4", cpu="48", memory="192Gi"))
    service.absorb_node(node_object(partly, gpus=4, product=product, cpu="48", memory="192Gi"))
    _run(service, pod_object("busy", stage="serving", gpus=1, uid="u-busy",
                             annotations={ANN + "model-params": "1B", ANN + "latency-class": "interactive"}),
         partly)
    return names


def _chat(gpus: int = 1) -> dict[str, Any]:
    return pod_object("chat", stage="serving", gpus=gpus, uid="u-chat",
                      annotations={ANN + "model-params": "1B", ANN + "latency-class": "interactive"})


def test_a_partly_used_faster_node_within_the_allowance_takes_the_pod(catalog: GpuCatalog) -> None:
    # An L40S costs 2.3x an L4 per GPU-hour; opening a 4-GPU L4 for one GPU strands three, and at an
    # idle share of 0.5 that is worth up to 1 + 3 x 0.5 = 2.5x: the open L40S slot wins.
    service = _service(catalog, cross_shape=True)
    names = _serving_fleet(service, "l40s-0", "NVIDIA-L40S")
    assert _best(service, _chat(), names) == {"l40s-0"}
    out = explain_spec(service, parse_workload(_chat()))
    notes = {e["node"]: e.get("whole_node_guard") for e in out["nodes"]}
    assert notes["l4-0"] and "l40s-0" in notes["l4-0"] and "same shape" not in notes["l4-0"]
    assert notes["l40s-0"] is None


def test_without_the_allowance_the_cheapest_gpu_opens(catalog: GpuCatalog) -> None:
    service = _service(catalog)  # the default: same shape only
    names = _serving_fleet(service, "l40s-0", "NVIDIA-L40S")
    assert _best(service, _chat(), names) == {"l4-0", "l4-1"}


def test_a_premium_above_the_allowance_opens_the_cheap_node(catalog: GpuCatalog) -> None:
    # Two GPUs of a 4-GPU L4 strand only two: the allowance is 1 + 2 x 0.5 / 2 = 1.5x, below the L40S's
    # 2.3x. A GB200 slot (17x an L4) is out of reach even for one GPU.
    service = _service(catalog, cross_shape=True)
    names = _serving_fleet(service, "l40s-0", "NVIDIA-L40S")
    assert _best(service, _chat(gpus=2), names) == {"l4-0", "l4-1"}
    service = _service(catalog, cross_shape=True)
    names = _serving_fleet(service, "gb200-0", "NVIDIA-GB200")
    assert _best(service, _chat(), names) == {"l4-0", "l4-1"}


def test_consolidating_never_overrides_the_gpu_the_pod_asked_for(catalog: GpuCatalog) -> None:
    # The same fleet as above, but the pod asks for L4s (gpu-preference): the open L40S slot is within
    # the price allowance, yet not what the pod asked for, so a whole L4 opens (the hardware terms of
    # the stand-in must be at least as good).
    service = _service(catalog, cross_shape=True)
    names = _serving_fleet(service, "l40s-0", "NVIDIA-L40S")
    chat = _chat()
    chat["metadata"]["annotations"][ANN + "gpu-preference"] = "L4"
    assert _best(service, chat, names) == {"l4-0", "l4-1"}
    out = explain_spec(service, parse_workload(chat))
    assert not any(e.get("whole_node_guard") for e in out["nodes"])


def test_gravity_cap_compares_with_smaller_whole_nodes_only(catalog: GpuCatalog) -> None:
    # No node is partly used. A 1-GPU consumer may still be pulled to its producer's 8-GPU node when
    # only 8-GPU nodes fit; with a 4-GPU node in the running, the 8-GPU node pulls no harder than it.
    service = _service(catalog, guard=False)
    for n in ("h100-a", "h100-b"):
        service.absorb_node(node_object(n, gpus=8, product=H100, cpu="128", memory="1Ti"))
    _run(service, pod_object("pretrain", stage="pretraining", gpus=8, uid="u-pre",
                             annotations={ANN + "model-params": "1B"}), "h100-a", finished=True)
    quant = pod_object("quant", stage="deployment", gpus=1, uid="u-q",
                       annotations={ANN + "model-params": "1B", ANN + "depends-on": "pretrain",
                                    ANN + "input-data-gb": "400"})
    only_big = {e["node"]: e for e in explain_spec(service, parse_workload(quant))["nodes"]}
    assert only_big["h100-a"].get("gravity_not_counted") is None
    assert only_big["h100-a"]["terms"]["gravity"] > only_big["h100-b"]["terms"]["gravity"]
    assert _best(service, quant, ["h100-a", "h100-b"]) == {"h100-a"}

    service.absorb_node(node_object("h100-small", gpus=4, product=H100, cpu="64", memory="512Gi"))
    mixed = {e["node"]: e for e in explain_spec(service, parse_workload(quant))["nodes"]}
    assert "8-GPU node for 1 GPU(s)" in (mixed["h100-a"].get("gravity_not_counted") or "")
    assert mixed["h100-a"]["terms"]["gravity"] == mixed["h100-small"]["terms"]["gravity"]
    # The 4-GPU node is itself more than twice the pod, but nothing smaller fits: it keeps its pull.
    assert mixed["h100-small"].get("gravity_not_counted") is None
    assert _best(service, quant, ["h100-a", "h100-b", "h100-small"]) == {"h100-small"}
