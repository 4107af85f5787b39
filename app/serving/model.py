"""Decode and first-token time of an LLM served on GPUs, calibrated against published measurements.

docs/stage-policy.md ("The serving model") states the model and its cross-validated error; in short:

* A decode step of a batch of ``b`` sequences reads the weights it touches (every weight for a
  dense model; the shared layers plus the experts that at least one of the ``b`` tokens routes to
  for a mixture of experts) and each sequence's KV cache, at a share of the GPUs' memory bandwidth
  that depends on how the weights are stored (dequantising int4 or weight-only fp8 costs time), and
  cannot be faster than its matrix work at a share of the GPUs' tensor throughput (large batches).
* Every step also pays a fixed cost (scheduling, sampling, kernel launches per layer) and, when
  the pod shards the model over several GPUs, two all-reduces per layer whose latency depends on
  the link (NVLink or PCIe) much more than on their size at decode. This floor is why decode does
  not keep speeding up with GPU count. Over PCIe a ring all-reduce moves its bytes at the host's
  share of the link, which long prompts feel.
* Under continuous batching, each other request's prompt is computed between decode steps, so a
  sequence waits ``(b - 1) / output tokens`` prompts per token on average.
* First-token time is the prompt's matrix and attention work at the precision's tensor throughput
  (fp8 on GPUs with FP8 tensor cores runs faster than bf16; weight-only int4 computes in 16 bits),
  never less than one pass over the weights a prefill step's tokens touch (nearly every expert of
  a mixture of experts), plus a fixed cost per expert layer and step, a fixed floor and the
  tensor-parallel all-reduces of the prompt. Under load it also waits for other clients' prompts:
  ``b`` clients of like requests finish together and send their next prompts together, which the
  engine computes a token budget per step, so a request's first token comes after the prompts of
  its own step and of the steps before it (``prompts_before_first_token``). A pod is estimated so;
  a benchmark whose request lengths vary has only its first round arrive together
  (``Case.together_share``), and the rest arrive alone between decode steps.

The free parameters (efficiencies, floors, latencies) live in ``ServingCalibration``; the shipped
values are produced by ``llm-placement calibrate`` from the measurement corpus in
``app/data/measurements`` and kept in ``app/data/serving_calibration.yaml``.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Protocol

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from app.base.catalog import GpuSpec
from app.base.datafile import parse_yaml, problems, read_text
from app.base.model_registry import ModelArch
from app.base.workload import Precision, WorkloadSpec
from app.serving.sizing import ACTIVATION_BYTES, Link, allreduce_us, gpu_link, shape

PACKAGE = "app.data"
RESOURCE = "serving_calibration.yaml"

Positive = Annotated[float, Field(gt=0, allow_inf_nan=False)]
NonNegative = Annotated[float, Field(ge=0, allow_inf_nan=False)]

# How the weights of each precision are read and multiplied, which is what the efficiencies are
# calibrated by: 16-bit; fp8 on FP8 tensor cores; fp8 weights on GPUs without them (weight-only
# kernels dequantise to 16 bits); int8; int4 (weight-only, 16-bit arithmetic).
KINDS = ("w16", "fp8", "fp8_weight_only", "int8", "int4")
# The engines a pod can name (``serving-engine``, app/base/workload.py ServingEngine).
ENGINE_NAMES = ("vllm", "sglang", "trtllm", "tgi", "lmdeploy", "nim")


def engine_name(engine: str | None) -> str | None:
    """``vllm`` for ``vllm/0.11.0``, ``lmdeploy`` for a corpus row's ``lmdeploy-turbomind``; None
    for an engine the model has no figures of."""
    if not engine:
        return None
    name = engine.split("/", 1)[0].split("-", 1)[0].lower()
    return name if name in ENGINE_NAMES else None


def weight_kind(precision: Precision, gpu: GpuSpec) -> str:
    if precision is Precision.FP8:
        return "fp8" if gpu.fp8 else "fp8_weight_only"
    if precision in (Precision.INT8, Precision.INT4):
        return precision.value
    return "w16"


# Probabilities at which the calibrate command records the error distribution; the confidence
# setting must lie within them (app/config/settings.py validates it) and is interpolated between them.
QUANTILE_LEVELS = (0.5, 0.6, 0.7, 0.75, 0.8, 0.85, 0.9, 0.95, 0.98, 0.99)
# The ``serving_confidence`` setting's default (app/config/settings.py), chosen by one rule: the lowest
# confidence whose leave-one-source-out per-token false-accept rate (a target missed by a third,
# accepted) is at most FALSE_ACCEPT_BUDGET, as ``bench/serving_decisions.py`` measures it over the
# packaged corpus (docs/stage-policy.md, "Target decision"). A higher one refuses more targets the
# hardware meets without buying a false-accept rate the product promises. Where no swept confidence
# meets the budget (the corpus's sources disagree more than any quantile buys back), the default
# is not raised to the nearest miss, which would refuse most targets the hardware meets: it stays,
# and BENCHMARKS.md section 0 states both rates at every confidence.
DEFAULT_CONFIDENCE = 0.7
FALSE_ACCEPT_BUDGET = 0.02
# A group's own distribution is used from this many cross-validated points; below it the group
# borrows its parent's (docs/stage-policy.md, "Target decision").
MIN_GROUP_POINTS = 20


class ErrorQuantiles(BaseModel):
    """One group's cross-validated distribution of measured / estimate, as quantiles."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    n: Annotated[int, Field(ge=1)]
    # probability (as written, "0.9") -> measured / estimate at that quantile
    q: dict[str, Annotated[float, Field(gt=0, le=1000, allow_inf_nan=False)]]

    def at(self, confidence: float) -> float:
        """The quantile at ``confidence``, linear between the recorded levels (clamped)."""
        levels = sorted((float(k), v) for k, v in self.q.items())
        if confidence <= levels[0][0]:
            return levels[0][1]
        for (p0, v0), (p1, v1) in itertools.pairwise(levels):
            if confidence <= p1:
                return v0 + (v1 - v0) * (confidence - p0) / (p1 - p0)
        return levels[-1][1]


