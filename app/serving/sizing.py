"""Memory and decode-latency estimates for LLM workloads.

Rules of thumb, documented so users can argue with them (and override with ``kv-cache-gb``):
* weights = parameters x bytes per parameter at the chosen precision;
* KV cache per token = 2 (K and V) x layers x hidden x 2 bytes x GQA share, with layers and hidden
  derived from the parameter count by the usual ``P ~= 12 * layers * hidden^2`` and ``hidden ~= 128 *
  layers``; grouped-query attention keeps 1/4 of the heads below 30B and 1/8 from 30B (Llama-3 style);
* training with mixed-precision Adam holds ~16 bytes per parameter (weights, grads, fp32 master, two
  moments), sharded across every GPU of the gang (FSDP / ZeRO-3), plus activations;
* LoRA / QLoRA (``finetune-method``) train small adapters on a frozen base: the base is held at its
  precision (QLoRA: 4-bit NF4 with double-quantised constants, ~4.127 bits per parameter as the
  QLoRA paper reports), only the adapters carry gradients, fp32 master and Adam moments (16 bytes per
  trainable parameter), and activations follow the architecture (one checkpoint per layer with
  gradient checkpointing, plus one layer recomputed, ~34 bytes per token per hidden unit as in
  "Reducing Activation Recomputation in Large Transformer Models", flash attention assumed);
* mixture of experts (``active-params``): memory holds every expert, but a decode step reads only
  the experts its batch touches. With B sequences each reading a share a = active / total, a step
  touches 1 - (1 - a)^B of the weights (independent routing; an upper bound, since shared layers
  are read once whatever B is). The KV cache follows the attention, so it is estimated from the
  active parameters;
* time per token and to first token on GPUs: ``app.serving.model`` (calibrated against
  published measurements); here only the tensor-parallel link and NCCL's all-reduce cost it uses,
  and the host-memory read rate of a CPU-served model (``decode_ms_per_token``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from app.base.catalog import GpuSpec
from app.base.workload import (
    CPU_STAGES,
    TRAINING_STAGES,
    FinetuneMethod,
    Precision,
    Stage,
    WorkloadSpec,
)

TRAIN_BYTES_PER_PARAM = 16.0
RUNTIME_OVERHEAD_GB = 1.0  # CUDA context, allocator, engine buffers per GPU
ACTIVATION_SHARE = 0.2  # activations as a share of sharded training state
GQA_BIG_MODEL_PARAMS = 30e9
# QLoRA paper: NF4 weights (4 bits) plus double-quantised block constants (0.127 bits per parameter).
NF4_BYTES_PER_PARAM = 4.127 / 8
ADAPTER_BYTES_PER_PARAM = 16.0  # same mixed-precision Adam state as full training, adapters only
# Default adapter: LoRA rank 16 on every linear layer of a Llama-style block (q, k, v, o: 2h each;
# gate, up, down: h + 2.7h each), i.e. r x ~19h per layer; 7B -> ~42M, 70B -> ~190M parameters.
DEFAULT_LORA_RANK = 16
LORA_WIDTH_PER_RANK = 19.0
# Tokens in one micro-batch of an adapter fine-tune (e.g. 4 sequences of 2,048), for activations.
ADAPTER_TOKENS_PER_STEP = 8192
CHECKPOINT_BYTES_PER_HIDDEN = 2.0  # one bf16 layer input kept per layer (gradient checkpointing)
LAYER_ACTIVATION_BYTES_PER_HIDDEN = 34.0  # the layer being recomputed, flash attention

# --- Tensor-parallel communication (docs/stage-policy.md, "Tensor-parallel communication") ------
# Megatron-LM (Shoeybi et al. 2019, arXiv:1909.08053, section 3 and figure 4): a tensor-parallel
# transformer layer all-reduces its activations twice in the forward pass, after self-attention
# and after the MLP; inference runs the forward pass only.
ALLREDUCES_PER_LAYER = 2
ACTIVATION_BYTES = 2.0  # bf16/fp16 activations, whatever precision the weights are stored at
# PCIe x16 per direction: 8 / 16 / 32 GT/s per lane (Gen3 / Gen4 / Gen5, PCI-SIG base spec) with
# 128b/130b encoding. NVIDIA data sheets quote both directions together: "PCIe Gen4 x16 64 GB/s"
# (L4, L40S), "PCIe Gen5 128 GB/s" (H100 PCIe), "PCIe Gen3 x16 32 GB/s" (T4).
PCIE_X16_GBPS: dict[str, float] = {"pcie3": 15.75, "pcie4": 31.5, "pcie5": 63.0}
# NVLink / Infinity Fabric: the catalog's interconnect names the per-GPU total of both directions
# ("nvlink4-900GBps": H100 SXM data sheet, 900 GB/s = 450 GB/s each way).
_LINK_TOTAL = re.compile(r"(\d+(?:\.\d+)?)\s*gbps", re.IGNORECASE)
# NCCL's own cost model for a ring all-reduce inside one node (NVIDIA/nccl src/graph/tuning.cc,
# ncclTopoTuneModel): 2 (n - 1) steps, each adding a per-step hardware latency to a base latency,
# with the LL protocol (low latency, small messages) at a quarter of the bus bandwidth and Simple
# at all of it. Figures in microseconds, as that file has them: base LL 3.6 / Simple 8.4; per step
# over NVLink LL 0.47 / Simple 3.4, over PCIe LL 1.0 / Simple 5.7.
NCCL_BASE_US = {"ll": 3.6, "simple": 8.4}
NCCL_STEP_US = {"nvlink": {"ll": 0.47, "simple": 3.4}, "pcie": {"ll": 1.0, "simple": 5.7}}
NCCL_LL_BANDWIDTH_SHARE = 0.25


@dataclass(frozen=True, slots=True)
class Sizing:
    """What one pod needs at one precision."""

    precision: Precision
    weights_gb: float
    kv_cache_gb: float
    per_gpu_gb: float  # memory needed on each GPU the pod gets (0 for CPU pods)
    host_memory_gb: float  # RAM the node must hold (CPU-served models, quantisation jobs)
    # Per-GPU (or host) GB by part, for explain: what the total is made of.
    breakdown: tuple[tuple[str, float], ...] = ()
    read_gb: float | None = None  # bytes one decode step reads when not weights + KV (MoE)
    # Serving on GPUs: what must fit per GPU for the engine to start (weights, runtime and the KV
    # cache of one full-length sequence; None: per_gpu_gb), one sequence's KV cache and the clients
    # asked for. Engines page the KV cache and queue the sequences it cannot hold, so
    # ``per_gpu_gb`` (every client's whole context resident) is what the pod would like, not what
    # it needs (docs/stage-policy.md, "Memory sizing").
    required_per_gpu_gb: float | None = None
    kv_per_sequence_gb: float = 0.0
    clients: int = 0

    @property
    def needed_per_gpu_gb(self) -> float:
        return self.per_gpu_gb if self.required_per_gpu_gb is None else self.required_per_gpu_gb

    def clients_held(self, usable_per_gpu_gb: float, gpus: int) -> int:
        """How many of the pod's clients the KV cache holds at once on GPUs with this much usable
        memory each (at least one once the pod fits; all of them when nothing limits it)."""
        if self.required_per_gpu_gb is None or self.kv_per_sequence_gb <= 0:
            return self.clients
        free = usable_per_gpu_gb * gpus - (self.per_gpu_gb * gpus - self.kv_cache_gb)
        return max(1, min(self.clients, int(free / self.kv_per_sequence_gb + 1e-9)))


def weights_gb(params: float, precision: Precision) -> float:
    return params * precision.bytes_per_param / 1e9


def shape(params: float) -> tuple[float, float]:
    """(layers, hidden) of a dense transformer of ``params`` parameters, by the rule above."""
    layers = (params / (12 * 128.0**2)) ** (1 / 3)
    return layers, 128.0 * layers


def kv_bytes_per_token(params: float) -> float:
    layers, hidden = shape(params)
    gqa = 1 / 8 if params >= GQA_BIG_MODEL_PARAMS else 1 / 4
    return 2 * layers * hidden * 2.0 * gqa


def kv_cache_gb(spec: WorkloadSpec, default_context: int, default_concurrency: int) -> float:
    if spec.kv_cache_gb is not None:
        return spec.kv_cache_gb
    if spec.stage is not Stage.SERVING or spec.model_params is None:
        return 0.0
    tokens = (spec.context_tokens or default_context) * (spec.concurrency or default_concurrency)
    if spec.model is not None:
        from app.base.model_registry import default_registry

        # The model's own layers, KV heads and head dimension (or MLA latent) beat the size rule,
        # which is off by 0.7-2.6x against published configurations.
        if (arch := default_registry().get(spec.model)) is not None:
            return tokens * arch.kv_bytes_per_token() / 1e9
    attention = spec.active_params or spec.model_params
    return tokens * kv_bytes_per_token(attention) / 1e9


def default_adapter_params(params: float) -> float:
    layers, hidden = shape(params)
    return DEFAULT_LORA_RANK * LORA_WIDTH_PER_RANK * layers * hidden


def adapter_activation_gb(params: float) -> float:
    layers, hidden = shape(params)
    per_token = hidden * (layers * CHECKPOINT_BYTES_PER_HIDDEN + LAYER_ACTIVATION_BYTES_PER_HIDDEN)
    return ADAPTER_TOKENS_PER_STEP * per_token / 1e9


def moe_read_share(spec: WorkloadSpec, default_concurrency: int) -> float:
    """Share of the weights one decode step reads: 1 for dense, the touched experts for MoE."""
    if spec.active_params is None or spec.model_params is None or spec.model_params <= 0:
        return 1.0
    a = min(1.0, spec.active_params / spec.model_params)
    batch = spec.concurrency or default_concurrency
    return min(1.0, 1 - (1 - a) ** batch)


def _adapter_training(
    spec: WorkloadSpec, precision: Precision, params: float, alignment_extra_headroom: float
) -> Sizing:
    """LoRA / QLoRA: frozen base + adapters with optimizer state + activations, per GPU."""
    qlora = spec.effective_finetune_method is FinetuneMethod.QLORA
    base = params * (NF4_BYTES_PER_PARAM if qlora else precision.bytes_per_param) / 1e9
    trainable = spec.trainable_params or default_adapter_params(params)
    adapters = trainable * ADAPTER_BYTES_PER_PARAM / 1e9
    acts = adapter_activation_gb(params)
    shards = max(gang_gpus(spec), 1)  # FSDP shards base and adapters alike; DDP would not
    # The headroom covers what varies with the batch (activations, optimizer buffers), not the
    # frozen base, whose size is known exactly.
    extra = alignment_extra_headroom if spec.stage is Stage.ALIGNMENT else 0.0
    parts: tuple[tuple[str, float], ...] = (
        ("frozen weights" + (" (nf4)" if qlora else f" ({precision.value})"), base / shards),
        ("adapters + gradients + Adam", adapters / shards),
        ("activations", acts / shards),
        ("headroom", (adapters + acts) / shards * extra),
    )
    if gang_gpus(spec) == 0:
        host = sum(v for _, v in parts)
        return Sizing(precision, base, 0.0, 0.0, host, parts)
    parts += (("runtime", RUNTIME_OVERHEAD_GB),)
    return Sizing(precision, base, 0.0, sum(v for _, v in parts), 0.0, parts)


def gang_gpus(spec: WorkloadSpec) -> int:
    """GPUs the whole job holds: the pod's own times the gang size (training state is sharded)."""
    members = spec.gang.size if spec.gang and spec.gang.size else 1
    return max(spec.gpus, 0) * members


