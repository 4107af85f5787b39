"""Each rule of the serving model (app/serving/model.py), checked by what it must change.

Architectures here are made up for the rule under test; they claim nothing about a real model.
"""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.base.catalog import default_catalog
from app.base.model_registry import ModelArch, Moe
from app.base.workload import Precision
from app.serving.model import (
    Case,
    ServingCalibration,
    Shape,
    closed_loop_wait_ms,
    estimate,
    prompts_before_first_token,
    weight_kind,
)

CAT = default_catalog()
H100 = CAT.by_name("H100-SXM-80GB")
A100 = CAT.by_name("A100-SXM4-80GB")
L4 = CAT.by_name("L4")
A10G = CAT.by_name("A10G")
MI300X = CAT.by_name("MI300X")
assert H100 and A100 and L4 and A10G and MI300X

DENSE = ModelArch(name="dense-7b", params=7e9, layers=32, hidden=4096, heads=32, kv_heads=8, head_dim=128,
                  source="synthetic")
MHA = DENSE.model_copy(update={"name": "mha-7b", "kv_heads": 32, "attention": "mha"})
MOE = ModelArch(name="moe", params=47e9, active_params=13e9, layers=32, hidden=4096, heads=32, kv_heads=8,
                head_dim=128, moe=Moe(experts=8, top_k=2, expert_intermediate=14336), source="synthetic")


def case(arch: ModelArch = DENSE, precision: Precision = Precision.BF16, gpu=H100, gpus: int = 1,
         concurrency: int = 1, prompt: int = 1000, output: int = 500) -> Case:
    return Case(Shape.of(arch.params, None, arch), precision, gpu, gpus, concurrency, prompt, output)


CAL = ServingCalibration()


def test_kv_from_architecture_follows_kv_heads_and_head_dim():
    # 2 (K, V) x layers x KV heads x head dim x 2 bytes
    assert DENSE.kv_bytes_per_token() == 2 * 32 * 8 * 128 * 2
    assert MHA.kv_bytes_per_token() == 4 * DENSE.kv_bytes_per_token()
    long = estimate(case(MHA, concurrency=32, prompt=8000), CAL).ms_per_token
    short = estimate(case(DENSE, concurrency=32, prompt=8000), CAL).ms_per_token
    assert long > short * 1.2  # reading four times the cache costs time


def test_mla_cache_is_the_latent_not_the_heads():
    mla = ModelArch.model_validate(DENSE.model_dump() | {
        "name": "mla", "attention": "mla", "mla": {"kv_lora_rank": 512, "qk_rope_head_dim": 64}})
    assert mla.kv_bytes_per_token() == 32 * (512 + 64) * 2
    assert mla.kv_bytes_per_token() < DENSE.kv_bytes_per_token()


def test_moe_reads_the_experts_a_batch_touches():
    one, many = MOE.params_read(1), MOE.params_read(64)
    routed = 8 * MOE.expert_params()
    shared = MOE.params - routed
    assert one == pytest.approx(shared + routed * 2 / 8)
    assert many == pytest.approx(shared + routed * (1 - (6 / 8) ** 64))
    assert one < MOE.active_params * 1.1  # batch 1 reads about the active parameters
    # So batching an MoE costs more per step than batching a dense model of its active size.
    moe_c1 = estimate(case(MOE, concurrency=1), CAL).ms_per_token
    moe_c16 = estimate(case(MOE, concurrency=16), CAL).ms_per_token
    assert moe_c16 > moe_c1 * 1.5


def test_tensor_parallel_has_a_floor_that_depends_on_the_link():
    one = estimate(case(gpu=A10G, gpus=1), CAL).ms_per_token
    eight = estimate(case(gpu=A10G, gpus=8), CAL).ms_per_token
    assert eight > one / 8 * 2  # far from perfect scaling
    free = CAL.with_parameters({"allreduce_latency_us.pcie": 0.1, "layer_overhead_us": 0.01,
                                "step_floor_ms": 0.01})
    assert estimate(case(gpu=A10G, gpus=8), free).ms_per_token < eight * 0.8
    pcie = estimate(case(gpu=A10G, gpus=8), CAL).tp_per_token_ms
    nvlink = estimate(case(gpu=H100, gpus=8), CAL).tp_per_token_ms
    assert pcie > nvlink


