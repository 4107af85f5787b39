"""Memory and decode-latency estimates for LLM workloads.

Rules of thumb, documented so users can argue with them (and override with ``kv-cache-gb``):
* weights = parameters x bytes per parameter at the chosen precision;
* KV cache per token = 2 (K and V) x layers x hidden x 2 bytes x GQA share, with layers and hidden
  derived from the parameter count by the usual ``P ~= 12 * layers * hidden^2`` and ``hidden ~= 128 *
  layers``; grouped-query attention keeps 1/4 of the heads below 30B and 1/8 from 30B (Llama-3 style);
* training with mixed-precision Adam holds ~16 bytes per parameter (weights, grads, fp32 master, two
  moments), sharded across every GPU of the gang (FSDP / ZeRO-3), plus activations;
* decode time per token = bytes read per step / (GPUs x HBM bandwidth x efficiency): decode is
  memory-bound, so bandwidth, not FLOPS, sets the latency.
"""

from __future__ import annotations

from dataclasses import dataclass

from app.core.workload import CPU_STAGES, TRAINING_STAGES, Precision, Stage, WorkloadSpec

TRAIN_BYTES_PER_PARAM = 16.0
RUNTIME_OVERHEAD_GB = 1.0  # CUDA context, allocator, engine buffers per GPU
ACTIVATION_SHARE = 0.2  # activations as a share of sharded training state
GQA_BIG_MODEL_PARAMS = 30e9


@dataclass(frozen=True, slots=True)
class Sizing:
    """What one pod needs at one precision."""

    precision: Precision
    weights_gb: float
    kv_cache_gb: float
    per_gpu_gb: float  # memory needed on each GPU the pod gets (0 for CPU pods)
    host_memory_gb: float  # RAM the node must hold (CPU-served models, quantisation jobs)


def weights_gb(params: float, precision: Precision) -> float:
    return params * precision.bytes_per_param / 1e9


def kv_bytes_per_token(params: float) -> float:
    layers = (params / (12 * 128.0**2)) ** (1 / 3)
    hidden = 128.0 * layers
    gqa = 1 / 8 if params >= GQA_BIG_MODEL_PARAMS else 1 / 4
    return 2 * layers * hidden * 2.0 * gqa


def kv_cache_gb(spec: WorkloadSpec, default_context: int, default_concurrency: int) -> float:
    if spec.kv_cache_gb is not None:
        return spec.kv_cache_gb
    if spec.stage is not Stage.SERVING or spec.model_params is None:
        return 0.0
    tokens = (spec.context_tokens or default_context) * (spec.concurrency or default_concurrency)
    return tokens * kv_bytes_per_token(spec.model_params) / 1e9


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
        total = spec.model_params * TRAIN_BYTES_PER_PARAM / 1e9
        shards = gang_gpus(spec)
        if shards == 0:
            return Sizing(precision, w, 0.0, 0.0, total * (1 + ACTIVATION_SHARE))
        per_gpu = total / shards * (1 + ACTIVATION_SHARE) + RUNTIME_OVERHEAD_GB
        if spec.stage is Stage.ALIGNMENT:
            per_gpu *= 1 + alignment_extra_headroom
        return Sizing(precision, w, 0.0, per_gpu, 0.0)
    if spec.stage in CPU_STAGES:
        # Quantising or packaging loads the weights into RAM at their source precision, plus a copy
        # of the output; 1.2x leaves room for the process itself.
        return Sizing(precision, w, 0.0, 0.0, w * 1.2 if spec.stage is Stage.DEPLOYMENT else 0.0)
    kv = kv_cache_gb(spec, default_context, default_concurrency)
    if spec.gpus > 0:
        per_gpu = (w + kv) / spec.gpus + RUNTIME_OVERHEAD_GB
        return Sizing(precision, w, kv, per_gpu, 0.0)
    return Sizing(precision, w, kv, 0.0, (w + kv) * 1.1)


def decode_ms_per_token(
    sizing: Sizing, gpus: int, bandwidth_tbs: float, efficiency: float
) -> float | None:
    """Predicted ms per output token, or None when there is nothing to read (unsized pod)."""
    read_gb = sizing.weights_gb + sizing.kv_cache_gb
    if read_gb <= 0 or bandwidth_tbs <= 0:
        return None
    lanes = max(gpus, 1)
    return read_gb / (lanes * bandwidth_tbs * efficiency)  # GB / (TB/s) = ms
