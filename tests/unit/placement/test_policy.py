"""Stage policy on the mixed cluster: hard rules in filter, preferences in prioritize."""

from __future__ import annotations

from typing import Any

from app.base.objects import pod_object
from app.base.workload import LatencyClass, Stage
from app.config.settings import Settings
from app.extender.service import ExtenderService
from app.snapshot.store import PlacedPod
from tests.conftest import mixed_nodes, mixed_service

NAMES = [n["metadata"]["name"] for n in mixed_nodes()]
GPU_NODES = {"h200-0", "h100-0", "a100-0", "l40s-0", "l4-0", "t4-0"}


def ranked(service: ExtenderService, pod: dict[str, Any]) -> list[str]:
    d = service.placer.filter(pod, NAMES)
    assert d.spec is not None
    scores = service.placer.score(d.spec, [d.fits[n] for n in d.passed])
    return [s.node for s in sorted(scores, key=lambda s: (-s.score, -s.total, s.node))]


def test_70b_serving_with_slo_needs_hbm_bandwidth(service: ExtenderService) -> None:
    pod = pod_object("p", stage="serving", gpus=4, annotations={
        "llm-placement.io/model-params": "70B", "llm-placement.io/max-ms-per-token": "25"})
    d = service.placer.filter(pod, NAMES)
    assert sorted(d.passed) == ["h100-0", "h200-0"]
    for n in d.passed:  # the prediction that let them through really meets the SLO
        ms = d.fits[n].ms_per_token
        assert ms is not None and ms <= 25


def test_70b_without_slo_still_needs_memory(service: ExtenderService) -> None:
    pod = pod_object("p", stage="serving", gpus=4, annotations={"llm-placement.io/model-params": "70B"})
    d = service.placer.filter(pod, NAMES)
    assert "t4-0" in d.unresolvable and "l4-0" in d.unresolvable
    assert "GPU memory too small" in d.unresolvable["t4-0"]
    assert {"h200-0", "h100-0", "a100-0"} <= set(d.passed)


def test_7b_int8_goes_to_cheapest_adequate_gpu(service: ExtenderService) -> None:
    # With an explicit 80 ms/token target every GPU is adequate, and the cheapest (a T4) wins.
    pod = pod_object("p", stage="serving", gpus=1, annotations={
        "llm-placement.io/model-params": "7B", "llm-placement.io/precision": "int8",
        "llm-placement.io/max-ms-per-token": "80"})
    order = ranked(service, pod)
    costs = {n: service.snapshot.nodes[n].hourly_cost / service.snapshot.nodes[n].gpu_count for n in GPU_NODES}
    assert order[0] == min(costs, key=lambda n: costs[n]) == "t4-0"
    assert order.index("h200-0") > order.index("l4-0")
    # Without a target, interactive serving is held to the default 50 ms/token: the nodes the serving
    # model predicts slower are filtered out (others meet it), and the cheapest that meets it wins.
    pod["metadata"]["annotations"].pop("llm-placement.io/max-ms-per-token")
    pod["metadata"]["annotations"]["llm-placement.io/model-params"] = "13B"
    d = service.placer.filter(pod, NAMES)
    assert "t4-0" in d.unresolvable and "l4-0" in d.unresolvable
    assert "misses the default interactive target" in d.unresolvable["l4-0"]
    order = ranked(service, pod)
    adequate = [n for n in GPU_NODES if n in d.passed]
    assert order[0] == min(adequate, key=lambda n: costs[n])
    assert all((d.fits[n].ms_per_token or 0) <= 50 for n in adequate)


def test_data_prep_never_scores_gpu_node_above_cpu_node(service: ExtenderService) -> None:
    pod = pod_object("p", stage="data-prep", cpu="8", memory="32Gi")
    d = service.placer.filter(pod, NAMES)
    assert set(d.passed) == {"cpu-0", "storage-0"}
    assert all("stay off GPU nodes" in d.unresolvable[n] for n in GPU_NODES)
    # Even with the hard rule switched off, GPU nodes rank below CPU and storage nodes.
    relaxed = mixed_service(Settings(cluster_source="none", metrics_port=0, cpu_stages_may_use_gpu_nodes=True))
    order = ranked(relaxed, pod)
    assert order[0] == "storage-0"
    assert max(order.index("cpu-0"), order.index("storage-0")) < min(order.index(n) for n in GPU_NODES)


def test_deployment_needs_ram_for_weights(service: ExtenderService) -> None:
    pod = pod_object("q", stage="quantize", cpu="16", memory="64Gi",
                     annotations={"llm-placement.io/model-params": "180B"})
    d = service.placer.filter(pod, NAMES)
    # 180B bf16 = 360 GB x 1.2: only the 512 GiB CPU node holds it.
    assert d.passed == ["cpu-0"]
    assert "node memory" in d.unresolvable["storage-0"]


