"""Tensor-parallel communication of multi-GPU serving, PCIe against NVLink (docs/stage-policy.md,
"Tensor-parallel communication").

Expected figures are computed here from the published numbers, not read back from the code:
* Megatron-LM (arXiv:1909.08053, section 3): two all-reduces per layer in the forward pass;
* PCIe x16 per direction: 16 GT/s x 16 lanes x 128/130 / 8 = 31.5 GB/s (Gen4), 15.75 GB/s (Gen3);
  NVIDIA data sheets quote both directions: L4 / L40S "PCIe Gen4 x16 64 GB/s", T4 "32 GB/s";
* H100 SXM data sheet: NVLink 900 GB/s per GPU, both directions together;
* NCCL src/graph/tuning.cc: ring all-reduce latency = base + 2 (n - 1) x per-step latency
  (LL: 3.6 + 1.0/step over PCIe, 0.47/step over NVLink; Simple: 8.4 + 5.7 PCIe, 3.4 NVLink, in us),
  LL at a quarter of the bus bandwidth;
* nccl-tests doc/PERFORMANCE.md: each GPU moves 2 (n - 1) / n of an all-reduce's message.
"""

from __future__ import annotations

from typing import Any

import pytest

from app.base.catalog import GpuCatalog, default_catalog
from app.base.objects import node_object, pod_object
from app.base.workload import parse_workload
from app.config.settings import Settings
from app.extender.service import ExtenderService
from app.extender.wiring import build_core
from app.serving.model import default_calibration, target_quantile, tp_link
from app.serving.sizing import allreduce_us, gpu_link, shape

ANN = "llm-placement.io/"
CATALOG = default_catalog()


def spec_of(gpus: int, **ann: str) -> Any:
    pod = pod_object("p", stage="serving", gpus=gpus,
                     annotations={ANN + k.replace("_", "-"): v for k, v in ann.items()})
    return parse_workload(pod)


@pytest.fixture
def service() -> ExtenderService:
    svc = build_core(Settings(cluster_source="none", metrics_port=0), GpuCatalog.load())
    for name, product in (("l40s", "NVIDIA-L40S"), ("h100", "NVIDIA-H100-80GB-HBM3"),
                          ("t4", "Tesla-T4")):
        svc.absorb_node(node_object(name, gpus=4, product=product))
    return svc


def test_links_come_from_the_catalog_with_data_sheet_bandwidths() -> None:
    for name in ("L4", "L40S", "A10G"):
        link = gpu_link(CATALOG.by_name(name))  # type: ignore[arg-type]
        assert (link.kind, link.gb_per_s) == ("pcie", pytest.approx(16 * 16 * 128 / 130 / 8, rel=1e-3))
        assert 2 * link.gb_per_s == pytest.approx(64, rel=0.02)  # the data sheet's bidirectional 64
    t4 = gpu_link(CATALOG.by_name("T4"))  # type: ignore[arg-type]
    assert (t4.kind, t4.gb_per_s) == ("pcie", pytest.approx(8 * 16 * 128 / 130 / 8, rel=1e-3))
    h100 = gpu_link(CATALOG.by_name("H100-SXM-80GB"))  # type: ignore[arg-type]
    assert (h100.kind, h100.gb_per_s) == ("nvlink", 900 / 2)
    # A PCIe H100 has a pair-only bridge: a 4-GPU ring crosses PCIe Gen5.
    pcie_h100 = gpu_link(CATALOG.by_name("H100-PCIe-80GB"))  # type: ignore[arg-type]
    assert (pcie_h100.kind, pcie_h100.gb_per_s) == ("pcie", pytest.approx(32 * 16 * 128 / 130 / 8, rel=1e-3))


def test_one_allreduce_follows_nccls_ring_model() -> None:
    pcie = gpu_link(CATALOG.by_name("L40S"))  # type: ignore[arg-type]
    nvl = gpu_link(CATALOG.by_name("H100-SXM-80GB"))  # type: ignore[arg-type]
    # A decode step of 8 sequences, hidden 8,192, bf16: 131 kB; 4 GPUs move 1.5x that each way.
    msg = 8 * 8192 * 2
    vol = 2 * 3 / 4 * msg
    gen4 = 16 * 16 * 128 / 130 / 8 * 1e3  # bytes per microsecond
    ll_pcie = 3.6 + 6 * 1.0 + vol / (gen4 * 0.25)
    simple_pcie = 8.4 + 6 * 5.7 + vol / gen4
    assert allreduce_us(msg, 4, pcie) == pytest.approx(min(ll_pcie, simple_pcie), rel=1e-3)
    ll_nvl = 3.6 + 6 * 0.47 + vol / (450e3 * 0.25)
    assert allreduce_us(msg, 4, nvl) == pytest.approx(ll_nvl, rel=1e-9)
    # A prefill-sized message (4,096 tokens): bandwidth-bound, NCCL's Simple protocol wins.
    big = 4096 * 8192 * 2
    assert allreduce_us(big, 4, pcie) == pytest.approx(8.4 + 6 * 5.7 + 1.5 * big / gen4, rel=1e-3)
    assert allreduce_us(msg, 1, pcie) == 0.0


