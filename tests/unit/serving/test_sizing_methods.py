"""Sizing of today's workloads as they run: LoRA / QLoRA fine-tuning and mixture-of-experts decode
(docs/stage-policy.md, "Memory sizing")."""

from __future__ import annotations

from typing import Any

import pytest

from app.base.catalog import GpuCatalog
from app.base.objects import node_object, pod_object
from app.base.workload import FinetuneMethod, Precision, WorkloadError, parse_workload
from app.config.settings import Settings
from app.extender.service import ExtenderService
from app.extender.wiring import build_core
from app.serving.sizing import decode_ms_per_token, size

ANN = "llm-placement.io/"


def spec_of(stage: str, gpus: int = 1, **ann: str) -> Any:
    pod = pod_object("p", stage=stage, gpus=gpus,
                     annotations={ANN + k.replace("_", "-"): v for k, v in ann.items()})
    return parse_workload(pod)


def per_gpu(spec: Any, precision: Precision = Precision.BF16) -> float:
    return size(spec, precision, default_context=4096, default_concurrency=8).per_gpu_gb


@pytest.fixture
def service() -> ExtenderService:
    svc = build_core(Settings(cluster_source="none", metrics_port=0), GpuCatalog.load())
    for name, product in (("l4", "NVIDIA-L4"), ("a10", "NVIDIA-A10"), ("t4", "Tesla-T4"),
                          ("h100", "NVIDIA-H100-80GB-HBM3")):
        svc.absorb_node(node_object(name, gpus=4 if name != "h100" else 8, product=product))
    return svc


def test_full_fine_tuning_keeps_the_adam_figure() -> None:
    # 16 bytes per parameter, +20 % activations, +1 GB runtime, +15 % alignment headroom: 7B -> 156 GB.
    full = spec_of("sft", model_params="7B")
    assert full.effective_finetune_method is FinetuneMethod.FULL
    assert per_gpu(full) == pytest.approx((7e9 * 16 / 1e9 * 1.2 + 1) * 1.15)
    assert per_gpu(spec_of("sft", model_params="7B", finetune_method="full")) == per_gpu(full)


def test_lora_and_qlora_7b_fit_one_24_gb_gpu() -> None:
    lora = per_gpu(spec_of("sft", model_params="7B", finetune_method="lora"))
    qlora = per_gpu(spec_of("sft", model_params="7B", finetune_method="qlora"))
    # The bf16 base alone is 14 GB; adapters (~42M at rank 16), activations and runtime add ~6 GB.
    assert 14 < lora < 24 * 0.9
    # QLoRA paper: a 4-bit NF4 base with double quantisation, ~4.127 bits per parameter (3.6 GB).
    assert 3.6 < qlora < 12 and qlora < lora - 9
    # The precision annotation sets a LoRA base's bytes; QLoRA is 4-bit whatever it says.
    assert per_gpu(spec_of("sft", model_params="7B", finetune_method="lora"), Precision.INT8) < lora
    assert per_gpu(spec_of("sft", model_params="7B", finetune_method="qlora"), Precision.FP32) == qlora


def test_trainable_params_alone_means_adapters_and_scales_the_optimizer_state() -> None:
    small = spec_of("sft", model_params="7B", trainable_params="10M")
    big = spec_of("sft", model_params="7B", trainable_params="1B")
    assert small.effective_finetune_method is FinetuneMethod.LORA
    assert per_gpu(big) - per_gpu(small) == pytest.approx(0.99e9 * 16 / 1e9 * 1.15)


def test_breakdown_adds_up_to_the_total() -> None:
    for method in ("full", "lora", "qlora"):
        s = size(spec_of("sft", model_params="7B", finetune_method=method), Precision.BF16,
                 default_context=4096, default_concurrency=8)
        assert sum(v for _, v in s.breakdown) == pytest.approx(s.per_gpu_gb)
    s = size(spec_of("serving", model_params="7B"), Precision.BF16, default_context=4096,
             default_concurrency=8)
    assert sum(v for _, v in s.breakdown) == pytest.approx(s.per_gpu_gb)


