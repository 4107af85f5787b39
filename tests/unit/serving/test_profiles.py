"""Measured serving profiles replace the estimates for the pods they match, and explain says which
figure is measured and which estimated (docs/stage-policy.md, "Measured profiles")."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from app.base.catalog import GpuCatalog
from app.base.objects import node_object, pod_object
from app.base.workload import parse_workload
from app.config.settings import ConfigError, Settings, load_settings
from app.extender.explain import explain_spec
from app.extender.service import ExtenderService
from app.extender.wiring import build_core
from app.serving.profiles import ProfileBook, ProfileError

ANN = "llm-placement.io/"
CATALOG = GpuCatalog.load()
T4_CHAT = {"model": "chat-7b", "model_params": "7B", "gpu": "T4", "precision": "int8",
           "ms_per_token": 38.0, "source": "benchmark run on our T4 pool"}


def spec_of(gpus: int = 1, **ann: str) -> Any:
    pod = pod_object("p", stage="serving", gpus=gpus,
                     annotations={ANN + k.replace("_", "-"): v for k, v in ann.items()})
    return parse_workload(pod)


def service_with(tmp_path: Path, profiles: list[dict[str, Any]] | None) -> ExtenderService:
    kw: dict[str, Any] = {}
    if profiles is not None:
        path = tmp_path / "profiles.yaml"
        path.write_text(json.dumps({"profiles": profiles}))  # JSON is YAML: either format loads
        kw["profiles_file"] = str(path)
    svc = build_core(Settings(cluster_source="none", metrics_port=0, **kw), CATALOG)
    for name, product in (("t4", "Tesla-T4"), ("h100", "NVIDIA-H100-80GB-HBM3")):
        svc.absorb_node(node_object(name, gpus=4, product=product))
    return svc


def best(svc: ExtenderService, spec: Any) -> tuple[str, dict[str, Any]]:
    fits, rejections = svc.placer.evaluate_nodes(spec, ["t4", "h100"])
    scores = svc.placer.score(spec, list(fits.values()))
    top = max(scores, key=lambda s: s.total).node
    return top, {"fits": fits, "rejections": rejections}


def test_a_measured_profile_changes_the_decision(tmp_path: Path) -> None:
    chat = spec_of(model_params="7B", precision="int8", max_ms_per_token="40", concurrency="8")
    # Estimated: a T4 (0.32 TB/s) cannot read 7 GB of int8 weights plus eight clients' KV cache in
    # 40 ms, the H100 can, so the T4 is filtered out and the H100 serves it.
    top, out = best(service_with(tmp_path, None), chat)
    assert top == "h100" and "t4" in out["rejections"]
    assert out["fits"]["h100"].ms_source == "estimated"
    # Measured at 38 ms on the T4: it meets the target and is the cheaper node.
    svc = service_with(tmp_path, [T4_CHAT])
    top, out = best(svc, chat)
    assert top == "t4"
    t4 = out["fits"]["t4"]
    assert t4.ms_per_token == 38.0 and t4.ms_source == "measured"
    assert t4.estimated_ms_per_token is not None and t4.estimated_ms_per_token > 40
    # Explain names the source of every figure, and keeps the estimate beside the measurement.
    nodes = {e["node"]: e for e in explain_spec(svc, chat)["nodes"]}
    assert nodes["t4"]["ms_per_token_source"] == "measured"
    assert nodes["t4"]["profile"]["source"] == "benchmark run on our T4 pool"
    assert nodes["t4"]["estimated_ms_per_token"] > 40
    assert nodes["h100"]["ms_per_token_source"] == "estimated" and nodes["h100"]["profile"] is None


def test_only_the_same_model_gpu_count_and_precision_match(tmp_path: Path) -> None:
    svc = service_with(tmp_path, [T4_CHAT])
    for other in (spec_of(model_params="7B", precision="int4"), spec_of(model_params="13B", precision="int8"),
                  spec_of(gpus=2, model_params="7B", precision="int8"),
                  spec_of(model_params="7B", active_params="1B", precision="int8")):
        fits, _ = svc.placer.evaluate_nodes(other, ["t4", "h100"])
        assert all(f.profile is None and f.ms_source == "estimated" for f in fits.values())
    # A model card's exact count is the same model as the round figure (1 % tolerance).
    fits, _ = svc.placer.evaluate_nodes(spec_of(model_params="7.05B", precision="int8"), ["t4"])
    assert fits["t4"].ms_source == "measured"


def test_measured_concurrency_and_time_to_first_token(tmp_path: Path) -> None:
    svc = service_with(tmp_path, [{**T4_CHAT, "max_concurrency": 4, "ttft_ms": 900, "prompt_tokens": 1000}])
    fits, rejections = svc.placer.evaluate_nodes(
        spec_of(model_params="7B", precision="int8", concurrency="8"), ["t4"])
    assert not fits
    assert rejections["t4"].message.endswith("measured: serves at most 4 sequences at once")
    # TTFT measured at 1,000 tokens, asked at 2,000: scaled linearly (prefill is compute-bound).
    ann = {"model_params": "7B", "precision": "int8", "concurrency": "4", "latency_class": "batch"}
    fits, _ = svc.placer.evaluate_nodes(spec_of(prompt_tokens="2000", max_ttft_ms="5000", **ann), ["t4"])
    assert fits["t4"].ttft_ms == pytest.approx(1800.0) and fits["t4"].ttft_source == "measured"
    fits, rejections = svc.placer.evaluate_nodes(
        spec_of(prompt_tokens="2000", max_ttft_ms="1500", **ann), ["t4", "h100"])
    assert set(fits) == {"h100"} and fits["h100"].ttft_source == "estimated"
    assert "cannot meet 1500 ms to first token: measured too slow" in rejections["t4"].message
    # A measured ms/token too slow for an explicit target says so.
    fits, rejections = svc.placer.evaluate_nodes(spec_of(max_ms_per_token="30", **ann), ["t4"])
    assert "cannot meet 30 ms/token: measured too slow" in rejections["t4"].message


@pytest.mark.parametrize(("entry", "text"), [
    ({**T4_CHAT, "precision": "int9"}, "entry #1 (chat-7b): field 'precision'"),
    ({**T4_CHAT, "model_params": "lots"}, "entry #1 (chat-7b): field 'model_params'"),
    ({**T4_CHAT, "gpus": 0}, "field 'gpus'"),
    ({**T4_CHAT, "ms_per_token": -1}, "field 'ms_per_token'"),
    ({**T4_CHAT, "speed": 3}, "field 'speed'"),
    ({k: v for k, v in T4_CHAT.items() if k != "ms_per_token"},
     "give at least one of ms_per_token, ttft_ms, max_concurrency"),
    ({**T4_CHAT, "active_params": "9B"}, "active_params must be positive and at most model_params"),
])
def test_a_bad_entry_is_named_with_its_field(entry: dict[str, Any], text: str) -> None:
    with pytest.raises(ProfileError, match="entry") as exc:
        ProfileBook.from_data({"profiles": [entry]}, "p.yaml")
    assert text in str(exc.value)


def test_a_bad_file_fails_the_configuration(tmp_path: Path) -> None:
    path = tmp_path / "profiles.yaml"
    path.write_text("profiles:\n  - model: x\n    model_params: 8B\n    gpu: L4\n    precision: int9\n")
    with pytest.raises(ConfigError, match=r"profiles_file: .*entry #1 \(x\): field 'precision'"):
        load_settings(profiles_file=str(path))
    with pytest.raises(ConfigError, match=r"profiles_file: .*cannot read"):
        load_settings(profiles_file=str(tmp_path / "missing.yaml"))
    path.write_text("profiles:\n  - model: x\n    model_params: 8B\n    gpu: L4\n    precision: INT8\n"
                    "    ms_per_token: 20\n")
    book = load_settings(profiles_file=str(path)).policies().placement.feasibility.profiles
    assert book is not None and book.entries[0].ms_per_token == 20