def test_interactive_serving_kept_off_training_nodes(service: ExtenderService) -> None:
    service.snapshot.place(PlacedPod("t1", "ml/train", "h100-0", 4, 0, 0, Stage.PRETRAINING, None, None))
    pod = pod_object("p", stage="serving", gpus=1, annotations={"llm-placement.io/model-params": "13B"})
    d = service.placer.filter(pod, NAMES)
    assert "h100-0" not in d.passed
    assert d.unresolvable["h100-0"] == "llm-placement: interactive serving is kept off nodes running training"
    batch = pod_object("b", stage="serving", gpus=1, annotations={
        "llm-placement.io/model-params": "13B", "llm-placement.io/latency-class": "batch"})
    assert "h100-0" in service.placer.filter(batch, NAMES).passed


def test_training_avoids_interactive_serving_nodes(service: ExtenderService) -> None:
    service.snapshot.place(PlacedPod("s1", "ml/chat", "h100-0", 1, 0, 0, Stage.SERVING,
                                     LatencyClass.INTERACTIVE, None))
    pod = pod_object("t", stage="sft", gpus=4, annotations={"llm-placement.io/model-params": "7B"})
    order = ranked(service, pod)
    assert order.index("h100-0") > order.index("a100-0")


def test_gpu_accounting_rejects_full_node_resolvably(service: ExtenderService) -> None:
    service.snapshot.place(PlacedPod("x", "ml/x", "l4-0", 4, 0, 0, None, None, None))
    pod = pod_object("p", stage="serving", gpus=1, annotations={"llm-placement.io/model-params": "1B"})
    d = service.placer.filter(pod, NAMES)
    assert "l4-0" in d.failed and "free GPUs" in d.failed["l4-0"]


def test_precision_fallback_quantizes_before_scaling(service: ExtenderService) -> None:
    pod = pod_object("p", stage="serving", gpus=1, annotations={
        "llm-placement.io/model-params": "34B", "llm-placement.io/precision-fallback": "int8",
        "llm-placement.io/latency-class": "batch"})  # memory alone decides here
    d = service.placer.filter(pod, NAMES)
    # bf16 34B (68 GB + KV) fits the H200 and, at the 81,559 MiB an H100 reports, the H100 too;
    # int8 opens the 48 GB L40S; nothing opens the 16 GB T4.
    assert d.fits["h200-0"].sizing.precision.value == "bf16"
    assert d.fits["h100-0"].sizing.precision.value == "bf16" and not d.fits["h100-0"].fallback_used
    assert d.fits["l40s-0"].sizing.precision.value == "int8" and d.fits["l40s-0"].fallback_used
    assert "t4-0" not in d.passed


def test_unknown_gpu_product_is_conservative(service: ExtenderService) -> None:
    from app.base.objects import node_object

    service.absorb_node(node_object("mystery-0", gpus=8, product="NVIDIA-Z9000"))
    facts = service.snapshot.nodes["mystery-0"]
    assert facts.gpu is None and any("not in the catalog" in w for w in facts.warnings)
    sized = pod_object("p", stage="serving", gpus=1, annotations={"llm-placement.io/model-params": "1B"})
    d = service.placer.filter(sized, ["mystery-0"])
    assert "unknown to the catalog" in d.unresolvable["mystery-0"]
    plain = pod_object("plain", gpus=1)  # no model size: nothing to size, the GPU is usable
    assert service.placer.filter(plain, ["mystery-0"]).passed == ["mystery-0"]


def test_node_without_gpu_labels_does_not_crash(service: ExtenderService) -> None:
    from app.base.objects import node_object

    n = node_object("bare-gpu", gpus=2)  # advertises GPUs, no product label at all
    service.absorb_node(n)
    assert "no GPU product label" in service.snapshot.nodes["bare-gpu"].warnings[0]
    pod = pod_object("p", stage="serving", gpus=1, annotations={"llm-placement.io/model-params": "1B"})
    assert "bare-gpu" in service.placer.filter(pod, ["bare-gpu"]).unresolvable


def test_weights_per_stage_come_from_config(service: ExtenderService) -> None:
    pod = pod_object("p", stage="serving", gpus=1, annotations={
        "llm-placement.io/model-params": "7B", "llm-placement.io/precision": "int8"})
    # The default target only scores here (the T4 misses it), so the cheapest hour wins.
    soft = Settings(cluster_source="none", metrics_port=0, feature_gates={"DefaultTargetFilter": False})
    assert ranked(mixed_service(soft), pod)[0] == "t4-0"
    # Make speed everything: the fastest GPU now wins.
    zero = dict.fromkeys(("memory_fit", "cost", "separation", "packing", "preference", "node_class",
                          "gravity", "precision"), 0.0)
    speed = Settings(cluster_source="none", metrics_port=0, default_interactive_ms_per_token=1.0,
                     weights={"serving": {**zero, "bandwidth": 1.0}})
    assert ranked(mixed_service(speed), pod)[0] == "h200-0"