def size(
    spec: WorkloadSpec,
    precision: Precision,
    *,
    default_context: int,
    default_concurrency: int,
    alignment_extra_headroom: float = 0.15,
) -> Sizing:
    """Memory needs of ``spec`` at ``precision``. Pods without model-params need nothing sized."""
    if spec.model_params is None:
        return Sizing(precision, 0.0, 0.0, 0.0, 0.0)
    w = weights_gb(spec.model_params, precision)
    if spec.stage in TRAINING_STAGES:
        if spec.effective_finetune_method is not FinetuneMethod.FULL:
            return _adapter_training(spec, precision, spec.model_params, alignment_extra_headroom)
        total = spec.model_params * TRAIN_BYTES_PER_PARAM / 1e9
        shards = gang_gpus(spec)
        if shards == 0:
            return Sizing(precision, w, 0.0, 0.0, total * (1 + ACTIVATION_SHARE))
        state = total / shards
        parts: tuple[tuple[str, float], ...] = (
            ("weights + gradients + fp32 master + Adam", state),
            ("activations", state * ACTIVATION_SHARE),
            ("runtime", RUNTIME_OVERHEAD_GB),
        )
        per_gpu = state * (1 + ACTIVATION_SHARE) + RUNTIME_OVERHEAD_GB
        if spec.stage is Stage.ALIGNMENT:
            parts += (("headroom", per_gpu * alignment_extra_headroom),)
            per_gpu *= 1 + alignment_extra_headroom
        return Sizing(precision, w, 0.0, per_gpu, 0.0, parts)
    if spec.stage in CPU_STAGES:
        # Quantising or packaging loads the weights into RAM at their source precision, plus a copy
        # of the output; 1.2x leaves room for the process itself.
        return Sizing(precision, w, 0.0, 0.0, w * 1.2 if spec.stage is Stage.DEPLOYMENT else 0.0)
    kv = kv_cache_gb(spec, default_context, default_concurrency)
    share = moe_read_share(spec, default_concurrency)
    read = w * share + kv if share < 1.0 else None
    if spec.gpus > 0:
        per_gpu = (w + kv) / spec.gpus + RUNTIME_OVERHEAD_GB
        serving = (("weights", w / spec.gpus), ("kv cache", kv / spec.gpus),
                   ("runtime", RUNTIME_OVERHEAD_GB))
        if spec.kv_cache_gb is not None:  # the user sized the cache: all of it must fit
            return Sizing(precision, w, kv, per_gpu, 0.0, serving, read)
        clients = spec.concurrency or default_concurrency
        one = kv / clients
        return Sizing(precision, w, kv, per_gpu, 0.0, serving, read,
                      required_per_gpu_gb=(w + one) / spec.gpus + RUNTIME_OVERHEAD_GB,
                      kv_per_sequence_gb=one, clients=clients)
    return Sizing(precision, w, kv, 0.0, (w + kv) * 1.1, (("weights", w), ("kv cache", kv)), read)