class ServingCalibration(BaseModel):
    """The model's free parameters. Efficiencies are shares of the catalog's peak figures (memory
    bandwidth; dense BF16 tensor TFLOPS, which fp8 may exceed); times are per step or per layer."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    bandwidth_efficiency: dict[str, Positive] = Field(
        default_factory=lambda: {"w16": 0.75, "fp8": 0.7, "fp8_weight_only": 0.6, "int8": 0.65,
                                 "int4": 0.5})
    kv_bandwidth_efficiency: Positive = 0.6
    decode_compute_efficiency: Positive = 0.5
    prefill_efficiency: dict[str, Positive] = Field(
        default_factory=lambda: {"w16": 0.5, "fp8": 0.9, "fp8_weight_only": 0.45, "int8": 0.7,
                                 "int4": 0.45})
    step_floor_ms: NonNegative = 1.0
    layer_overhead_us: NonNegative = 10.0
    allreduce_latency_us: dict[str, NonNegative] = Field(
        default_factory=lambda: {"nvlink": 10.0, "pcie": 40.0})
    # Share of a PCIe x16 link's rate a ring all-reduce over PCIe reaches: the host's CPUs and
    # memory carry it. The starting value is a published NCCL measurement, the fit moves it
    # (docs/stage-policy.md, "Tensor-parallel communication", states the source).
    pcie_allreduce_share: Annotated[float, Field(gt=0, le=1, allow_inf_nan=False)] = 0.44
    interleave: NonNegative = 1.0
    # Fixed cost of one mixture-of-experts layer in a prefill step, however few its tokens:
    # routing, sorting the tokens by expert and back, grouped launches over the experts
    # (docs/stage-policy.md, "The serving model").
    expert_layer_prefill_us: Positive = 100.0
    ttft_floor_ms: NonNegative = 10.0
    # Each engine's own fixed cost of a request's first token, as a multiple of ``ttft_floor_ms``
    # (how it receives, tokenises, schedules and streams: an API server in front, a stream
    # interval, chunked delivery); 1 where the corpus does not show the engine.
    engine_ttft_floor_scale: dict[str, Positive] = Field(
        default_factory=lambda: dict.fromkeys(ENGINE_NAMES, 1.0))
    # Share of the NVIDIA-calibrated efficiencies another vendor's GPUs reach with the engines the
    # corpus measured on them (kernels and libraries, not the datasheet, set it).
    vendor_efficiency: dict[str, Positive] = Field(default_factory=lambda: {"amd": 1.0, "intel": 1.0})
    # Under continuous batching, what each other sequence in the batch adds to a decode step:
    # the engine's per-request work every step (scheduling, sampling, detokenising, streaming),
    # which a fixed-batch benchmark does not do (docs/stage-policy.md, "The serving model").
    sequence_overhead_us: Positive = 1.0
    # Prompt tokens the engine computes in one prefill step: prompts that arrive together are
    # taken this many tokens at a time (a starting value; the fit moves it).
    prefill_token_budget: Positive = 8192.0
    # Each engine's own budget as a multiple of the pooled one (engines ship different defaults:
    # a chunked-prefill size, a maximum of tokens per batch); 1 for an engine the corpus does not
    # show, and for a pod that does not name its engine (``serving-engine``).
    engine_budget_scale: dict[str, Positive] = Field(
        default_factory=lambda: dict.fromkeys(ENGINE_NAMES, 1.0))
    # Each engine's share of the pooled bandwidth efficiencies at decode (its kernels, scheduler and
    # weight layouts read the weights at a different share of the peak), for a pod that names it.
    engine_decode_scale: dict[str, Positive] = Field(
        default_factory=lambda: dict.fromkeys(ENGINE_NAMES, 1.0))
    # The scale a pod that names no engine gets, per weight kind: the centre (geometric mean) of the
    # scales of the engines the corpus measured with that kind ("all": of every engine measured).
    # Written by the fit from the rows, not fitted (docs/stage-policy.md, "The serving model").
    decode_scale_unnamed: dict[str, Positive] = Field(default_factory=dict)
    # Per metric ("tpot", "ttft") and corpus group: quantiles of measured / estimate over the
    # cross-validated errors (each source predicted by a fit to the others), at the probabilities
    # of QUANTILE_LEVELS, and how many points they were taken from. A target is met when the
    # estimate times the quantile at the ``serving_confidence`` setting is within it
    # (docs/stage-policy.md, "Target decision"). Written by the calibrate command; not fitted.
    error_quantiles: dict[str, dict[str, ErrorQuantiles]] = Field(default_factory=dict)
    # Where the values came from (the calibrate command writes the corpus and the fit's figures).
    provenance: dict[str, Any] = Field(default_factory=dict)

    def free_parameters(self) -> dict[str, float]:
        """Flat name -> value of every fitted figure (``bandwidth_efficiency.int4`` and so on)."""
        out: dict[str, float] = {}
        for key in ("bandwidth_efficiency", "prefill_efficiency", "allreduce_latency_us",
                    "engine_budget_scale", "engine_ttft_floor_scale", "engine_decode_scale",
                    "vendor_efficiency"):
            for kind, value in getattr(self, key).items():
                out[f"{key}.{kind}"] = value
        for key in ("kv_bandwidth_efficiency", "decode_compute_efficiency", "step_floor_ms",
                    "layer_overhead_us", "interleave", "ttft_floor_ms", "prefill_token_budget",
                    "pcie_allreduce_share", "expert_layer_prefill_us", "sequence_overhead_us"):
            out[key] = getattr(self, key)
        return out

    def with_parameters(self, flat: dict[str, float], provenance: dict[str, Any] | None = None
                        ) -> ServingCalibration:
        data = self.model_dump()
        for name, value in flat.items():
            if "." in name:
                group, kind = name.split(".", 1)
                data[group][kind] = value
            else:
                data[name] = value
        if provenance is not None:
            data["provenance"] = provenance
        return ServingCalibration.model_validate(data)

    @classmethod
    def load(cls, path: Path | None = None) -> ServingCalibration:
        text, origin = read_text(path, PACKAGE, RESOURCE, ValueError)
        data = parse_yaml(text, origin, ValueError)
        try:
            return cls.model_validate(data or {})
        except ValidationError as exc:
            raise ValueError(f"{origin}: {problems(exc)}") from None


@functools.cache
def default_calibration() -> ServingCalibration:
    """The shipped calibration (``llm-placement calibrate`` over the packaged corpus)."""
    try:
        return ServingCalibration.load()
    except (ValueError, FileNotFoundError):
        return ServingCalibration()


@dataclass(frozen=True, slots=True)
class Shape:
    """The architecture facts the estimate uses: from the registry, else the size rule."""

    params: float
    active_params: float
    layers: float
    hidden: float
    kv_bytes_per_token: float  # at 16-bit
    arch: ModelArch | None = None

    @property
    def moe_layers(self) -> int:
        """Layers with routed experts: the registry's, else every layer of a pod whose active
        parameters are fewer than its total (a mixture of experts given by counts; the published
        ones route in every layer or nearly: Mixtral 32 of 32, DeepSeek-V3 58 of 61)."""
        if self.arch is not None and self.params == self.arch.params:
            return self.arch.moe_layers
        return round(self.layers) if self.active_params < self.params else 0

    @classmethod
    def of(cls, params: float, active_params: float | None, arch: ModelArch | None) -> Shape:
        if arch is not None:
            return cls(params, active_params or arch.read_params, float(arch.layers), float(arch.hidden),
                       arch.kv_bytes_per_token(), arch)
        from app.serving.sizing import kv_bytes_per_token  # the size rule, for models not in the registry

        attention = active_params or params
        layers, hidden = shape(attention)
        return cls(params, attention, layers, hidden, kv_bytes_per_token(attention))

    def params_read(self, batch: int) -> float:
        if self.arch is not None and self.arch.moe is not None and self.params == self.arch.params:
            return self.arch.params_read(batch)
        if self.active_params >= self.params:
            return self.params
        # No routing facts: each of the batch's tokens reads an independent share of the weights.
        share = self.active_params / self.params
        return self.params * min(1.0, 1 - (1 - share) ** max(batch, 1))


@dataclass(frozen=True, slots=True)
class Case:
    """One serving configuration: the model, how it is stored, the hardware and the load."""

    shape: Shape
    precision: Precision
    gpu: GpuSpec
    gpus: int
    concurrency: int
    input_tokens: int
    output_tokens: int
    bandwidth_tbs: float | None = None  # the node's measured bandwidth, else the catalog's
    kv_bytes_per_value: float = 2.0
    static: bool = False  # a fixed batch, all prompts first (benchmarks), not continuous batching
    # Share of requests whose prompts arrive together with the other clients' (1 for a pod: with
    # several clients, the slower case); the rest arrive alone, between decode steps.
    together_share: float = 1.0
    engine: str | None = None  # ENGINE_NAMES; None: unstated

    def ttft_floor_ms(self, cal: ServingCalibration) -> float:
        """The fixed cost of a first token: the engine's own where the fit knows it."""
        scale = cal.engine_ttft_floor_scale.get(self.engine, 1.0) if self.engine else 1.0
        return cal.ttft_floor_ms * scale

    def decode_scale(self, cal: ServingCalibration, kind: str) -> float:
        """The engine's share of the bandwidth efficiencies; unnamed, the centre of the engines the
        corpus measured with weights stored this way."""
        if self.engine:
            return cal.engine_decode_scale.get(self.engine, 1.0)
        return cal.decode_scale_unnamed.get(kind, cal.decode_scale_unnamed.get("all", 1.0))

    def prefill_budget(self, cal: ServingCalibration) -> float:
        """Prompt tokens per prefill step: the engine's own where the fit knows it."""
        scale = cal.engine_budget_scale.get(self.engine, 1.0) if self.engine else 1.0
        return cal.prefill_token_budget * scale