def test_precision_efficiency_int4_is_not_a_free_halving():
    bf16 = estimate(case(gpu=L4), CAL)
    int4 = estimate(case(gpu=L4, precision=Precision.INT4), CAL)
    assert int4.ms_per_token > bf16.ms_per_token / 4
    even = CAL.with_parameters({"bandwidth_efficiency.int4": CAL.bandwidth_efficiency["w16"]})
    assert estimate(case(gpu=L4, precision=Precision.INT4), even).ms_per_token != int4.ms_per_token


def test_fp8_on_a_gpu_without_fp8_tensor_cores_is_weight_only():
    assert weight_kind(Precision.FP8, A100) == "fp8_weight_only"
    assert weight_kind(Precision.FP8, H100) == "fp8"
    changed = CAL.with_parameters({"bandwidth_efficiency.fp8_weight_only": 0.2})
    assert (estimate(case(gpu=A100, precision=Precision.FP8), changed).ms_per_token
            > estimate(case(gpu=A100, precision=Precision.FP8), CAL).ms_per_token)


def test_batched_decode_becomes_compute_bound():
    # Past the GPU's FLOP-per-byte ratio a bigger batch costs matrix time, not weight reads.
    c = case(gpu=L4, concurrency=512, prompt=10, output=10)
    parts = dict(estimate(c, CAL).parts)
    assert parts["matrix work"] > parts["weights read"]
    no_compute = CAL.with_parameters({"decode_compute_efficiency": 1.0, "prefill_efficiency.w16": 2.5})
    assert estimate(c, no_compute).ms_per_token < estimate(c, CAL).ms_per_token


def test_other_prompts_slow_each_token_under_concurrency():
    alone = estimate(case(concurrency=1, prompt=5000, output=500), CAL)
    busy = estimate(case(concurrency=25, prompt=5000, output=500), CAL)
    assert dict(alone.parts)["other prompts"] == 0
    assert dict(busy.parts)["other prompts"] > 0
    assert busy.ttft_ms > alone.ttft_ms  # and they queue for their own first token


def test_first_token_is_precision_aware_and_has_a_floor():
    bf16 = estimate(case(prompt=4000), CAL).ttft_ms
    fp8 = estimate(case(precision=Precision.FP8, prompt=4000), CAL).ttft_ms
    assert fp8 < bf16
    tiny = estimate(case(prompt=1), CAL).ttft_ms
    assert tiny >= CAL.ttft_floor_ms


def test_prompts_arriving_together_are_computed_a_token_budget_at_a_time():
    # Within one prefill step every prompt gets its first token when the step ends.
    assert prompts_before_first_token(10, 200, 8192) == 10
    assert prompts_before_first_token(1, 200, 8192) == 1
    # Over several steps a prompt waits for the steps up to its own: (clients + per step) / 2.
    assert prompts_before_first_token(50, 2000, 8000) == pytest.approx((50 + 4) / 2)
    # A prompt longer than the budget still takes one step of its own.
    assert prompts_before_first_token(9, 20000, 8192) == pytest.approx((9 + 1) / 2)