def _tp(spec: Any, gpu: str) -> Any:
    from app.serving.model import default_calibration, serving_estimate

    class Defaults:
        default_context_tokens = 4096
        default_concurrency = 1  # the setting's default (docs/stage-policy.md, "Default load")
        serving = default_calibration()

    g = CATALOG.by_name(gpu)
    assert g is not None
    return serving_estimate(spec, spec.precision, g, g.hbm_bandwidth_tbs, Defaults())


def test_per_token_cost_is_two_allreduces_per_layer_and_pcie_pays_more() -> None:
    from app.serving.model import default_calibration

    cal = default_calibration()
    spec = spec_of(4, model_params="70B", precision="int8", concurrency="8")
    layers, hidden = shape(70e9)
    pcie, nvl = _tp(spec, "L40S"), _tp(spec, "H100-SXM-80GB")
    link = tp_link(CATALOG.by_name("L40S"), cal)  # type: ignore[arg-type]
    # Two all-reduces per layer: the link's measured latency plus NCCL's transfer of the batch.
    one = cal.allreduce_latency_us["pcie"] + allreduce_us(8 * hidden * 2, 4, link)
    assert pcie.tp_per_token_ms == pytest.approx(2 * layers * one / 1e3)
    # The prompt (half the default context) all-reduces once, whole.
    big = cal.allreduce_latency_us["pcie"] + allreduce_us(2048 * hidden * 2, 4, link)
    assert pcie.tp_prefill_ms == pytest.approx(2 * layers * big / 1e3)
    assert pcie.tp_per_token_ms > nvl.tp_per_token_ms
    assert pcie.tp_prefill_ms > 5 * nvl.tp_prefill_ms
    # Concurrency widens the decode message.
    wide = _tp(spec_of(4, model_params="70B", precision="int8", concurrency="64"), "L40S")
    assert wide.tp_per_token_ms > pcie.tp_per_token_ms
    # One GPU: nothing to all-reduce.
    assert _tp(spec_of(1, model_params="70B"), "L40S").tp_per_token_ms == 0


def test_the_estimate_includes_the_allreduces_on_pcie_nodes(service: ExtenderService) -> None:
    spec = spec_of(4, model_params="70B", precision="int8", latency_class="batch")
    fits, _ = service.placer.evaluate_nodes(spec, ["l40s", "h100"])
    for name in ("l40s", "h100"):
        fit = fits[name]
        assert fit.tp is not None and fit.estimate is not None
        assert fit.ms_per_token == pytest.approx(fit.estimate.ms_per_token)
        assert fit.tp.per_token_ms == pytest.approx(fit.estimate.tp_per_token_ms)
        assert fit.tp.per_token_ms > 0
        assert dict(fit.estimate.parts)["all-reduce"] == pytest.approx(fit.tp.per_token_ms)
    assert fits["l40s"].tp.link.kind == "pcie"  # type: ignore[union-attr]
    assert fits["h100"].tp.link.kind == "nvlink"  # type: ignore[union-attr]


def test_a_target_bandwidth_alone_meets_is_missed_over_pcie(service: ExtenderService) -> None:
    base = spec_of(4, model_params="70B", precision="int8", latency_class="batch")
    est = _tp(base, "L40S")
    # The filter compares the estimate times its group's quantile (docs/stage-policy.md).
    confidence = service.placer.policy.feasibility.serving_confidence
    margin = target_quantile(default_calibration(), "int8/fp8", "tpot", confidence, 1).factor
    target = margin * (est.ms_per_token - est.tp_per_token_ms / 2)
    spec = spec_of(4, model_params="70B", precision="int8", latency_class="batch",
                   max_ms_per_token=f"{target:.3f}")
    fits, rejections = service.placer.evaluate_nodes(spec, ["l40s", "h100"])
    assert set(fits) == {"h100"}
    assert (f"cannot meet {float(f'{target:.3f}'):g} ms/token: tensor-parallel all-reduce over pcie too slow"
            in rejections["l40s"].message)
    # A time-to-first-token target: prefill compute alone fits on the L40S, the prompt's
    # all-reduces over PCIe do not.
    probe_spec = spec_of(4, model_params="8B", prompt_tokens="2000", serving_role="prefill")
    probe = _tp(probe_spec, "L40S")
    limit = (target_quantile(default_calibration(), "tp>=4", "ttft", confidence, 1).factor
             * (probe.ttft_ms - probe.tp_prefill_ms / 2))
    spec = spec_of(4, model_params="8B", prompt_tokens="2000", serving_role="prefill",
                   max_ttft_ms=f"{limit:.3f}")
    fits, rejections = service.placer.evaluate_nodes(spec, ["l40s", "h100"])
    assert "h100" in fits and "l40s" not in fits
    assert "tensor-parallel all-reduce over pcie too slow" in rejections["l40s"].message


def test_explain_shows_the_term(service: ExtenderService) -> None:
    from app.extender.explain import explain_spec

    out = explain_spec(service, spec_of(4, model_params="70B", precision="int8", latency_class="batch"))
    by_node = {e["node"]: e for e in out["nodes"]}
    l40s = by_node["l40s"]["tensor_parallel"]
    assert l40s["link"] == "pcie4" and l40s["link_kind"] == "pcie" and l40s["gpus"] == 4
    assert l40s["ms_per_token"] > by_node["h100"]["tensor_parallel"]["ms_per_token"] > 0
    single = explain_spec(service, spec_of(1, model_params="7B"))
    assert all(e.get("tensor_parallel") is None for e in single["nodes"])
