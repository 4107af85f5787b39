"""The load a serving pod is judged at: one request at a time when it states no concurrency, and
never more clients than its KV cache holds at once (docs/stage-policy.md, "Default load" and
"Memory sizing")."""

from __future__ import annotations

from typing import Any

import pytest

from app.base.catalog import GpuCatalog
from app.base.objects import node_object, pod_object
from app.base.workload import parse_workload
from app.config.settings import Settings
from app.extender.explain import explain_spec
from app.extender.service import ExtenderService
from app.extender.wiring import build_core

ANN = "llm-placement.io/"


def spec_of(gpus: int, **ann: str) -> Any:
    return parse_workload(pod_object("p", stage="serving", gpus=gpus,
                                     annotations={ANN + k.replace("_", "-"): v for k, v in ann.items()}))


def service(**settings: Any) -> ExtenderService:
    svc = build_core(Settings(cluster_source="none", metrics_port=0, **settings), GpuCatalog.load())
    svc.absorb_node(node_object("h100", gpus=8, product="NVIDIA-H100-80GB-HBM3"))
    return svc


# A 70B bf16 prefill pod on 4 x H100 SXM with an 8,192-token prompt and no concurrency annotation.
PREFILL = {"model_params": "70B", "precision": "bf16", "serving_role": "prefill",
           "prompt_tokens": "8192", "max_ttft_ms": "1000"}


def test_a_pod_without_concurrency_is_judged_at_one_request() -> None:
    fits, rejections = service().placer.evaluate_nodes(spec_of(4, **PREFILL), ["h100"])
    assert "h100" in fits, rejections
    # The same pod judged at eight prompts arriving together is refused: the default is what
    # places it, not a lax check.
    fits, rejections = service(default_concurrency=8).placer.evaluate_nodes(spec_of(4, **PREFILL), ["h100"])
    assert "h100" not in fits
    assert "cannot meet 1000 ms to first token" in rejections["h100"].message
    # A pod stating eight clients is judged at eight.
    fits, _ = service().placer.evaluate_nodes(spec_of(4, **PREFILL, concurrency="8"), ["h100"])
    assert "h100" not in fits


def test_the_default_load_matches_the_published_single_client_first_token() -> None:
    # The corpus's own one-client measurement of the deployment (Llama-3 70B fp16 on 4 x H100 SXM,
    # 2,000-token prompt, NIM: 160.77 ms, nvidia-dli-nim-genai-perf-llama-3.yaml row 704): the
    # pod's estimate at the default load is that single-client figure, not eight prompts' worth.
    spec = spec_of(4, model_params="70B", precision="bf16", serving_role="prefill", prompt_tokens="2000",
                   max_ttft_ms="100000")
    fit = service().placer.evaluate_nodes(spec, ["h100"])[0]["h100"]
    assert fit.ttft_ms is not None and 0.7 <= fit.ttft_ms / 160.77 <= 1.3


def test_memory_needs_one_full_length_sequence_and_the_cache_queues_the_rest() -> None:
    # 70B fp8 on 2 x H100 to 50 clients of 5,500 tokens: a published NIM run. Every client's whole
    # context resident would need about 81 GB per GPU; the engine holds what fits and queues the rest.
    spec = spec_of(2, model="llama-3.3-70b", precision="fp8", concurrency="50", context_tokens="5500",
                   prompt_tokens="5000")
    svc = service()
    fits, rejections = svc.placer.evaluate_nodes(spec, ["h100"])
    assert "h100" in fits, rejections
    fit = fits["h100"]
    usable = fits["h100"].node.gpu_memory_gb * 0.9  # memory_headroom 0.1
    assert fit.sizing.per_gpu_gb > usable  # the whole batch would not fit
    assert fit.sizing.needed_per_gpu_gb < usable
    held = fit.clients_held
    assert held is not None and 1 <= held < 50
    # The clients held are those whose KV cache fits beside the weights, and no more.
    free = usable * 2 - (fit.sizing.needed_per_gpu_gb * 2 - fit.sizing.kv_per_sequence_gb)
    assert held == int(free / fit.sizing.kv_per_sequence_gb)
    # Latency is estimated at the clients held, not at 50 (the rest wait in the queue).
    at_held = svc.placer.evaluate_nodes(spec_of(2, model="llama-3.3-70b", precision="fp8",
                                                concurrency=str(held), context_tokens="5500",
                                                prompt_tokens="5000"), ["h100"])[0]["h100"]
    assert fit.ms_per_token == pytest.approx(at_held.ms_per_token)
    note = next(e for e in explain_spec(svc, spec)["nodes"] if e["node"] == "h100")["serving_model"]
    assert note["kv_cache_holds"] == f"{held} of 50 clients at once; the rest queue (latency estimated at {held})"


def test_a_pod_whose_one_sequence_does_not_fit_is_refused_saying_so() -> None:
    spec = spec_of(1, model_params="70B", precision="bf16", context_tokens="4096")
    fits, rejections = service().placer.evaluate_nodes(spec, ["h100"])
    assert "h100" not in fits
    assert "(weights and one full-length sequence); GPU memory too small" in rejections["h100"].message


def test_a_stated_kv_cache_must_fit_whole() -> None:
    # kv-cache-gb is the user's own sizing: no queueing is assumed for it.
    spec = spec_of(1, model_params="8B", precision="bf16", kv_cache_gb="60")
    assert "h100" not in service().placer.evaluate_nodes(spec, ["h100"])[0]
    spec = spec_of(1, model_params="8B", precision="bf16", concurrency="64", context_tokens="32768")
    assert "h100" in service().placer.evaluate_nodes(spec, ["h100"])[0]


@pytest.mark.parametrize(("model", "first_token", "per_token"), [
    # By hand / registry, first token and per token at 16 clients (docs/stage-policy.md, "A mixture
    # of experts written two ways": the facts only the registry knows keep them apart by this much).
    ("deepseek-v3", (0.9, 1.1), (0.9, 1.3)),
    ("mixtral-8x7b", (1.0, 1.3), (1.0, 1.2)),
    ("qwen2-57b-a14b", (1.0, 1.5), (1.0, 1.35)),
])
def test_a_mixture_of_experts_by_hand_is_estimated_like_its_registry_model(
        model: str, first_token: tuple[float, float], per_token: tuple[float, float]) -> None:
    from app.base.model_registry import default_registry

    arch = default_registry().get(model)
    assert arch is not None and arch.active_params is not None
    common = {"precision": "fp8", "concurrency": "16", "prompt_tokens": "2000", "context_tokens": "2500",
              "max_ms_per_token": "100000", "max_ttft_ms": "1000000"}
    svc = service()
    svc.absorb_node(node_object("h200", gpus=8, product="NVIDIA-H200"))  # DeepSeek-V3 fp8: 671 GB
    named = svc.placer.evaluate_nodes(spec_of(8, model=model, **common), ["h200"])[0]["h200"]
    by_hand = svc.placer.evaluate_nodes(spec_of(8, model_params=f"{arch.params / 1e9:.4g}B",
                                                active_params=f"{arch.active_params / 1e9:.4g}B", **common),
                                        ["h200"])[0]["h200"]
    assert named.ttft_ms and by_hand.ttft_ms and named.ms_per_token and by_hand.ms_per_token
    # Both pay the fixed cost per expert layer of a prefill step: by hand, every layer routes.
    assert first_token[0] <= by_hand.ttft_ms / named.ttft_ms <= first_token[1]
    assert per_token[0] <= by_hand.ms_per_token / named.ms_per_token <= per_token[1]