@dataclass(frozen=True, slots=True)
class Link:
    """The GPU-to-GPU path inside one box, as tensor parallelism uses it."""

    name: str  # the catalog's interconnect, e.g. "pcie4", "nvlink4-900GBps"
    kind: str  # "nvlink" (NVLink / Infinity Fabric across the box) or "pcie"
    gb_per_s: float  # per GPU, per direction


def gpu_link(gpu: GpuSpec) -> Link:
    """The link of ``gpu`` from the catalog: NVLink when it spans the box, else its PCIe slot.

    A PCIe part with a pair-only NVLink bridge (H100 PCIe, A100 PCIe) has ``nvlink: false`` in the
    catalog: beyond two GPUs a ring crosses PCIe, so it is priced as PCIe.
    """
    name = gpu.interconnect.strip().lower()
    if gpu.nvlink and (m := _LINK_TOTAL.search(name)) is not None:
        return Link(gpu.interconnect, "nvlink", float(m.group(1)) / 2)
    gen = re.match(r"pcie\s*(\d)", name)
    gbps = PCIE_X16_GBPS.get(f"pcie{gen.group(1)}") if gen else None
    # An unrecognised PCIe generation is priced as Gen3, the slowest the catalog holds: the
    # estimate should err towards the penalty, never hide it.
    return Link(gpu.interconnect, "pcie", gbps if gbps is not None else PCIE_X16_GBPS["pcie3"])