def test_first_token_waits_for_the_prompts_of_the_other_clients():
    cal = CAL.model_copy(update={"prefill_token_budget": 8192.0, "ttft_floor_ms": 0.0})
    alone = estimate(case(concurrency=1, prompt=2000), cal).ttft_ms
    # 4 prompts of 2,000 tokens fit one step: all four computed before any first token.
    four = estimate(case(concurrency=4, prompt=2000), cal).ttft_ms
    assert four == pytest.approx(4 * alone, rel=0.02)
    # 40 clients: about (40 + 4) / 2 = 22 prompts' work before the mean first token.
    forty = estimate(case(concurrency=40, prompt=2000), cal).ttft_ms
    assert forty == pytest.approx(22 * alone, rel=0.02)
    # A larger budget batches more prompts per step, so the first of them waits longer.
    wide = estimate(case(concurrency=40, prompt=2000), cal.model_copy(
        update={"prefill_token_budget": 80000.0})).ttft_ms
    assert wide == pytest.approx(40 * alone, rel=0.02)
    # A fixed batch (benchmarks' static batches) computes all its prompts first.
    from dataclasses import replace

    assert estimate(replace(case(concurrency=40, prompt=2000), static=True), cal).ttft_ms == \
        pytest.approx(40 * alone, rel=0.02)


def test_short_prompts_batched_in_one_step_read_the_weights_once():
    # 10 prompts of 20 tokens: one pass over the weights bounds the step, not 10 of them.
    cal = CAL.model_copy(update={"ttft_floor_ms": 0.0})
    alone = estimate(case(concurrency=1, prompt=20), cal).ttft_ms
    ten = estimate(case(concurrency=10, prompt=20), cal).ttft_ms
    assert ten < 2 * alone


def test_an_all_reduce_over_pcie_runs_at_the_hosts_share_of_the_link():
    l40s = CAT.by_name("L40S")
    assert l40s is not None
    slow = CAL.model_copy(update={"pcie_allreduce_share": 0.25})
    full = CAL.model_copy(update={"pcie_allreduce_share": 1.0})
    # 4 PCIe GPUs, 2,048-token prompt: the prompt's all-reduces are bandwidth-bound.
    pcie = case(gpu=l40s, gpus=4, prompt=2048)
    assert estimate(pcie, slow).tp_prefill_ms > 2.5 * estimate(pcie, full).tp_prefill_ms
    # NVLink boxes are not PCIe: the share leaves them alone.
    nvlink = case(gpu=H100, gpus=4, prompt=2048)
    assert estimate(nvlink, slow).tp_prefill_ms == estimate(nvlink, full).tp_prefill_ms


FINE_MOE = ModelArch(name="fine-moe", params=100e9, active_params=10e9, layers=32, hidden=4096, heads=32,
                     kv_heads=8, head_dim=128, moe=Moe(experts=128, top_k=8, expert_intermediate=2048),
                     source="synthetic")


def test_each_prefill_step_pays_a_fixed_cost_per_expert_layer():
    # Routing and sorting tokens by expert cost the same for a short prompt as for a long one:
    # 32 expert layers at 1 ms each add 32 ms to a prefill step of a mixture of experts.
    cal = CAL.model_copy(update={"ttft_floor_ms": 0.0})
    cheap = cal.model_copy(update={"expert_layer_prefill_us": 1.0})
    dear = cal.model_copy(update={"expert_layer_prefill_us": 1000.0})
    moe = case(FINE_MOE, gpus=8, prompt=200)
    assert estimate(moe, dear).ttft_ms - estimate(moe, cheap).ttft_ms == pytest.approx(32 * 0.999, rel=0.01)
    # Dense models have no expert layers.
    dense = case(gpus=8, prompt=200)
    assert estimate(dense, dear).ttft_ms == estimate(dense, cheap).ttft_ms


def test_a_long_prompt_reads_every_expert_not_only_the_active_ones():
    # A prompt of many tokens routes to every expert, so one prefill step reads all the weights:
    # on an H100 its 100 GB floor the step, however fast the tensor cores are.
    fast_cores = CAL.model_copy(update={"ttft_floor_ms": 0.0, "expert_layer_prefill_us": 1e-6,
                                        "prefill_efficiency": {k: 2.5 for k in CAL.prefill_efficiency}})
    got = estimate(case(FINE_MOE, prompt=4000), fast_cores).ttft_ms
    all_weights_ms = FINE_MOE.params * 2 / (H100.hbm_bandwidth_tbs * 1e12) * 1e3
    assert got >= all_weights_ms


