"""The `model` annotation and the memory each GPU really offers (docs/stage-policy.md, "The serving
model")."""

from __future__ import annotations

import pytest

from app.base.catalog import GpuCatalog
from app.base.model_registry import default_registry
from app.base.objects import node_object, pod_object
from app.base.workload import WorkloadError, parse_workload
from app.config.settings import Settings
from app.extender.wiring import build_core
from app.serving.sizing import kv_bytes_per_token, kv_cache_gb

ANN = "llm-placement.io/"


def spec(**ann: str):  # type: ignore[no-untyped-def]
    return parse_workload(pod_object("p", stage="serving", gpus=1,
                                     annotations={ANN + k.replace("_", "-"): v for k, v in ann.items()}))


def test_model_fills_params_and_sizes_the_kv_cache_from_its_architecture() -> None:
    s = spec(model="meta-llama/Llama-3.1-70B-Instruct")
    arch = default_registry().get("llama-3.1-70b")
    assert arch is not None and s.model == "llama-3.1-70b" and s.model_params == arch.params
    # 2 (K, V) x 80 layers x 8 KV heads x 128 x 2 bytes, from the config, not the size rule.
    assert arch.kv_bytes_per_token() == 2 * 80 * 8 * 128 * 2
    with_model = kv_cache_gb(s, 4096, 8)
    assert with_model == pytest.approx(4096 * 8 * arch.kv_bytes_per_token() / 1e9)
    without = kv_cache_gb(spec(model_params="70B"), 4096, 8)
    assert without == pytest.approx(4096 * 8 * kv_bytes_per_token(70e9) / 1e9)
    assert with_model != pytest.approx(without)


def test_unknown_model_is_refused_naming_the_nearest() -> None:
    with pytest.raises(WorkloadError, match=r'model "llama-3.1-7b" is not in the model registry \(nearest: '):
        spec(model="llama-3.1-7b")


def test_model_and_model_params_must_agree() -> None:
    assert spec(model="llama-2-7b", model_params="7B").model_params == 7e9
    with pytest.raises(WorkloadError, match="model-params 13B disagrees with model llama-2-7b"):
        spec(model="llama-2-7b", model_params="13B")


def test_a_node_without_a_memory_label_offers_what_the_driver_reports() -> None:
    """70B at fp8 on one H100 runs in practice; with the marketed 80 GB it was refused."""
    svc = build_core(Settings(cluster_source="none", metrics_port=0), GpuCatalog.load())
    svc.absorb_node(node_object("h100", gpus=1, product="NVIDIA-H100-80GB-HBM3"))
    facts = svc.snapshot.nodes["h100"]
    assert facts.gpu is not None and facts.gpu.memory_mib == 81559
    assert facts.gpu_memory_gb == pytest.approx(81559 * 1.048576 / 1000)
    pod = spec(model="llama-3.1-70b", precision="fp8", context_tokens="4096", concurrency="1",
               latency_class="batch")
    fits, rejections = svc.placer.evaluate_nodes(pod, ["h100"])
    assert "h100" in fits, rejections


def test_explain_shows_the_estimate_its_error_band_and_what_decided() -> None:
    from app.extender.explain import explain_spec

    svc = build_core(Settings(cluster_source="none", metrics_port=0), GpuCatalog.load())
    svc.absorb_node(node_object("h100", gpus=2, product="NVIDIA-H100-80GB-HBM3"))
    out = explain_spec(svc, spec(model="llama-3.1-8b", latency_class="batch"))
    note = next(e for e in out["nodes"] if e["node"] == "h100")["serving_model"]
    assert note["decided_by"] == "estimate"
    assert set(note["parts_ms"]) == {"weights read", "matrix work", "step floor", "all-reduce", "other prompts"}
    parts = note["parts_ms"]
    # The step is the slower of reading and computing, plus what every step pays.
    total = (max(parts["weights read"], parts["matrix work"]) + parts["step floor"] + parts["all-reduce"]
             + parts["other prompts"])
    assert note["estimated_ms_per_token"] == pytest.approx(total, abs=0.02)
    band = note["error_band"]
    assert band is not None and band["group"] == "dense" and band["p10"] <= band["median"] <= band["p90"]


def test_explain_shows_the_quantile_its_targets_were_checked_with() -> None:
    from app.extender.explain import explain_spec
    from app.serving.model import DEFAULT_CONFIDENCE, default_calibration, target_quantile

    svc = build_core(Settings(cluster_source="none", metrics_port=0), GpuCatalog.load())
    svc.absorb_node(node_object("h100", gpus=2, product="NVIDIA-H100-80GB-HBM3"))
    out = explain_spec(svc, spec(model="llama-3.1-8b", precision="int4", latency_class="batch",
                                 max_ms_per_token="500"))
    note = next(e for e in out["nodes"] if e["node"] == "h100")["serving_model"]
    for metric in ("tpot", "ttft"):
        want = target_quantile(default_calibration(), "int4", metric, DEFAULT_CONFIDENCE, 1)
        assert note["target_quantile"][metric] == {"confidence": DEFAULT_CONFIDENCE, "quantile": round(want.factor, 3),
                                                   "group": want.group, "points": want.n}
    line = note["target_decision"][0]
    pct = f"{DEFAULT_CONFIDENCE * 100:g}"
    assert line.startswith(f"meets 500 ms/token at {pct} % confidence: estimate ")
    tpot = target_quantile(default_calibration(), "int4", "tpot", DEFAULT_CONFIDENCE, 1)
    assert f"x q{pct} {tpot.factor:.2f} =" in line