@dataclass(frozen=True, slots=True)
class Estimate:
    """Per output token and to first token, with the parts each is made of (for explain)."""

    ms_per_token: float
    ttft_ms: float
    parts: tuple[tuple[str, float], ...]
    tp_per_token_ms: float  # the all-reduce share of ms_per_token (0 on one GPU)
    tp_prefill_ms: float


def tp_link(gpu: GpuSpec, cal: ServingCalibration) -> Link:
    """The link tensor parallelism's all-reduces see: the catalog's, at the host's share over PCIe."""
    link = gpu_link(gpu)
    if link.kind == "pcie":
        return dataclasses.replace(link, gb_per_s=link.gb_per_s * cal.pcie_allreduce_share)
    return link


def _tp_ms(case: Case, tokens: int, cal: ServingCalibration) -> float:
    """Two all-reduces per layer of ``tokens`` activations: link latency plus NCCL's transfer."""
    if case.gpus <= 1:
        return 0.0
    link = tp_link(case.gpu, cal)
    message = tokens * case.shape.hidden * ACTIVATION_BYTES
    transfer = allreduce_us(message, case.gpus, link)
    return 2 * case.shape.layers * (cal.allreduce_latency_us[link.kind] + transfer) / 1e3


def _prefill_compute_ms(case: Case, cal: ServingCalibration, prompts: float = 1.0,
                        steps: float = 1.0) -> float:
    """``prompts`` of the case's prompt length computed in ``steps`` prefill steps."""
    s = case.shape
    tokens = max(case.input_tokens, 1)
    # Linear layers 2 FLOPs per active parameter per token; causal attention 2 x 2 x layers x
    # tokens^2 x hidden / 2 (scores and weighted sum, half the matrix), per prompt.
    flops = (2 * s.active_params * tokens + 2 * s.layers * tokens * tokens * s.hidden) * prompts
    vendor = cal.vendor_efficiency.get(case.gpu.vendor, 1.0)
    tflops = case.gpu.bf16_tflops * cal.prefill_efficiency[weight_kind(case.precision, case.gpu)] * vendor
    compute = flops / (case.gpus * tflops * 1e12) * 1e3
    bw = (case.bandwidth_tbs or case.gpu.hbm_bandwidth_tbs) * vendor
    # A step over many prompt tokens touches nearly every expert, not only the active ones.
    per_step = max(round(tokens * prompts / max(steps, 1.0)), 1)
    one_pass = s.params_read(per_step) * case.precision.bytes_per_param / (case.gpus * bw * 1e12) * 1e3
    fixed = s.moe_layers * cal.expert_layer_prefill_us / 1e3 * steps
    return max(compute, one_pass * steps) + fixed