def test_lora_7b_sft_lands_on_an_l4_class_gpu_full_does_not(service: ExtenderService) -> None:
    nodes = ["l4", "a10", "t4", "h100"]
    fits, rejections = service.placer.evaluate_nodes(
        spec_of("sft", model_params="7B", finetune_method="lora"), nodes)
    assert {"l4", "a10", "h100"} <= set(fits) and "t4" in rejections  # 16 GB T4 is too small
    assert "lora training needs" in rejections["t4"].message
    fits, rejections = service.placer.evaluate_nodes(spec_of("sft", model_params="7B"), nodes)
    assert not fits and "training needs 156 GB per GPU" in rejections["h100"].message
    fits, _ = service.placer.evaluate_nodes(
        spec_of("sft", model_params="7B", finetune_method="qlora"), nodes)
    assert set(fits) == set(nodes)


def test_explain_shows_the_breakdown(service: ExtenderService) -> None:
    from app.extender.explain import explain_spec

    out = explain_spec(service, spec_of("sft", model_params="7B", finetune_method="qlora"))
    assert out["finetune_method"] == "qlora"
    entry = next(e for e in out["nodes"] if e["node"] == "l4")
    assert set(entry["memory_breakdown"]) >= {"frozen weights (nf4)", "adapters + gradients + Adam",
                                              "activations", "runtime"}


@pytest.mark.parametrize(("ann", "text"), [
    ({"finetune_method": "dora"}, 'finetune-method "dora" is not full, lora or qlora'),
    ({"trainable_params": "40M"}, "trainable-params is set but model-params is missing"),
    ({"model_params": "7B", "trainable_params": "8B"}, "trainable-params is larger than model-params"),
    ({"model_params": "7B", "trainable_params": "lots"}, 'trainable-params "lots" is not a parameter'),
    ({"model_params": "7B", "finetune_method": "full", "trainable_params": "1B"}, "not full"),
    ({"model_params": "7B", "active_params": "9B"}, "active-params is larger than model-params"),
    ({"model_params": "7B", "active_params": "1e400"}, 'active-params "1e400" is not a parameter'),
])
def test_bad_values_are_clear_problems(ann: dict[str, str], text: str) -> None:
    with pytest.raises(WorkloadError) as exc:
        spec_of("sft", **ann)
    assert any(text in p for p in exc.value.problems), exc.value.problems


def test_moe_decode_reads_the_active_experts_not_all_of_them() -> None:
    # Qwen3-235B-A22B (model card: 235B total, 22B activated) at fp8 on 8 H100 (3.35 TB/s each).
    dense = spec_of("serving", gpus=8, model_params="235B", precision="fp8", concurrency="1")
    moe = spec_of("serving", gpus=8, model_params="235B", active_params="22B", precision="fp8",
                  concurrency="1")
    sd, sm = (size(s, Precision.FP8, default_context=4096, default_concurrency=8) for s in (dense, moe))
    assert sm.weights_gb == sd.weights_gb == 235  # memory holds every expert
    ms_dense = decode_ms_per_token(sd, 8, 3.35, 0.6)
    ms_moe = decode_ms_per_token(sm, 8, 3.35, 0.6)
    assert ms_dense is not None and ms_moe is not None
    assert ms_dense / ms_moe > 8  # one sequence reads ~22 GB of weights, not 235 GB
    # A batch touches more experts: 8 sequences read 1 - (1 - 22/235)^8 = 55 % of the weights.
    batch = spec_of("serving", gpus=8, model_params="235B", active_params="22B", precision="fp8",
                    concurrency="8")
    sb = size(batch, Precision.FP8, default_context=4096, default_concurrency=8)
    assert sb.read_gb == pytest.approx(235 * (1 - (1 - 22 / 235) ** 8) + sb.kv_cache_gb)
    ms_batch = decode_ms_per_token(sb, 8, 3.35, 0.6)
    assert ms_batch is not None and ms_moe < ms_batch < ms_dense


def test_moe_kv_cache_follows_the_attention_of_the_active_path() -> None:
    dense = spec_of("serving", model_params="235B")
    moe = spec_of("serving", model_params="235B", active_params="22B")
    kv = [size(s, Precision.BF16, default_context=4096, default_concurrency=8).kv_cache_gb
          for s in (dense, moe)]
    assert kv[1] < kv[0] / 2


def test_moe_is_placed_by_active_bandwidth(service: ExtenderService) -> None:
    # 30B total / 3B active (Qwen3-30B-A3B) at int4 on one GPU, 40 ms/token: a dense 30B reads 15 GB
    # per token and misses on every GPU but H100; the MoE model meets it on an L4 even with the MoE
    # error quantile (docs/stage-policy.md, "Target decision").
    base = {"model_params": "30B", "precision": "int4", "max_ms_per_token": "40", "concurrency": "1",
            "context_tokens": "2048"}
    fits, _ = service.placer.evaluate_nodes(spec_of("serving", **base), ["l4", "h100"])
    assert set(fits) == {"h100"}
    fits, _ = service.placer.evaluate_nodes(spec_of("serving", active_params="3B", **base), ["l4", "h100"])
    assert set(fits) == {"l4", "h100"}