def allreduce_us(message_bytes: float, gpus: int, link: Link) -> float:
    """Microseconds for one ring all-reduce of ``message_bytes`` over ``gpus`` GPUs of one box.

    Each GPU sends (and receives) 2 (n - 1) / n of the message (nccl-tests doc/PERFORMANCE.md, "bus
    bandwidth"); latency and protocol choice follow NCCL's cost model, taking the cheaper protocol
    as NCCL's tuner does.
    """
    if gpus <= 1:
        return 0.0
    steps = 2 * (gpus - 1)
    volume = steps / gpus * message_bytes  # bytes through each GPU's link, each way
    mb_per_us = link.gb_per_s * 1e3  # GB/s = 1e3 bytes per microsecond
    step = NCCL_STEP_US[link.kind]
    ll = NCCL_BASE_US["ll"] + steps * step["ll"] + volume / (mb_per_us * NCCL_LL_BANDWIDTH_SHARE)
    simple = NCCL_BASE_US["simple"] + steps * step["simple"] + volume / mb_per_us
    return min(ll, simple)


@dataclass(frozen=True, slots=True)
class TensorParallel:
    """What sharding one serving pod over several GPUs of a box costs in communication."""

    link: Link
    gpus: int
    per_token_ms: float  # added to every decode step (one token per sequence)
    prefill_ms: float  # added to the time to first token of one prompt


def decode_ms_per_token(
    sizing: Sizing, gpus: int, bandwidth_tbs: float, efficiency: float
) -> float | None:
    """Predicted ms per output token, or None when there is nothing to read (unsized pod)."""
    read_gb = sizing.read_gb if sizing.read_gb is not None else sizing.weights_gb + sizing.kv_cache_gb
    if read_gb <= 0 or bandwidth_tbs <= 0:
        return None
    lanes = max(gpus, 1)
    return read_gb / (lanes * bandwidth_tbs * efficiency)  # GB / (TB/s) = ms