def prompts_before_first_token(clients: int, prompt_tokens: int, budget: float) -> float:
    """Mean number of prompts computed up to and including a request's own, when ``clients``
    prompts arrive together and the engine takes them ``budget`` tokens per prefill step.

    Why together: in a closed loop of like requests (what a concurrency level means, and how
    engines are benchmarked) the requests of one batch finish in the same step and their clients
    send the next prompts at once. Within one step every prompt gets its first token when the step
    ends; over several, prompt ``j`` waits for the steps up to its own: on average ``(clients +
    per step) / 2`` prompts.
    """
    per_step = max(1.0, budget / max(prompt_tokens, 1))
    if clients <= per_step:
        return float(max(clients, 1))
    return (clients + per_step) / 2


def closed_loop_wait_ms(clients: int, prefill_ms: float, think_ms: float) -> float:
    """Mean time a prompt spends at the prefill stage, its own computation and the prompts queued
    before it, when ``clients`` each send one, decode for ``think_ms`` and send the next: exact mean
    value analysis of one queue with think time. With few clients it is about the prompt's own
    time; once the clients' prompts outgrow their decodes it approaches ``clients x prefill -
    think``."""
    queued = 0.0
    response = prefill_ms
    for n in range(1, max(clients, 1) + 1):
        response = prefill_ms * (1 + queued)
        queued = n * response / (response + think_ms) if response + think_ms > 0 else 0.0
    return response