def _chat(**ann: str) -> Any:
    return spec_of("serving", **{"model_params": "7B", "precision": "int8", **ann})


def test_default_interactive_target_filters_only_when_some_node_meets_it(service: ExtenderService) -> None:
    # 13B int8: an L4 (300 GB/s) is predicted above the default 50 ms/token, an H100 well below, so
    # the L4 is filtered out.
    big = _chat(model_params="13B")
    fits, rejections = service.placer.evaluate_nodes(big, ["l4", "h100"])
    assert set(fits) == {"h100"}
    assert rejections["l4"].code.value == "latency_slo"
    assert "default interactive target of 50 ms/token" in rejections["l4"].message
    # When no candidate meets it, the pod is not refused: the slow node stays feasible.
    fits, _ = service.placer.evaluate_nodes(big, ["l4"])
    assert set(fits) == {"l4"} and (fits["l4"].ms_per_token or 0) > 50
    # An explicit target, batch serving, or the setting turned off: the default does not filter.
    fits, _ = service.placer.evaluate_nodes(_chat(model_params="13B", max_ms_per_token="150"), ["l4", "h100"])
    assert set(fits) == {"l4", "h100"}
    fits, _ = service.placer.evaluate_nodes(_chat(model_params="13B", latency_class="batch"), ["l4", "h100"])
    assert set(fits) == {"l4", "h100"}


def test_default_target_filter_can_be_turned_off() -> None:
    svc = build_core(Settings(cluster_source="none", metrics_port=0, feature_gates={"DefaultTargetFilter": False}),
                     GpuCatalog.load())
    for name, product in (("t4", "Tesla-T4"), ("h100", "NVIDIA-H100-80GB-HBM3")):
        svc.absorb_node(node_object(name, gpus=4, product=product))
    fits, _ = svc.placer.evaluate_nodes(_chat(), ["t4", "h100"])
    assert set(fits) == {"t4", "h100"}


def test_time_to_first_token_uses_the_catalogs_tflops(service: ExtenderService) -> None:
    # 7B bf16, 4,000-token prompt: 2 x 4,000 x 7e9 = 56 TFLOP of matrix work, at the calibrated share
    # of each GPU's data-sheet dense BF16 figure: the H100 (989 TFLOPS) meets 500 ms, the L4 (121)
    # and T4 (65) do not.
    ann = {"model_params": "7B", "prompt_tokens": "4000", "max_ttft_ms": "500", "latency_class": "batch",
           "concurrency": "1"}  # alone: no other requests to wait behind
    fits, rejections = service.placer.evaluate_nodes(spec_of("serving", **ann), ["l4", "t4", "h100"])
    assert set(fits) == {"h100"}
    est = fits["h100"].estimate
    assert est is not None and fits["h100"].ttft_ms == pytest.approx(est.ttft_ms)
    assert fits["h100"].ttft_ms > 2 * 4000 * 7e9 / 989e12 * 1e3  # never above the data sheet's peak
    assert "cannot meet 500 ms to first token: compute too low" in rejections["l4"].message
    # MoE prefill computes with the active parameters only.
    fits, _ = service.placer.evaluate_nodes(spec_of("serving", active_params="1B", **ann), ["l4"])
    assert set(fits) == {"l4"}
    # A decode pod is not held to the TTFT target; a prefill pod not to a ms/token target.
    fits, _ = service.placer.evaluate_nodes(spec_of("serving", serving_role="decode", **ann), ["l4"])
    assert set(fits) == {"l4"}
    fits, _ = service.placer.evaluate_nodes(
        spec_of("serving", serving_role="prefill", max_ms_per_token="1", **ann), ["h100"])
    assert set(fits) == {"h100"}
    with pytest.raises(WorkloadError, match='serving-role "mixed" is not prefill, decode or both'):
        spec_of("serving", serving_role="mixed")
    with pytest.raises(WorkloadError, match='max-ttft-ms "-3" must be greater than zero'):
        spec_of("serving", max_ttft_ms="-3")