def test_fp8_runs_weight_only_before_hopper_and_not_at_all_on_volta(service: ExtenderService) -> None:
    from app.base.objects import node_object

    service.absorb_node(node_object("v100-0", gpus=8, product="Tesla-V100-SXM2-32GB"))
    names = [*NAMES, "v100-0"]
    pod = pod_object("p", stage="serving", gpus=1, annotations={
        "llm-placement.io/model-params": "13B", "llm-placement.io/precision": "fp8",
        "llm-placement.io/latency-class": "batch"})  # no latency target: only the hardware counts
    d = service.placer.filter(pod, names)
    assert "fp8 needs FP8 tensor cores or weight-only FP8 kernels" in d.unresolvable["v100-0"]
    assert {"h100-0", "l4-0", "a100-0"} <= set(d.passed)  # Hopper and Ada natively, Ampere weight-only
    assert d.fits["a100-0"].sizing.precision.value == "fp8"
    pod["metadata"]["annotations"]["llm-placement.io/precision-fallback"] = "int8"
    d = service.placer.filter(pod, names)
    assert d.fits["v100-0"].sizing.precision.value == "int8"
    assert d.fits["a100-0"].sizing.precision.value == "fp8"


def test_unknown_gpu_node_is_not_priced_like_a_cpu_node(service: ExtenderService) -> None:
    from app.base.objects import node_object

    service.absorb_node(node_object("mystery-1", gpus=8, product="G3"))
    facts = service.snapshot.nodes["mystery-1"]
    assert facts.hourly_cost == 8 * service.settings.unknown_gpu_hourly_cost
    assert facts.hourly_cost > service.snapshot.nodes["cpu-0"].hourly_cost


def test_cpu_pod_on_gpu_nodes_avoids_stranding_free_gpus(service: ExtenderService) -> None:
    from app.base.objects import node_object

    for name in ("busy", "idle"):
        service.absorb_node(node_object(name, gpus=8, product="Tesla-T4", cpu="64", memory="256Gi"))
    service.snapshot.place(PlacedPod("g", "ml/g", "busy", 8, 8000, 0, None, None, None))
    plain = pod_object("cpu-job", cpu="16", memory="8Gi")  # no stage, no GPUs: may use GPU nodes
    d = service.placer.filter(plain, ["busy", "idle"])
    scores = {s.node: s for s in service.placer.score(d.spec, [d.fits[n] for n in d.passed])}
    assert scores["busy"].terms["packing"] > scores["idle"].terms["packing"]


def test_gpu_pod_packing_penalises_leaving_gpus_without_cpu(service: ExtenderService) -> None:
    from app.base.objects import node_object

    for name in ("starved", "roomy"):
        service.absorb_node(node_object(name, gpus=8, product="Tesla-T4", cpu="64", memory="256Gi"))
    # Same GPU use on both, but "starved" has given away almost all of its CPU.
    service.snapshot.place(PlacedPod("a", "ml/a", "starved", 4, 60000, 0, None, None, None))
    service.snapshot.place(PlacedPod("b", "ml/b", "roomy", 4, 8000, 0, None, None, None))
    pod = pod_object("p", gpus=2, cpu="2")
    d = service.placer.filter(pod, ["starved", "roomy"])
    scores = {s.node: s for s in service.placer.score(d.spec, [d.fits[n] for n in d.passed])}
    assert scores["roomy"].terms["packing"] > scores["starved"].terms["packing"]


def test_training_is_priced_per_unit_of_work_not_per_hour() -> None:
    from app.placement.scoring import work_cost

    svc = mixed_service()
    pod = pod_object("ft", stage="alignment", gpus=1, annotations={"llm-placement.io/model-params": "1B"})
    d = svc.placer.filter(pod, NAMES)
    assert d.spec is not None and {"h100-0", "a100-0"} <= set(d.passed)
    h100, a100 = d.fits["h100-0"], d.fits["a100-0"]
    # An A100 hour is cheaper than an H100 hour, but the same work takes its lower BF16 peak longer.
    assert a100.pod_hourly_cost < h100.pod_hourly_cost
    assert h100.node.gpu is not None and a100.node.gpu is not None
    per_work = {n: d.fits[n].pod_hourly_cost / d.fits[n].node.gpu.bf16_tflops  # type: ignore[union-attr]
                for n in ("h100-0", "a100-0")}
    assert work_cost(d.spec, h100, False) == per_work["h100-0"] < work_cost(d.spec, a100, False)
    scores = {s.node: s for s in svc.placer.score(d.spec, [d.fits[n] for n in d.passed])}
    assert scores["h100-0"].terms["cost"] > scores["a100-0"].terms["cost"]
    # Interactive serving keeps the cheapest hour.
    chat = pod_object("chat", stage="serving", gpus=1, annotations={"llm-placement.io/model-params": "1B"})
    c = svc.placer.filter(chat, NAMES)
    assert c.spec is not None
    assert work_cost(c.spec, c.fits["a100-0"], True) == c.fits["a100-0"].pod_hourly_cost