def estimate(case: Case, cal: ServingCalibration) -> Estimate:
    s = case.shape
    kind = weight_kind(case.precision, case.gpu)
    vendor = cal.vendor_efficiency.get(case.gpu.vendor, 1.0)
    bw = (case.bandwidth_tbs or case.gpu.hbm_bandwidth_tbs) * 1e12 * case.gpus * vendor  # bytes/s, all GPUs
    batch = max(case.concurrency, 1)
    context = case.input_tokens + case.output_tokens / 2  # mean over the decode
    weights = s.params_read(batch) * case.precision.bytes_per_param
    kv = batch * context * s.kv_bytes_per_token * case.kv_bytes_per_value / 2.0
    memory_ms = (weights / cal.bandwidth_efficiency[kind] + kv / cal.kv_bandwidth_efficiency) / bw * 1e3
    memory_ms /= case.decode_scale(cal, kind)
    # Batched decode is the same matrix work as a prompt of ``batch`` tokens, at a lower share of
    # the tensor throughput (skinny matrices).
    tflops = case.gpu.bf16_tflops * cal.prefill_efficiency[kind] * cal.decode_compute_efficiency * vendor
    compute_ms = 2 * s.active_params * batch / (case.gpus * tflops * 1e12) * 1e3
    floor_ms = cal.step_floor_ms + s.layers * cal.layer_overhead_us / 1e3
    if not case.static:
        floor_ms += (batch - 1) * cal.sequence_overhead_us / 1e3
    tp_decode = _tp_ms(case, batch, cal)
    prefill = _prefill_compute_ms(case, cal)
    interleave = 0.0 if case.static else cal.interleave * (batch - 1) / max(case.output_tokens, 1) * prefill
    step = max(memory_ms, compute_ms) + floor_ms + tp_decode
    per_token = step + interleave
    tp_prefill = _tp_ms(case, max(case.input_tokens, 1), cal)
    ttft_floor = case.ttft_floor_ms(cal)
    parts = (("weights read", memory_ms), ("matrix work", compute_ms), ("step floor", floor_ms),
             ("all-reduce", tp_decode), ("other prompts", interleave))
    if case.static:
        # A fixed batch computes every prompt, in one pass, before the first token of any.
        ahead, steps = float(batch), 1.0
    else:
        budget = case.prefill_budget(cal)
        ahead = prompts_before_first_token(batch, case.input_tokens, budget)
        steps = max(1.0, ahead * max(case.input_tokens, 1) / budget)
    first = (_prefill_compute_ms(case, cal, ahead, steps)
             + _tp_ms(case, max(round(case.input_tokens * ahead), 1), cal) + ttft_floor)
    if not case.static and batch > 1:
        # However the prompts arrive, a request's prompt also queues behind the others' in steady
        # state: when the clients' prompts take longer than their decodes, the prefill is the
        # bottleneck and each waits for nearly all the others. The time between a client's prompts
        # is its decode steps alone (the other prompts computed meanwhile are the queue itself).
        first = max(first, closed_loop_wait_ms(batch, prefill + tp_prefill, case.output_tokens * step)
                    + ttft_floor + step / 2)
    if case.together_share < 1.0:
        # A prompt arriving alone waits for the other clients' running decode step (half of one on
        # average; nothing runs when it is the only client), then is computed by itself.
        alone = prefill + tp_prefill + ttft_floor + (step / 2 if batch > 1 else 0.0)
        first = case.together_share * first + (1 - case.together_share) * alone
    return Estimate(per_token, first, parts, tp_decode, tp_prefill)