def test_prompts_that_arrive_alone_wait_for_one_step_not_for_the_other_clients():
    from dataclasses import replace

    cal = CAL.model_copy(update={"prefill_token_budget": 2000.0})
    busy = case(concurrency=32, prompt=1000)
    together = estimate(busy, cal)
    alone = estimate(replace(busy, together_share=0.0), cal)
    one_client = estimate(case(concurrency=1, prompt=1000), cal)
    # Alone: its own prompt plus at most half a decode step, far below 32 clients' round.
    assert alone.ttft_ms < one_client.ttft_ms + together.ms_per_token
    assert together.ttft_ms > 5 * alone.ttft_ms
    # A benchmark whose first round (1 in 10 requests) arrives together averages the two.
    mixed = estimate(replace(busy, together_share=0.1), cal).ttft_ms
    assert mixed == pytest.approx(0.1 * together.ttft_ms + 0.9 * alone.ttft_ms)


def test_a_lone_client_has_no_decode_step_to_wait_for():
    from dataclasses import replace

    one = case(concurrency=1, prompt=1000)
    assert estimate(replace(one, together_share=0.0), CAL).ttft_ms == estimate(one, CAL).ttft_ms


@pytest.mark.parametrize("clients", [2, 16, 64])
def test_continuous_batching_pays_per_sequence_work_each_step_and_a_fixed_batch_does_not(clients: int):
    """Each other sequence under continuous batching adds ``sequence_overhead_us`` to a decode step
    (scheduling, sampling, streaming per request); one client and a static batch add nothing."""
    cheap = CAL.model_copy(update={"sequence_overhead_us": 1.0})
    dear = CAL.model_copy(update={"sequence_overhead_us": 101.0})
    served = case(concurrency=clients)
    static = dataclasses.replace(served, static=True)
    added = estimate(served, dear).ms_per_token - estimate(served, cheap).ms_per_token
    assert added == pytest.approx((clients - 1) * 100 / 1e3)
    assert estimate(static, dear).ms_per_token == pytest.approx(estimate(static, cheap).ms_per_token)
    alone = case(concurrency=1)
    assert estimate(alone, dear).ms_per_token == pytest.approx(estimate(alone, cheap).ms_per_token)


def test_an_engine_takes_prompts_at_its_own_budget():
    from dataclasses import replace

    cal = CAL.model_copy(update={"prefill_token_budget": 8192.0, "ttft_floor_ms": 0.0,
                                 "engine_budget_scale": {**CAL.engine_budget_scale, "sglang": 0.5}})
    busy = case(concurrency=40, prompt=2000)
    # Half the budget: two prompts a step instead of four, so a mean prompt waits (40 + 2) / 2
    # prompts' work instead of (40 + 4) / 2.
    pooled = estimate(busy, cal).ttft_ms
    own = estimate(replace(busy, engine="sglang"), cal).ttft_ms
    assert own == pytest.approx(pooled * 21 / 22, rel=0.02)
    # An engine the fit has no figures of, and a pod naming none, take the pooled budget.
    assert estimate(replace(busy, engine="tgi"), cal).ttft_ms == pooled


@pytest.mark.parametrize(("raw", "name"), [("vllm/0.11.0", "vllm"), ("lmdeploy-turbomind", "lmdeploy"),
                                           ("NIM", "nim"), ("unstated", None), (None, None)])
def test_engine_names_as_pods_and_corpus_rows_write_them(raw: str | None, name: str | None):
    from app.serving.model import engine_name

    assert engine_name(raw) == name