class ServingDefaults(Protocol):
    """What a pod leaves unsaid, and the calibration (``FeasibilityPolicy`` provides both)."""

    @property
    def default_context_tokens(self) -> int: ...
    @property
    def default_concurrency(self) -> int: ...
    @property
    def serving(self) -> ServingCalibration: ...


MIN_OUTPUT_TOKENS = 16


def serving_lengths(spec: WorkloadSpec, defaults: ServingDefaults) -> tuple[int, int]:
    """(prompt, output) tokens of one request: ``prompt-tokens`` or half the context, and the rest
    of ``context-tokens`` (half a context when the prompt fills it; a request always decodes)."""
    context = spec.context_tokens or defaults.default_context_tokens
    prompt = spec.prompt_tokens or max(context // 2, 1)
    # A prompt longer than the (default) context names no output length: take half a context.
    output = context - prompt if context > prompt else context // 2
    return prompt, max(output, MIN_OUTPUT_TOKENS)


# Estimates by what they are computed from: a filter judges every class of node, and the pods of a
# cluster come in few shapes, so the same estimate is asked for over and over (bounded: cleared when
# full). Values keep the GPU and calibration objects their key names by id, checked on a hit.
_ESTIMATES: dict[tuple[Any, ...], tuple[GpuSpec, ServingCalibration, Estimate]] = {}
ESTIMATE_MEMORY = 4096


def serving_estimate(spec: WorkloadSpec, precision: Precision, gpu: GpuSpec, bandwidth_tbs: float,
                     defaults: ServingDefaults, clients: int | None = None) -> Estimate:
    """The estimate for a serving pod on ``spec.gpus`` GPUs of one product, ``clients`` served at
    once (default: the pod's concurrency; fewer when the KV cache holds fewer and the rest queue)."""
    load = clients or spec.concurrency or defaults.default_concurrency
    cal = defaults.serving
    engine = engine_name(spec.serving_engine)
    key = (spec.model, spec.model_params, spec.active_params, spec.context_tokens, spec.prompt_tokens,
           spec.gpus, precision.value, id(gpu), bandwidth_tbs, load, defaults.default_context_tokens,
           engine, id(cal))
    hit = _ESTIMATES.get(key)
    if hit is not None and hit[0] is gpu and hit[1] is cal:
        return hit[2]
    from app.base.model_registry import default_registry

    arch = default_registry().get(spec.model) if spec.model else None
    params = spec.model_params or (arch.params if arch else 0.0)
    prompt, output = serving_lengths(spec, defaults)
    case = Case(Shape.of(params, spec.active_params, arch), precision, gpu, max(spec.gpus, 1), load,
                prompt, output, bandwidth_tbs=bandwidth_tbs or None, engine=engine)
    got = estimate(case, cal)
    if len(_ESTIMATES) >= ESTIMATE_MEMORY:
        _ESTIMATES.clear()
    _ESTIMATES[key] = (gpu, cal, got)
    return got


# An estimate the filter accepts may be this far from what the engine measures (docs/stage-policy.md).
MISS = 1.3


def narrowest_group(moe: bool, precision: Precision, gpus: int, concurrency: int) -> str:
    """The corpus group a configuration belongs to most specifically; every configuration has one."""
    if moe:
        return "moe"
    if precision is Precision.INT4:
        return "int4"
    if precision in (Precision.FP8, Precision.INT8):
        return "int8/fp8"
    if gpus >= 4:
        return "tp>=4"
    if concurrency >= 16:
        return "concurrency>=16"
    return "dense"


def error_group(spec: WorkloadSpec, precision: Precision, clients: int) -> str:
    """The corpus group whose cross-validated error describes this pod best (the narrowest), served
    to ``clients`` at once (its concurrency, or the default, or what its KV cache holds)."""
    moe = (spec.active_params is not None and bool(spec.model_params)
           and spec.active_params < (spec.model_params or 0))
    return narrowest_group(moe, precision, spec.gpus, clients)


# Where a group with fewer than MIN_GROUP_POINTS cross-validated points borrows its distribution:
# every narrow dense group from all dense models, those and mixtures of experts from the pool; a
# group at one client (a request alone: no queueing behind other prompts, the tighter regime) from
# every one-client point, then the pool.
DECISION_PARENT: dict[str, str] = {
    "int4": "dense", "int8/fp8": "dense", "tp>=4": "dense", "concurrency>=16": "dense",
    "dense-16bit": "dense", "dense": "all", "moe": "all", "1 client": "all"}
ONE_CLIENT = ", 1 client"


def decision_keys(group: str, clients: int, engine: str | None = None) -> tuple[str, ...]:
    """The error-distribution groups of a configuration, narrowest first: the engine's own
    (``engine vllm``, when the pod names it), its narrowest group (the narrow 16-bit dense group is
    recorded as ``dense-16bit`` so that ``dense`` names every dense model), at one client its own
    one-client group first, then the parents."""
    base = "dense-16bit" if group == "dense" else group
    keys = [f"{base}{ONE_CLIENT}", "1 client"] if clients <= 1 else [base]
    while (parent := DECISION_PARENT.get(keys[-1])) is not None:
        keys.append(parent)
    if engine:
        keys.insert(0, engine_key(engine))
    return tuple(keys)


def engine_key(engine: str) -> str:
    """``engine vllm`` for ``vllm/0.11.0`` or a corpus row's ``vllm``; ``lmdeploy-turbomind`` is
    LMDeploy's TurboMind backend."""
    return "engine " + engine.split("/", 1)[0].split("-", 1)[0].lower()


@dataclass(frozen=True, slots=True)
class TargetQuantile:
    """What an estimate is multiplied by before it is compared with a target, and why."""

    factor: float  # measured / estimate at ``confidence`` (1 without a recorded distribution)
    confidence: float
    group: str  # the group whose distribution was used (the pod's own, or a parent)
    n: int  # cross-validated points behind it (0: none recorded)

    def rule(self) -> str:
        """``estimate x q90 1.18``: the same for every node of the pod's group, so a rejection's
        text stays one reason across GPU products (explain gives each node's figures)."""
        if self.n == 0:
            return "bare estimate: no error distribution recorded"
        return f"estimate x q{self.confidence * 100:g} {self.factor:.2f}"

    def says(self, estimate_ms: float) -> str:
        """``estimate 31 ms x q90 1.18 = 36.6 ms``."""
        if self.n == 0:
            return f"estimate {estimate_ms:.3g} ms (no error distribution recorded)"
        return (f"estimate {estimate_ms:.3g} ms x q{self.confidence * 100:g} {self.factor:.2f} = "
                f"{estimate_ms * self.factor:.1f} ms")


def target_quantile(cal: ServingCalibration, group: str, metric: str, confidence: float, clients: int,
                    engine: str | None = None) -> TargetQuantile:
    """The quantile of measured / estimate at ``confidence`` for a pod of narrowest ``group`` served
    to ``clients`` at once by ``engine`` (None: unstated): the engine's when it has MIN_GROUP_POINTS,
    else its own group's when that has, else the nearest parent's that has (never one point's)."""
    table = cal.error_quantiles.get(metric, {})
    for key in decision_keys(group, clients, engine):
        got = table.get(key)
        if got is not None and got.n >= MIN_GROUP_POINTS:
            return TargetQuantile(got.at(confidence), confidence, key, got.n)
    return TargetQuantile(1.0, confidence, "none", 0)


def error_band(cal: ServingCalibration, group: str, metric: str = "tpot") -> dict[str, Any] | None:
    """The cross-validated estimate/measured figures of ``group`` that ``calibrate`` recorded."""
    table = cal.provenance.get("cross_validated", {}).get(metric, {})
    band = table.get(group) or table.get("all")
    return dict(band, group=group if group in table else "all") if isinstance(band, dict) else None