def test_another_vendors_gpus_run_at_their_own_share_of_the_fitted_efficiencies():
    from dataclasses import replace

    half = CAL.model_copy(update={"vendor_efficiency": {**CAL.vendor_efficiency, "amd": 0.5}})
    one = case(gpu=MI300X, concurrency=1, prompt=4000)
    # Memory-bound decode of one client and a long prompt's prefill both take twice as long (the
    # step floor and the first-token floor are the engine's, not the GPU's).
    floors = CAL.step_floor_ms + DENSE.layers * CAL.layer_overhead_us / 1e3
    assert estimate(one, half).ms_per_token - floors == pytest.approx(
        2 * (estimate(one, CAL).ms_per_token - floors), rel=0.01)
    assert estimate(one, half).ttft_ms - CAL.ttft_floor_ms == pytest.approx(
        2 * (estimate(one, CAL).ttft_ms - CAL.ttft_floor_ms), rel=0.01)
    # NVIDIA's GPUs, which the efficiencies were fitted on, are untouched.
    nvidia = replace(one, gpu=H100)
    assert estimate(nvidia, half) == estimate(nvidia, CAL)


def test_an_engine_pays_its_own_fixed_cost_of_a_first_token():
    from dataclasses import replace

    cal = CAL.model_copy(update={"ttft_floor_ms": 10.0,
                                 "engine_ttft_floor_scale": {**CAL.engine_ttft_floor_scale, "tgi": 4.0}})
    one = case(concurrency=1, prompt=500)
    pooled = estimate(one, cal).ttft_ms
    assert estimate(replace(one, engine="tgi"), cal).ttft_ms == pytest.approx(pooled + 30.0)
    # Per token is the decode loop, which the first token's fixed cost does not touch.
    assert estimate(replace(one, engine="tgi"), cal).ms_per_token == estimate(one, cal).ms_per_token
    assert estimate(replace(one, engine="vllm"), cal).ttft_ms == pooled


@given(clients=st.integers(1, 256), prefill=st.floats(0.1, 5_000), think=st.floats(0, 100_000))
def test_a_closed_loop_prompt_waits_at_least_its_own_time_and_at_most_everyones(
        clients: int, prefill: float, think: float):
    wait = closed_loop_wait_ms(clients, prefill, think)
    assert prefill * (1 - 1e-9) <= wait <= clients * prefill * (1 + 1e-9)
    # One more client never shortens the wait.
    assert closed_loop_wait_ms(clients + 1, prefill, think) >= wait * (1 - 1e-9)


def test_a_closed_loop_saturates_at_every_client_ahead_less_the_decode():
    # Prompts that take far longer than the decodes between them: the prefill is the bottleneck
    # and each prompt waits for nearly all the others (the response time law, N x S - Z).
    assert closed_loop_wait_ms(8, 1_000.0, 500.0) == pytest.approx(8 * 1_000 - 500, rel=0.01)
    # Decodes far longer than the prompts: the queue is nearly always empty.
    assert closed_loop_wait_ms(8, 10.0, 100_000.0) == pytest.approx(10.0, rel=0.01)
    assert closed_loop_wait_ms(1, 10.0, 0.0) == 10.0


def test_long_prompts_from_a_few_clients_queue_behind_each_other_in_steady_state():
    # 8 clients sending 28,000-token prompts and reading 100 tokens back: the prompts, not the
    # decodes, are the work, so a first token waits for about all 8 prompts whatever the budget.
    cal = CAL.model_copy(update={"prefill_token_budget": 8192.0, "ttft_floor_ms": 0.0})
    alone = estimate(case(concurrency=1, prompt=28_000, output=100), cal).ttft_ms
    eight = estimate(case(concurrency=8, prompt=28_000, output=100), cal).ttft_ms
    # The arrive-together rule alone says (8 + 1) / 2 = 4.5 prompts' work; in steady state a prompt
    # waits for the 7 others less the ~2 s its client spends decoding (8 x 1.2 - 2.2 s).
    assert eight == pytest.approx(8 * alone - 100 * (estimate(case(concurrency=8, prompt=28_000, output=100),
                                                              cal).ms_per_token - _other_prompts(cal)), rel=0.05)
    assert eight > 6 * alone


def _other_prompts(cal: ServingCalibration) -> float:
    busy = estimate(case(concurrency=8, prompt=28_000, output=100), cal)
    return dict(busy.parts)["other prompts"]
